"""Computing a comparison's pending pairs: plan the tasks, run them in process or in the worker pool, store results.

`compute_pending` is the entry point: pairs whose metrics are already in the catalog are not computed again,
and results are committed in batches, so an interrupted run keeps every batch it committed.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any, Protocol

import duckdb
import numpy as np

from workbench.catalog import first_row
from workbench.catalog.store import (
    insert_columns,
    int_column,
    nan_kept_column,
    nan_kept_select,
    registered,
    typed_columns,
)
from workbench.compare.execution.early import EarlyPairs, PairKey
from workbench.compare.execution.pool import IN_PROCESS_BYTES, PoolStarter
from workbench.compare.execution.tasks import PairTask, StatsTask, Twin, batches, file_identity, tensor_bytes
from workbench.compare.execution.worker import release_staging, run_batch
from workbench.compare.judging.dtypes import compared_compute_dtype, compute_dtype
from workbench.compare.judging.judge import (
    PairResult,
    StatsResult,
    judge_carried,
    judge_pair,
    model_node,
    result_from_wire,
)
from workbench.compare.judging.thresholds import Thresholds
from workbench.compare.pairing.frames import Coded, RunFrames, TensorPairs
from workbench.core.metrics import ALL_METRICS, STAT_BOUND, STAT_METRIC_NAMES, STAT_STEP_KEY, SUMMARY_FIELDS
from workbench.core.progress import CompareCancelled, Progress, ProgressFn
from workbench.formats.overwrites import overwrites_its_target

Judge = Callable[[PairResult], tuple[bool | None, list[str]]]


class Cluster(Protocol):
    """Runs batches elsewhere (`workbench.compare.execution.ray_exec.RayCluster`), handing each batch's results back."""

    def run(
        self,
        todo: Sequence[list[PairTask | StatsTask]],
        take: Callable[[list[dict[str, Any]]], None],
        cancel: threading.Event | None,
    ) -> None: ...


FLUSH_ROWS = 4096  # buffered result rows (about 1 KB each, with their statistics rows) written at once
# Ranks compared at once may share one run (a single-rank golden partnering every test rank): two flushes updating
# the same `tensors` rows at once would fail DuckDB's optimistic check ("Conflict on update"), so flushes take turns.
_FLUSH_LOCK = threading.Lock()


