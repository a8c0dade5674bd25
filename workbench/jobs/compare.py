"""The compare job: read two dumps, ingest them, match, compute metrics, refresh the verdicts, summarise.

The engine of one golden/test pair of dumps: `jobs/compare_dumps.py` (every compare: `wb compare`, `wb demo`,
the app's worker) calls `run_compare` for each rank; the app's mapping editor calls `add_node_pairs`.
Incremental: pairs whose metrics are already in the catalog are not computed again; an interrupted run keeps
every batch it committed.

Light to import (no DuckDB or torch; a compare never loads pandas): the worker pool is started first, in the
background, and the pairs that are obvious (same place in two dumps of one kind) go to it as soon as both dumps
are read, while this process imports the heavy modules and builds the catalog.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import CancelledError, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workbench.compare.execution.pool import PoolStarter, default_workers, worth_a_pool
from workbench.core.progress import CompareCancelled, Progress, ProgressFn
from workbench.core.tokens import TokenRanges, token_text

if TYPE_CHECKING:
    import duckdb

    from workbench.analysis.reporting.summary import CompareResult
    from workbench.compare.execution.early import EarlyPairs
    from workbench.compare.execution.executor import Cluster
    from workbench.compare.judging.thresholds import Thresholds
    from workbench.compare.pairing.frames import RunFrames
    from workbench.compare.pairing.mapping import MappingFile, PairSpec
    from workbench.compare.pairing.matching import AutoMatcher
    from workbench.formats.model import Dump

__all__ = ["BesideVerdicts", "CompareCancelled", "Progress", "ProgressFn", "add_node_pairs", "run_compare"]

# work on the metrics alone, run beside the verdicts: (a cursor of the catalog, cmp_id, golden run id)
BesideVerdicts = Callable[["duckdb.DuckDBPyConnection", int, int], None]


def run_compare(
    golden: str | Path | Dump,
    test: str | Path | Dump,
    catalog: str | Path,
    *,
    mapping: str | Path | MappingFile | None = None,
    tokens: Collection[int] | TokenRanges | None = None,
    workers: int | None = None,
    thresholds: str | Path | Thresholds | None = None,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    auto: bool = True,
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
    freeze_gc: bool = False,
    follow_symlinks: bool = False,
    cluster: Cluster | None = None,
    then: Callable[[duckdb.DuckDBPyConnection, CompareResult], None] | None = None,
    beside_verdicts: BesideVerdicts | None = None,
) -> CompareResult:
    """Read (unless given read), ingest, match and compare two dumps into `catalog`; see the module docstring.

    `pool` (from `workbench.compare.execution.pool.new_pool` or a `PoolStarter`) is used and left running; without
    one, a pool is started here when `worth_a_pool` says so (the one rule) and shut down at the end: the
    executor never starts one. With a pool,
    same-kind dumps get their same-place pairs computed while the catalog is prepared (`early`, made here
    if not given). `freeze_gc` (for a short-lived process such as the CLI) moves every object imported so
    far out of the garbage collector's sight once the heavy modules are in, and runs no collection before
    that: ~0.1 s less of GC per run.
    `tokens` may be `TokenRanges` (`--tokens`), bound to the tokens the dumps hold once they are read.
    `follow_symlinks` reads files whose links leave a dump (refused by default).
    `cluster` (`workbench.compare.execution.ray_exec.RayCluster`, connected by the caller) computes the pairs instead of
    the local pool, on the nodes that hold the files (docs/scaling.md).
    `then` is called with the catalog's connection and the result before the connection closes: the caller's
    own reads and writes (the report) share this one open of the catalog (each open checks it, ~50 ms).
    `beside_verdicts(cursor, cmp_id, golden_run)` runs on a thread of its own, on a cursor of the catalog, once every
    pair's metrics are stored, while this thread computes the verdicts (DuckDB lets go of the GIL while it runs a
    query): the caller's reads of the metrics alone (the CSV reports) then take no time after the verdicts. It has
    ended before `then` is called; what it raises, `run_compare` raises.
    Raises `CompareCancelled` when `cancel` is set; what was committed is kept.
    """
    n_workers = workers or default_workers()
    own: PoolStarter | None = None
    if cluster is None and pool is None and worth_a_pool(_root(golden), _root(test), n_workers):
        own = pool = PoolStarter(n_workers)  # first: its workers boot while everything else happens
    try:
        from workbench.compare.judging.thresholds import Thresholds
        from workbench.compare.pairing.mapping import MappingFile

        th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.load(thresholds)
        mf = mapping if isinstance(mapping, MappingFile) or mapping is None else MappingFile.load(mapping)
        settings = _Settings(
            Path(catalog),
            mf,
            th,
            n_workers,
            progress,
            cancel,
            auto,
            pool,
            follow_symlinks,
            cluster,
            then,
            beside_verdicts,
        )
        with _CollectorPause(freeze_gc) as collector:
            return _read_ingest_compare(golden, test, tokens, settings, early, collector)
    finally:
        if own is not None:
            own.shutdown()


def _root(dump: str | Path | Dump) -> Path:
    return Path(dump) if isinstance(dump, str | Path) else dump.root


@dataclass(frozen=True, slots=True)
class _Settings:
    """What `run_compare` was asked, resolved (mapping and thresholds loaded, the worker count known): handed
    down whole instead of a dozen parameters."""

    catalog: Path
    mapping: MappingFile | None
    thresholds: Thresholds
    workers: int
    progress: ProgressFn | None
    cancel: threading.Event | None
    auto: bool
    pool: ProcessPoolExecutor | PoolStarter | None
    follow_symlinks: bool
    cluster: Cluster | None
    then: Callable[[duckdb.DuckDBPyConnection, CompareResult], None] | None
    beside_verdicts: BesideVerdicts | None


class _CollectorPause:
    """With `freeze_gc`, no collection runs before the freeze: what the reads and the heavy imports make lives on,
    and the ~200 collections that scanned it were ~0.04 s of a CLI compare's CPU. `freeze` moves every object made
    so far out of the collector's sight and lets it run again; leaving the block lets it run in any case."""

    def __init__(self, freeze_gc: bool) -> None:
        self.freeze_gc = freeze_gc
        self.paused = False

    def __enter__(self) -> _CollectorPause:
        self.paused = self.freeze_gc and gc.isenabled()
        if self.paused:
            gc.disable()
        return self

    def freeze(self) -> None:
        if self.freeze_gc:
            gc.freeze()
        self._resume()

    def __exit__(self, *exc: object) -> None:
        self._resume()

    def _resume(self) -> None:
        if self.paused:
            gc.enable()
            self.paused = False


