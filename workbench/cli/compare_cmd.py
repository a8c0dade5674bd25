"""`wb compare`: two dumps in, a catalog, an msit-compatible CSV and the verdict out."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from workbench.catalog import first_row
from workbench.cli.common import ProgressPrinter, app, fail, guarded, say, signal_inside
from workbench.core.files import CATALOG_NAME, DEFAULT_OUTPUT

T = TypeVar("T")


def run_compare_cli(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    tokens: str | None,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool = False,
    follow_symlinks: bool = False,
    ray: str | None = None,
    show_stale: bool = False,
) -> Any:
    """Shared by `wb compare`, `wb open` and `wb demo`: compare, write the CSV, print the summary.

    Two multi-rank dumps (one folder per process or device) are compared rank with rank into one catalog
    (`runs.rank`), with one CSV and one summary per rank; returns the last rank's result then. `ray` (an
    address, `auto` or `local`) computes the pairs on a Ray cluster (docs/scaling.md)."""
    from workbench.compare.tasks import token_ranges

    if ray is not None:
        from workbench.compare.ray_exec import import_ray

        import_ray()  # before anything is read or written: `ray is not installed: ...`, exit 2
    ranges = token_ranges(tokens)  # a bad --tokens fails before anything is read; ranges bind to the dumps' tokens
    check_output_dir(out)
    if ray is None:
        return _compare_ranks(
            golden, test, out, mapping, ranges, workers, thresholds, quiet, follow_symlinks, None, show_stale
        )
    from workbench.compare.ray_exec import RayCluster

    cluster = RayCluster.connect(ray, workers)
    try:
        return _compare_ranks(
            golden, test, out, mapping, ranges, workers, thresholds, quiet, follow_symlinks, cluster, show_stale
        )
    finally:
        cluster.shutdown()


def _compare_ranks(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    ranges: Any,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool,
    follow_symlinks: bool,
    cluster: Any,
    show_stale: bool,
) -> Any:
    from workbench.formats.detect import find_ranks, pair_ranks

    refused: list[str] = []
    g_ranks, t_ranks = find_ranks(golden, refused), find_ranks(test, refused)
    for line in refused:
        say(f"problem: {line}")
    if not (g_ranks or t_ranks):
        return _compare_one(
            golden,
            test,
            out,
            mapping,
            ranges,
            workers,
            thresholds,
            quiet,
            follow_symlinks=follow_symlinks,
            cluster=cluster,
            show_stale=show_stale,
        )
    shared: list[Any] = []  # a single-rank dump partnering every rank of the other side
    if g_ranks and t_ranks:
        pairs = pair_ranks(g_ranks, t_ranks)
        by_id = all(g.rank is not None and g.rank == t.rank for g, t in pairs)
        how = "device/rank id" if by_id else "order"
    else:  # one side single-rank (a golden run on one device): compared with every rank of the other
        by_id = True
        single = _whole(golden if t_ranks else test, follow_symlinks)
        shared.append(single)
        pairs = [(single, r) for r in t_ranks] if t_ranks else [(r, single) for r in g_ranks]
        how = "the single-rank " + ("golden" if t_ranks else "test") + " with each rank"
    say(f"ranks: golden {len(g_ranks) or 1}, test {len(t_ranks) or 1}; paired {len(pairs)} by {how}")
    ranked = [
        (next((x.rank for x in (g, t) if x.rank is not None), i) if by_id else i, g, t)
        for i, (g, t) in enumerate(pairs)
    ]

    def one_rank(rank: int, g: Any, t: Any, emit: Callable[[str], None], cancel: threading.Event | None) -> Any:
        emit(f"== rank {rank}: golden {g.label}, test {t.label}")
        return _compare_one(
            g.path,
            t.path,
            out,
            mapping,
            ranges,
            workers,
            thresholds,
            quiet or cancel is not None,  # ranks at once: no progress lines interleaved
            rank=rank,
            rank_sides=(g.rank is not None or bool(g_ranks), t.rank is not None or bool(t_ranks)),
            dumps=(g.open, t.open),
            follow_symlinks=follow_symlinks,
            cluster=cluster,
            show_stale=show_stale,
            emit=emit,
            cancel=cancel,
        )

    if cluster is None or len(ranked) == 1:
        results = [one_rank(rank, g, t, say, None) for rank, g, t in ranked]
    else:
        results = _ranks_at_once(ranked, one_rank, out, shared)
    runs = [(rank, r.golden_run, r.test_run) for (rank, _, _), r in zip(ranked, results)]
    res = results[-1]
    failing: dict[int, list[str]] = {}
    for side, ranks in (("golden", [g for g, _ in pairs]), ("test", [t for _, t in pairs])):
        if len({r.label for r in ranks}) > 1:
            checked = _allreduce_check(side, ranks, [(r, g if side == "golden" else t) for r, g, t in runs], out)
            for x in checked:
                if x.passed is False:
                    failing.setdefault(runs[x.rank_index][0], []).append(f"{side} {x.node} (token {x.token})")
    say("per rank:")
    for (rank, _, _), r in zip(runs, results):
        say("  " + rank_line(rank, r, failing.get(rank, [])))
    return res


def _ranks_at_once(
    ranked: list[tuple[int, Any, Any]], one_rank: Callable[..., Any], out: Path, shared: list[Any]
) -> list[Any]:
    """Every rank's compare at once, one driver thread each: on a cluster the driver only reads, ingests and waits,
    so with each rank's files on its own nodes, every node computes at the same time. A dump every rank shares (a
    single-rank golden) is ingested once first. Each rank's lines print together, in rank order, as soon as it and
    the ranks before it are done. Ctrl-C cancels every rank (what was committed is kept)."""
    from concurrent.futures import ThreadPoolExecutor

    from workbench.catalog.store import ingest_dump, open_catalog

    catalog = out / CATALOG_NAME

    def prepare() -> None:  # the schema once, not from every thread; the shared dump ingested once
        con = open_catalog(catalog)
        try:
            for dump in shared:
                ingest_dump(con, dump.open())
        finally:
            con.close()

    catalog_guard(catalog, prepare)
    cancel = threading.Event()
    lines: list[list[str]] = [[] for _ in ranked]
    with ThreadPoolExecutor(max_workers=len(ranked), thread_name_prefix="wb-rank") as pool:
        futures = [pool.submit(one_rank, r, g, t, lines[i].append, cancel) for i, (r, g, t) in enumerate(ranked)]
        results = []
        try:
            for i, f in enumerate(futures):
                results.append(f.result())
                for line in lines[i]:
                    say(line)
        except BaseException:
            cancel.set()  # the other ranks stop at their next batch; what they committed stays
            for f in futures:
                with contextlib.suppress(BaseException):
                    f.result()
            raise
    return results


def rank_line(rank: int, res: Any, allreduce_failing: list[str]) -> str:
    """One rank's figures: pairs, failures, where the first error is born, failing all-reduce ops."""
    line = f"rank {rank}: {res.pairs} pairs, {res.failed} failed, {res.uncomparable} not comparable"
    born = [(tok, name) for tok, name in sorted(res.born.items()) if name]
    if born:
        tok, name = born[0]
        test_name = res.born_test.get(tok)
        line += f"; error born at {name} (token {tok})" + (f" [test op: {test_name}]" if test_name else "")
    else:
        origin = next(((tok, o) for tok, o in sorted(res.origins.items()) if o.stands_out), None)
        if origin is not None:
            tok, o = origin
            line += f"; most likely origin {o.golden_node} (token {tok})"
            line += f" [test op: {o.test_node}]" if o.test_node and o.test_node != o.golden_node else ""
        else:
            line += "; no error born"
    if allreduce_failing:
        line += f"; all-reduce failing: {len(allreduce_failing)} ({allreduce_failing[0]}"
        line += ", ...)" if len(allreduce_failing) > 1 else ")"
    return line


