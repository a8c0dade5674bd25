"""Pass/fail of a tensor pair: the typed result of one computed pair, the one NaN/Inf rule, re-judging.

The worker sends plain dicts (cheap to pickle, see `compare.execution.worker`); `result_from_wire` turns each into a
`PairResult` or a `StatsResult` as it arrives. `judge_pair` is the one place a pair's verdict is decided:
the compare sink, `rejudge` (new thresholds, no tensor read) and the ATB precheck all call it.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from workbench.compare.judging.carried import carried_errors
from workbench.compare.judging.dtypes import compared_compute_dtype, looser, more_precise, more_precise_than
from workbench.compare.judging.gain import carried_gain
from workbench.compare.judging.thresholds import NAN_INF, Thresholds
from workbench.core.metrics import ALL_METRICS, REL_EUCLID, STAT_BOUND, SUMMARY_FIELDS
from workbench.formats.overwrites import overwritten_target

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
    stat_values: dict[str, float | None] | None = None  # `STAT_METRICS` (every pair; the only ones on statistics)

    @property
    def comparable(self) -> bool:
        """Whether any metric (tensor or statistics) could be computed."""
        return any(self.values.get(m) is not None for m in ALL_METRICS) or self.on_statistics

    @property
    def on_statistics(self) -> bool:
        """No tensor metric, but statistics ones: a side of a statistics-only dump."""
        return not any(self.values.get(m) is not None for m in ALL_METRICS) and any(
            v is not None for v in (self.stat_values or {}).values()
        )

    def under(self, pair_id: int, golden_tensor_id: int, test_tensor_id: int) -> PairResult:
        """The same numbers for another pair that reads the same files."""
        # built directly: `dataclasses.replace` inspects the fields on every call (~5 us, once per pair)
        return PairResult(
            pair_id,
            golden_tensor_id,
            test_tensor_id,
            self.values,
            self.finite_only,
            self.reason,
            self.golden,
            self.test,
            self.stat_values,
        )


@dataclass(frozen=True, slots=True)
class StatsResult:
    """The statistics of one tensor no pair covers; `error` says why there are none."""

    run_id: int
    tensor_id: int
    summary: Stats | None
    error: str | None


def result_from_wire(res: dict[str, Any]) -> PairResult | StatsResult:
    """The typed form of one result dict of `compare.execution.worker.run_batch`."""
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
            res.get("stat_values") or None,
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


_Node = TypeVar("_Node")


def model_node(roots: Collection[_Node]) -> _Node | None:
    """The node whose output is the model's own (judged by the rules with `model_output`, the logits rule), of a
    run's root nodes: its root when it has exactly one (msit's `root`). A run whose top level holds several nodes
    (msprobe's modules; at its `level: L1`, every torch call) has none: a top-level call's output is not the model's."""
    return next(iter(roots)) if len(roots) == 1 else None


def judge_pair(
    thresholds: Thresholds,
    values: dict[str, float | None],
    golden: Stats | None,
    test: Stats | None,
    dtype: str | None,
    *,
    node_name: str = "",
    node_type: str = "",
    io: str = "out",
    is_model: bool = False,
    stat_bound: float | None = None,
    run_dtype: str | None = None,
    carried_in: float | None = None,
    numel: int | None = None,
    overwritten: bool = False,
) -> tuple[bool | None, list[str]]:
    """(passed, failed metrics) of one pair. A NaN/Inf mismatch fails it, even when no metric is computable.
    `overwritten`: the pair is what an in-place call overwrites, before the write (`overwrites.overwritten_target`):
    not judged (None), NaN/Inf or not.

    `io` says whether the pair is a node's input or output (rules such as the logits rule judge outputs
    only); `is_model` marks the model's own output (`model_node`). A pair without tensor metrics is
    judged on its statistics (`stat_bound`, `stat_rel_euclid_bound`) against the looser of its own dtype and
    the run's compute dtype (`run_dtype`): statistics cannot tell an upcast op's own error from the error its
    input carried in, which the tensor metrics of its inputs would show.

    A tensor more precise than the run computes in (`more_precise`: RMSNorm's float32 variance in a bfloat16 run)
    carries its bfloat16 inputs' error: as a node's input it is judged by the run's dtype (it holds what ran
    before); as an output, failing its own dtype's bounds, it passes by the run's dtype's when its relative
    euclidean distance is at most `carried_gain(numel, node_type)` times `carried_in`, its node's inputs' largest at
    this token (it adds no error of its own; `judge_carried` gives it; `numel`: the output's element count).
    """
    if overwritten:
        return None, []
    if stat_bound is not None and not any(values.get(m) is not None for m in ALL_METRICS):
        return thresholds.judge_statistics(
            stat_bound,
            looser(dtype, run_dtype) or "float32",
            node_name=node_name,
            node_type=node_type,
            io=io,
            is_model=is_model,
        )
    mismatch = nan_inf_mismatch(golden, test)
    passed, failed = thresholds.judge(
        values,
        (looser(dtype, run_dtype) if io == "in" else dtype) or "float32",
        node_name=node_name,
        node_type=node_type,
        nan_inf_mismatch=mismatch,
        io=io,
        is_model=is_model,
    )
    if mismatch and passed is None:
        return False, [NAN_INF]
    if passed is False and io == "out" and carried_in is not None and more_precise(dtype, run_dtype):
        distance = values.get(REL_EUCLID)
        if distance is not None and distance <= carried_gain(numel, node_type) * carried_in:
            by_run, _over = thresholds.judge(
                values, run_dtype, node_name=node_name, node_type=node_type, io=io, is_model=is_model
            )
            if by_run:
                return True, []
    return passed, failed


def judge_carried(
    con: duckdb.DuckDBPyConnection, cmp_id: int, thresholds: Thresholds, run_dtype: str | None = None
) -> int:
    """Judge again, with what their node's inputs carried in (`carried.carried_errors`), the failing outputs more
    precise than the run computes in (`run_dtype`, else `compared_compute_dtype`); returns how many now pass. Run
    after every pair of the comparison is judged: an output's inputs are other pairs, computed in any order."""
    from workbench.catalog.store import int_column, registered

    run_dtype = run_dtype or compared_compute_dtype(con, cmp_id)
    precise = more_precise_than(run_dtype)
    if not precise:
        return 0
    records = _pair_records(
        con,
        f"{_PAIR_RECORDS_SQL} AND m.io = 'out' AND x.passed = false AND tt.dtype IN ({', '.join('?' * len(precise))})",
        [cmp_id, *precise],
    )
    if not records:
        return 0
    carried = carried_errors(con, cmp_id, {(int(r["_token"]), int(r["_node_id"])) for r in records}, run_dtype)
    model = _model_of(con, cmp_id)
    now_pass = []
    for r in records:
        c = carried.get((int(r["_token"]), int(r["_node_id"])))
        if c is not None and _judge_record(thresholds, r, model, run_dtype, carried_in=c.rel_euclid)[0]:
            now_pass.append(int(r["pair_id"]))
    if now_pass:
        with registered(con, "_carried", {"pair_id": int_column(now_pass)}):
            con.execute(
                "UPDATE metrics SET passed = true, failed_metrics = NULL FROM _carried k "
                "WHERE metrics.cmp_id = ? AND metrics.pair_id = k.pair_id",
                [cmp_id],
            )
    return len(now_pass)


# every computed pair of a comparison (parameter: its cmp_id) with what judges it: its metrics, statistics bound,
# golden node, io, token and test dtype (`_judge_record`); a caller may add conditions
_PAIR_RECORDS_SQL = (
    f"SELECT x.*, s.{STAT_BOUND} AS _stat_bound, gn.name AS _node, gn.type AS _type, "
    "gn.node_id AS _node_id, m.io AS _io, m.token_id AS _token, tt.dtype AS _dtype, tt.idx AS _idx, "
    "tt.numel AS _numel "
    "FROM metrics x LEFT JOIN stat_metrics s USING (cmp_id, pair_id) "
    "JOIN matches m USING (cmp_id, pair_id) JOIN comparisons c USING (cmp_id) "
    "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
    "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
    "WHERE x.cmp_id = ?"
)


def _pair_records(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any]) -> list[dict[str, Any]]:
    result = con.execute(sql, params)
    names = [d[0] for d in result.description]
    return [dict(zip(names, row)) for row in result.fetchall()]


