"""`wb badcase`: the cases of two result files whose verdict flipped or whose outputs differ, and what to dump next."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.cli.common import app, guarded

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


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "pass" if value else "fail"
    text = str(value).replace("\n", " ")
    return text if len(text) <= 40 else text[:39] + "…"


def run_badcase(golden: Path, test: Path, out: Path | None, run: list[str] | None = None) -> int:
    """Print the bad cases (and write them to `out` as CSV), run `run` commands for the first; returns how many."""
    from workbench.analysis.badcase import compare_cases, next_dump, read_cases, run_command
    from workbench.core.owned import check_replaceable

    if out is not None:
        check_replaceable(out, ",".join(COLUMNS_CSV), "badcase")
    g_cases, t_cases = read_cases(golden), read_cases(test)
    bad, only_g, only_t = compare_cases(g_cases, t_cases)
    common = len(g_cases) - len(only_g)
    if out is not None:
        import pandas as pd

        out.parent.mkdir(parents=True, exist_ok=True)
        df = pd.DataFrame([b.as_dict() for b in bad], columns=list(COLUMNS_CSV))
        df["first_diff"] = df["first_diff"].astype("Int64")
        df.to_csv(out, index=False)
    if bad:
        rows = [[_cell(getattr(b, c)) for c in COLUMNS] for b in bad]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
        typer.echo("  ".join(c.ljust(w) for c, w in zip(COLUMNS, widths, strict=True)).rstrip())
        for r in rows:
            typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    flipped = sum(1 for b in bad if b.flipped)
    differ = sum(1 for b in bad if b.outputs_differ)
    typer.echo(
        f"{len(bad)} bad case(s) of {common} in both files: {flipped} flipped pass/fail, {differ} with other outputs"
    )
    if only_g or only_t:
        typer.echo(f"not compared: {len(only_g)} case(s) only in {golden}, {len(only_t)} only in {test}")
    if out is not None:
        typer.echo(f"report: {out}")
    if bad:
        first = next((b for b in bad if b.first_diff is not None), bad[0])
        for line in next_dump(first):
            typer.echo(line)
        for template in run or []:
            argv, code = run_command(template, first)
            typer.echo(f"run: {shlex.join(argv)} -> exit {code}")
            if code != 0:
                raise ValueError(f"--run: {argv[0]} exited with status {code}")
    return len(bad)


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