def _read_ingest_compare(
    golden: str | Path | Dump,
    test: str | Path | Dump,
    tokens: Collection[int] | TokenRanges | None,
    job: _Settings,
    early: EarlyPairs | None,
    collector: _CollectorPause,
) -> CompareResult:
    """Read, ingest, match and compare (`run_compare`'s work); the collector, when paused, resumes at the freeze."""
    from workbench.formats import open_dump

    if job.progress:
        job.progress(Progress("read dumps", 0, 2))
    # a worker reads the test dump while this process reads the golden one; when no worker has started on it by
    # then (the pool's forkserver loads numpy and the kernels' machine code, ~0.12 s), this process reads it too
    remote = _read_in_worker(test, job.pool, job.follow_symlinks) if isinstance(test, str | Path) else None
    g_dump = open_dump(golden, follow_symlinks=job.follow_symlinks) if isinstance(golden, str | Path) else golden
    g_print = _fingerprint_in_worker(g_dump.root, job.pool)
    if job.progress:
        job.progress(Progress("read dumps", 1, 2))
    if remote is not None and remote.cancel():  # no worker has started reading it yet: faster read here
        remote = None
    if remote is not None and not remote.done():
        _import_heavy_beside()  # while the worker finishes reading; this thread takes its dump as soon as it is read
    t_dump = _test_dump(remote, test, job.follow_symlinks) if isinstance(test, str | Path) else test
    t_print = _fingerprint_in_worker(t_dump.root, job.pool)
    if job.progress:
        job.progress(Progress("read dumps", 2, 2))
    if isinstance(tokens, TokenRanges):
        asked = tokens.text
        tokens = tokens.among(g_dump.tokens, t_dump.tokens)
        check_tokens(tokens, g_dump.tokens, t_dump.tokens, asked)
    elif tokens is not None:
        check_tokens(set(tokens), g_dump.tokens, t_dump.tokens)
    if early is None and job.pool is not None and g_dump.kind == t_dump.kind:
        from workbench.compare.execution.early import EarlyPairs

        early = EarlyPairs(g_dump, t_dump, job.pool, tokens)
    try:
        from workbench.catalog.store import ingest_dump

        opening = _CatalogOpening(job.catalog)
        try:
            _import_heavy()  # while the catalog opens and the workers compute the early pairs (or done above)
            from workbench.compare.pair_store import frames_of_dump
        except BaseException:
            opening.close()
            raise
        con = opening.result()
        collector.freeze()
        try:
            if job.progress:
                job.progress(Progress("ingest", 0, 2))
            # each dump is dropped once the catalog holds it: one Python object per file is memory the next
            # ingest and the compare need
            g_ing = ingest_dump(con, g_dump, _worker_fingerprint(g_print))
            frames = [None if g_ing.skipped else frames_of_dump(g_dump, g_ing.run_id)]
            del g_dump
            t_ing = ingest_dump(con, t_dump, _worker_fingerprint(t_print))
            frames.append(None if t_ing.skipped else frames_of_dump(t_dump, t_ing.run_id))
            del t_dump
            if job.progress:
                job.progress(Progress("ingest", 2, 2))
            if job.cancel is not None and job.cancel.is_set():
                raise CompareCancelled()
            problems = [*g_ing.problems, *t_ing.problems]
            res = _compare_runs(con, (g_ing.run_id, t_ing.run_id), frames, tokens, job, problems, early)
            if job.then is not None:
                job.then(con, res)
            return res
        finally:
            con.close()
    finally:
        if early is not None:
            early.cancel()  # whatever was not claimed


