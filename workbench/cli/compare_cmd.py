"""`wb compare`: two dumps in, a catalog, an msit-compatible CSV and the verdict out."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.catalog import first_row
from workbench.cli.common import ProgressPrinter, app, fail, guarded


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
    from workbench.catalog import CATALOG_NAME
    from workbench.compare.pool import PoolStarter, default_workers, worth_a_pool
    from workbench.compare.tasks import parse_tokens

    # boot the workers first, then read the dumps and hand the workers the pairs that are obvious
    # (same place in two dumps of one kind) while this process imports pandas/DuckDB and builds the catalog
    n_workers = workers or default_workers()
    starter = (
        PoolStarter(n_workers) if golden.exists() and test.exists() and worth_a_pool(golden, test, n_workers) else None
    )
    try:
        from workbench.formats import open_dump

        tok = parse_tokens(tokens)
        g_dump, t_dump = open_dump(golden), open_dump(test)
        if tok is not None:
            check_tokens(tok, g_dump.tokens, t_dump.tokens, tokens or "")
        early = None
        if starter is not None and g_dump.kind == t_dump.kind:
            from workbench.compare.early import EarlyPairs

            early = EarlyPairs(g_dump, t_dump, starter, tok)

        from workbench.catalog.store import open_catalog
        from workbench.compare.pipeline import run_compare
        from workbench.compare.report import format_summary, write_msit_csv

        gc.freeze()  # the imported modules' objects need no more collecting: ~0.1 s less of GC per run

        out.mkdir(parents=True, exist_ok=True)
        catalog = out / CATALOG_NAME
        res = run_compare(
            g_dump,
            t_dump,
            catalog,
            mapping=mapping,
            tokens=tok,
            workers=n_workers,
            thresholds=thresholds,
            progress=None if quiet else ProgressPrinter(),
            pool=starter,
            early=early,
        )
    finally:
        if starter is not None:
            starter.shutdown()
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


def check_tokens(wanted: set[int], golden: list[int], test: list[int], text: str) -> None:
    """Refuse `--tokens` naming no token of the dumps (nothing would be compared; no empty CSV is written)."""
    have = sorted(set(golden) & set(test))
    if wanted & set(have):
        return
    raise ValueError(f"--tokens {text}: the dumps have no such token; they hold tokens {token_ranges(have) or 'none'}")


def token_ranges(tokens: list[int]) -> str:
    """[0, 1, 2, 3, 7] -> '0-3, 7'."""
    out: list[str] = []
    for t in sorted(tokens):
        if out and t == int(out[-1].split("-")[-1]) + 1:
            out[-1] = f"{out[-1].split('-')[0]}-{t}"
        else:
            out.append(str(t))
    return ", ".join(out)


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
    ] = Path("wb_out"),
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
