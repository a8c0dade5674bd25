"""Pass/fail of a tensor pair: the typed result of one computed pair, the one NaN/Inf rule, re-judging.

The worker sends plain dicts (cheap to pickle, see `compare.worker`); `result_from_wire` turns each into a
`PairResult` or a `StatsResult` as it arrives. `judge_pair` is the one place a pair's verdict is decided:
the compare sink, `rejudge` (new thresholds, no tensor read) and the ATB precheck all call it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from workbench.compare.tasks import SUMMARY_FIELDS
from workbench.compare.thresholds import NAN_INF, Thresholds
from workbench.core.metrics import ALL_METRICS

if TYPE_CHECKING:
    import duckdb

Stats = dict[str, Any]  # one tensor's statistics, keyed by `SUMMARY_FIELDS`


@dataclass(frozen=True, slots=True)
class PairResult:
    """The metrics of one golden/test pair and both sides' statistics (None: that side was unreadable)."""

    pair_id: int
    golden_tensor_id: int
    test_tensor_id: int
    values: dict[str, float | None]
    finite_only: bool
    reason: str | None
    golden: Stats | None = None
    test: Stats | None = None

    @property
    def comparable(self) -> bool:
        """Whether any metric could be computed."""
        return any(self.values.get(m) is not None for m in ALL_METRICS)

    def under(self, pair_id: int, golden_tensor_id: int, test_tensor_id: int) -> PairResult:
        """The same numbers for another pair that reads the same files."""
        return replace(self, pair_id=pair_id, golden_tensor_id=golden_tensor_id, test_tensor_id=test_tensor_id)


@dataclass(frozen=True, slots=True)
class StatsResult:
    """The statistics of one tensor no pair covers; `error` says why there are none."""

    run_id: int
    tensor_id: int
    summary: Stats | None
    error: str | None


def result_from_wire(res: dict[str, Any]) -> PairResult | StatsResult:
    """The typed form of one result dict of `compare.worker.run_batch`."""
    if "pair_id" in res:
        return PairResult(
            int(res["pair_id"]),
            int(res["golden_tensor_id"]),
            int(res["test_tensor_id"]),
            res.get("values") or {},
            bool(res.get("finite_only")),
            res.get("reason") or None,
            res.get("golden") or None,
            res.get("test") or None,
        )
    summary = res.get("summary")
    return StatsResult(
        int(res["run_id"]),
        int(res["tensor_id"]),
        {f: summary.get(f) for f in SUMMARY_FIELDS} if summary else None,
        res.get("error"),
    )


def nan_inf_mismatch(golden: Stats | None, test: Stats | None) -> bool:
    """The test side has NaN/Inf and not exactly the golden side's counts of them (the one NaN/Inf rule)."""
    if not golden or not test:
        return False
    t_nan, t_inf = test.get("nan_count") or 0, test.get("inf_count") or 0
    g_nan, g_inf = golden.get("nan_count") or 0, golden.get("inf_count") or 0
    return t_nan + t_inf > 0 and (t_nan, t_inf) != (g_nan, g_inf)


def judge_pair(
    thresholds: Thresholds,
    values: dict[str, float | None],
    golden: Stats | None,
    test: Stats | None,
    dtype: str | None,
    *,
    node_name: str = "",
    node_type: str = "",
) -> tuple[bool | None, list[str]]:
    """(passed, failed metrics) of one pair. A NaN/Inf mismatch fails it, even when no metric is computable."""
    mismatch = nan_inf_mismatch(golden, test)
    passed, failed = thresholds.judge(
        values, dtype or "float32", node_name=node_name, node_type=node_type, nan_inf_mismatch=mismatch
    )
    if mismatch and passed is None:
        return False, [NAN_INF]
    return passed, failed


def rejudge(con: duckdb.DuckDBPyConnection, cmp_id: int, thresholds: Thresholds) -> None:
    """Apply new thresholds to every computed pair of a comparison (no tensor is read)."""
    import pandas as pd

    from workbench.compare.pair_store import none_if_na

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
        p, over = judge_pair(
            thresholds,
            {m: none_if_na(r[m]) for m in ALL_METRICS},
            {"nan_count": none_if_na(r["golden_nan_count"]), "inf_count": none_if_na(r["golden_inf_count"])},
            {"nan_count": none_if_na(r["my_nan_count"]), "inf_count": none_if_na(r["my_inf_count"])},
            none_if_na(r["_dtype"]),
            node_name=str(r["_node"]),
            node_type=str(r["_type"] or ""),
        )
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
