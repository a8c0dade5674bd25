"""A selection that flipped: where the error is born at a `topk`, `sort` or `argmax` whose indices differ between the
runs while everything else of it agrees, whether the values it chose from were near-tied.

A MoE router's `topk` over the experts' scores, a sampler's `argmax`: the indices they output are not values with a
relative error, they pick. When two candidates' scores are closer than the error the input carries, the test run may
pick the other one though the op is right; from there on what is picked (an expert, a token) differs and every op
downstream fails on its inputs. The golden input's values at both runs' picks tell a near tie (the gap is within twice
the input's largest absolute error: one candidate up, the other down) from an op that picked wrongly (a gap its
input's error cannot explain). The line says which, as evidence under the verdict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.formats.arrays import as_float64, read_array
from workbench.formats.model import DumpError
from workbench.formats.node_names import call_name
from workbench.formats.token_ids import INT_DTYPES

if TYPE_CHECKING:
    import duckdb

# the calls whose integer output holds positions picked from their input 0 (along its last dimension, or over the
# whole of it where the output is one index)
SELECTION_CALLS = frozenset(("topk", "sort", "argsort", "argmax", "argmin", "max", "min", "kthvalue", "msort"))
MAX_SELECTION_ELEMENTS = 64 * 1024 * 1024  # a larger input is not read for this line (it only explains a verdict)


def selection_evidence(
    con: duckdb.DuckDBPyConnection, cmp_id: int, verdicts: dict[int, tuple[int | None, int | None]]
) -> dict[int, str]:
    """token -> a line on the decision that flipped where the error is born at an op whose only failing pairs are
    integer outputs: for a selection call (`SELECTION_CALLS`) whether it was a near tie, for any other op (a MoE
    router module) how many of its integer output's elements differ; none where its tensors cannot be read."""
    born = [(t, g) for t, (g, _tid) in verdicts.items() if g is not None]
    if not born:
        return {}
    # the (token, op)s with a failing integer output: the only ones whose pairs are read
    flipped = {
        (int(t), int(g))
        for t, g in con.execute(
            "SELECT DISTINCT m.token_id, m.golden_node_id FROM matches m JOIN comparisons c USING (cmp_id) "
            "JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id "
            "JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id "
            "WHERE m.cmp_id = ? AND m.io = 'out' AND x.passed = false AND list_contains(?, gt.dtype) "
            "AND list_contains(?, m.golden_node_id)",
            [cmp_id, sorted(INT_DTYPES), sorted({g for _t, g in born})],
        ).fetchall()
    }
    out: dict[int, str] = {}
    for token, gid in born:
        line = _flip_line(con, cmp_id, token, gid) if (token, gid) in flipped else None
        if line is not None:
            out[token] = line
    return out


_PAIRS_SQL = """
SELECT m.io, gt.idx, gt.dtype, x.passed, x.max_absolute_error, gt.path, tt.path, n.name, n.type
FROM matches m JOIN comparisons c USING (cmp_id)
JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = m.golden_node_id
JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id
JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id
WHERE m.cmp_id = ? AND m.token_id = ? AND m.golden_node_id = ?
ORDER BY m.io DESC, gt.idx
"""


def _flip_line(con: duckdb.DuckDBPyConnection, cmp_id: int, token: int, gid: int) -> str | None:
    rows = con.execute(_PAIRS_SQL, [cmp_id, token, gid]).fetchall()
    failing = [r for r in rows if r[3] is False]
    if not failing or any(r[0] != "out" or r[2] not in INT_DTYPES for r in failing):
        return None
    picked = failing[0]
    if not picked[5] or not picked[6]:
        return None
    name = str(rows[0][7])
    try:
        golden_idx = read_array(str(picked[5])).array
        test_idx = read_array(str(picked[6])).array
    except DumpError:
        return None
    source = next((r for r in rows if r[0] == "in" and r[1] == 0), None)
    if call_name(rows[0][8]) in SELECTION_CALLS and source is not None and source[3] is True and source[5]:
        line = _tie_line(name, str(source[5]), float(source[4] or 0.0), golden_idx, test_idx)
        if line is not None:
            return line
    if golden_idx.shape != test_idx.shape:
        return None
    differ = int(np.count_nonzero(np.asarray(golden_idx) != np.asarray(test_idx)))
    if not differ:
        return None
    return (
        f"{name}: its output {picked[1]} ({picked[2]}) differs at {differ} of {golden_idx.size} elements while its "
        "other outputs and its inputs pass: a discrete choice that flipped (experts, tokens picked), near-tied "
        "candidates decided by rounding or a wrong pick; the values it chose between are not dumped to tell which"
    )