def _whole(path: Path, follow_symlinks: bool) -> Any:
    """A single-rank dump standing as the partner of every rank of the other side (read once per rank, as
    each comparison is its own run)."""
    import functools

    from workbench.formats.detect import RankDump, open_dump

    return RankDump(None, path.name, path, functools.partial(open_dump, path, follow_symlinks=follow_symlinks))


def _allreduce_check(side: str, ranks: list[Any], run_ids: list[tuple[int, int]], out: Path) -> list[Any]:
    """All-reduce check of one side's ranks: stored in `allreduce_checks`, failures printed; the results."""
    from workbench.analysis.allreduce import check_allreduce, describe
    from workbench.catalog.store import insert_rows, open_catalog

    results = check_allreduce([r.open() for r in ranks])
    if not results:
        return []
    labels = [f"rank {rk}" for rk, _ in run_ids]
    catalog = out / CATALOG_NAME
    con = catalog_guard(catalog, lambda: open_catalog(catalog))
    try:
        insert_rows(
            con,
            "allreduce_checks",
            [
                (
                    run_ids[x.rank_index][1],
                    x.token,
                    x.node,
                    x.rel_error,
                    x.passed,
                    None if x.culprit is None else run_ids[x.culprit][0],
                    x.factor,
                    x.reason,
                )
                for x in results
            ],
            replace=True,
        )
    finally:
        con.close()
    bad = [x for x in results if x.passed is False]
    ops = {(x.token, x.node) for x in results}
    say(
        f"all-reduce check ({side}): {len(ops)} op calls x {len(ranks)} ranks, "
        f"{len({(x.token, x.node) for x in bad})} failing"
    )
    for x in bad[:20]:
        say(f"  all-reduce mismatch: {describe(x, labels)}")
    return results