class ResultSink:
    """Buffers worker results and writes them to the catalog in transactions."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, cmp_id: int, golden_run: int, test_run: int, judge: Judge
    ) -> None:
        self.con, self.cmp_id, self.golden_run, self.test_run, self.judge = con, cmp_id, golden_run, test_run, judge
        # rows as tuples in their tables' column order (`_METRIC_COLUMNS`, `_STAT_COLUMNS`, `_STAT_METRIC_COLUMNS`):
        # a flush turns them into columns with one zip (13,000 rows of dicts took ~0.1 s to take apart)
        self.metric_rows: list[tuple[Any, ...]] = []
        self.stat_rows: list[tuple[Any, ...]] = []
        self.stat_metric_rows: list[tuple[Any, ...]] = []
        self.failed = 0
        self.uncomparable = 0
        self.done_pairs: set[int] = set()
        self.done_stats: set[tuple[int, int]] = set()
        # pairs that read exactly the files of another pair (hard-linked dumps): computed once, copied;
        # pair id -> its copies as flat (pair id, golden tensor id, test tensor id) triples
        self.aliases: dict[int, array[int]] = {}
        # pairs sent as twins of a pair reading the same golden file (a weight hard-linked across tokens): the
        # worker copies that pair's result when the test bytes match too; pair id -> its own tensor ids
        self.twin_ids: dict[int, tuple[int, int]] = {}

    def is_done(self, task: PairTask | StatsTask) -> bool:
        if isinstance(task, PairTask):
            return task.pair_id in self.done_pairs
        return (task.run_id, task.tensor_id) in self.done_stats

    def add_wire(self, results: list[dict[str, Any]]) -> None:
        """Add the results of one worker batch, as the worker sent them."""
        for res in results:
            self.add(result_from_wire(res))

    def add(self, res: PairResult | StatsResult) -> None:
        if isinstance(res, StatsResult):
            self.done_stats.add((res.run_id, res.tensor_id))
            s = res.summary or {}
            self.stat_rows.append((res.run_id, res.tensor_id, *map(s.get, SUMMARY_FIELDS), res.error))
            return
        if res.pair_id in self.done_pairs:  # delivered twice (a retried batch): the same files, the same numbers
            return
        ids = self.twin_ids.pop(res.pair_id, None)
        if ids is not None:  # a twin's result comes with its owner's tensor ids (or none, when computed)
            res = res.under(res.pair_id, ids[0], ids[1])
        copies = self.aliases.get(res.pair_id)
        if copies is not None:
            for k in range(0, len(copies), 3):
                self.add(res.under(copies[k], copies[k + 1], copies[k + 2]))
        self.done_pairs.add(res.pair_id)
        values = res.values
        passed, over = self.judge(res)
        g, t = res.golden or {}, res.test or {}
        self.metric_rows.append(
            (
                res.pair_id,
                *map(values.get, ALL_METRICS),
                g.get("nan_count"),
                g.get("inf_count"),
                t.get("nan_count"),
                t.get("inf_count"),
                res.finite_only,
                passed,
                ",".join(over) if over else None,
                res.reason or None,
            )
        )
        if passed is False:
            self.failed += 1
        if not res.comparable:
            self.uncomparable += 1
        if res.stat_values:
            self.stat_metric_rows.append((res.pair_id, *map(res.stat_values.get, STAT_METRIC_NAMES)))
        if g:
            self.stat_rows.append((self.golden_run, res.golden_tensor_id, *map(g.get, SUMMARY_FIELDS), None))
        if t:
            self.stat_rows.append((self.test_run, res.test_tensor_id, *map(t.get, SUMMARY_FIELDS), None))
        if len(self.metric_rows) >= FLUSH_ROWS:  # one result may stand for thousands of hard-linked pairs
            self.flush()

    def flush(self) -> None:
        if not self.metric_rows and not self.stat_rows and not self.stat_metric_rows:
            return
        with _FLUSH_LOCK:
            self._write()
        self.metric_rows.clear()
        self.stat_rows.clear()
        self.stat_metric_rows.clear()

    def _write(self) -> None:
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            if self.metric_rows:
                mdf = _columns(
                    self.metric_rows, _METRIC_COLUMNS, ints=_COUNTS, floats=ALL_METRICS, bools=("finite_only", "passed")
                )
                target = f"metrics (cmp_id, {', '.join(_METRIC_COLUMNS)})"
                insert_columns(con, target, mdf, select="?, *", params=[self.cmp_id])
            if self.stat_metric_rows:
                # NaN stays NaN: a bound from NaN/Inf statistics fails (a re-judge reads it back), NULL is "none"
                columns = list(zip(*self.stat_metric_rows, strict=True))
                xdf = {"pair_id": int_column(columns[0])}
                for name, values in zip(STAT_METRIC_NAMES, columns[1:], strict=True):
                    xdf.update(nan_kept_column(name, values))
                target = f"stat_metrics (cmp_id, {', '.join(_STAT_METRIC_COLUMNS)})"
                select = f"?, pair_id, {nan_kept_select(STAT_METRIC_NAMES)}"
                insert_columns(con, target, xdf, select=select, params=[self.cmp_id])
            if self.stat_rows:
                last = {r[:2]: r for r in self.stat_rows}  # a tensor's last statistics
                sdf = _columns(
                    list(last.values()),
                    _STAT_COLUMNS,
                    ints=("numel", "nan_count", "inf_count"),
                    floats=("min", "max", "mean", "std", "norm"),
                )
                with registered(con, "_sdf", sdf):
                    con.execute(
                        "UPDATE tensors SET min = s.min, max = s.max, mean = s.mean, std = s.std, norm = s.norm, "
                        "nan_count = s.nan_count, inf_count = s.inf_count, numel = coalesce(s.numel, tensors.numel), "
                        "error = coalesce(s.error, tensors.error) "
                        "FROM _sdf s WHERE tensors.run_id = s.run_id AND tensors.tensor_id = s.tensor_id"
                    )
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


_COUNTS = ("golden_nan_count", "golden_inf_count", "my_nan_count", "my_inf_count")
_METRIC_COLUMNS = ("pair_id", *ALL_METRICS, *_COUNTS, "finite_only", "passed", "failed_metrics", "cmp_fail_reason")
_STAT_COLUMNS = ("run_id", "tensor_id", *SUMMARY_FIELDS, "error")
_STAT_METRIC_COLUMNS = ("pair_id", *STAT_METRIC_NAMES)


def _columns(
    rows: list[tuple[Any, ...]],
    names: Sequence[str],
    *,
    ints: Sequence[str] = (),
    floats: Sequence[str] = (),
    bools: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """`rows` (tuples in the order of `names`) as the `names` columns, typed by `catalog.store.typed_columns`."""
    return typed_columns(dict(zip(names, zip(*rows), strict=True)), ints=ints, floats=floats, bools=bools)


def execute_tasks(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: ResultSink,
    *,
    workers: int,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    stage: str = "compare",
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
    claims: dict[PairKey, PairTask] | None = None,
    cluster: Cluster | None = None,
) -> None:
    """Run tasks in `pool` (or in process without one or when small, or on `cluster`), streaming results into the
    sink. The pool belongs to the caller (the compare job decides whether one is worth starting, and stops it).

    `claims` maps pairs computed early (`early`) to the tasks that take their results.
    """
    t0 = time.perf_counter()
    if progress:
        progress(Progress(stage, 0, len(tasks)))
    if not tasks:
        if early is not None:
            # every pair was in the catalog (a re-run): the early batches still queued would run to no use while
            # the verdicts and the report are written, and the pool's shutdown would wait for them
            early.drop()
        return
    if cluster is not None:
        if early is not None:
            # not taken on this path: held, the early results (a dict per pair) would pile up until the end
            early.drop()
        _run_on_cluster(tasks, sizes, sink, cluster, progress, cancel, stage, t0)
        return
    started = None
    if pool is not None and workers > 1 and sum(sizes) >= IN_PROCESS_BYTES:
        started = pool.get() if isinstance(pool, PoolStarter) else pool  # None: the pool could not start
    if started is None:
        if early is not None:
            # not taken on this path: held, the early results (a dict per pair) would pile up until the end
            early.drop()
        _run_in_process(tasks, sizes, sink, progress, cancel, stage, t0)
        return
    try:
        _run_in_pool(tasks, sizes, sink, workers, progress, cancel, stage, t0, started, early, claims or {})
    except BrokenProcessPool:
        # a worker died (killed, out of memory, an unimportable __main__): finish here, one pair at a time
        sink.flush()
        left = [(t, n) for t, n in zip(tasks, sizes) if not sink.is_done(t)]
        _run_in_process([t for t, _ in left], [n for _, n in left], sink, progress, cancel, stage, t0)


KERNELS_COMPILING = "compiling the metric kernels (once per install)"


class _Reporter:
    """Progress callbacks and periodic flushes of the sink, shared by the in-process and pool paths."""

    def __init__(self, sink: ResultSink, progress: ProgressFn | None, stage: str, total: int, t0: float) -> None:
        self.sink, self.progress, self.stage, self.total, self.t0 = sink, progress, stage, total, t0
        self.done = 0
        self.last_flush = time.perf_counter()

    def advance(self, n: int, force_flush: bool = False, message: str = "") -> None:
        """`n` more done (`message`: said next to the counts, the kernels being compiled)."""
        self.done += n
        now = time.perf_counter()
        if self.progress:
            rate = self.done / max(now - self.t0, 1e-9)
            self.progress(Progress(self.stage, self.done, self.total, rate, message))
        pending = len(self.sink.metric_rows) + len(self.sink.stat_rows)
        if force_flush or now - self.last_flush > 1.0 or pending > 5000:
            self.sink.flush()
            self.last_flush = now


def _run_in_process(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: ResultSink,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    stage: str,
    t0: float,
) -> None:
    reporter = _Reporter(sink, progress, stage, len(tasks), t0)
    try:
        for batch in batches(tasks, sizes):
            if cancel is not None and cancel.is_set():
                sink.flush()
                raise CompareCancelled()
            sink.add_wire(run_batch(batch))
            reporter.advance(len(batch))
    finally:
        release_staging()  # this process lives on (the app): its read buffers go
    sink.flush()


def _run_on_cluster(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: ResultSink,
    cluster: Cluster,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    stage: str,
    t0: float,
) -> None:
    reporter = _Reporter(sink, progress, stage, len(tasks), t0)

    def take(results: list[dict[str, Any]]) -> None:
        sink.add_wire(results)
        reporter.advance(len(results))

    try:
        cluster.run(list(batches(tasks, sizes)), take, cancel)
    finally:
        sink.flush()  # what came back is kept, whatever ended the run
    reporter.advance(0, force_flush=True)


def _run_in_pool(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: ResultSink,
    workers: int,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    stage: str,
    t0: float,
    pool: ProcessPoolExecutor,
    early: EarlyPairs | None,
    claims: dict[PairKey, PairTask],
) -> None:
    reporter = _Reporter(sink, progress, stage, len(tasks), t0)
    claimed = {t.pair_id for t in claims.values()}
    rest = [(t, n) for t, n in zip(tasks, sizes) if not (isinstance(t, PairTask) and t.pair_id in claimed)]
    # largest first: the workers then finish together instead of one computing a big pair while the others idle
    rest.sort(key=lambda tn: tn[1], reverse=True)
    todo: deque[list[PairTask | StatsTask]] = deque(batches([t for t, _ in rest], [n for _, n in rest]))
    early_futures: set[Future[list[dict[str, Any]]]] = set()
    if early is not None:
        early_futures = set(early.keep_only(claims))
    inflight: dict[Future[list[dict[str, Any]]], int] = {}

    def submit_more() -> None:
        while len(inflight) < 2 * workers and todo:
            nxt = todo.popleft()
            inflight[pool.submit(run_batch, nxt)] = len(nxt)

    submit_more()
    while inflight or early_futures:
        if cancel is not None and cancel.is_set():
            for f in [*inflight, *early_futures]:
                f.cancel()
            sink.flush()
            raise CompareCancelled()
        finished, _ = wait([*inflight, *early_futures], timeout=0.2, return_when=FIRST_COMPLETED)
        n_done = 0
        for f in finished:
            if f in early_futures:
                early_futures.discard(f)
                if early is not None and not f.cancelled():
                    n_done += _take_early(f.result(), early, claims, sink)
                if early is not None:
                    early.release(f)
                if not early_futures:  # whatever the early batches did not deliver is computed now
                    left = [t for t in claims.values() if not sink.is_done(t)]
                    todo.extend(batches(left, [0] * len(left)))
                continue
            n_done += inflight.pop(f)
            sink.add_wire(f.result())
        submit_more()
        compiling = early is not None and early.compiling_kernels()
        reporter.advance(n_done, message=KERNELS_COMPILING if compiling else "")
    reporter.advance(0, force_flush=True)


def _take_early(
    results: list[dict[str, Any]], early: EarlyPairs, claims: dict[PairKey, PairTask], sink: ResultSink
) -> int:
    """Hand the claimed results of one early batch to the sink, under the claiming task's ids."""
    n = 0
    for wire in results:
        res = result_from_wire(wire)
        assert isinstance(res, PairResult)
        task = claims.get(early.keys[res.pair_id])
        if task is not None and not sink.is_done(task):
            sink.add(res.under(task.pair_id, task.golden_tensor_id, task.test_tensor_id))
            n += 1
    early.taken += n
    return n


