"""`wb badcase`: the cases of two result files whose verdict flipped or whose outputs differ, and what to dump next."""

from __future__ import annotations

import csv
import os
import shlex
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer

from workbench.cli.common import app, guarded, say
from workbench.core.text import csv_safe, printable

COLUMNS_CSV = (
    "key",
    "prompt",
    "passed_golden",
    "passed_test",
    "flipped",
    "outputs_differ",
    "first_diff",
    "unit",
    "golden_at",
    "test_at",
)
COLUMNS = ("key", "passed_golden", "passed_test", "first_diff", "unit", "golden_at", "test_at", "prompt")


SHOWN = 50  # bad cases in the printed table; `-o` gets every one


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "pass" if value else "fail"
    text = printable(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _csv_value(value: Any) -> Any:
    return "" if value is None else csv_safe(value)


def run_badcase(golden: Path, test: Path, out: Path | None, run: list[str] | None = None) -> int:
    """Print the bad cases (and write them to `out` as CSV), run `run` commands for the first; returns how many.

    The golden file is streamed against the test file's cases; the CSV is written as the cases come (to a
    temporary file renamed at the end, so a malformed line leaves no half report) and the table shows the
    first `SHOWN`."""
    from workbench.analysis.verdicts.badcase import BadCase, CaseCounts, find_bad_cases, next_dump, run_command
    from workbench.core.owned import check_replaceable

    if out is not None:
        check_replaceable(out, ",".join(COLUMNS_CSV), "badcase")

    counts = CaseCounts()
    shown: list[BadCase] = []
    first: BadCase | None = None
    n_bad = flipped = differ = 0
    tmp: Path | None = None
    writer: Any = None
    fh: TextIO | None = None
    try:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f".{out.name}.{os.getpid()}.part")
            fh = open(tmp, "w", encoding="utf-8", newline="")
            writer = csv.writer(fh, lineterminator="\r\n")  # CRLF (RFC 4180): a CR inside a cell is then quoted too
            writer.writerow(COLUMNS_CSV)
        for b in find_bad_cases(golden, test, counts):
            n_bad += 1
            flipped += b.flipped
            differ += bool(b.outputs_differ)
            if len(shown) < SHOWN:
                shown.append(b)
            if first is None or (first.first_diff is None and b.first_diff is not None):
                first = b
            if writer is not None:
                writer.writerow([_csv_value(getattr(b, c)) for c in COLUMNS_CSV])
        if fh is not None and tmp is not None and out is not None:
            fh.close()
            os.replace(tmp, out)
            tmp = None
    finally:
        if fh is not None:
            fh.close()
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    if shown:
        rows = [[_cell(getattr(b, c)) for c in COLUMNS] for b in shown]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        say("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())
        for r in rows:
            say("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        if n_bad > len(shown):
            more = f"all of them in {out}" if out is not None else "-o FILE writes all of them"
            say(f"... and {n_bad - len(shown)} more bad case(s) ({more})")
    say(
        f"{n_bad} bad case(s) of {counts.common} in both files: {flipped} flipped pass/fail, "
        f"{differ} with other outputs"
    )
    if counts.only_golden or counts.only_test:
        say(f"not compared: {counts.only_golden} case(s) only in {golden}, {counts.only_test} only in {test}")
    if out is not None:
        say(f"report: {out}")
    if first is not None:
        for line in next_dump(first):
            say(line)
        for template in run or []:
            argv, code = run_command(template, first)
            say(f"run: {shlex.join(argv)} -> exit {code}")
            if code != 0:
                raise ValueError(f"--run: {argv[0]} exited with status {code}")
    return n_bad


@app.command()
def badcase(
    golden: Annotated[Path, typer.Option("-gp", "--golden-path", help="Golden results: msit bad-case CSV or JSONL.")],
    test: Annotated[Path, typer.Option("-mp", "--my-path", help="Test results, same kinds.")],
    out: Annotated[Path | None, typer.Option("-o", "--output", help="Write the bad cases to this CSV file.")] = None,
    run: Annotated[
        list[str] | None,
        typer.Option(
            "--run",
            help="Command to run for the first bad case (repeatable: golden, then test), with {prompt}, {key}, "
            '{tokens} (0,1,..,N) and {last_token} filled in, e.g. "python dump_case.py --prompt {prompt}".',
        ),
    ] = None,
) -> None:
    """Bad cases of two result files (msit analyze/bcanalyze CSVs or JSONL): flipped or other outputs; what to dump."""
    guarded(lambda: run_badcase(golden, test, out, run))
