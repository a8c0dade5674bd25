"""Every compare `wb` runs: one `CompareRequest` in, one `CompareOutcome` out.

`wb compare`, `wb open` (the app's compare worker) and `wb demo` call `compare_dumps`. It checks the output
folder, connects a Ray cluster when asked (and owns it), pairs the ranks of multi-rank dumps and compares them
rank with rank into one catalog (`runs.rank`), checks the all-reduce ops of each side's ranks
(`allreduce_checks`), writes one msit CSV per rank and hands back, per rank, the result, the tokens resolved from
`--tokens`, the run labels and the report's path. The lines a terminal shows (the summary of each rank, the
ranks' pairing, the all-reduce check) go to `emit`; the CLI prints them, the app drops them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.catalog import first_row
from workbench.catalog.guard import catalog_guard
from workbench.core.progress import ProgressFn

if TYPE_CHECKING:
    import duckdb

    from workbench.analysis.checks.allreduce import AllReduceResult
    from workbench.analysis.reporting.summary import CompareResult
    from workbench.compare.execution.executor import Cluster
    from workbench.compare.execution.pool import PoolStarter
    from workbench.core.tokens import TokenRanges
    from workbench.formats.detect import RankDump
    from workbench.formats.model import Dump

Emit = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class CompareRequest:
    """What to compare and how: the two dumps (single- or multi-rank), the catalog, and the options of
    `wb compare`. `report_dir` gets the msit CSV of each rank (None: no CSV, as in the app)."""

    golden: Path
    test: Path
    catalog: Path
    report_dir: Path | None = None
    mapping: Path | None = None
    tokens: TokenRanges | None = None  # parsed `--tokens`, bound to each dump's tokens when read
    workers: int | None = None
    thresholds: Path | None = None
    follow_symlinks: bool = False
    ray: str | None = None  # an address, `auto` or `local`: the pairs computed on a Ray cluster
    show_stale: bool = False


@dataclass(frozen=True, slots=True)
class RankOutcome:
    """One golden/test pair of dumps compared: `rank` is None for single-rank dumps."""

    rank: int | None
    result: CompareResult
    golden_label: str
    test_label: str
    tokens: frozenset[int] | None  # the `--tokens` resolved among the golden run's tokens (None: all)
    report: Path | None
    allreduce_failing: tuple[str, ...] = ()
    stats_report: Path | None = None  # the statistics CSV (msit's statistics comparison columns), when written


@dataclass(frozen=True, slots=True)
class CompareOutcome:
    """Every rank's outcome, in rank order (one for single-rank dumps)."""

    ranks: tuple[RankOutcome, ...]
    allreduce: tuple[AllReduceResult, ...] = field(default=())

    @property
    def result(self) -> CompareResult:
        """The last rank's result (the one the app opens)."""
        return self.ranks[-1].result


def compare_dumps(
    request: CompareRequest,
    *,
    progress: ProgressFn | None = None,
    emit: Emit | None = None,
    cancel: threading.Event | None = None,
) -> CompareOutcome:
    """Compare `request`'s dumps (see the module docstring); raises `CompareCancelled` when `cancel` is set,
    keeping what was committed."""
    say: Emit = emit or (lambda _line: None)
    if request.ray is not None:
        from workbench.compare.execution.ray_exec import import_ray

        import_ray()  # before anything is read or written: `ray is not installed: ...`
    if request.report_dir is not None:
        check_output_dir(request.report_dir, request.catalog)
    _numpy_one_blas_thread()  # before the pool: workers forked from this process have it loaded
    pool = _start_pool(request) if request.ray is None else None
    if request.ray is None:
        try:
            return _compare_ranks(request, None, progress, say, cancel, pool)
        finally:
            if pool is not None:
                pool.shutdown()
    from workbench.compare.execution.ray_exec import RayCluster

    cluster = RayCluster.connect(request.ray, request.workers)
    try:
        return _compare_ranks(request, cluster, progress, say, cancel)
    finally:
        cluster.shutdown()