def _overwritten_targets(pairs: TensorPairs, golden: RunFrames, test: RunFrames) -> set[int]:
    """The pair ids of `pairs` that are what an in-place call overwrites, before the write (`overwritten_target` of
    the golden node's type and, as the catalog's re-judge reads it, the test tensor's index)."""
    nodes = golden.nodes
    kinds = {t for t in set(nodes.type) if overwrites_its_target(t)}  # a dump's few distinct types
    if not kinds:
        return set()
    calls = np.asarray([n for n, t in zip(nodes.node_id.tolist(), nodes.type) if t in kinds], dtype=np.int64)
    io_in = np.asarray([io == "in" for io in pairs.io], dtype=bool)
    maybe = np.flatnonzero(io_in & np.isin(pairs.golden_node_id, calls))
    if not len(maybe):
        return set()
    t = test.tensors
    rows = t.rows_of(pairs.test_tensor_id[maybe])
    first = (rows >= 0) & (t.idx[np.maximum(rows, 0)] == 0)
    return {int(p) for p in pairs.pair_id[maybe[first]].tolist()}


class _PairFacts:
    """pair_id -> (golden node id, test dtype, io) of the pairs to judge, as columns: no per-pair Python objects
    (three dicts of a 150k-file dump's pairs were ~15 MB)."""

    def __init__(self, pairs: TensorPairs, test: RunFrames) -> None:
        ids = pairs.pair_id
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.node = pairs.golden_node_id[order]
        io = Coded.of(pairs.io)
        self.io_codes, self.io_names = io.codes[order], io.values
        t = test.tensors
        self.dtype_names: list[str | None] = list(t.dtype.values)
        pos = t.rows_of(pairs.test_tensor_id)
        codes = t.dtype.codes
        self.dtype_codes = np.where(pos >= 0, codes[np.maximum(pos, 0)] if len(codes) else -1, -1)  # pairs' order
        dense = len(ids) == 0 or int(self.ids[-1]) - int(self.ids[0]) == len(ids) - 1  # sorted; unique pair ids
        self.base = int(self.ids[0]) if len(ids) else 0
        self.pos = None if dense else {int(x): i for i, x in enumerate(self.ids)}
        self.order = order

    def test_dtypes(self, among: np.ndarray | None = None) -> Iterator[str | None]:
        """The test dtype of every pair (or of those `among`, a mask in the pairs' order), in the pairs' order."""
        names = self.dtype_names
        codes = self.dtype_codes if among is None else self.dtype_codes[among]
        return (names[c] if c >= 0 else None for c in codes.tolist())

    def __getitem__(self, pair_id: int) -> tuple[int, str | None, str]:
        i = pair_id - self.base if self.pos is None else self.pos[pair_id]
        c = int(self.dtype_codes[self.order[i]])
        return int(self.node[i]), self.dtype_names[c] if c >= 0 else None, self.io_names[self.io_codes[i]]


