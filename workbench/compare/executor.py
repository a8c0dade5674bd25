"""Computing a comparison's pending pairs: plan the tasks, run them in process or in the worker pool, store results.

`compute_pending` is the entry point: pairs whose metrics are already in the catalog are not computed again,
and results are committed in batches, so an interrupted run keeps every batch it committed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Protocol

import duckdb
import pandas as pd

from workbench.compare.early import EarlyPairs, PairKey
from workbench.compare.judge import PairResult, StatsResult, compute_dtype, judge_pair, result_from_wire
from workbench.compare.matching import RunFrames
from workbench.compare.pair_store import none_if_na
from workbench.compare.pool import IN_PROCESS_BYTES, PoolStarter, new_pool
from workbench.compare.tasks import SUMMARY_FIELDS, PairTask, StatsTask, batches, file_identity, tensor_bytes
from workbench.compare.thresholds import Thresholds
from workbench.compare.worker import run_batch
from workbench.core.metrics import ALL_METRICS, STAT_BOUND, STAT_METRIC_NAMES, STAT_STEP_KEY
from workbench.core.progress import CompareCancelled, Progress, ProgressFn

Judge = Callable[[PairResult], tuple[bool | None, list[str]]]


class Cluster(Protocol):
    """Runs batches elsewhere (`workbench.compare.ray_exec.RayCluster`), handing each batch's results back."""

    def run(
        self,
        todo: Sequence[list[PairTask | StatsTask]],
        take: Callable[[list[dict[str, Any]]], None],
        cancel: threading.Event | None,
    ) -> None: ...


FLUSH_ROWS = 4096  # buffered result rows (about 1 KB each, with their statistics rows) written at once