def _start_pool(req: CompareRequest) -> PoolStarter | None:
    """The pool, started before anything else when the dumps are worth one (`worth_a_pool`): its forkserver loads
    numpy and the kernels (~0.1 s) while this process reads the golden dump, so a worker can read the test dump.
    Every rank is compared on it."""
    from workbench.compare.execution.pool import PoolStarter, default_workers, worth_a_pool

    workers = req.workers or default_workers()
    return PoolStarter(workers) if worth_a_pool(req.golden, req.test, workers) else None


def _numpy_one_blas_thread() -> None:
    """Load numpy (when no one has yet) with its OpenBLAS on one thread. OpenBLAS starts a thread per core as it
    loads, and on a busy machine they cost ~0.08 s of CPU at start; this process never uses them (the metric
    kernels call no BLAS). Only the load sees the setting: nothing started later (torch, the pool, which sets its
    own in `forkserver_preload`) inherits it, and a user's own `OPENBLAS_NUM_THREADS` is kept."""
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    finally:
        os.environ.pop("OPENBLAS_NUM_THREADS", None)


@dataclass(frozen=True, slots=True)
class _RankPair:
    """One rank's two dumps: `open` reads each side; `sides` says which side is really a rank (a single-rank
    side partnering every rank keeps `runs.rank` NULL)."""

    rank: int | None
    golden: Path
    test: Path
    open: tuple[Callable[[], Dump], Callable[[], Dump]] | None = None
    sides: tuple[bool, bool] = (True, True)


def _compare_ranks(
    req: CompareRequest,
    cluster: Cluster | None,
    progress: ProgressFn | None,
    say: Emit,
    cancel: threading.Event | None,
    pool: PoolStarter | None = None,
) -> CompareOutcome:
    from workbench.formats.detect import find_ranks, pair_ranks

    refused: list[str] = []
    g_ranks, t_ranks = find_ranks(req.golden, refused), find_ranks(req.test, refused)
    for line in refused:
        say(f"problem: {line}")
    if not (g_ranks or t_ranks):
        one = _compare_one(req, _RankPair(None, req.golden, req.test), cluster, progress, say, cancel, pool)
        return CompareOutcome((one,))
    shared: list[RankDump] = []  # a single-rank dump partnering every rank of the other side
    if g_ranks and t_ranks:
        pairs = pair_ranks(g_ranks, t_ranks)
        by_id = all(g.rank is not None and g.rank == t.rank for g, t in pairs)
        how = "device/rank id" if by_id else "order"
    else:  # one side single-rank (a golden run on one device): compared with every rank of the other
        by_id = True
        single = _whole(req.golden if t_ranks else req.test, req.follow_symlinks)
        shared.append(single)
        pairs = [(single, r) for r in t_ranks] if t_ranks else [(r, single) for r in g_ranks]
        how = "the single-rank " + ("golden" if t_ranks else "test") + " with each rank"
    say(f"ranks: golden {len(g_ranks) or 1}, test {len(t_ranks) or 1}; paired {len(pairs)} by {how}")
    ranked = [
        (next((x.rank for x in (g, t) if x.rank is not None), i) if by_id else i, g, t)
        for i, (g, t) in enumerate(pairs)
    ]

    def one_rank(rank: int, g: RankDump, t: RankDump, emit: Emit, stop: threading.Event | None) -> RankOutcome:
        emit(f"== rank {rank}: golden {g.label}, test {t.label}")
        pair = _RankPair(
            rank,
            g.path,
            t.path,
            (g.open, t.open),
            (g.rank is not None or bool(g_ranks), t.rank is not None or bool(t_ranks)),
        )
        # ranks at once: no progress lines interleaved
        return _compare_one(req, pair, cluster, None if stop is not None else progress, emit, stop or cancel, pool)

    if cluster is None or len(ranked) == 1:
        outcomes = [one_rank(rank, g, t, say, None) for rank, g, t in ranked]
    else:
        outcomes = _ranks_at_once(ranked, one_rank, req.catalog, shared, say)
    runs = [(rank, o.result.golden_run, o.result.test_run) for (rank, _, _), o in zip(ranked, outcomes)]
    failing: dict[int, list[str]] = {}
    checks: list[AllReduceResult] = []
    for side, ranks in (("golden", [g for g, _ in pairs]), ("test", [t for _, t in pairs])):
        if len({r.label for r in ranks}) > 1:
            checked = _allreduce_check(
                side, ranks, [(r, g if side == "golden" else t) for r, g, t in runs], req.catalog, say
            )
            checks += checked
            for x in checked:
                if x.passed is False:
                    failing.setdefault(runs[x.rank_index][0], []).append(f"{side} {x.node} (token {x.token})")
    final = tuple(
        RankOutcome(
            o.rank,
            o.result,
            o.golden_label,
            o.test_label,
            o.tokens,
            o.report,
            tuple(failing.get(r, [])),
            o.stats_report,
        )
        for (r, _, _), o in zip(runs, outcomes)
    )
    say("per rank:")
    for o in final:
        say("  " + rank_line(o))
    return CompareOutcome(final, tuple(checks))