def operand_paths(con: duckdb.DuckDBPyConnection, run_id: int, transform: str) -> str:
    """A transform's `#tensor_id` operands (`compare.pairing.quant_pairs`) replaced by their files (`#missing` kept)."""
    steps = []
    for step in transform.split(";"):
        head, sep, ref = step.partition(":#")
        if sep and ref.isdigit():
            row = first_row(
                con.execute("SELECT path FROM tensors WHERE run_id = ? AND tensor_id = ?", [run_id, int(ref)])
            )
            path = None if row is None else row[0]
            step = f"{head}:{path}" if path and ";" not in str(path) else f"{head}:#missing"
        steps.append(step)
    return ";".join(steps)


# the pending pairs with their files, in token then golden execution order (partial results are the useful ones)
_PLAN_SQL = """
SELECT p.pair_id, p.golden_tensor_id, p.test_tensor_id, p.transform, g.path, g.dtype, g.numel, t.path, t.dtype, t.numel
FROM _todo p
JOIN tensors g ON g.run_id = $golden AND g.tensor_id = p.golden_tensor_id
JOIN tensors t ON t.run_id = $test AND t.tensor_id = p.test_tensor_id
LEFT JOIN nodes n ON n.run_id = $golden AND n.node_id = p.golden_node_id
ORDER BY p.token_id, n.exec_order NULLS LAST, p.golden_node_id, p.pair_id
"""
PLAN_SLICE = 8192  # planned rows fetched at a time


