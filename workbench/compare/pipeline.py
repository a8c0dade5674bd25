"""The compare pipeline: read two dumps, ingest them, match, compute metrics in a process pool, judge.

Used by `wb compare`, `wb open` (in a thread worker, reporting `Progress`) and the app's
mapping editor (`add_node_pairs`). Incremental: pairs whose metrics are already in the
catalog are not computed again; an interrupted run keeps every batch it committed.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from workbench.analysis.born import refresh_verdicts
from workbench.catalog.schema import ALL_METRICS
from workbench.catalog.store import first_row, ingest_dump, open_catalog
from workbench.compare.early import EarlyPairs, PairKey
from workbench.compare.mapping import MappingFile, PairSpec
from workbench.compare.matching import NodeMatch, RunFrames, match_nodes, pair_tensors
from workbench.compare.pool import IN_PROCESS_BYTES, PoolStarter, default_workers, new_pool, worth_a_pool
from workbench.compare.tasks import SUMMARY_FIELDS, PairTask, StatsTask, batches, file_identity, tensor_bytes
from workbench.compare.thresholds import Thresholds
from workbench.compare.worker import run_batch
from workbench.formats import open_dump
from workbench.formats.model import Dump

ProgressFn = Callable[["Progress"], None]


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a long operation stands: `done` of `total` items in `stage`, at `rate` items/s."""

    stage: str
    done: int
    total: int
    rate: float = 0.0
    message: str = ""


class CompareCancelled(Exception):
    """The user cancelled; everything committed so far is kept and consistent."""


@dataclass(slots=True)
class CompareResult:
    cmp_id: int
    catalog: Path
    golden_run: int
    test_run: int
    pairs: int = 0  # tensor pairs in this comparison (selected tokens)
    computed: int = 0  # pairs computed by this call
    skipped: int = 0  # pairs already in the catalog
    failed: int = 0
    uncomparable: int = 0  # pairs with no metrics (unreadable file, shape mismatch, ...)
    shape_mismatch: int = 0  # pairs whose element counts differ
    unmatched_golden: int = 0
    unmatched_test: int = 0
    golden_nodes: int = 0
    test_nodes: int = 0
    born: dict[int, str | None] = field(default_factory=dict)
    born_test: dict[int, str | None] = field(default_factory=dict)
    born_evidence: dict[int, str] = field(default_factory=dict)
    first_failing_token: int | None = None
    problems: list[str] = field(default_factory=list)
    coverage: dict[str, Any] = field(default_factory=dict)


def load_frames(con: duckdb.DuckDBPyConnection, run_id: int) -> RunFrames:
    kind_row = first_row(con.execute("SELECT kind FROM runs WHERE run_id = ?", [run_id]))
    assert kind_row is not None
    nodes = con.execute(
        "SELECT node_id, name, type, parent_id, depth, exec_order, layer, phase, params FROM nodes "
        "WHERE run_id = ? ORDER BY node_id",
        [run_id],
    ).df()
    tensors = con.execute(
        "SELECT tensor_id, token_id, node_id, io, idx, path, dtype, shape, numel, layout, error FROM tensors "
        "WHERE run_id = ? ORDER BY tensor_id",
        [run_id],
    ).df()
    return RunFrames(run_id, str(kind_row[0]), nodes, tensors)


def _comparison_id(
    con: duckdb.DuckDBPyConnection, golden_run: int, test_run: int, mapping: MappingFile | None, thresholds: Thresholds
) -> tuple[int, bool]:
    digest = mapping.digest() if mapping and not mapping.is_empty() else "none"
    row = first_row(
        con.execute(
            "SELECT cmp_id, thresholds FROM comparisons WHERE golden_run = ? AND test_run = ? "
            "AND mapping_digest = ? ORDER BY cmp_id DESC LIMIT 1",
            [golden_run, test_run, digest],
        )
    )
    th_json = thresholds.to_json()
    if row:
        changed = (row[1] is None) or json.loads(row[1]) != json.loads(th_json)
        if changed:
            con.execute("UPDATE comparisons SET thresholds = ? WHERE cmp_id = ?", [th_json, row[0]])
        return int(row[0]), changed
    nxt = first_row(con.execute("SELECT nextval('cmp_seq')"))
    assert nxt is not None
    cmp_id = int(nxt[0])
    con.execute(
        "INSERT INTO comparisons (cmp_id, golden_run, test_run, mapping_digest, mapping, thresholds) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            cmp_id,
            golden_run,
            test_run,
            digest,
            json.dumps(mapping.to_json()) if mapping and not mapping.is_empty() else None,
            th_json,
        ],
    )
    return cmp_id, False


