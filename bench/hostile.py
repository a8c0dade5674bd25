"""Run the whole hostile-input set (issue 15) and print a table: case, expected, got, ok.

    python bench/hostile.py [-k WORD]

Each case builds its crafted input in a temporary folder (see `tests/fixtures/hostile_cases.py`).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.hostile_cases import CASES, Outcome
from workbench.core.text import printable


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-k", default="", help="only cases whose name holds this text")
    args = ap.parse_args()
    rows = []
    for c in CASES:
        if args.k.lower() not in c.name.lower():
            continue
        t0 = time.perf_counter()
        if c.needs_root and os.geteuid() != 0:
            out = Outcome("skipped: needs root", True)
        else:
            with tempfile.TemporaryDirectory(prefix="wb-hostile-") as tmp:
                try:
                    out = c.run(Path(tmp))
                except Exception as exc:  # a case that crashes is a failed case, the table goes on
                    out = Outcome(f"case crashed: {type(exc).__name__}: {exc}", False)
        rows.append((f"{c.item}. {c.name}", c.expected, printable(out.got), "ok" if out.ok else "FAIL"))
        print(f"{rows[-1][3]:4s} {rows[-1][0]} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    widths = [min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((48, 56, 90, 4))]
    head = ("case", "expected", "got", "ok")
    print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(str(v)[:w].ljust(w) for v, w in zip(r, widths)))
    failed = sum(r[3] != "ok" for r in rows)
    print(f"\n{len(rows) - failed}/{len(rows)} cases ok")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
