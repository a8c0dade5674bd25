"""What an in-place call overwrites, before the write: one rule in Python (the judge) and in SQL (the summary and the
rank view), judged nowhere."""

from __future__ import annotations

import duckdb
import pytest

from workbench.compare.judging.judge import judge_pair
from workbench.compare.judging.thresholds import Thresholds
from workbench.formats.overwrites import OVERWRITING_CALLS, overwritten_target, overwritten_target_sql

CASES = [
    (op_type, io, idx)
    for op_type in (
        "Tensor.__setitem__",
        "Tensor.copy_",
        "Torch.zero_",
        "Tensor.add_",  # reads its target
        "Tensor.masked_fill_",  # what it keeps feeds its output
        "Functional.linear",
        "Tensor.__SETITEM__",
        "setitem",
        None,
    )
    for io in ("in", "out")
    for idx in (0, 1)
]


def test_the_sql_condition_is_the_python_rule() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (type VARCHAR, io VARCHAR, idx BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", CASES)
    in_sql = con.execute(
        f"SELECT type, io, idx, coalesce({overwritten_target_sql('type', 'io', 'idx')}, false) FROM t"
    ).fetchall()
    con.close()
    assert [(t, io, idx, overwritten_target(t, io, idx)) for t, io, idx in CASES] == in_sql
    assert {r[0] for r in in_sql if r[3]} == {"Tensor.__setitem__", "Tensor.copy_", "Torch.zero_", "Tensor.__SETITEM__"}


@pytest.mark.parametrize("nan_on_test_side", [False, True])
def test_an_overwritten_target_is_not_judged_whatever_it_holds(nan_on_test_side: bool) -> None:
    """Leftover bytes are anything: cosine 0.27 and a NaN the golden buffer lacks alike leave it unjudged; the same
    numbers on a tensor the call reads fail."""
    th = Thresholds.load()
    values = {"cosine_similarity": 0.27, "relative_euclidean_distance": 1.23}
    test = {"nan_count": 1 if nan_on_test_side else 0, "inf_count": 0}
    golden = {"nan_count": 0, "inf_count": 0}
    kw = {"node_name": "Tensor.__setitem__.0.forward", "node_type": "Tensor.__setitem__", "io": "in"}
    assert judge_pair(th, values, golden, test, "int64", overwritten=True, **kw) == (None, [])
    passed, failed = judge_pair(th, values, golden, test, "int64", **kw)
    assert passed is False and failed, failed
    assert "__setitem__" in OVERWRITING_CALLS and "add_" not in OVERWRITING_CALLS