def _compare_one(
    golden: Path,
    test: Path,
    out: Path,
    mapping: Path | None,
    ranges: Any,
    workers: int | None,
    thresholds: Path | None,
    quiet: bool = False,
    *,
    rank: int | None = None,
    rank_sides: tuple[bool, bool] = (True, True),
    dumps: tuple[Any, Any] | None = None,
    follow_symlinks: bool = False,
    cluster: Any = None,
    show_stale: bool = False,
    emit: Callable[[str], None] = say,
    cancel: threading.Event | None = None,
) -> Any:
    """One golden/test pair of dumps (or of ranks: `dumps` reads them, `rank` goes into `runs.rank`); the summary
    goes to `emit`."""
    from workbench.jobs.compare import run_compare  # light: the pool starts before pandas and DuckDB load

    catalog = out / CATALOG_NAME
    res = catalog_guard(
        catalog,
        lambda: run_compare(
            dumps[0]() if dumps else golden,
            dumps[1]() if dumps else test,
            catalog,
            mapping=mapping,
            tokens=ranges,
            workers=workers,
            thresholds=thresholds,
            progress=None if quiet else ProgressPrinter(),
            freeze_gc=True,
            follow_symlinks=follow_symlinks,
            cluster=cluster,
            cancel=cancel,
        ),
    )
    from workbench.analysis.token_inputs import token_lines
    from workbench.catalog.store import open_catalog
    from workbench.compare.report import format_summary, write_msit_csv

    con = catalog_guard(catalog, lambda: open_catalog(catalog))
    try:
        if rank is not None:  # a single-rank side partnering every rank keeps rank NULL
            sides = [run for run, is_rank in zip((res.golden_run, res.test_run), rank_sides) if is_rank]
            for run_id in sides:
                con.execute("UPDATE runs SET rank = ? WHERE run_id = ?", [rank, run_id])
        tok = None if ranges is None else ranges.among(_run_tokens(con, res.golden_run))
        suffix = "" if rank is None else f"_rank{rank}"
        csv_path = catalog_guard(catalog, lambda: write_msit_csv(con, res.cmp_id, out, tok, suffix))
        first_divergent, inputs_differ = token_lines(con, res.cmp_id)
        labels = {}
        for run_id in (res.golden_run, res.test_run):
            row = first_row(con.execute("SELECT kind, path FROM runs WHERE run_id = ?", [run_id]))
            labels[run_id] = f"{row[1]} ({row[0]})" if row else str(run_id)
    finally:
        con.close()
    for line in format_summary(
        res, labels[res.golden_run], labels[res.test_run], csv_path, first_divergent, inputs_differ, show_stale
    ):
        emit(line)
    return res


def _run_tokens(con: Any, run_id: int) -> list[int]:
    return [
        int(r[0]) for r in con.execute("SELECT DISTINCT token_id FROM tensors WHERE run_id = ?", [run_id]).fetchall()
    ]


def check_output_dir(out: Path) -> None:
    """Fail now, before any dump is read, when `out` cannot hold the catalog and the report."""
    try:
        if out.exists() and not out.is_dir():
            raise ValueError(f"{out}: -o must be a folder, and this is an existing file")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"{out}: cannot create the output folder ({exc.strerror or exc})") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".wb-write-check-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ValueError(f"{out}: cannot write in the output folder ({exc.strerror or exc})") from None
    catalog = out / CATALOG_NAME
    if catalog.exists() and (catalog.is_dir() or not os.access(catalog, os.R_OK | os.W_OK)):
        raise ValueError(f"{catalog}: exists but cannot be written")


def catalog_guard(catalog: Path, fn: Callable[[], T]) -> T:
    """Run `fn`; a DuckDB or storage error becomes a one-line `CatalogError` naming the catalog and saying
    what is kept (a failed write never loses what was committed before)."""
    import duckdb

    from workbench.catalog import CatalogError, storage_message

    try:
        return fn()
    except duckdb.InterruptException:
        raise  # a signal, not a storage fault: `guarded` says interrupted or terminated
    except duckdb.Error as exc:
        interrupt = signal_inside(exc)
        if interrupt is not None:  # a signal, not a storage fault, even when DuckDB wrapped it
            raise interrupt from None
        raise CatalogError(
            f"{catalog}: {storage_message(exc)}; nothing committed was lost (earlier runs and comparisons are kept)"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        raise CatalogError(
            f"{exc.filename or catalog}: {storage_message(exc)}; nothing committed was lost "
            "(earlier runs and comparisons are kept)"
        ) from None


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
    follow_symlinks: Annotated[
        bool,
        typer.Option("--follow-symlinks", help="Read files whose symbolic links lead outside the dump (off: refused)."),
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS|auto|local",
            help="Compute the pairs on a Ray cluster, on the nodes holding the files (`local` starts one here; "
            "needs pip install 'workbench[ray]').",
        ),
    ] = None,
    show_stale: Annotated[
        bool, typer.Option("--show-stale", help="List every mapping pair that no longer fits the dumps, and why.")
    ] = False,
) -> None:
    """Compare two dumps op by op: OUT/catalog.duckdb, an msit-compatible CSV, and where the error is born."""
    res = guarded(
        lambda: run_compare_cli(
            golden,
            test,
            out,
            mapping,
            tokens,
            workers,
            thresholds,
            follow_symlinks=follow_symlinks,
            show_stale=show_stale,
            ray=ray,
        )
    )
    if res.pairs == 0 or res.uncomparable >= res.pairs:
        raise fail("nothing could be compared (no matched tensor pairs with readable data)", 1)
