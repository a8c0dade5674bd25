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
    """Shared by `wb compare`, `wb open` and `wb demo`: compare, write the CSV, print the summary.

    Two multi-rank dumps (one folder per process or device) are compared rank with rank into one catalog
    (`runs.rank`), with one CSV and one summary per rank; returns the last rank's result then."""
    from workbench.formats.detect import find_ranks, pair_ranks

    g_ranks, t_ranks = find_ranks(golden), find_ranks(test)
    if not (g_ranks and t_ranks):
        return _compare_one(golden, test, out, mapping, tokens, workers, thresholds, quiet)
    pairs = pair_ranks(g_ranks, t_ranks)
    by_id = all(g.rank is not None and g.rank == t.rank for g, t in pairs)
    typer.echo(
        f"ranks: golden {len(g_ranks)}, test {len(t_ranks)}; paired {len(pairs)} "
        f"by {'device/rank id' if by_id else 'order'}"
    )
    res = None
    runs: list[tuple[int, int, int]] = []  # rank, golden run, test run
    for i, (g, t) in enumerate(pairs):
        rank = g.rank if by_id and g.rank is not None else i
        typer.echo(f"== rank {rank}: golden {g.label}, test {t.label}")
        res = _compare_one(
            g.path, t.path, out, mapping, tokens, workers, thresholds, quiet, rank=rank, dumps=(g.open, t.open)
        )
        runs.append((rank, res.golden_run, res.test_run))
    for side, ranks in (("golden", [g for g, _ in pairs]), ("test", [t for _, t in pairs])):
        _allreduce_check(side, ranks, [(r, g if side == "golden" else t) for r, g, t in runs], out)
    return res


def _allreduce_check(side: str, ranks: list[Any], run_ids: list[tuple[int, int]], out: Path) -> None:
    """All-reduce check of one side's ranks: stored in `allreduce_checks`, failures printed."""
    from workbench.analysis.allreduce import check_allreduce, describe
    from workbench.catalog import CATALOG_NAME
    from workbench.catalog.store import open_catalog

    results = check_allreduce([r.open() for r in ranks])
    if not results:
        return
    labels = [f"rank {rk}" for rk, _ in run_ids]
    con = open_catalog(out / CATALOG_NAME)
    try:
        con.executemany(
            "INSERT OR REPLACE INTO allreduce_checks VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                [
                    run_ids[x.rank_index][1],
                    x.token,
                    x.node,
                    x.rel_error,
                    x.passed,
                    None if x.culprit is None else run_ids[x.culprit][0],
                    x.factor,
                    x.reason,
                ]
                for x in results
            ],
        )
    finally:
        con.close()
    bad = [x for x in results if x.passed is False]
    ops = {(x.token, x.node) for x in results}
    typer.echo(
        f"all-reduce check ({side}): {len(ops)} op calls x {len(ranks)} ranks, "
        f"{len({(x.token, x.node) for x in bad})} failing"
    )
    for x in bad[:20]:
        typer.echo(f"  all-reduce mismatch: {describe(x, labels)}")


def _compare_one(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    tokens: str | None,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool = False,
    *,
    rank: int | None = None,
    dumps: tuple[Any, Any] | None = None,
) -> Any:
    """One golden/test pair of dumps (or of ranks: `dumps` reads them, `rank` goes into `runs.rank`)."""
    from workbench.compare.tasks import parse_tokens
    from workbench.core.files import CATALOG_NAME
    from workbench.jobs.compare import run_compare

    tok = parse_tokens(tokens)
    catalog = out / CATALOG_NAME  # the job makes OUT once both dumps are read
    res = run_compare(
        dumps[0]() if dumps else golden,
        dumps[1]() if dumps else test,
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
        if rank is not None:
            con.execute("UPDATE runs SET rank = ? WHERE run_id IN (?, ?)", [rank, res.golden_run, res.test_run])
        csv_path = write_msit_csv(con, res.cmp_id, out, tok, "" if rank is None else f"_rank{rank}")
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