class ResultSink:
    """Buffers worker results and writes them to the catalog in transactions."""

    def __init__(
        self, con: duckdb.DuckDBPyConnection, cmp_id: int, golden_run: int, test_run: int, judge: Judge
    ) -> None:
        self.con, self.cmp_id, self.golden_run, self.test_run, self.judge = con, cmp_id, golden_run, test_run, judge
        self.metric_rows: list[dict[str, Any]] = []
        self.stat_rows: list[dict[str, Any]] = []
        self.stat_metric_rows: list[dict[str, Any]] = []
        self.failed = 0
        self.uncomparable = 0
        self.done_pairs: set[int] = set()
        self.done_stats: set[tuple[int, int]] = set()
        # pairs that read exactly the files of another pair (hard-linked dumps): computed once, copied
        self.aliases: dict[int, list[tuple[int, int, int]]] = {}

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
            self.stat_rows.append(
                {
                    "run_id": res.run_id,
                    "tensor_id": res.tensor_id,
                    **{f: s.get(f) for f in SUMMARY_FIELDS},
                    "error": res.error,
                }
            )
            return
        for pair_id, g_tid, t_tid in self.aliases.get(res.pair_id, ()):
            self.add(res.under(pair_id, g_tid, t_tid))
        self.done_pairs.add(res.pair_id)
        values = res.values
        passed, over = self.judge(res)
        g, t = res.golden or {}, res.test or {}
        self.metric_rows.append(
            {
                "pair_id": res.pair_id,
                **{m: values.get(m) for m in ALL_METRICS},
                "golden_nan_count": g.get("nan_count"),
                "golden_inf_count": g.get("inf_count"),
                "my_nan_count": t.get("nan_count"),
                "my_inf_count": t.get("inf_count"),
                "finite_only": res.finite_only,
                "passed": passed,
                "failed_metrics": ",".join(over) if over else None,
                "cmp_fail_reason": res.reason or None,
            }
        )
        if passed is False:
            self.failed += 1
        if not res.comparable:
            self.uncomparable += 1
        if res.stat_values:
            self.stat_metric_rows.append({"pair_id": res.pair_id, **res.stat_values})
        if g:
            self.stat_rows.append({"run_id": self.golden_run, "tensor_id": res.golden_tensor_id, **g, "error": None})
        if t:
            self.stat_rows.append({"run_id": self.test_run, "tensor_id": res.test_tensor_id, **t, "error": None})
        if len(self.metric_rows) >= FLUSH_ROWS:  # one result may stand for thousands of hard-linked pairs
            self.flush()

    def flush(self) -> None:
        if not self.metric_rows and not self.stat_rows and not self.stat_metric_rows:
            return
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            if self.metric_rows:
                mdf = pd.DataFrame(self.metric_rows)
                for col in ("golden_nan_count", "golden_inf_count", "my_nan_count", "my_inf_count"):
                    mdf[col] = mdf[col].astype("Int64")
                for col in ALL_METRICS:
                    mdf[col] = mdf[col].astype("float64")
                mdf["passed"] = mdf["passed"].astype("boolean")
                con.register("_mdf", mdf)
                cols = ", ".join(
                    [
                        "pair_id",
                        *ALL_METRICS,
                        "golden_nan_count",
                        "golden_inf_count",
                        "my_nan_count",
                        "my_inf_count",
                        "finite_only",
                        "passed",
                        "failed_metrics",
                        "cmp_fail_reason",
                    ]
                )
                con.execute(
                    f"INSERT OR REPLACE INTO metrics (cmp_id, {cols}) SELECT ?, {cols} FROM _mdf", [self.cmp_id]
                )
                con.unregister("_mdf")
            if self.stat_metric_rows:
                xdf = pd.DataFrame(self.stat_metric_rows, columns=["pair_id", *STAT_METRIC_NAMES])
                for col in STAT_METRIC_NAMES:
                    xdf[col] = xdf[col].astype("float64")
                con.register("_xdf", xdf)
                cols = ", ".join(["pair_id", *STAT_METRIC_NAMES])
                con.execute(
                    f"INSERT OR REPLACE INTO stat_metrics (cmp_id, {cols}) SELECT ?, {cols} FROM _xdf", [self.cmp_id]
                )
                con.unregister("_xdf")
            if self.stat_rows:
                sdf = pd.DataFrame(self.stat_rows).drop_duplicates(["run_id", "tensor_id"], keep="last")
                for col in ("numel", "nan_count", "inf_count"):
                    sdf[col] = sdf[col].astype("Int64")
                for col in ("min", "max", "mean", "std", "norm"):
                    sdf[col] = sdf[col].astype("float64")
                con.register("_sdf", sdf)
                con.execute(
                    "UPDATE tensors SET min = s.min, max = s.max, mean = s.mean, std = s.std, norm = s.norm, "
                    "nan_count = s.nan_count, inf_count = s.inf_count, numel = coalesce(s.numel, tensors.numel), "
                    "error = coalesce(s.error, tensors.error) "
                    "FROM _sdf s WHERE tensors.run_id = s.run_id AND tensors.tensor_id = s.tensor_id"
                )
                con.unregister("_sdf")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        self.metric_rows.clear()
        self.stat_rows.clear()
        self.stat_metric_rows.clear()


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
    """Run tasks in a process pool (or in process when small, or on `cluster`), streaming results into the sink.

    `claims` maps pairs computed early (`early`) to the tasks that take their results.
    """
    t0 = time.perf_counter()
    if progress:
        progress(Progress(stage, 0, len(tasks)))
    if not tasks:
        return
    if cluster is not None:
        _run_on_cluster(tasks, sizes, sink, cluster, progress, cancel, stage, t0)
        return
    if workers <= 1 or sum(sizes) < IN_PROCESS_BYTES:
        _run_in_process(tasks, sizes, sink, progress, cancel, stage, t0)
        return
    try:
        _run_in_pool(tasks, sizes, sink, workers, progress, cancel, stage, t0, pool, early, claims or {})
    except BrokenProcessPool:
        # a worker died (killed, out of memory, an unimportable __main__): finish here, one pair at a time
        sink.flush()
        left = [(t, n) for t, n in zip(tasks, sizes) if not sink.is_done(t)]
        _run_in_process([t for t, _ in left], [n for _, n in left], sink, progress, cancel, stage, t0)