class _CatalogOpening:
    """The catalog opened (created, checked, its schema made: ~25-40 ms, mostly inside DuckDB, which lets go of the
    GIL) on a thread while this one imports the compare modules."""

    def __init__(self, catalog: Path) -> None:
        self._out: Future[duckdb.DuckDBPyConnection] = Future()
        self._thread = threading.Thread(target=self._open, args=(catalog,), name="wb-catalog-open", daemon=True)
        self._thread.start()

    def _open(self, catalog: Path) -> None:
        from workbench.catalog.store import open_catalog

        try:
            catalog.parent.mkdir(parents=True, exist_ok=True)
            self._out.set_result(open_catalog(catalog))
        except BaseException as exc:  # raised where the connection is asked for
            self._out.set_exception(exc)

    def result(self) -> duckdb.DuckDBPyConnection:
        self._thread.join()
        return self._out.result()

    def close(self) -> None:
        """The connection, if it opened, closed (the compare failed before it used it)."""
        self._thread.join()
        if self._out.exception() is None:
            self._out.result().close()


def _import_heavy() -> None:
    """DuckDB and the compare modules (~0.1 s): loaded while workers are busy."""
    from workbench.analysis.reporting import summary  # noqa: F401
    from workbench.catalog import store  # noqa: F401
    from workbench.compare import pair_store  # noqa: F401
    from workbench.compare.execution import executor  # noqa: F401


def _import_heavy_beside() -> None:
    """`_import_heavy` on a thread of its own. Importing holds the GIL but hands it over every few milliseconds, so
    the worker's test dump is taken, and the early pairs handed to the workers, as soon as it is read, not after the
    imports (~0.07 s); the imports go on meanwhile. One that fails raises again where the compare imports the
    modules itself (`_import_heavy` below, once the catalog opens)."""

    def run() -> None:
        with contextlib.suppress(Exception):
            _import_heavy()

    threading.Thread(target=run, name="wb-import-heavy", daemon=True).start()


def _import_verdicts() -> None:
    """The modules of the steps after the metrics: verdicts, advice, logits and the msit CSV."""
    from workbench.analysis.reporting import report  # noqa: F401
    from workbench.analysis.verdicts import advisor, logits, token_inputs  # noqa: F401


def _read_in_worker(
    test: str | Path, pool: ProcessPoolExecutor | PoolStarter | None, follow_symlinks: bool
) -> Future[Dump] | None:
    """The test dump read by a pool worker (None without a pool: it is read here)."""
    if pool is None:
        return None
    from workbench.compare.execution.worker import read_dump

    try:
        return pool.submit(read_dump, str(test), follow_symlinks)
    except RuntimeError:  # a pool already shut down
        return None