def _model_of(con: duckdb.DuckDBPyConnection, cmp_id: int) -> tuple[Any, ...] | None:
    """The comparison's model node (`model_node` of its golden run's roots), as a row holding its id."""
    return model_node(
        con.execute(
            "SELECT n.node_id FROM nodes n JOIN comparisons c ON n.run_id = c.golden_run "
            "WHERE c.cmp_id = ? AND n.parent_id IS NULL",
            [cmp_id],
        ).fetchall()
    )


def _judge_record(
    thresholds: Thresholds,
    r: dict[str, Any],
    model: tuple[Any, ...] | None,
    run_dtype: str | None,
    carried_in: float | None = None,
) -> tuple[bool | None, list[str]]:
    """`judge_pair` of one row of `_PAIR_RECORDS_SQL`."""
    return judge_pair(
        thresholds,
        {m: none_if_na(r[m]) for m in ALL_METRICS},
        {"nan_count": none_if_na(r["golden_nan_count"]), "inf_count": none_if_na(r["golden_inf_count"])},
        {"nan_count": none_if_na(r["my_nan_count"]), "inf_count": none_if_na(r["my_inf_count"])},
        none_if_na(r["_dtype"]),
        node_name=str(r["_node"]),
        node_type=str(r["_type"] or ""),
        io=str(r["_io"]),
        is_model=model is not None and r["_node_id"] == model[0],
        stat_bound=r["_stat_bound"],  # NaN (NaN/Inf statistics) fails; None judges nothing
        run_dtype=run_dtype,
        carried_in=carried_in,
        numel=none_if_na(r["_numel"]),
        overwritten=overwritten_target(r["_type"], str(r["_io"]), int(r["_idx"])),
    )