class _Reporter:
    """Progress callbacks and periodic flushes of the sink, shared by the in-process and pool paths."""

    def __init__(self, sink: ResultSink, progress: ProgressFn | None, stage: str, total: int, t0: float) -> None:
        self.sink, self.progress, self.stage, self.total, self.t0 = sink, progress, stage, total, t0
        self.done = 0
        self.last_flush = time.perf_counter()

    def advance(self, n: int, force_flush: bool = False) -> None:
        self.done += n
        now = time.perf_counter()
        if self.progress:
            self.progress(Progress(self.stage, self.done, self.total, self.done / max(now - self.t0, 1e-9)))
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
    for batch in batches(tasks, sizes):
        if cancel is not None and cancel.is_set():
            sink.flush()
            raise CompareCancelled()
        sink.add_wire(run_batch(batch))
        reporter.advance(len(batch))
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
    pool: ProcessPoolExecutor | PoolStarter | None,
    early: EarlyPairs | None,
    claims: dict[PairKey, PairTask],
) -> None:
    reporter = _Reporter(sink, progress, stage, len(tasks), t0)
    claimed = {t.pair_id for t in claims.values()}
    rest = [(t, n) for t, n in zip(tasks, sizes) if not (isinstance(t, PairTask) and t.pair_id in claimed)]
    todo: deque[list[PairTask | StatsTask]] = deque(batches([t for t, _ in rest], [n for _, n in rest]))
    if isinstance(pool, PoolStarter):
        pool = pool.get()  # started in the background at the very beginning
    own_pool = pool is None
    if pool is None:
        pool = new_pool(workers)
    early_futures: set[Future[list[dict[str, Any]]]] = set()
    if early is not None:
        early_futures = set(early.keep_only(claims))
    try:
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
                    if not early_futures:  # whatever the early batches did not deliver is computed now
                        left = [t for t in claims.values() if not sink.is_done(t)]
                        todo.extend(batches(left, [0] * len(left)))
                    continue
                n_done += inflight.pop(f)
                sink.add_wire(f.result())
            submit_more()
            reporter.advance(n_done)
    finally:
        if own_pool:
            pool.shutdown(wait=True, cancel_futures=True)
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


class _TensorInfo:
    """tensor_id -> (path, dtype, numel) of one run, read from the frame's columns on demand: no per-tensor
    tuples (a million-file dump would hold a million of them), and no pandas per-row `.loc` (far slower)."""

    def __init__(self, frames: RunFrames) -> None:
        t = frames.tensors
        ids = t["tensor_id"].to_numpy()
        self.path, self.dtype, self.numel = t["path"].to_numpy(), t["dtype"].to_numpy(), t["numel"].to_numpy()
        dense = len(ids) == 0 or (int(ids[0]) == 0 and int(ids[-1]) == len(ids) - 1)  # ids are sorted and unique
        self.pos = None if dense else {int(x): i for i, x in enumerate(ids)}

    def __getitem__(self, tensor_id: int) -> tuple[str | None, str | None, Any]:
        i = tensor_id if self.pos is None else self.pos[tensor_id]
        return none_if_na(self.path[i]), none_if_na(self.dtype[i]), none_if_na(self.numel[i])


def _tensor_info(frames: RunFrames) -> _TensorInfo:
    """tensor_id -> (path, dtype, numel) of one run."""
    return _TensorInfo(frames)


