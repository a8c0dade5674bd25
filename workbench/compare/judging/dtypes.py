"""What a test run computes in, and which of its tensors are more precise than that: the one home of the fact the
judge, a re-judge, the carried-in rule, the advisor and the app read."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb

# floating dtypes from the tightest bounds to the loosest
PRECISION = ("float64", "float32", "float16", "bfloat16")


def compute_dtype(dtypes: Iterable[str | None]) -> str | None:
    """The floating dtype most of a run's tensors have: what a bf16 model computes in, although some of its ops
    (RMSNorm's variance, softmax) upcast to float32 and so carry bf16 error in float32 tensors. A tie goes to the
    name first in order, as `compared_compute_dtype` breaks it."""
    counts = Counter(d for d in dtypes if d in PRECISION)
    return min(counts, key=lambda d: (-counts[d], d)) if counts else None


def compared_compute_dtype(con: duckdb.DuckDBPyConnection, cmp_id: int) -> str | None:
    """`compute_dtype` of the test tensors paired at a comparison's first token (computed or not): the one answer
    to "what does the test run compute in". The first token (the prompt's) runs every op a later one does; one
    token is ~4 ms at 1.9M pairs, every pair 0.12 s."""
    found = con.execute(
        "SELECT tt.dtype FROM matches m JOIN comparisons c USING (cmp_id) "
        "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
        "WHERE m.cmp_id = ? AND m.token_id = (SELECT min(token_id) FROM matches WHERE cmp_id = ?) "
        f"AND tt.dtype IN ({', '.join('?' * len(PRECISION))}) "
        "GROUP BY tt.dtype ORDER BY count(*) DESC, tt.dtype LIMIT 1",
        [cmp_id, cmp_id, *PRECISION],
    ).fetchone()
    return str(found[0]) if found else None


def looser(a: str | None, b: str | None) -> str | None:
    """The less precise of two floating dtypes (the one given where the other is not floating)."""
    if a not in PRECISION or b not in PRECISION:
        return a or b
    return max(a, b, key=PRECISION.index)


def more_precise(dtype: str | None, run_dtype: str | None) -> bool:
    """Whether a tensor of `dtype` is more precise than its run computes in (float32 in a bfloat16 run)."""
    return dtype in PRECISION and run_dtype in PRECISION and looser(dtype, run_dtype) != dtype


def more_precise_than(run_dtype: str | None) -> list[str]:
    """The floating dtypes more precise than `run_dtype` (none where it is not floating)."""
    return [d for d in PRECISION if more_precise(d, run_dtype)]
