"""Peak memory of the main `wb compare` process on a dump with many tiny tensor files (issue 15, item 11).

    python bench/bench_load.py [--tokens 512] [--modules 48] [--distinct] [--ref /work/main] [--keep DIR]

Writes a golden and a test msit-layout torch dump of `tokens` x `modules` x 3 files each (512 x 48 x 3 x 2 =
147,456 files by default): the first token's files are written, later tokens hard-link them (as our dumper
does for repeated tensors), so the dump costs seconds; `--distinct` writes every file (every pair is computed:
the results the main process receives count too). Then runs `wb compare` (the CLI's code path, in a
child process) with this checkout and, when `--ref` names another checkout, with that one, and prints each
one's peak RSS of the main process (workers not counted), its wall time and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = """
import resource, sys, time
from pathlib import Path
from workbench.cli.compare_cmd import compare_request, run_compare_cli
t0 = time.perf_counter()
res = run_compare_cli(compare_request(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])), quiet=True)
wall = time.perf_counter() - t0
print("RESULT", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, wall, res.pairs, file=sys.stderr)
"""


def make_dump(dev: Path, tokens: int, modules: int, seed: int, distinct: bool = False) -> int:
    """An msit torch dump; returns the number of tensor files."""
    import torch

    names = [f"root.layers.{i // 4}.m{i % 4}" for i in range(modules)]
    dev.mkdir(parents=True)
    tree = {"name": "root", "type": "M", "children": [{"name": n, "type": "Linear", "children": []} for n in names]}
    (dev / "model_tree.json").write_text(json.dumps(tree))
    gen = torch.Generator().manual_seed(seed)
    files = ("input_0.pth", "output_0.pth", "output_1.pth")
    first = dev / "0"
    for n in names:
        (first / n).mkdir(parents=True)
        for f in files:
            torch.save(torch.randn(4, 8, generator=gen), first / n / f)
    for tok in range(1, tokens):
        for n in names:
            (dev / str(tok) / n).mkdir(parents=True)
            for f in files:
                if distinct:
                    torch.save(torch.randn(4, 8, generator=gen), dev / str(tok) / n / f)
                else:
                    os.link(first / n / f, dev / str(tok) / n / f)
    return tokens * modules * len(files)


def measure(checkout: Path, golden: Path, test: Path, out: Path) -> tuple[int, float, int]:
    """(peak RSS KB of the main process, wall seconds, pairs) of one compare with `checkout`'s code."""
    shutil.rmtree(out, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    r = subprocess.run(
        [sys.executable, "-c", _CHILD, str(golden), str(test), str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=checkout,
    )
    line = next((ln for ln in r.stderr.splitlines() if ln.startswith("RESULT")), None)
    if line is None:
        raise SystemExit(f"{checkout}: compare failed:\n{r.stderr[-2000:]}")
    _tag, rss, wall, pairs = line.split()
    return int(rss), float(wall), int(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--modules", type=int, default=48)
    ap.add_argument("--ref", type=Path, default=None, help="another checkout to measure the same way (e.g. main)")
    ap.add_argument("--distinct", action="store_true", help="write every file (no hard links): every pair computed")
    ap.add_argument("--keep", type=Path, default=None, help="build the dumps here and keep them")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="wb-load-"))
    golden, test = base / "golden" / "cpu_1", base / "test" / "cpu_1"
    t0 = time.perf_counter()
    n = 0
    if not golden.exists():
        n += make_dump(golden, args.tokens, args.modules, 1, args.distinct)
        n += make_dump(test, args.tokens, args.modules, 2, args.distinct)
    print(
        f"dumps: {args.tokens} tokens x {args.modules} modules x 3 files x 2 = {n or 'existing'} files "
        f"({time.perf_counter() - t0:.1f} s to write)"
    )
    rows = [("this checkout", ROOT)] + ([("reference", args.ref)] if args.ref else [])
    results = {}
    for label, checkout in rows:
        rss, wall, pairs = measure(checkout, golden, test, base / f"out-{label.replace(' ', '_')}")
        results[label] = rss
        files = 2 * args.tokens * args.modules * 3
        print(
            f"{label:14s} peak RSS {rss / 1024:7.0f} MB  ({rss * 1024 / files / 1024:5.2f} KB per file)  "
            f"wall {wall:6.1f} s  pairs {pairs}"
        )
    if args.ref:
        print(f"peak RSS ratio this/reference: {results['this checkout'] / results['reference']:.2f}")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