# The rules that decide a pair's verdict beyond the thresholds' numbers, numbered: a comparison judged by older rules
# (an older wb) is judged again the next time it is compared, as after a `--thresholds` change. 2: the model's output
# is the run's one root's; 3: tensors more precise than the run judged with what they carried in; 4: with the outputs
# before them where no input was dumped, and one definition of the run's compute dtype; 5: what an in-place call
# overwrites, before the write, not judged; 6: the carried-in gain stretched for outputs of few elements.
JUDGE_RULES = 6


def _rules_key(cmp_id: int) -> str:
    return f"judge_rules:{cmp_id}"


def judged_by_older_rules(con: duckdb.DuckDBPyConnection, cmp_id: int) -> bool:
    """Whether a comparison's verdicts were decided by rules older than `JUDGE_RULES` (or it has none yet)."""
    row = con.execute("SELECT value FROM meta WHERE key = ?", [_rules_key(cmp_id)]).fetchone()
    return row is None or not str(row[0]).isdigit() or int(row[0]) < JUDGE_RULES


def mark_judged(con: duckdb.DuckDBPyConnection, cmp_id: int) -> None:
    """Record that every pair of a comparison was judged by the current rules."""
    con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [_rules_key(cmp_id), str(JUDGE_RULES)])


def rejudge(con: duckdb.DuckDBPyConnection, cmp_id: int, thresholds: Thresholds) -> None:
    """Apply new thresholds, and the current rules (`JUDGE_RULES`, recorded), to every computed pair of a comparison
    (no tensor is read)."""
    from workbench.catalog.store import bool_column, int_column, object_column, registered

    records = _pair_records(con, _PAIR_RECORDS_SQL, [cmp_id])
    mark_judged(con, cmp_id)
    if not records:
        return
    run_dtype = compared_compute_dtype(con, cmp_id)
    model = _model_of(con, cmp_id)
    passed, failed = [], []
    for r in records:
        p, over = _judge_record(thresholds, r, model, run_dtype)
        passed.append(p)
        failed.append(",".join(over) if over else None)
    upd = {
        "pair_id": int_column([r["pair_id"] for r in records]),
        "passed": bool_column(passed),
        "failed": object_column(failed),
    }
    with registered(con, "_upd", upd):
        con.execute(
            "UPDATE metrics SET passed = u.passed, failed_metrics = u.failed FROM _upd u "
            "WHERE metrics.cmp_id = ? AND metrics.pair_id = u.pair_id",
            [cmp_id],
        )


def none_if_na(v: Any) -> Any:
    """None for None and NaN (a metric stored as NaN counts as missing); `v` otherwise."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