def compute_pending(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    golden: RunFrames,
    test: RunFrames,
    pairs: pd.DataFrame,
    thresholds: Thresholds,
    *,
    workers: int,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    stats_for_unpaired: bool = True,
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
    cluster: Cluster | None = None,
) -> tuple[int, int, int]:
    """Compute metrics for pairs without them, and stats of unpaired tensors (on `cluster` when given).

    Returns (computed, failed, uncomparable).
    """
    done_ids = {int(x) for x in con.execute("SELECT pair_id FROM metrics WHERE cmp_id = ?", [cmp_id]).df()["pair_id"]}
    todo = pairs[~pairs["pair_id"].isin(done_ids)]
    g_info, t_info = _tensor_info(golden), _tensor_info(test)
    g_order = dict(zip(golden.nodes["node_id"], golden.nodes["exec_order"]))
    # feed pairs in token then execution order so partial results are the useful ones
    order = todo.assign(_eo=todo["golden_node_id"].map(g_order)).sort_values(
        ["token_id", "_eo", "golden_node_id"], na_position="last"
    )
    tasks: list[PairTask | StatsTask] = []
    sizes: list[int] = []
    first_of: dict[PairKey, int] = {}
    aliases: dict[int, list[tuple[int, int, int]]] = {}
    claims: dict[PairKey, PairTask] = {}
    g_stats, t_stats = _recorded_stats(con, golden.run_id), _recorded_stats(con, test.run_id)
    if early is not None:
        early.wait_submitted()
    for pair_id, g_tid, t_tid, transform in zip(
        order["pair_id"], order["golden_tensor_id"], order["test_tensor_id"], order["transform"]
    ):
        pair_id, g_tid, t_tid, transform = int(pair_id), int(g_tid), int(t_tid), none_if_na(transform)
        g_path, g_dtype, g_numel = g_info[g_tid]
        t_path, t_dtype, t_numel = t_info[t_tid]
        g_file, t_file = file_identity(g_path), file_identity(t_path)
        key: PairKey | None = None
        if g_file is not None and t_file is not None:
            key = (g_file, t_file, t_dtype, transform)
            if key in first_of:
                aliases.setdefault(first_of[key], []).append((pair_id, g_tid, t_tid))
                continue
            first_of[key] = pair_id
        gs, ts = g_stats.get(g_tid) if g_path is None else None, t_stats.get(t_tid) if t_path is None else None
        if gs is not None or ts is not None:  # a statistics-only side: compared on statistics
            numel = int(g_numel) if g_numel is not None and g_numel == g_numel else None
            task = PairTask(pair_id, g_path, t_path, t_dtype, g_tid, t_tid, transform, gs, ts, numel)
        else:
            task = PairTask(pair_id, g_path, t_path, t_dtype, g_tid, t_tid, transform)
        if early is not None and key is not None and early.has(key):
            claims[key] = task
        tasks.append(task)
        sizes.append(
            (tensor_bytes(g_numel, g_dtype) if g_path else 0) + (tensor_bytes(t_numel, t_dtype) if t_path else 0)
        )
    if stats_for_unpaired:
        for run, info, used in (
            (golden.run_id, g_info, set(pairs["golden_tensor_id"])),
            (test.run_id, t_info, set(pairs["test_tensor_id"])),
        ):
            missing = con.execute(
                "SELECT tensor_id FROM tensors WHERE run_id = ? AND std IS NULL AND path IS NOT NULL AND error IS NULL",
                [run],
            ).df()["tensor_id"]
            for tid in missing:
                if int(tid) in used:
                    continue
                path, dtype, numel = info[int(tid)]
                tasks.append(StatsTask(run, int(tid), str(path)))
                sizes.append(tensor_bytes(numel, dtype))

    node_info = {
        int(n): (str(nm), str(tp) if tp is not None else "", bool(pd.isna(parent)))
        for n, nm, tp, parent in zip(
            golden.nodes["node_id"], golden.nodes["name"], golden.nodes["type"], golden.nodes["parent_id"]
        )
    }
    pair_node = dict(zip(pairs["pair_id"].astype(int), pairs["golden_node_id"].astype(int)))
    pair_dtype = {int(p): t_info[int(tid)][1] for p, tid in zip(pairs["pair_id"], pairs["test_tensor_id"])}
    pair_io = dict(zip(pairs["pair_id"].astype(int), pairs["io"].astype(str)))

    run_dtype = compute_dtype(t_info[int(tid)][1] for tid in pairs["test_tensor_id"])

    def judge(res: PairResult) -> tuple[bool | None, list[str]]:
        name, op_type, is_root = node_info[pair_node[res.pair_id]]
        return judge_pair(
            thresholds,
            res.values,
            res.golden,
            res.test,
            pair_dtype[res.pair_id],
            node_name=name,
            node_type=op_type,
            io=pair_io[res.pair_id],
            is_model=is_root,
            stat_bound=(res.stat_values or {}).get(STAT_BOUND),
            run_dtype=run_dtype,
        )

    sink = ResultSink(con, cmp_id, golden.run_id, test.run_id, judge)
    sink.aliases = aliases
    n_stats = sum(1 for t in tasks if isinstance(t, StatsTask))
    # the progress counts tasks: the pairs to compute (files shared by several pairs once) and the statistics
    # of tensors without a counterpart, so its total differs from the summary's `pairs compared`
    stage = f"compare ({len(tasks) - n_stats} pairs + {n_stats} unpaired tensors' statistics)" if n_stats else "compare"
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
    return len(todo), sink.failed, sink.uncomparable


def _recorded_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, dict[str, float | None]]:
    """tensor_id -> the max/min/mean/norm a statistics-only dump recorded, for its tensors without data."""
    rows = con.execute(
        "SELECT tensor_id, max, min, mean, norm FROM tensors WHERE run_id = ? AND path IS NULL "
        "AND (max IS NOT NULL OR min IS NOT NULL OR mean IS NOT NULL OR norm IS NOT NULL)",
        [run_id],
    ).fetchall()
    step = con.execute(f"SELECT TRY_CAST(meta->>'{STAT_STEP_KEY}' AS DOUBLE) FROM runs WHERE run_id = ?", [run_id])
    found = step.fetchone()
    extra = {"step": float(found[0])} if found and found[0] else {}
    return {int(r[0]): {"max": r[1], "min": r[2], "mean": r[3], "norm": r[4], **extra} for r in rows}