def _fingerprint_in_worker(root: Path, pool: ProcessPoolExecutor | PoolStarter | None) -> Future[str] | None:
    """The run fingerprint of the dump at `root` (every file stat-ed: 0.19 s at 13,000 files) computed by a pool
    worker while this process reads, imports and opens the catalog (None without a pool: `ingest_dump` computes it)."""
    if pool is None:
        return None
    from workbench.formats.fingerprint import run_fingerprint

    try:
        return pool.submit(run_fingerprint, str(root))
    except RuntimeError:  # a pool already shut down
        return None


def _worker_fingerprint(job: Future[str] | None) -> str | None:
    """What `_fingerprint_in_worker` computed, if a worker has by the time the ingest needs it; else None (and the
    ingest computes it): a fingerprint queued behind the kernels' first compile or an early batch of a large pair is
    never waited for."""
    if job is None:
        return None
    if not job.done():
        job.cancel()  # still queued: no worker takes it
        return None
    from concurrent.futures.process import BrokenProcessPool

    from workbench.compare.execution.pool import PoolUnavailable

    try:
        return job.result()
    except (PoolUnavailable, BrokenProcessPool, OSError, CancelledError):
        return None


def _test_dump(remote: Future[Dump] | None, test: str | Path, follow_symlinks: bool) -> Dump:
    """The worker's reading of the test dump, or this process's own when the pool could not take it."""
    from concurrent.futures.process import BrokenProcessPool

    from workbench.compare.execution.pool import PoolUnavailable
    from workbench.formats import open_dump

    if remote is not None:
        try:
            return remote.result()
        except (PoolUnavailable, BrokenProcessPool):
            pass
    return open_dump(test, follow_symlinks=follow_symlinks)


def _auto_matcher(auto: bool) -> AutoMatcher | None:
    if not auto:
        return None
    try:
        from workbench.compare.pairing.automap import auto_match
    except ImportError:
        return None
    return auto_match


def _compare_runs(
    con: duckdb.DuckDBPyConnection,
    runs: tuple[int, int],
    frames: list[RunFrames | None],
    tokens: Collection[int] | None,
    job: _Settings,
    problems: list[str],
    early: EarlyPairs | None,
) -> CompareResult:
    from workbench.analysis.reporting.call_drift import drift_lines, store_call_drift
    from workbench.analysis.reporting.summary import summarize_comparison
    from workbench.analysis.verdicts.born import refresh_verdicts
    from workbench.compare.execution.executor import compute_pending
    from workbench.compare.judging.judge import judged_by_older_rules, rejudge
    from workbench.compare.pair_store import comparison_for_runs, load_frames, store_node_matches, store_tensor_pairs
    from workbench.compare.pairing.matching import match_nodes, pair_tensors
    from workbench.compare.pairing.token_realign import call_drifts, realign_drifted

    mapping = job.mapping

    golden_run, test_run = runs
    # the frames of a run this compare ingested were made from its dump; a run already in the catalog is read
    golden = frames[0] or load_frames(con, golden_run)
    test = frames[1] or load_frames(con, test_run)
    cmp_id, th_changed = comparison_for_runs(con, golden_run, test_run, job.mapping, job.thresholds)
    if job.progress:
        job.progress(Progress("match", 0, 1))
    check = None
    if mapping is not None and (mapping.pairs or mapping.rules):
        from workbench.compare.pairing.fingerprint import check_mapping, store_check

        check = check_mapping(mapping, con, golden_run, test_run)  # stale pairs are reported, never used
        store_check(con, cmp_id, check, mapping.source)
    matches = match_nodes(
        golden, test, check.usable(mapping) if check and mapping else mapping, auto=_auto_matcher(job.auto)
    )
    store_node_matches(con, cmp_id, matches)
    drifts = call_drifts(golden, test, tokens)
    paired, realigned = realign_drifted(pair_tensors(matches, golden, test, tokens), golden, test, drifts)
    pairs = store_tensor_pairs(con, cmp_id, paired)
    if job.progress:
        job.progress(Progress("match", 1, 1, message=f"{len(pairs)} tensor pairs"))
    if th_changed or judged_by_older_rules(con, cmp_id):  # new thresholds, or verdicts an older wb decided
        rejudge(con, cmp_id, job.thresholds)
    drift = drift_lines(drifts, realigned)
    store_call_drift(con, cmp_id, drift)
    # the verdict and report modules load while this thread mostly waits on the workers (~0.03 s less after them)
    preload = threading.Thread(target=_import_verdicts, name="wb-import-verdicts", daemon=True)
    preload.start()
    computed, _failed_new, _unc = compute_pending(
        con,
        cmp_id,
        golden,
        test,
        pairs,
        job.thresholds,
        workers=job.workers,
        progress=job.progress,
        cancel=job.cancel,
        pool=job.pool,
        early=early,
        cluster=job.cluster,
        every_pair=True,
    )
    preload.join()
    beside = _Beside(con, job.beside_verdicts, cmp_id, golden_run)
    try:
        if job.progress:
            job.progress(Progress("verdict", 0, 1))
        refresh_verdicts(con, cmp_id)
        if job.progress:
            job.progress(Progress("verdict", 1, 1))
        beside.verdicts_done.set()  # checkpointed again while the summary reads
        res = summarize_comparison(
            con,
            job.catalog,
            cmp_id,
            golden,
            test,
            matches,
            pairs,
            tokens,
            computed=computed,
            problems=problems,
            call_drift=[line for line, _repaired in drift],
        )
    except BaseException:
        beside.verdicts_done.set()
        beside.join(raise_error=False)  # the verdicts' error is the one told
        raise
    beside.join()
    res.mapping_check = check
    return res