def _insert_node_matches(con: duckdb.DuckDBPyConnection, cmp_id: int, matches: list[NodeMatch]) -> None:
    if not matches:
        return
    df = pd.DataFrame(
        {
            "golden_node_id": [m.golden_node_id for m in matches],
            "test_node_id": [m.test_node_id for m in matches],
            "method": [m.method for m in matches],
            "confidence": [m.confidence for m in matches],
            "evidence": [m.evidence for m in matches],
        }
    )
    # one row per node pair (docs/catalog.md): a pair matched for several tensor selections (fused q/k/v,
    # gate/up) is still one pair; one already stored (an editor re-pair) is not added again
    df = df.drop_duplicates(["golden_node_id", "test_node_id"], keep="first")
    con.register("_nm", df)
    con.execute(
        "INSERT INTO node_matches SELECT ?, n.golden_node_id, n.test_node_id, n.method, n.confidence, n.evidence "
        "FROM _nm n WHERE NOT EXISTS (SELECT 1 FROM node_matches o WHERE o.cmp_id = ? "
        "AND o.golden_node_id = n.golden_node_id AND o.test_node_id = n.test_node_id)",
        [cmp_id, cmp_id],
    )
    con.unregister("_nm")


def _store_node_matches(con: duckdb.DuckDBPyConnection, cmp_id: int, matches: list[NodeMatch]) -> None:
    """Replace the node pairs of a comparison."""
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM node_matches WHERE cmp_id = ?", [cmp_id])
    _insert_node_matches(con, cmp_id, matches)
    con.execute("COMMIT")


def _store_pairs(con: duckdb.DuckDBPyConnection, cmp_id: int, pairs: pd.DataFrame) -> pd.DataFrame:
    """Insert tensor pairs not yet in the catalog; return every pair of `pairs` with its pair_id."""
    existing = con.execute(
        "SELECT pair_id, golden_tensor_id, test_tensor_id FROM matches WHERE cmp_id = ?", [cmp_id]
    ).df()
    merged = pairs.merge(existing, on=["golden_tensor_id", "test_tensor_id"], how="left")
    new = merged[merged["pair_id"].isna()].copy()
    if len(new):
        start_row = first_row(
            con.execute("SELECT coalesce(max(pair_id), -1) + 1 FROM matches WHERE cmp_id = ?", [cmp_id])
        )
        assert start_row is not None
        start = int(start_row[0])
        new["pair_id"] = range(start, start + len(new))
        con.register("_new_pairs", new)
        con.execute(
            "INSERT INTO matches SELECT ?, pair_id, token_id, test_token_id, golden_tensor_id, test_tensor_id, "
            "golden_node_id, test_node_id, io, method, confidence, transform FROM _new_pairs",
            [cmp_id],
        )
        con.unregister("_new_pairs")
        merged.loc[merged["pair_id"].isna(), "pair_id"] = new["pair_id"].values
    merged["pair_id"] = merged["pair_id"].astype(int)
    return merged


