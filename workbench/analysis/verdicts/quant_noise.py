"""Quantization noise: what error each quantized linear of a test run is expected to add, and why it adds more.

For a linear `Y = X W^T` quantized on a symmetric (or asymmetric) int8 grid, rounding adds to each element an
error uniform over one step: variance `scale^2 / 12`. Independent errors add up, so the expected relative
error of the output, from the linear's own scales and the golden input and output (one token's rows):

    weights (per-channel scales s_o):     ||s_w|| * ||X|| / (sqrt(12) * ||Y||)
    activations (per-token scales s_t):   ||W||_F * ||s_x|| / (sqrt(12) * ||Y||)        (W8A8 only)
    expected = sqrt(weights^2 + activations^2)

Values beyond the grid's range are clipped, not rounded: that error is not expected of a good recipe. An op
whose added error exceeds the expectation (`STANDS_OUT` times) is a finding, and the reason says which:

- `clipping`: the golden input holds values beyond the int8 range of its per-token scale (and offset), and
  their clipped energy exceeds the grid's rounding;
- `weight scale`: weight channels pile up at +-127 where a correct symmetric scale puts one element (the
  channel's max): those scales are too small for the data;
- `offset`: the op has an activation offset and its int8 activations dequantize with it to well within
  what the op adds (less than half): the offset is applied twice (or not at all) in the matmul;
- otherwise the error is beyond what its scales explain, cause unknown.

An op whose error is what its scales predict but `STANDS_OUT` times what the same op's quantization is
expected to add in the other layers is noisy by design (outliers stretch the grid): keep it in float.

The int tensors, scales and offsets are found by the manifest's `quant` entry (`formats/quant_links.py`).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace

import duckdb
import numpy as np

from workbench.analysis.verdicts.causes import CAUSE_LEAD
from workbench.catalog import first_row
from workbench.core.advice import STANDS_OUT
from workbench.core.median import median
from workbench.formats.arrays import read_array
from workbench.formats.model import DumpError
from workbench.formats.quant_links import QuantLinear, TensorRef, quant_links

SQRT12 = math.sqrt(12.0)
QMAX = 127


@dataclass(frozen=True, slots=True)
class QuantExpect:
    """What one quantized linear is expected to add at one token, and what its tensors show."""

    linear: str
    expected: float  # expected relative error of its output from rounding alone
    weight_part: float
    act_part: float
    clip: float  # relative energy of the golden input beyond the int8 range (0: none)
    saturated: int  # weight channels with 3 or more elements at +-127
    channels: int
    act_err: float | None  # measured error of its dequantized int8 activations (W8A8)
    has_offset: bool
    peer_ratio: float = 0.0  # expected / the same op's expected in the other layers (median)


def quant_expectations(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[tuple[int, int], QuantExpect]:
    """(token, golden node id) -> the expectation of each quantized linear of comparison `cmp_id` ({} when the
    test run declares no quantized linear)."""
    row = first_row(
        con.execute(
            "SELECT c.golden_run, c.test_run, r.meta FROM comparisons c JOIN runs r ON r.run_id = c.test_run "
            "WHERE c.cmp_id = ?",
            [cmp_id],
        )
    )
    if row is None or row[2] is None:
        return {}
    golden_run, test_run = int(row[0]), int(row[1])
    try:
        meta = json.loads(row[2]) if isinstance(row[2], str) else row[2]
        _links, linears = quant_links(meta) if isinstance(meta, dict) else ([], [])
    except ValueError:
        return {}
    if not linears:
        return {}
    g_ids = dict(con.execute("SELECT name, node_id FROM nodes WHERE run_id = ?", [golden_run]).fetchall())
    t_ids = dict(con.execute("SELECT name, node_id FROM nodes WHERE run_id = ?", [test_run]).fetchall())
    g_t = _tensors(con, golden_run)
    t_t = _tensors(con, test_run)
    act_err = _act_errors(con, cmp_id)
    out: dict[tuple[int, int], QuantExpect] = {}
    for lin in linears:
        gid = g_ids.get(lin.name)
        if gid is None:
            continue
        weight = _weight(lin, t_ids, t_t)
        if weight is None:
            continue
        w_fro, saturated, channels = weight
        for tok in sorted({k[1] for k in g_t if k[0] == gid}):
            e = _expect(lin, int(gid), tok, w_fro, saturated, channels, g_t, t_t, t_ids, act_err)
            if e is not None:
                out[(tok, int(gid))] = e
    return _with_peers(out, {int(v): str(k) for k, v in g_ids.items()})


_Key = tuple[int, int, str, int]  # node id, token, io, index


def _tensors(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[_Key, tuple[str | None, float | None]]:
    return {
        (int(n), int(t), str(io), int(i)): (None if p is None else str(p), None if nm is None else float(nm))
        for n, t, io, i, p, nm in con.execute(
            "SELECT node_id, token_id, io, idx, path, norm FROM tensors WHERE run_id = ?", [run_id]
        ).fetchall()
    }


def _act_errors(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[tuple[int, int], float]:
    """(token, golden node) -> measured error of its dequantized int8 activations (the `quant` input pairs)."""
    return {
        (int(t), int(g)): float(e)
        for t, g, e in con.execute(
            "SELECT m.token_id, m.golden_node_id, max(x.relative_euclidean_distance) FROM matches m "
            "JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id "
            "WHERE m.cmp_id = ? AND m.method = 'quant' AND m.io = 'in' GROUP BY 1, 2",
            [cmp_id],
        ).fetchall()
        if e is not None
    }


def _array(
    ref: TensorRef | None, tok: int, ids: dict[str, int], tensors: dict[_Key, tuple[str | None, float | None]]
) -> np.ndarray | None:
    if ref is None or ref.node not in ids:
        return None
    path = tensors.get((int(ids[ref.node]), tok, ref.io, ref.index), (None, None))[0]
    if path is None:
        return None
    try:
        return read_array(path).array.astype(np.float64)
    except DumpError:
        return None


def _first_token(
    ref: TensorRef, ids: dict[str, int], tensors: dict[_Key, tuple[str | None, float | None]]
) -> int | None:
    nid = ids.get(ref.node)
    toks = sorted(k[1] for k in tensors if k[0] == nid and k[2] == ref.io and k[3] == ref.index)
    return toks[0] if toks else None


def _weight(
    lin: QuantLinear, t_ids: dict[str, int], t_t: dict[_Key, tuple[str | None, float | None]]
) -> tuple[float, int, int] | None:
    """(||W||_F of the dequantized weight, saturated channels, channels) from the first token's dump."""
    tok = _first_token(lin.weight, t_ids, t_t)
    if tok is None:
        return None
    q, s = _array(lin.weight, tok, t_ids, t_t), _array(lin.weight_scale, tok, t_ids, t_t)
    if q is None or s is None or q.ndim != 2:
        return None
    s = s.reshape(-1)
    w_fro = float(np.sqrt(((q * q).sum(axis=1) * s * s).sum()))
    # a correct symmetric scale puts about one element per channel at +-127
    saturated = int(((np.abs(q) >= QMAX).sum(axis=1) >= max(3, q.shape[1] // 64)).sum())
    return w_fro, saturated, int(q.shape[0])


def _expect(
    lin: QuantLinear,
    gid: int,
    tok: int,
    w_fro: float,
    saturated: int,
    channels: int,
    g_t: dict[_Key, tuple[str | None, float | None]],
    t_t: dict[_Key, tuple[str | None, float | None]],
    t_ids: dict[str, int],
    act_err: dict[tuple[int, int], float],
) -> QuantExpect | None:
    x_path, x_norm = g_t.get((gid, tok, "in", 0), (None, None))
    _y_path, y_norm = g_t.get((gid, tok, "out", 0), (None, None))
    ws_norm = _norm(lin.weight_scale, tok, t_ids, t_t)
    if not x_norm or not y_norm or ws_norm is None:
        return None
    weight_part = ws_norm * x_norm / (SQRT12 * y_norm)
    act_part, clip = 0.0, 0.0
    if lin.activation_scale is not None:
        xs_norm = _norm(lin.activation_scale, tok, t_ids, t_t)
        act_part = w_fro * (xs_norm or 0.0) / (SQRT12 * y_norm)
        clip = _clipped(x_path, lin, tok, t_ids, t_t)
    return QuantExpect(
        lin.name,
        math.hypot(weight_part, act_part),
        weight_part,
        act_part,
        clip,
        saturated,
        channels,
        act_err.get((tok, gid)),
        lin.activation_offset is not None,
    )


def _norm(
    ref: TensorRef, tok: int, ids: dict[str, int], tensors: dict[_Key, tuple[str | None, float | None]]
) -> float | None:
    nid = ids.get(ref.node)
    if nid is None:
        return None
    hit = tensors.get((int(nid), tok, ref.io, ref.index))
    if hit is None:  # a weight scale dumped at one token only
        first = _first_token(ref, ids, tensors)
        hit = None if first is None else tensors.get((int(nid), first, ref.io, ref.index))
    return None if hit is None else hit[1]


def _clipped(
    x_path: str | None,
    lin: QuantLinear,
    tok: int,
    t_ids: dict[str, int],
    t_t: dict[_Key, tuple[str | None, float | None]],
) -> float:
    """Relative energy of the golden input beyond the int8 range its per-token scale (and offset) covers."""
    if x_path is None:
        return 0.0
    try:
        x = read_array(x_path).array.astype(np.float64)
    except DumpError:
        return 0.0
    s = _array(lin.activation_scale, tok, t_ids, t_t)
    if s is None:
        return 0.0
    z = _array(lin.activation_offset, tok, t_ids, t_t)
    lo, hi = ((-QMAX - 1 - z) * s, (QMAX - z) * s) if z is not None else (-QMAX * s, QMAX * s)
    try:
        beyond = x - np.clip(x, lo, hi)
    except ValueError:
        return 0.0
    total = float(np.linalg.norm(x))
    return float(np.linalg.norm(beyond)) / total if total > 0 else 0.0


_LAYER_RE = re.compile(r"\.(\d+)\.")


def _with_peers(out: dict[tuple[int, int], QuantExpect], names: dict[int, str]) -> dict[tuple[int, int], QuantExpect]:
    """Each expectation with its ratio to the same op's expectation in the other layers (median)."""
    groups: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for tok, gid in out:
        groups[(tok, _LAYER_RE.sub(".*.", names.get(gid, ""), count=1))].append((tok, gid))
    res: dict[tuple[int, int], QuantExpect] = {}
    for keys in groups.values():
        for k in keys:
            others = [out[o].expected for o in keys if o != k]
            med = median(others) if len(others) >= 2 else 0.0
            e = out[k]
            res[k] = replace(e, peer_ratio=e.expected / med if med > 0 else 0.0)
    return res


def expected_below(quant: dict[int, QuantExpect], parent: dict[int, int | None]) -> dict[int, float]:
    """node -> the quantization noise its quantized descendants are expected to add together (in quadrature)."""
    acc: dict[int, float] = defaultdict(float)
    for gid, e in quant.items():
        p, seen = parent.get(gid), 0
        while p is not None and seen < 10_000:
            acc[p] += e.expected * e.expected
            p, seen = parent.get(p), seen + 1
    return {g: math.sqrt(v) for g, v in acc.items()}


def judge(e: QuantExpect, own: float, floor: float) -> tuple[float, float, str, str | None]:
    """(reference, score, what the reference is, cause or None) of a quantized linear adding `own`.

    The score is `own / expected`; an op noisy by design scores its `peer_ratio` when that is higher."""
    ref = max(e.expected, floor)
    label = f"its expected int8 rounding error ({e.expected:.3g} from its scales)"
    score = own / ref if ref > 0 else 0.0
    cause: str | None = None
    if score >= STANDS_OUT:
        cause = CAUSE_LEAD + _cause(e, own)
    elif e.peer_ratio >= STANDS_OUT:
        score = e.peer_ratio
        label = (
            f"the int8 rounding the same op is expected to add in the other layers (its own error is what its "
            f"scales predict, {e.expected:.3g})"
        )
        cause = (
            f"{CAUSE_LEAD}quantization noise as its scales predict ({e.expected:.3g}), far above its peers': "
            "a few large values stretch its int8 grid; keep it in float"
        )
    return ref, score, label, cause


def _cause(e: QuantExpect, own: float) -> str:
    rounding = max(e.act_part, 1e-12)
    if e.clip > rounding:
        return (
            f"clipping: {e.clip:.3g} of its input's energy lies beyond the int8 range of its activation scale "
            f"(rounding alone: {e.act_part:.3g}); the range was taken too narrow"
        )
    if e.saturated:
        return (
            f"a weight scale inconsistent with the data: {e.saturated} of {e.channels} weight channels pile up at "
            "+-127 (a symmetric per-channel scale puts only the channel's max there): their scales are too small"
        )
    if e.has_offset and e.act_err is not None and e.act_err < 0.5 * own:
        return (
            f"an offset: its int8 activations dequantize with their offset to within {e.act_err:.3g} of the input, "
            f"yet it adds {own:.3g}: the asymmetric offset is applied twice (or not at all) in its matmul"
        )
    return "an error beyond the rounding its scales explain (no clipping, scale or offset fault seen)"