def _ranks_at_once(
    ranked: list[tuple[int, RankDump, RankDump]],
    one_rank: Callable[[int, RankDump, RankDump, Emit, threading.Event], RankOutcome],
    catalog: Path,
    shared: list[RankDump],
    say: Emit,
) -> list[RankOutcome]:
    """Every rank's compare at once, one driver thread each: on a cluster the driver only reads, ingests and waits,
    so with each rank's files on its own nodes, every node computes at the same time. A dump every rank shares (a
    single-rank golden) is ingested once first. Each rank's lines go out together, in rank order, as soon as it and
    the ranks before it are done. Ctrl-C cancels every rank (what was committed is kept)."""
    from concurrent.futures import ThreadPoolExecutor

    from workbench.catalog.store import ingest_dump, open_catalog

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


def rank_line(outcome: RankOutcome) -> str:
    """One rank's figures: pairs, failures, where the first error is born, failing all-reduce ops."""
    res = outcome.result
    line = f"rank {outcome.rank}: {res.pairs} pairs, {res.failed} failed, {res.uncomparable} not comparable"
    if res.not_judged:
        line += f", {res.not_judged} not judged"
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
    failing = outcome.allreduce_failing
    if failing:
        line += f"; all-reduce failing: {len(failing)} ({failing[0]}"
        line += ", ...)" if len(failing) > 1 else ")"
    return line


def _whole(path: Path, follow_symlinks: bool) -> RankDump:
    """A single-rank dump standing as the partner of every rank of the other side (read once per rank, as
    each comparison is its own run)."""
    from workbench.formats.detect import RankDump, open_dump

    return RankDump(None, path.name, path, functools.partial(open_dump, path, follow_symlinks=follow_symlinks))


def _allreduce_check(
    side: str, ranks: list[RankDump], run_ids: list[tuple[int, int]], catalog: Path, say: Emit
) -> list[AllReduceResult]:
    """All-reduce check of one side's ranks: stored in `allreduce_checks`, failures said; the results."""
    from workbench.analysis.checks.allreduce import check_allreduce, describe
    from workbench.catalog.store import insert_rows, open_catalog

    results = check_allreduce([r.open() for r in ranks])
    if not results:
        return []
    labels = [f"rank {rk}" for rk, _ in run_ids]
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
    req: CompareRequest,
    pair: _RankPair,
    cluster: Cluster | None,
    progress: ProgressFn | None,
    say: Emit,
    cancel: threading.Event | None,
    pool: PoolStarter | None = None,
) -> RankOutcome:
    """One golden/test pair of dumps (or of ranks: `pair.open` reads them, `pair.rank` goes into `runs.rank`);
    its summary goes to `say`. `pool`: the compare's (else `run_compare` starts one where worth it)."""
    from workbench.jobs.compare import run_compare  # light: the pool starts before DuckDB loads

    catalog = req.catalog
    done = _Written()
    res = catalog_guard(
        catalog,
        lambda: run_compare(
            pair.open[0]() if pair.open else pair.golden,
            pair.open[1]() if pair.open else pair.test,
            catalog,
            mapping=req.mapping,
            tokens=req.tokens,
            workers=req.workers,
            thresholds=req.thresholds,
            progress=progress,
            freeze_gc=True,
            follow_symlinks=req.follow_symlinks,
            cluster=cluster,
            cancel=cancel,
            pool=pool,
            then=functools.partial(_write_reports, req, pair, done),  # on run_compare's open of the catalog
            beside_verdicts=functools.partial(_write_csvs, req, pair, done),
        ),
    )
    from workbench.analysis.reporting.report import format_summary

    golden_label, test_label = done.labels[res.golden_run], done.labels[res.test_run]
    for line in format_summary(
        res, golden_label, test_label, done.csv, done.first_divergent, done.inputs_differ, req.show_stale
    ):
        say(line)
    if done.stats is not None:
        say(f"statistics report (msit's statistics comparison columns): {done.stats}")
    return RankOutcome(
        pair.rank,
        res,
        golden_label,
        test_label,
        None if done.tokens is None else frozenset(done.tokens),
        done.csv,
        stats_report=done.stats,
    )