def _tie_line(name: str, source_path: str, err: float, golden_idx: np.ndarray, test_idx: np.ndarray) -> str | None:
    """The near tie or wrong pick of a selection call, from its golden input (`source_path`, whose largest absolute
    error is `err`) at both runs' picks; None where its shapes say no selection this reads."""
    try:
        values = read_array(source_path)
    except DumpError:
        return None
    if values.numel > MAX_SELECTION_ELEMENTS:
        return None
    flips = _flips(as_float64(values.array, values.dtype), golden_idx, test_idx)
    if flips is None:
        return None
    n_flipped, n_picks, g_pick, t_pick, g_value, t_value, gap, out_of_range = flips
    if out_of_range:
        return f"{name} picked positions outside its input at {out_of_range} of {n_picks} picks: the op selects wrongly"
    where = (
        f"at {n_flipped} of {n_picks} picks the test run chose position {t_pick} where the golden chose {g_pick} "
        f"(golden values {g_value:.6g} and {t_value:.6g}, {gap:.3g} apart"
    )
    if gap <= 2 * err:
        return (
            f"{name}: a near tie flipped: {where}, within twice its input's error of {err:.3g} an element): it selects "
            "correctly from what it was given; what it selects (experts, tokens) differs from here on"
        )
    return f"{name} selects wrongly: {where}, more than twice its input's error of {err:.3g} an element)"


def _flips(
    values: np.ndarray, golden_idx: np.ndarray, test_idx: np.ndarray
) -> tuple[int, int, int, int, float, float, float, int] | None:
    """(flipped picks, picks, golden and test position and golden value at the widest flip, its gap, picks out of
    range) of two runs' indices into `values` (the golden input); None where the shapes say no selection along its
    last dimension or over the whole of it."""
    if golden_idx.shape != test_idx.shape or not golden_idx.size:
        return None
    g_idx = np.asarray(golden_idx, dtype=np.int64)
    t_idx = np.asarray(test_idx, dtype=np.int64)
    if g_idx.size == 1 and values.ndim != g_idx.ndim:  # over the whole input (argmax without a dimension)
        rows: Any = values.reshape(1, -1)
        g_idx, t_idx = g_idx.reshape(1, 1), t_idx.reshape(1, 1)
    elif values.ndim == g_idx.ndim and values.shape[:-1] == g_idx.shape[:-1]:  # topk, sort, keepdim
        rows = values.reshape(-1, values.shape[-1])
        g_idx, t_idx = g_idx.reshape(len(rows), -1), t_idx.reshape(len(rows), -1)
    elif values.ndim == g_idx.ndim + 1 and values.shape[:-1] == g_idx.shape:  # argmax(dim=-1)
        rows = values.reshape(-1, values.shape[-1])
        g_idx, t_idx = g_idx.reshape(-1, 1), t_idx.reshape(-1, 1)
    else:
        return None
    width = rows.shape[1]
    bad = (t_idx < 0) | (t_idx >= width) | (g_idx < 0) | (g_idx >= width)
    if bad.any():
        return 0, int(g_idx.size), 0, 0, 0.0, 0.0, 0.0, int(bad.sum())
    flipped = g_idx != t_idx
    if not flipped.any():
        return None
    r = np.arange(len(rows))[:, None]
    g_val, t_val = rows[r, g_idx], rows[r, t_idx]
    gaps = np.where(flipped, np.abs(g_val - t_val), -1.0)
    at = np.unravel_index(int(np.argmax(gaps)), gaps.shape)
    return (
        int(flipped.sum()),
        int(g_idx.size),
        int(g_idx[at]),
        int(t_idx[at]),
        float(g_val[at]),
        float(t_val[at]),
        float(gaps[at]),
        0,
    )