class _ResultSink:
    """Buffers worker results and writes them to the catalog in transactions."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        cmp_id: int,
        golden_run: int,
        test_run: int,
        judge: Callable[[dict[str, Any]], tuple[bool | None, list[str]]],
    ) -> None:
        self.con, self.cmp_id, self.golden_run, self.test_run, self.judge = con, cmp_id, golden_run, test_run, judge
        self.metric_rows: list[dict[str, Any]] = []
        self.stat_rows: list[dict[str, Any]] = []
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

    def add(self, res: dict[str, Any]) -> None:
        for pair_id, g_tid, t_tid in self.aliases.get(int(res.get("pair_id", -1)), ()):
            self.add({**res, "pair_id": pair_id, "golden_tensor_id": g_tid, "test_tensor_id": t_tid})
        if "pair_id" in res:
            self.done_pairs.add(int(res["pair_id"]))
            values = res["values"]
            passed, over = self.judge(res)
            g, t = res.get("golden") or {}, res.get("test") or {}
            row = {
                "pair_id": res["pair_id"],
                **{m: values.get(m) for m in ALL_METRICS},
                "golden_nan_count": g.get("nan_count"),
                "golden_inf_count": g.get("inf_count"),
                "my_nan_count": t.get("nan_count"),
                "my_inf_count": t.get("inf_count"),
                "finite_only": res["finite_only"],
                "passed": passed,
                "failed_metrics": ",".join(over) if over else None,
                "cmp_fail_reason": res["reason"] or None,
            }
            self.metric_rows.append(row)
            if passed is False:
                self.failed += 1
            if not values or all(values.get(m) is None for m in ALL_METRICS):
                self.uncomparable += 1
            if g:
                self.stat_rows.append(
                    {"run_id": self.golden_run, "tensor_id": res["golden_tensor_id"], **g, "error": None}
                )
            if t:
                self.stat_rows.append({"run_id": self.test_run, "tensor_id": res["test_tensor_id"], **t, "error": None})
        else:
            self.done_stats.add((int(res["run_id"]), int(res["tensor_id"])))
            s = res.get("summary") or {}
            self.stat_rows.append(
                {
                    "run_id": res["run_id"],
                    "tensor_id": res["tensor_id"],
                    **{f: s.get(f) for f in SUMMARY_FIELDS},
                    "error": res.get("error"),
                }
            )

    def flush(self) -> None:
        if not self.metric_rows and not self.stat_rows:
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


def execute_tasks(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: _ResultSink,
    *,
    workers: int,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    stage: str = "compare",
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
    claims: dict[PairKey, PairTask] | None = None,
) -> None:
    """Run tasks in a process pool (or in process when small), streaming results into the sink.

    `claims` maps pairs computed early (`early`) to the tasks that take their results.
    """
    t0 = time.perf_counter()
    if progress:
        progress(Progress(stage, 0, len(tasks)))
    if not tasks:
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

    def __init__(self, sink: _ResultSink, progress: ProgressFn | None, stage: str, total: int, t0: float) -> None:
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
    sink: _ResultSink,
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
        for res in run_batch(batch):
            sink.add(res)
        reporter.advance(len(batch))
    sink.flush()


def _run_in_pool(
    tasks: Sequence[PairTask | StatsTask],
    sizes: Sequence[int],
    sink: _ResultSink,
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
                for res in f.result():
                    sink.add(res)
            submit_more()
            reporter.advance(n_done)
    finally:
        if own_pool:
            pool.shutdown(wait=True, cancel_futures=True)
    reporter.advance(0, force_flush=True)


def _take_early(
    results: list[dict[str, Any]], early: EarlyPairs, claims: dict[PairKey, PairTask], sink: _ResultSink
) -> int:
    """Hand the claimed results of one early batch to the sink, under the claiming task's ids."""
    n = 0
    for res in results:
        task = claims.get(early.keys[int(res["pair_id"])])
        if task is not None and not sink.is_done(task):
            sink.add(
                {
                    **res,
                    "pair_id": task.pair_id,
                    "golden_tensor_id": task.golden_tensor_id,
                    "test_tensor_id": task.test_tensor_id,
                }
            )
            n += 1
    early.taken += n
    return n