def compute_pending(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    golden: RunFrames,
    test: RunFrames,
    pairs: TensorPairs,
    thresholds: Thresholds,
    *,
    workers: int,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    stats_for_unpaired: bool = True,
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
    cluster: Cluster | None = None,
    every_pair: bool = False,
) -> tuple[int, int, int]:
    """Compute metrics for pairs without them, and stats of unpaired tensors (on `cluster` when given); then, every
    pair of the comparison judged, the outputs more precise than the run computes in are judged with what their
    inputs carried in (`judge_carried`: an output's inputs are other pairs, computed in any order).
    `every_pair`: `pairs` are all the comparison's (the compare that made it), so the dtype the run computes in is
    read from them, not asked of the catalog (`compared_compute_dtype`, one query).

    Returns (computed, failed, uncomparable): `failed` as the pairs computed now were first judged.
    """
    done = con.execute("SELECT pair_id::BIGINT AS pair_id FROM metrics WHERE cmp_id = ?", [cmp_id]).fetchnumpy()
    # the sink inserts rows (INSERT OR REPLACE took ~3x as long): no pair it computes may have a row already. A pair
    # without metrics has none; statistics metrics left of a pair whose metrics were deleted (catalogs before
    # 2026-11-27: a re-dump or an unpairing kept them) go first
    con.execute(
        "DELETE FROM stat_metrics WHERE cmp_id = ? AND pair_id NOT IN (SELECT pair_id FROM metrics WHERE cmp_id = ?)",
        [cmp_id, cmp_id],
    )
    todo = pairs.take(~np.isin(pairs.pair_id, np.asarray(done["pair_id"], dtype=np.int64)))
    tasks: list[PairTask | StatsTask] = []
    sizes: list[int] = []
    first_of: dict[PairKey, int] = {}
    aliases: dict[int, array[int]] = {}
    claims: dict[PairKey, PairTask] = {}
    owners: dict[tuple[tuple[int, int], str | None, int | None], int] = {}  # golden file, test dtype, numel -> task
    twin_ids: dict[int, tuple[int, int]] = {}
    g_stats, t_stats = _recorded_stats(con, golden.run_id), _recorded_stats(con, test.run_id)
    # the files' identities as the readers saw them (a stat per file otherwise: ~0.08 s at 13,000 pairs)
    g_files, t_files = golden.tensors.known_files(), test.tensors.known_files()
    if early is not None:
        early.wait_submitted()
    # paths come from the catalog a slice at a time: one Python string per tensor file is held by no frame
    todo_columns = todo.columns(
        ("pair_id", "token_id", "golden_tensor_id", "test_tensor_id", "golden_node_id", "transform")
    )
    with registered(con, "_todo", todo_columns):
        cur = con.execute(_PLAN_SQL, {"golden": golden.run_id, "test": test.run_id})
        while rows := cur.fetchmany(PLAN_SLICE):
            for pair_id, g_tid, t_tid, transform, g_path, g_dtype, g_numel, t_path, t_dtype, t_numel in rows:
                if transform is not None and "#" in transform:  # a dequantized int tensor's operands
                    transform = operand_paths(con, test.run_id, transform)
                g_file = (g_files.get(g_tid) or file_identity(g_path)) if g_path is not None else None
                t_file = (t_files.get(t_tid) or file_identity(t_path)) if t_path is not None else None
                key: PairKey | None = None
                if g_file is not None and t_file is not None:
                    key = (g_file, t_file, t_dtype, transform)
                    if key in first_of:
                        aliases.setdefault(first_of[key], array("q")).extend((pair_id, g_tid, t_tid))
                        continue
                    first_of[key] = pair_id
                gs = g_stats.get(g_tid) if g_path is None else None
                ts = t_stats.get(t_tid) if t_path is None else None
                if gs is not None or ts is not None:  # a statistics-only side: compared on statistics
                    numel = int(g_numel) if g_numel is not None else None
                    task = PairTask(pair_id, g_path, t_path, t_dtype, g_tid, t_tid, transform, gs, ts, numel)
                else:
                    task = PairTask(pair_id, g_path, t_path, t_dtype, g_tid, t_tid, transform)
                nbytes = (tensor_bytes(g_numel, g_dtype) if g_path else 0) + (
                    tensor_bytes(t_numel, t_dtype) if t_path else 0
                )
                if early is not None and key is not None and early.has(key):
                    claims[key] = task
                elif cluster is None and g_file is not None and t_path is not None and transform is None:
                    # the golden file of an earlier pair (a weight at every token, hard-linked by our FX dumper):
                    # sent with it; the worker checks the test bytes and copies its result or computes this one
                    # (not on a cluster, whose progress counts results)
                    owner_key = (g_file, t_dtype, t_numel)
                    owner = owners.get(owner_key)
                    if owner is not None:
                        first = tasks[owner]
                        assert isinstance(first, PairTask)
                        tasks[owner] = replace(first, twins=(*first.twins, Twin(pair_id, g_path, t_path)))
                        sizes[owner] += nbytes // 8
                        twin_ids[pair_id] = (g_tid, t_tid)
                        continue
                    owners[owner_key] = len(tasks)
                tasks.append(task)
                sizes.append(nbytes)
    if stats_for_unpaired:
        with registered(con, "_paired", pairs.columns(("golden_tensor_id", "test_tensor_id"))):
            for run, side in ((golden.run_id, "golden_tensor_id"), (test.run_id, "test_tensor_id")):
                for tid, path, dtype, numel in con.execute(
                    "SELECT tensor_id, path, dtype, numel FROM tensors WHERE run_id = ? AND std IS NULL "
                    f"AND path IS NOT NULL AND error IS NULL AND tensor_id NOT IN (SELECT {side} FROM _paired) "
                    "ORDER BY tensor_id",
                    [run],
                ).fetchall():
                    tasks.append(StatsTask(run, int(tid), str(path)))
                    sizes.append(tensor_bytes(numel, dtype))

    nodes = golden.nodes
    model = model_node([n for n, parent in zip(nodes.node_id.tolist(), nodes.parent_id) if parent is None])
    node_info = {
        n: (nm, str(tp) if tp is not None else "", n == model)
        for n, nm, tp in zip(nodes.node_id.tolist(), nodes.name, nodes.type)
    }
    facts = _PairFacts(pairs, test)
    overwritten = _overwritten_targets(pairs, golden, test)
    # the pairs handed are the comparison's own when it is made (`every_pair`); a re-dump or a mapping edit hands a
    # few, whose dtypes may not be the run's
    run_dtype = (
        compute_dtype(facts.test_dtypes(pairs.token_id == pairs.token_id.min()))  # as `compared_compute_dtype` counts
        if every_pair and len(pairs)
        else compared_compute_dtype(con, cmp_id)
    )

    def judge(res: PairResult) -> tuple[bool | None, list[str]]:
        node, test_dtype, io = facts[res.pair_id]
        name, op_type, is_model = node_info[node]
        return judge_pair(
            thresholds,
            res.values,
            res.golden,
            res.test,
            test_dtype,
            node_name=name,
            node_type=op_type,
            io=io,
            is_model=is_model,
            stat_bound=(res.stat_values or {}).get(STAT_BOUND),
            run_dtype=run_dtype,
            overwritten=res.pair_id in overwritten,
        )

    sink = ResultSink(con, cmp_id, golden.run_id, test.run_id, judge)
    sink.aliases = aliases
    sink.twin_ids = twin_ids
    n_stats = sum(1 for t in tasks if isinstance(t, StatsTask))
    # the progress counts tasks: the pairs to compute (files shared by several pairs once) and the statistics
    # of tensors without a counterpart; the label says both, so its total and the summary's `pairs compared` agree
    n_pair_tasks = len(tasks) - n_stats
    pairs_part = f"{len(todo)} pairs" + (f" in {n_pair_tasks} tasks" if n_pair_tasks != len(todo) else "")
    stage = f"compare ({pairs_part}" + (f" + {n_stats} unpaired tensors' statistics)" if n_stats else ")")
    execute_tasks(
        tasks,
        sizes,
        sink,
        workers=workers,
        progress=progress,
        cancel=cancel,
        pool=pool,
        early=early,
        claims=claims,
        stage=stage,
        cluster=cluster,
    )
    judge_carried(con, cmp_id, thresholds, run_dtype)
    return len(todo), sink.failed, sink.uncomparable


def _recorded_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, dict[str, float | None]]:
    """tensor_id -> the max/min/mean/norm a statistics-only dump recorded, for its tensors without data."""
    rows = con.execute(
        "SELECT tensor_id, max, min, mean, norm FROM tensors WHERE run_id = ? AND path IS NULL "
        "AND (max IS NOT NULL OR min IS NOT NULL OR mean IS NOT NULL OR norm IS NOT NULL)",
        [run_id],
    ).fetchall()
    found = first_row(
        con.execute(f"SELECT TRY_CAST(meta->>'{STAT_STEP_KEY}' AS DOUBLE) FROM runs WHERE run_id = ?", [run_id])
    )
    extra = {"step": float(found[0])} if found and found[0] else {}
    return {int(r[0]): {"max": r[1], "min": r[2], "mean": r[3], "norm": r[4], **extra} for r in rows}