@dataclass(slots=True)
class _Written:
    """What `_write_csvs` and `_write_reports` read and wrote on the catalog, for `_compare_one`'s summary."""

    tokens: set[int] | None = None
    csv: Path | None = None
    stats: Path | None = None
    first_divergent: str = ""
    inputs_differ: dict[int, str] = field(default_factory=dict)
    labels: dict[int, str] = field(default_factory=dict)


def _write_csvs(
    req: CompareRequest, pair: _RankPair, out: _Written, cur: duckdb.DuckDBPyConnection, cmp_id: int, golden_run: int
) -> None:
    """On a cursor of the catalog, while the compare computes its verdicts: the `--tokens` among the golden run's
    tokens and the msit CSVs (into `out`)."""
    from workbench.analysis.reporting.report import write_msit_csv, write_msit_stats_csv

    tok = None if req.tokens is None else req.tokens.among(_run_tokens(cur, golden_run))
    out.tokens = tok
    suffix = "" if pair.rank is None else f"_rank{pair.rank}"
    if req.report_dir is not None:
        out.csv = write_msit_csv(cur, cmp_id, req.report_dir, tok, suffix)
        out.stats = write_msit_stats_csv(cur, cmp_id, req.report_dir, tok, suffix)


def _write_reports(
    req: CompareRequest, pair: _RankPair, out: _Written, con: duckdb.DuckDBPyConnection, res: CompareResult
) -> None:
    """On the compare's own connection, after `_write_csvs`: the rank of each side, the token lines and the run
    labels (into `out`)."""
    from workbench.analysis.verdicts.token_inputs import token_lines

    if pair.rank is not None:  # a single-rank side partnering every rank keeps rank NULL
        sides = [run for run, is_rank in zip((res.golden_run, res.test_run), pair.sides) if is_rank]
        for run_id in sides:
            con.execute("UPDATE runs SET rank = ? WHERE run_id = ?", [pair.rank, run_id])
    out.first_divergent, out.inputs_differ = token_lines(con, res.cmp_id)
    for run_id in (res.golden_run, res.test_run):
        row = first_row(con.execute("SELECT kind, path FROM runs WHERE run_id = ?", [run_id]))
        out.labels[run_id] = f"{row[1]} ({row[0]})" if row else str(run_id)


def _run_tokens(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    return [
        int(r[0]) for r in con.execute("SELECT DISTINCT token_id FROM tensors WHERE run_id = ?", [run_id]).fetchall()
    ]


def check_output_dir(out: Path, catalog: Path) -> None:
    """Fail now, before any dump is read, when `out` cannot hold the report or `catalog` cannot be written."""
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
    if catalog.exists() and (catalog.is_dir() or not os.access(catalog, os.R_OK | os.W_OK)):
        raise ValueError(f"{catalog}: exists but cannot be written")