def _tensor_info(frames: RunFrames) -> dict[int, tuple[str | None, str | None, Any]]:
    """tensor_id -> (path, dtype, numel) of one run (dict lookups: pandas' per-row .loc is far slower)."""
    t = frames.tensors
    return {
        int(tid): (_none(p), _none(d), _none(n))
        for tid, p, d, n in zip(t["tensor_id"], t["path"], t["dtype"], t["numel"])
    }


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
) -> tuple[int, int, int]:
    """Compute metrics for pairs without them, and stats of unpaired tensors.

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
    first_of: dict[tuple[Any, ...], int] = {}
    aliases: dict[int, list[tuple[int, int, int]]] = {}
    claims: dict[PairKey, PairTask] = {}
    if early is not None:
        early.wait_submitted()
    for pair_id, g_tid, t_tid, transform in zip(
        order["pair_id"], order["golden_tensor_id"], order["test_tensor_id"], order["transform"]
    ):
        pair_id, g_tid, t_tid, transform = int(pair_id), int(g_tid), int(t_tid), _none(transform)
        g_path, g_dtype, g_numel = g_info[g_tid]
        t_path, t_dtype, t_numel = t_info[t_tid]
        key = (file_identity(g_path), file_identity(t_path), t_dtype, transform)
        if key[0] is not None and key[1] is not None:
            if key in first_of:
                aliases.setdefault(first_of[key], []).append((pair_id, g_tid, t_tid))
                continue
            first_of[key] = pair_id
        task = PairTask(pair_id, g_path, t_path, t_dtype, g_tid, t_tid, transform)
        if early is not None and early.has(key):
            claims[key] = task
        tasks.append(task)
        sizes.append(tensor_bytes(g_numel, g_dtype) + tensor_bytes(t_numel, t_dtype))
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
        int(n): (str(nm), str(tp) if tp is not None else "")
        for n, nm, tp in zip(golden.nodes["node_id"], golden.nodes["name"], golden.nodes["type"])
    }
    pair_node = dict(zip(pairs["pair_id"].astype(int), pairs["golden_node_id"].astype(int)))
    pair_dtype = {int(p): t_info[int(tid)][1] for p, tid in zip(pairs["pair_id"], pairs["test_tensor_id"])}

    def judge(res: dict[str, Any]) -> tuple[bool | None, list[str]]:
        return _judge(thresholds, res, node_info[pair_node[res["pair_id"]]], pair_dtype[res["pair_id"]])

    sink = _ResultSink(con, cmp_id, golden.run_id, test.run_id, judge)
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
    )
    return len(todo), sink.failed, sink.uncomparable


def _judge(
    thresholds: Thresholds, res: dict[str, Any], node: tuple[str, str], dtype: str | None
) -> tuple[bool | None, list[str]]:
    """Pass/fail of one pair: NaN/Inf on the test side that the golden side does not have fails it."""
    values = res["values"]
    if not values or all(values.get(m) is None for m in ALL_METRICS):
        g, t = res.get("golden") or {}, res.get("test") or {}
        if g and t and (t.get("nan_count") or t.get("inf_count")) and not (g.get("nan_count") or g.get("inf_count")):
            return False, ["nan_inf"]
        return None, []
    g, t = res.get("golden") or {}, res.get("test") or {}
    t_bad = (t.get("nan_count") or 0) + (t.get("inf_count") or 0)
    mismatch = t_bad > 0 and (t.get("nan_count"), t.get("inf_count")) != (g.get("nan_count"), g.get("inf_count"))
    return thresholds.judge(
        values, dtype or "float32", node_name=node[0], node_type=node[1], nan_inf_mismatch=bool(mismatch)
    )


def rejudge(con: duckdb.DuckDBPyConnection, cmp_id: int, thresholds: Thresholds) -> None:
    """Apply new thresholds to every computed pair of a comparison (no tensor is read)."""
    df = con.execute(
        "SELECT x.*, gn.name AS _node, gn.type AS _type, tt.dtype AS _dtype FROM metrics x "
        "JOIN matches m USING (cmp_id, pair_id) JOIN comparisons c USING (cmp_id) "
        "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
        "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
        "WHERE x.cmp_id = ?",
        [cmp_id],
    ).df()
    if df.empty:
        return
    passed, failed = [], []
    for r in df.to_dict("records"):
        res = {
            "values": {m: _none(r[m]) for m in ALL_METRICS},
            "golden": {"nan_count": _none(r["golden_nan_count"]), "inf_count": _none(r["golden_inf_count"])},
            "test": {"nan_count": _none(r["my_nan_count"]), "inf_count": _none(r["my_inf_count"])},
        }
        p, over = _judge(thresholds, res, (str(r["_node"]), str(r["_type"] or "")), _none(r["_dtype"]))
        passed.append(p)
        failed.append(",".join(over) if over else None)
    upd = pd.DataFrame({"pair_id": df["pair_id"], "passed": pd.array(passed, dtype="boolean"), "failed": failed})
    con.register("_upd", upd)
    con.execute(
        "UPDATE metrics SET passed = u.passed, failed_metrics = u.failed FROM _upd u "
        "WHERE metrics.cmp_id = ? AND metrics.pair_id = u.pair_id",
        [cmp_id],
    )
    con.unregister("_upd")


def _none(v: Any) -> Any:
    if v is None:
        return None
    try:
        if pd.isna(v):
            return None
    except (TypeError, ValueError):
        pass
    return v


def _category(op_type: str) -> str | None:
    t = op_type.lower()
    for cat, needles in (
        ("norm", ("norm",)),
        ("attention", ("attention",)),
        ("mlp", ("mlp", "feedforward")),
        ("linear", ("linear",)),
    ):
        if any(n in t for n in needles):
            return cat
    return None


def _coverage(golden: RunFrames, test: RunFrames, matches: list[NodeMatch], pairs: pd.DataFrame) -> dict[str, Any]:
    g_with = set(golden.tensors["node_id"])
    t_with = set(test.tensors["node_id"])
    g_matched = {m.golden_node_id for m in matches} & g_with
    t_matched = {m.test_node_id for m in matches} & t_with
    by_method: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    for m in matches:  # node pairs, each once (a fused q/k/v pair is matched once per tensor selection)
        if (m.golden_node_id, m.test_node_id) in seen:
            continue
        seen.add((m.golden_node_id, m.test_node_id))
        by_method[m.method.split(":")[0]] = by_method.get(m.method.split(":")[0], 0) + 1
    # the modules a port is judged on: Linear, norm, attention and MLP blocks of the golden model
    categories: dict[str, list[int]] = {}
    for nid, typ in zip(golden.nodes["node_id"], golden.nodes["type"].fillna("")):
        cat = _category(str(typ))
        if cat and int(nid) in g_with:
            categories.setdefault(cat, [0, 0])
            categories[cat][1] += 1
            categories[cat][0] += int(nid) in g_matched
    return {
        "golden_nodes": len(g_with),
        "golden_matched": len(g_matched),
        "categories": categories,
        "test_nodes": len(t_with),
        "test_matched": len(t_matched),
        "by_method": by_method,
        "tensor_pairs": len(pairs),
    }


def run_compare(
    golden: str | Path | Dump,
    test: str | Path | Dump,
    catalog: str | Path,
    *,
    mapping: str | Path | MappingFile | None = None,
    tokens: Collection[int] | None = None,
    workers: int | None = None,
    thresholds: str | Path | Thresholds | None = None,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    auto: bool = True,
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
) -> CompareResult:
    """Read (unless given read), ingest, match and compare two dumps into `catalog`; see the module docstring.

    `pool` (from `workbench.compare.pool.new_pool`) is used and left running; without one, a pool is
    started here when the dumps are big enough and shut down at the end. With a pool, same-kind dumps
    get their same-place pairs computed while the catalog is prepared (`early`, made here if not given).
    """
    th = thresholds if isinstance(thresholds, Thresholds) else Thresholds.load(thresholds)
    mf = mapping if isinstance(mapping, MappingFile) or mapping is None else MappingFile.load(mapping)
    n_workers = workers or default_workers()
    own = pool is None and worth_a_pool(_root(golden), _root(test), n_workers)
    if own:
        pool = new_pool(n_workers)
    try:
        return _read_ingest_compare(
            golden, test, catalog, mf, tokens, th, n_workers, progress, cancel, auto, pool, early
        )
    finally:
        if own and pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _root(dump: str | Path | Dump) -> Path:
    return dump.root if isinstance(dump, Dump) else Path(dump)


def _read_ingest_compare(
    golden: str | Path | Dump,
    test: str | Path | Dump,
    catalog: str | Path,
    mf: MappingFile | None,
    tokens: Collection[int] | None,
    th: Thresholds,
    workers: int,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    auto: bool,
    pool: ProcessPoolExecutor | PoolStarter | None,
    early: EarlyPairs | None,
) -> CompareResult:
    if progress:
        progress(Progress("read dumps", 0, 2))
    g_dump = golden if isinstance(golden, Dump) else open_dump(golden)
    if progress:
        progress(Progress("read dumps", 1, 2))
    t_dump = test if isinstance(test, Dump) else open_dump(test)
    if progress:
        progress(Progress("read dumps", 2, 2))
    if early is None and pool is not None and g_dump.kind == t_dump.kind:
        early = EarlyPairs(g_dump, t_dump, pool, tokens)
    con = open_catalog(catalog)
    try:
        if progress:
            progress(Progress("ingest", 0, 2))
        g_ing = ingest_dump(con, g_dump)
        t_ing = ingest_dump(con, t_dump)
        if progress:
            progress(Progress("ingest", 2, 2))
        if cancel is not None and cancel.is_set():
            raise CompareCancelled()
        return _compare_runs(
            con,
            Path(catalog),
            g_ing.run_id,
            t_ing.run_id,
            mf,
            tokens,
            th,
            workers,
            progress,
            cancel,
            auto,
            problems=[*g_ing.problems, *t_ing.problems],
            pool=pool,
            early=early,
        )
    finally:
        con.close()
        if early is not None:
            early.cancel()  # whatever was not claimed


def _auto_matcher(auto: bool) -> Any:
    if not auto:
        return None
    try:
        from workbench.compare.automap import auto_match
    except ImportError:
        return None
    return auto_match


def _compare_runs(
    con: duckdb.DuckDBPyConnection,
    catalog: Path,
    golden_run: int,
    test_run: int,
    mapping: MappingFile | None,
    tokens: Collection[int] | None,
    thresholds: Thresholds,
    workers: int,
    progress: ProgressFn | None,
    cancel: threading.Event | None,
    auto: bool,
    problems: list[str],
    pool: ProcessPoolExecutor | PoolStarter | None = None,
    early: EarlyPairs | None = None,
) -> CompareResult:
    golden = load_frames(con, golden_run)
    test = load_frames(con, test_run)
    cmp_id, th_changed = _comparison_id(con, golden_run, test_run, mapping, thresholds)
    if progress:
        progress(Progress("match", 0, 1))
    matches = match_nodes(golden, test, mapping, auto=_auto_matcher(auto))
    _store_node_matches(con, cmp_id, matches)
    pairs = pair_tensors(matches, golden, test, tokens)
    con.execute("BEGIN TRANSACTION")
    pairs = _store_pairs(con, cmp_id, pairs) if len(pairs) else pairs.assign(pair_id=pd.Series(dtype=int))
    con.execute("COMMIT")
    if progress:
        progress(Progress("match", 1, 1, message=f"{len(pairs)} tensor pairs"))
    if th_changed:
        rejudge(con, cmp_id, thresholds)
    computed, _failed_new, _unc = compute_pending(
        con,
        cmp_id,
        golden,
        test,
        pairs,
        thresholds,
        workers=workers,
        progress=progress,
        cancel=cancel,
        pool=pool,
        early=early,
    )
    if progress:
        progress(Progress("verdict", 0, 1))
    refresh_verdicts(con, cmp_id)
    if progress:
        progress(Progress("verdict", 1, 1))
    return summarize_comparison(
        con, catalog, cmp_id, golden, test, matches, pairs, tokens, computed=computed, problems=problems
    )


def summarize_comparison(
    con: duckdb.DuckDBPyConnection,
    catalog: Path,
    cmp_id: int,
    golden: RunFrames,
    test: RunFrames,
    matches: list[NodeMatch],
    pairs: pd.DataFrame,
    tokens: Collection[int] | None,
    *,
    computed: int = 0,
    problems: list[str] | None = None,
) -> CompareResult:
    """The numbers `wb compare` prints, read back from the catalog."""
    ids = [int(x) for x in pairs["pair_id"]] if len(pairs) else []
    con.register("_ids", pd.DataFrame({"pair_id": ids}, dtype="int64"))
    row = first_row(
        con.execute(
            "SELECT count(*), count(*) FILTER (WHERE passed = false), "
            "count(*) FILTER (WHERE passed IS NULL), "
            "count(*) FILTER (WHERE cmp_fail_reason LIKE 'data shape doesn''t match%') FROM metrics "
            "WHERE cmp_id = ? AND pair_id IN (SELECT pair_id FROM _ids)",
            [cmp_id],
        )
    )
    con.unregister("_ids")
    assert row is not None
    cov = _coverage(golden, test, matches, pairs)
    res = CompareResult(
        cmp_id=cmp_id,
        catalog=catalog,
        golden_run=golden.run_id,
        test_run=test.run_id,
        pairs=len(pairs),
        computed=computed,
        skipped=len(pairs) - computed,
        failed=int(row[1]),
        uncomparable=int(row[2]),
        shape_mismatch=int(row[3]),
        unmatched_golden=cov["golden_nodes"] - cov["golden_matched"],
        unmatched_test=cov["test_nodes"] - cov["test_matched"],
        golden_nodes=cov["golden_nodes"],
        test_nodes=cov["test_nodes"],
        problems=list(problems or []),
        coverage=cov,
    )
    tok_filter = "" if tokens is None else f" AND b.token_id IN ({','.join(str(int(t)) for t in sorted(tokens))})"
    for tok, gname, tname, why in con.execute(
        "SELECT b.token_id, gn.name, tn.name, b.evidence FROM error_born b JOIN comparisons c USING (cmp_id) "
        "LEFT JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = b.golden_node_id "
        "LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = b.test_node_id "
        f"WHERE b.cmp_id = ?{tok_filter} ORDER BY b.token_id",
        [cmp_id],
    ).fetchall():
        res.born[int(tok)] = gname
        res.born_test[int(tok)] = tname
        if why:
            res.born_evidence[int(tok)] = why
    first = next((t for t, n in sorted(res.born.items()) if n is not None), None)
    res.first_failing_token = first
    return res


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
    con = open_catalog(catalog)
    try:
        row = first_row(
            con.execute("SELECT golden_run, test_run, thresholds FROM comparisons WHERE cmp_id = ?", [cmp_id])
        )
        if row is None:
            raise ValueError(f"{catalog}: no comparison {cmp_id}")
        golden, test = load_frames(con, int(row[0])), load_frames(con, int(row[1]))
        th = Thresholds.from_dict(json.loads(row[2])) if row[2] else Thresholds.load(None)
        g_names, t_names = golden.by_name(), test.by_name()
        con.execute("BEGIN TRANSACTION")
        for g, t in remove:
            gid, tid = g_names.get(g), t_names.get(t)
            if gid is None or tid is None:
                continue
            con.execute(
                "DELETE FROM metrics WHERE cmp_id = ? AND pair_id IN (SELECT pair_id FROM matches "
                "WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?)",
                [cmp_id, cmp_id, gid, tid],
            )
            con.execute(
                "DELETE FROM matches WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?", [cmp_id, gid, tid]
            )
            con.execute(
                "DELETE FROM node_matches WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?",
                [cmp_id, gid, tid],
            )
        new_matches = []
        for p in pairs:
            gid, tid = g_names.get(p.golden), t_names.get(p.test)
            if gid is None:
                raise ValueError(f"golden node {p.golden!r} is not in comparison {cmp_id}")
            if tid is None:
                raise ValueError(f"test node {p.test!r} is not in comparison {cmp_id}")
            new_matches.append(
                NodeMatch(gid, tid, "editor", 1.0, "paired in the mapping editor", p.golden_tensor, p.test_tensor)
            )
        _insert_node_matches(con, cmp_id, new_matches)
        tp = pair_tensors(new_matches, golden, test)
        before = first_row(con.execute("SELECT count(*) FROM matches WHERE cmp_id = ?", [cmp_id]))
        stored = _store_pairs(con, cmp_id, tp) if len(tp) else tp.assign(pair_id=pd.Series(dtype=int))
        after = first_row(con.execute("SELECT count(*) FROM matches WHERE cmp_id = ?", [cmp_id]))
        con.execute("COMMIT")
        compute_pending(con, cmp_id, golden, test, stored, th, workers=workers, stats_for_unpaired=False)
        refresh_verdicts(con, cmp_id)
        assert before is not None and after is not None
        return int(after[0]) - int(before[0])
    finally:
        con.close()