class _Beside:
    """Beside the verdicts, on a thread of its own and a cursor of `con`: `work(cursor, cmp_id, golden_run)` (see
    `run_compare`), then a checkpoint, and a second one once `verdicts_done` is set. What is committed by then (the
    dumps, the pairs, every metric; then the verdicts) is written to the catalog file while the verdicts and the
    summary are computed, and closing the catalog has little left to write (~15 ms less after them, for 836
    pairs)."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, work: BesideVerdicts | None, cmp_id: int, golden_run: int
    ) -> None:
        self._cursor = con.cursor()
        self._error: BaseException | None = None
        self.verdicts_done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(work, cmp_id, golden_run), name="wb-beside-verdicts", daemon=True
        )
        self._thread.start()

    def _run(self, work: BesideVerdicts | None, cmp_id: int, golden_run: int) -> None:
        try:
            if work is not None:
                work(self._cursor, cmp_id, golden_run)
            self._checkpoint()
            self.verdicts_done.wait()
            self._checkpoint()
        except BaseException as exc:  # raised by `join`, in the compare's thread
            self._error = exc
        finally:
            self._cursor.close()

    def _checkpoint(self) -> None:
        import duckdb

        try:
            self._cursor.execute("CHECKPOINT")
        except duckdb.Error:
            pass  # not now (another transaction stands in its way): closing the catalog checkpoints it

    def join(self, *, raise_error: bool = True) -> None:
        self._thread.join()
        if raise_error and self._error is not None:
            raise self._error


def add_node_pairs(
    catalog: str | Path,
    cmp_id: int,
    pairs: Sequence[PairSpec],
    remove: Sequence[tuple[str, str]] = (),
    *,
    workers: int = 1,
) -> int:
    """Pair (and unpair) nodes of an existing comparison; metrics of new tensor pairs are computed now.

    Returns the number of tensor pairs added. Used by the app's mapping editor.
    """
    from workbench.analysis.verdicts.born import refresh_verdicts
    from workbench.catalog.store import open_catalog
    from workbench.compare.execution.executor import compute_pending
    from workbench.compare.pair_store import comparison_runs, edit_node_pairs

    con = open_catalog(catalog)
    try:
        golden, test, th = comparison_runs(con, catalog, cmp_id)
        stored, added = edit_node_pairs(con, cmp_id, golden, test, pairs, remove)
        compute_pending(con, cmp_id, golden, test, stored, th, workers=workers, stats_for_unpaired=False)
        refresh_verdicts(con, cmp_id)
        return added
    finally:
        con.close()


def check_tokens(wanted: set[int], golden: list[int], test: list[int], asked: str | None = None) -> None:
    """Refuse tokens the dumps lack entirely (nothing would be compared, and the report would be empty)."""
    have = sorted(set(golden) & set(test))
    if wanted & set(have):
        return
    asked = asked or token_text(wanted)
    raise ValueError(f"--tokens {asked}: the dumps have no such token; they hold tokens {token_text(have) or 'none'}")
