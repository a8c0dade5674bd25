"""`wb compare`: two dumps in, a catalog, an msit-compatible CSV and the verdict out."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.catalog import first_row
from workbench.cli.common import ProgressPrinter, app, fail, guarded
from workbench.core.files import DEFAULT_OUTPUT


def run_compare_cli(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    tokens: str | None,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool = False,
) -> Any:
    """Shared by `wb compare`, `wb open` and `wb demo`: compare, write the CSV, print the summary."""
    from workbench.compare.tasks import parse_tokens
    from workbench.core.files import CATALOG_NAME
    from workbench.jobs.compare import run_compare

    tok = parse_tokens(tokens)
    catalog = out / CATALOG_NAME  # the job makes OUT once both dumps are read
    res = run_compare(
        golden,
        test,
        catalog,
        mapping=mapping,
        tokens=tok,
        workers=workers,
        thresholds=thresholds,
        progress=None if quiet else ProgressPrinter(),
        freeze_gc=True,
    )
    from workbench.catalog.store import open_catalog
    from workbench.compare.report import format_summary, write_msit_csv

    con = open_catalog(catalog)
    try:
        csv_path = write_msit_csv(con, res.cmp_id, out, tok)
        labels = {}
        for run_id in (res.golden_run, res.test_run):
            row = first_row(con.execute("SELECT kind, path FROM runs WHERE run_id = ?", [run_id]))
            labels[run_id] = f"{row[1]} ({row[0]})" if row else str(run_id)
    finally:
        con.close()
    for line in format_summary(res, labels[res.golden_run], labels[res.test_run], csv_path):
        typer.echo(line)
    return res


@app.command()
def compare(
    golden: Annotated[Path, typer.Option("-gp", "--golden-path", help="Golden dump (any level msit accepts).")],
    test: Annotated[Path, typer.Option("-mp", "--my-path", help="Test dump (any level msit accepts).")],
    mapping: Annotated[
        Path | None,
        typer.Option(
            "-mf",
            "--mapping",
            help="Mapping file (wb-mapping JSON), msit's op_mapping_file.json, or a folder with them.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("-o", "--output", help="Output folder: catalog.duckdb and the CSV report.")
    ] = Path(DEFAULT_OUTPUT),
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to compare, e.g. 0-3,7.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Worker processes (default: cores).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
) -> None:
    """Compare two dumps op by op: OUT/catalog.duckdb, an msit-compatible CSV, and where the error is born."""
    res = guarded(lambda: run_compare_cli(golden, test, out, mapping, tokens, workers, thresholds))
    if res.pairs == 0 or res.uncomparable >= res.pairs:
        raise fail("nothing could be compared (no matched tensor pairs with readable data)", 1)
