"""Single-op precheck for ATB dumps: re-run one op on its dumped inputs against a high-precision reference.

Inside a fused ATB group some ops have no torch counterpart, so a golden/test comparison can only
name the group. The precheck names the op: each leaf op folder of one token
(`{index}_{OpType}/` with `before/intensor*.bin`, `after/outtensor*.bin`, `op_param.json`) is
recomputed in float64 (float32 where float64 would be costly) from its dumped inputs and its
params, following ATB semantics, and each dumped output is judged against that reference with
the thresholds of the output's dtype (`Thresholds.judge`).

A kernel can only be as right as its params. A param that every other op of its kind in the
token disagrees with (an RMSNorm epsilon, an attention `qkScale`) fails the op too: the reference
then uses the peers' value, and the reason says whether the kernel at least follows its own param.

This module reads dump files only; it never imports the stack that wrote them.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.analysis.checks.precheck_result import OutputCheck, PrecheckResult
from workbench.compare.judging.judge import judge_pair, nan_inf_mismatch
from workbench.compare.judging.metrics import compare_tensors
from workbench.compare.judging.thresholds import Thresholds
from workbench.core.capped import OP_PARAM, FileRefused, read_text
from workbench.formats import atb_bin
from workbench.formats.atb import (
    OP_PARAM_FILE,
    TOO_DEEP,
    leaf_op_folders,
    op_tensor_files,
    parse_op_folder,
    token_folder_of,
)
from workbench.formats.model import DumpError
from workbench.formats.tensor_io import bin_to_tensor, dtype_name

Tensor = torch.Tensor

FLOAT64_MAC_LIMIT = 1 << 27  # multiply-adds below which a reference is computed in float64
LINEAR_CHUNK_BYTES = 64 << 20  # weight slice converted at a time (bounds the copy of a huge lm_head)
ROW_CHUNK = 1 << 14  # cache rows compared at a time for stray in-place writes
_PLAIN_LAYOUTS = {"ND", "NCHW", "NHWC", "NCDHW", "NDHWC", "HWCN", "UNDEFINED"}
SHAPE = "shape"  # failed-metric name: the dumped output cannot hold the reference
STRAY_WRITES = "stray_writes"  # failed-metric name: an in-place op changed what it must not touch


class _Unsupported(Exception):
    """The op (or this use of it) has no reference here."""


class _Misfit(Exception):
    """The dumped tensors do not fit the op as its params describe it."""


@dataclass(slots=True)
class _Ref:
    """One output to judge: the reference and the dumped values it must match."""

    index: int
    reference: Tensor
    test: Tensor
    stray: str | None = None  # a failure found outside the metrics (in-place writes where none belong)
    note: str | None = None


@dataclass(slots=True)
class _Ctx:
    inputs_before: bool  # inputs were dumped before the op ran (in-place inputs not yet overwritten)


Checker = Callable[[list[Tensor], list[Tensor], dict[str, Any], _Ctx], list[_Ref]]


# ---------------------------------------------------------------------------------------- helpers


def _need(ins: list[Tensor], n: int, what: str) -> None:
    if len(ins) != n:
        raise _Unsupported(f"expects {n} inputs ({what}), the dump has {len(ins)}")


def _prec(macs: int) -> torch.dtype:
    return torch.float64 if macs <= FLOAT64_MAC_LIMIT else torch.float32


def _int_param(param: dict[str, Any], key: str, default: int) -> int:
    value = param.get(key, default)
    try:
        return int(value if value is not None else default)
    except (TypeError, ValueError):
        raise _Misfit(f"param {key}={value!r} is not an integer") from None


def _float_param(param: dict[str, Any], key: str, default: float) -> float:
    value = param.get(key, default)
    try:
        return float(value if value is not None else default)
    except (TypeError, ValueError):
        raise _Misfit(f"param {key}={value!r} is not a number") from None


def _heads_view(t: Tensor, tokens: int, heads: int, what: str) -> Tensor:
    """`[T, H, D]` or `[T, H*D]` -> `[T, H, D]`."""
    if t.dim() == 3 and t.shape[1] == heads:
        return t
    if t.numel() % (tokens * heads):
        raise _Misfit(f"{what} {list(t.shape)} does not split into {tokens} tokens x {heads} heads")
    return t.reshape(tokens, heads, -1)


# ---------------------------------------------------------------------------------------- references


def _rms_norm(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    layer_type = _int_param(param, "layerType", 1)
    norm = param.get("normParam") or {}
    if layer_type == 1:
        sub = norm
    elif layer_type in (2, 3):
        sub = param.get("preNormParam" if layer_type == 2 else "postNormParam") or {}
    else:
        raise _Unsupported(f"layerType {layer_type}")
    if _int_param(sub, "quantType", 0) or _int_param(norm, "quantType", 0):
        raise _Unsupported("quantized RmsNorm")
    if sub.get("hasBias") or norm.get("rstd"):
        raise _Unsupported("RmsNorm with bias or rstd output")
    eps = _float_param(sub, "epsilon", 1e-5)
    if layer_type == 1:
        _need(ins, 2, "x, gamma")
        x, gamma = ins[0].double(), ins[1]
    else:
        _need(ins, 3, "x, residual, gamma")
        x, gamma = ins[0].double() + ins[1].double(), ins[2]
    g = gamma.double()
    if _int_param(norm, "modelType", 0) == 1:  # Gemma: the weight is stored minus one
        g = g + 1.0
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    refs = [_Ref(0, y, outs[0])]
    if layer_type == 2 and len(outs) > 1:
        refs.append(_Ref(1, x, outs[1]))
    return refs


def _linear(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    has_bias, accum = bool(param.get("hasBias", False)), bool(param.get("enAccum", False))
    _need(ins, 2 + has_bias + accum, "x, weight" + (", bias" if has_bias else "") + (", accum" if accum else ""))
    x, w = ins[0], ins[1]
    if param.get("transposeA", False):
        x = x.transpose(-1, -2)
    if x.dim() < 2 or w.dim() != 2:
        raise _Unsupported(f"x {list(x.shape)} with weight {list(w.shape)} (only 2-D weights)")
    trans_b = bool(param.get("transposeB", False))
    k_dim, n_out = (w.shape[1], w.shape[0]) if trans_b else (w.shape[0], w.shape[1])
    if x.shape[-1] != k_dim:
        raise _Misfit(f"x {list(x.shape)} does not multiply weight {list(w.shape)} (transposeB {trans_b})")
    rows = x.numel() // max(k_dim, 1)
    dt = _prec(rows * k_dim * n_out)
    xf = x.to(dt)
    step = max(1, LINEAR_CHUNK_BYTES // max(1, k_dim * 8))
    parts = []
    for o in range(0, n_out, step):  # weight slices: the float copy of a huge weight stays small
        wk = (w[o : o + step] if trans_b else w[:, o : o + step].T).to(dt)
        parts.append(xf @ wk.T)
    y = torch.cat(parts, dim=-1) if parts else xf.new_zeros(*x.shape[:-1], 0)
    if has_bias:
        y = y + ins[2].to(dt)
    if accum:
        y = y + ins[-1].to(dt)
    return [_Ref(0, y, outs[0])]


def _split(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    _need(ins, 1, "x")
    x = ins[0]
    dim = _int_param(param, "splitDim", 0)
    if not -x.dim() <= dim < x.dim():
        raise _Misfit(f"splitDim {dim} out of range for x {list(x.shape)}")
    sizes = [int(s) for s in param.get("splitSizes") or []]
    num = _int_param(param, "splitNum", 2)
    if sizes:
        if sum(sizes) != x.shape[dim]:
            raise _Misfit(f"splitSizes {sizes} do not add up to dim {dim} of x {list(x.shape)}")
        parts = torch.split(x, sizes, dim=dim)
    else:
        if num < 1 or x.shape[dim] % num:
            raise _Misfit(f"splitNum {num} does not divide dim {dim} of x {list(x.shape)}")
        parts = torch.chunk(x, num, dim=dim)
    return [_Ref(i, p.double(), outs[i]) for i, p in enumerate(parts) if i < len(outs)]


def _rope(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    _need(ins, 5, "q, k, cos, sin, seqLen")
    coeff = _int_param(param, "rotaryCoeff", 4)
    if coeff != 2:
        raise _Unsupported(f"rotaryCoeff {coeff} (only 2, rotate-half, is implemented)")
    if _int_param(param, "cosFormat", 0) != 0:
        raise _Unsupported(f"cosFormat {param.get('cosFormat')}")
    q, k, cos, sin, _seqlen = ins
    tokens = q.shape[0]
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != tokens or cos.shape[1] % 2:
        raise _Misfit(f"cos {list(cos.shape)} / sin {list(sin.shape)} do not fit q {list(q.shape)}")
    d = cos.shape[1]
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]

    def rotate(t: Tensor, what: str) -> Tensor:
        if t.shape[0] != tokens or t.numel() % (tokens * d):
            raise _Misfit(f"{what} {list(t.shape)} does not split into heads of {d} (cos {list(cos.shape)})")
        h = t.reshape(tokens, -1, d).double()
        half = d // 2
        rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
        return (h * c + rotated * s).reshape(t.shape)

    return [_Ref(0, rotate(q, "q"), outs[0]), _Ref(1, rotate(k, "k"), outs[1])][: len(outs)]


def _reshape_and_cache(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    _need(ins, 5, "k, v, kCache, vCache, slots")
    if _int_param(param, "compressType", 0) or _int_param(param, "kvCacheCfg", 0):
        raise _Unsupported("compressed or k-only caches")
    slots = ins[4].long().reshape(-1)
    keep = slots >= 0  # -1 marks padding tokens, which ATB skips
    refs = []
    for i, (src, cache_in) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
        if i >= len(outs):
            break
        out = outs[i]
        if out.dim() < 2 or out.shape != cache_in.shape:
            raise _Misfit(f"cache {i} in {list(cache_in.shape)} vs out {list(out.shape)}")
        rows = out.shape[0] * out.shape[1]
        flat_out = out.reshape(rows, -1)
        if src.shape[0] != slots.numel() or src.numel() != slots.numel() * flat_out.shape[1]:
            raise _Misfit(
                f"{'kv'[i]} {list(src.shape)} does not fill {slots.numel()} cache rows of {flat_out.shape[1]} elements"
            )
        if slots.numel() and int(slots.max()) >= rows:
            raise _Misfit(f"slot {int(slots.max())} beyond the {rows} rows of the cache")
        written = slots[keep]
        ref = src.reshape(slots.numel(), -1)[keep].double()
        stray, note = None, None
        if ctx.inputs_before:
            changed = _stray_rows(cache_in.reshape(rows, -1), flat_out, written)
            if changed:
                stray = f"{changed} cache rows outside the slot indices changed"
        else:
            note = "inputs dumped after the op: writes outside the slots not checked"
        refs.append(_Ref(i, ref, flat_out.index_select(0, written), stray, note))
    return refs


def _stray_rows(before: Tensor, after: Tensor, written: Tensor) -> int:
    """Rows that differ (bitwise) between two caches, not counting the rows the op was to write."""
    target = torch.zeros(before.shape[0], dtype=torch.bool)
    target[written] = True
    changed = 0
    for start in range(0, before.shape[0], ROW_CHUNK):
        a, b = before[start : start + ROW_CHUNK], after[start : start + ROW_CHUNK]
        if a.dtype.is_floating_point:
            differ = ((a != b) & ~(a.isnan() & b.isnan())).any(dim=1)
        else:
            differ = (a != b).any(dim=1)
        changed += int((differ & ~target[start : start + ROW_CHUNK]).sum())
    return changed


def _attend(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    """q `[Tq, H, D]` over k/v `[Tk, Hkv, D]` (GQA: head h reads kv head h // (H / Hkv)); out `[Tq, H, D]`."""
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise _Misfit(f"{heads} query heads do not group over {kv_heads} kv heads")
    rep = heads // kv_heads
    dt = _prec(q.shape[0] * k.shape[0] * q.shape[2])
    out = torch.empty(q.shape[0], heads, v.shape[2], dtype=dt)
    m = mask.to(dt) if mask is not None else None
    for h in range(heads):  # one head at a time: scores stay [Tq, Tk]
        kh, vh = k[:, h // rep].to(dt), v[:, h // rep].to(dt)
        scores = (q[:, h].to(dt) @ kh.T) * scale
        if m is not None:
            scores = scores + m
        out[:, h] = torch.softmax(scores, dim=-1) @ vh
    return out


def _self_attention(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    calc = _int_param(param, "calcType", 0)
    if calc not in (1, 3):
        raise _Unsupported(f"calcType {calc} (only the encoder / PA encoder forms are implemented)")
    mask_type = _int_param(param, "maskType", 0)
    if mask_type not in (0, 1):
        raise _Unsupported(f"maskType {mask_type}")
    if _int_param(param, "quantType", 0) or _int_param(param, "clampType", 0):
        raise _Unsupported("quantized or clamped attention")
    _need(ins, 5 if mask_type else 4, "q, k, v, " + ("mask, " if mask_type else "") + "seqLen")
    q_in, k_in, v_in = ins[:3]
    mask = ins[3] if mask_type else None
    seqlen = [int(s) for s in ins[-1].reshape(-1).tolist()]
    tokens = q_in.shape[0]
    if sum(seqlen) != tokens or any(s < 0 for s in seqlen):
        raise _Misfit(f"seqLen {seqlen} does not add up to the {tokens} tokens of q")
    heads = _int_param(param, "headNum", 0)
    kv_heads = _int_param(param, "kvHeadNum", 0) or heads
    if heads <= 0:
        raise _Misfit(f"headNum {param.get('headNum')!r}")
    q = _heads_view(q_in, tokens, heads, "q")
    k = _heads_view(k_in, tokens, kv_heads, "k")
    v = _heads_view(v_in, tokens, kv_heads, "v")
    scale = _float_param(param, "qkScale", 1.0) * _float_param(param, "qScale", 1.0)
    parts, off = [], 0
    for b, n in enumerate(seqlen):
        m = None
        if mask is not None:
            mb = mask if mask.dim() == 2 else mask[b if mask.shape[0] > 1 else 0]
            if mb.dim() != 2 or mb.shape[0] < n or mb.shape[1] < n:
                raise _Unsupported(f"mask {list(mask.shape)} for a sequence of {n} (compressed masks)")
            m = mb[:n, :n]
        parts.append(_attend(q[off : off + n], k[off : off + n], v[off : off + n], scale, m))
        off += n
    return [_Ref(0, torch.cat(parts, dim=0), outs[0])]


def _paged_attention(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    if _int_param(param, "maskType", 0) or _int_param(param, "quantType", 0):
        raise _Unsupported("masked or quantized paged attention")
    _need(ins, 5, "q, kCache, vCache, blockTables, contextLens")
    q_in, k_cache, v_cache, tables, lens = ins
    if k_cache.dim() != 4 or v_cache.dim() != 4 or tables.dim() != 2:
        raise _Misfit(f"caches {list(k_cache.shape)}/{list(v_cache.shape)} or block tables {list(tables.shape)}")
    blocks, bs = k_cache.shape[0], k_cache.shape[1]
    batch = q_in.shape[0]
    heads = _int_param(param, "headNum", 0) or (q_in.shape[1] if q_in.dim() == 3 else 0)
    if heads <= 0:
        raise _Misfit(f"headNum {param.get('headNum')!r}")
    q = _heads_view(q_in, batch, heads, "q")
    lens_l = [int(n) for n in lens.reshape(-1).tolist()]
    if len(lens_l) != batch or tables.shape[0] != batch:
        raise _Misfit(f"{batch} queries vs contextLens {lens_l} and block tables {list(tables.shape)}")
    scale = _float_param(param, "qkScale", 1.0) * _float_param(param, "qScale", 1.0)
    k_rows, v_rows = k_cache.reshape(blocks * bs, *k_cache.shape[2:]), v_cache.reshape(blocks * bs, *v_cache.shape[2:])
    parts = []
    for b, n in enumerate(lens_l):
        pos = torch.arange(n)
        if n > tables.shape[1] * bs:
            raise _Misfit(f"context length {n} exceeds the {tables.shape[1]} blocks of its table")
        blk = tables[b].long()[pos // bs]
        if n and (int(blk.min()) < 0 or int(blk.max()) >= blocks):
            raise _Misfit(f"block table of sequence {b} points outside the {blocks} cache blocks")
        slots = blk * bs + pos % bs
        parts.append(_attend(q[b : b + 1], k_rows.index_select(0, slots), v_rows.index_select(0, slots), scale, None))
    return [_Ref(0, torch.cat(parts, dim=0), outs[0])]


_ELEWISE_UNARY: dict[int, Callable[[Tensor, dict[str, Any]], Tensor]] = {
    1: lambda x, p: x,  # CAST: the value survives, the dtype is the output's
    2: lambda x, p: x * _float_param(p.get("mulsParam") or {}, "varAttr", 0.0),  # MULS
    3: lambda x, p: torch.cos(x),
    4: lambda x, p: torch.sin(x),
    5: lambda x, p: -x,
    7: lambda x, p: (x == 0).double(),  # LOGICAL_NOT
    20: lambda x, p: torch.tanh(x),
}
_ELEWISE_BINARY: dict[int, Callable[[Tensor, Tensor], Tensor]] = {
    8: torch.add,
    9: torch.mul,
    10: torch.div,
    11: lambda a, b: ((a != 0) & (b != 0)).double(),
    12: lambda a, b: ((a != 0) | (b != 0)).double(),
    13: lambda a, b: (a < b).double(),
    14: lambda a, b: (a > b).double(),
    15: torch.sub,
    16: lambda a, b: (a == b).double(),
}


def _elewise(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    kind = _int_param(param, "elewiseType", 0)
    if kind in _ELEWISE_UNARY:
        _need(ins, 1, "x")
        return [_Ref(0, _ELEWISE_UNARY[kind](ins[0].double(), param), outs[0])]
    if kind in _ELEWISE_BINARY:
        _need(ins, 2, "a, b")
        return [_Ref(0, _ELEWISE_BINARY[kind](ins[0].double(), ins[1].double()), outs[0])]
    raise _Unsupported(f"elewiseType {kind} (quantization and others are not implemented)")


def _activation(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    kind = _int_param(param, "activationType", 0)
    _need(ins, 1, "x")
    x = ins[0].double()
    f = torch.nn.functional
    if kind == 1:
        y = f.relu(x)
    elif kind == 2:
        y = f.gelu(x, approximate="tanh" if _int_param(param, "geluMode", 0) == 0 else "none")
    elif kind == 3:
        y = x * torch.sigmoid(1.702 * x)
    elif kind == 4:
        y = x * torch.sigmoid(_float_param(param, "scale", 1.0) * x)
    elif kind == 5:
        y = torch.log(x)
    elif kind == 6:
        dim = _int_param(param, "dim", -1)
        if x.shape[dim] % 2:
            raise _Misfit(f"SwiGLU over odd dim {dim} of x {list(x.shape)}")
        gate, up = x.chunk(2, dim=dim)
        y = f.silu(gate) * up
    elif kind == 8:
        y = torch.sigmoid(x)
    else:
        raise _Unsupported(f"activationType {kind}")
    return [_Ref(0, y, outs[0])]


def _gather(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: _Ctx) -> list[_Ref]:
    _need(ins, 2, "table, indices")
    if _int_param(param, "batchDims", 0):
        raise _Unsupported("batchDims != 0")
    table, idx = ins
    axis = _int_param(param, "axis", 0)
    if not -table.dim() <= axis < table.dim():
        raise _Misfit(f"axis {axis} out of range for {list(table.shape)}")
    axis %= table.dim()
    flat = idx.long().reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= table.shape[axis]):
        raise _Misfit(f"indices outside [0, {table.shape[axis]}) of axis {axis}")
    rows = table.index_select(axis, flat)
    shape = (*table.shape[:axis], *idx.shape, *table.shape[axis + 1 :])
    return [_Ref(0, rows.double().reshape(shape), outs[0])]


CHECKERS: dict[str, Checker] = {
    "RmsNormOperation": _rms_norm,
    "LinearOperation": _linear,
    "SplitOperation": _split,
    "RopeOperation": _rope,
    "SelfAttentionOperation": _self_attention,
    "PagedAttentionOperation": _paged_attention,
    "ReshapeAndCacheOperation": _reshape_and_cache,
    "ElewiseOperation": _elewise,
    "ActivationOperation": _activation,
    "GatherOperation": _gather,
}
SUPPORTED_OPS: tuple[str, ...] = tuple(CHECKERS)


# ---------------------------------------------------------------------------------------- params of peers
# A param every op of its kind shares; a lone different value is a bug born in that op.
_AUDITED: dict[str, tuple[str, tuple[str, ...]]] = {
    "RmsNormOperation": ("RmsNormOperation", ("normParam", "epsilon")),
    "SelfAttentionOperation": ("attention", ("qkScale",)),
    "PagedAttentionOperation": ("attention", ("qkScale",)),
}


def _get_path(param: dict[str, Any], path: tuple[str, ...]) -> float | None:
    cur: Any = param
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    try:
        return float(cur)
    except (TypeError, ValueError):
        return None


def _with_path(param: dict[str, Any], path: tuple[str, ...], value: float) -> dict[str, Any]:
    out = copy.deepcopy(param)
    cur = out
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value
    return out


def _audit_key(op_type: str, param: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    spec = _AUDITED.get(op_type)
    if spec is None or (op_type == "RmsNormOperation" and param.get("layerType", 1) != 1):
        return None
    return spec


def _canonical(op_type: str, param: dict[str, Any], ins: list[Tensor]) -> float | None:
    """The textbook value of an audited param, used only to break a tie between peers."""
    if op_type in ("SelfAttentionOperation", "PagedAttentionOperation") and ins:
        q, heads = ins[0], _int_param(param, "headNum", 0)
        d = q.shape[-1] if q.dim() == 3 else (q.shape[-1] // heads if heads else 0)
        return 1.0 / math.sqrt(d) if d > 0 else None
    return None


class _Peers:
    """Audited params of every leaf op of a token folder, read once per token folder."""

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    def params(self, token_dir: Path) -> list[tuple[str, dict[str, Any]]]:
        key = str(token_dir)
        if key not in self._seen:
            found = []
            for leaf in leaf_op_folders(token_dir):
                parsed = parse_op_folder(leaf.name)
                op_type = parsed[1] if parsed else ""
                if op_type in _AUDITED:
                    try:
                        found.append((op_type, _read_param(leaf)))
                    except DumpError:
                        continue  # that op reports its own problem when it is checked
            self._seen[key] = found
        return self._seen[key]

    def consensus(
        self, token_dir: Path, group: str, path: tuple[str, ...], canonical: float | None
    ) -> tuple[float, int, int, bool] | None:
        """(value, ops holding it, ops of the group, tie broken by the textbook value), if a value prevails."""
        counts: dict[float, int] = {}
        for op_type, param in self.params(token_dir):
            spec = _audit_key(op_type, param)
            value = _get_path(param, path) if spec is not None and spec[0] == group else None
            if value is not None:
                rounded = float(f"{value:.6g}")
                counts[rounded] = counts.get(rounded, 0) + 1
        total = sum(counts.values())
        if total < 2:
            return None
        top = max(counts.values())
        winners = [v for v, n in counts.items() if n == top]
        if len(winners) == 1:
            return winners[0], top, total, False
        if canonical is not None:
            match = [v for v in winners if math.isclose(v, canonical, rel_tol=1e-5)]
            if match:
                return match[0], top, total, True
        return None


# ---------------------------------------------------------------------------------------- files


def _read_param(op_dir: Path) -> dict[str, Any]:
    path = op_dir / OP_PARAM_FILE
    try:
        text = read_text(path, OP_PARAM)
    except FileRefused as exc:
        raise DumpError(path, exc.reason) from None
    except FileNotFoundError:
        raise DumpError(path, "missing file: the op's params are unknown") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        param = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise DumpError(path, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise DumpError(path, "JSON nested too deeply to read") from None
    if not isinstance(param, dict):
        raise DumpError(path, f"holds a JSON {type(param).__name__}, not an object")
    return param


def _load(path: Path) -> Tensor:
    hdr = atb_bin.read_header(path)
    if hdr.layout not in _PLAIN_LAYOUTS:
        raise _Unsupported(f"{path}: {hdr.layout} layout is not supported (only ND tensors)")
    return bin_to_tensor(atb_bin.read_bin(path, hdr), hdr.dtype)


# ---------------------------------------------------------------------------------------- judging


def _judge(ref: _Ref, th: Thresholds, name: str, op_type: str) -> OutputCheck:
    test = ref.test
    dtype = dtype_name(test.dtype)
    notes = [n for n in (ref.note, ref.stray) if n]
    stray = [STRAY_WRITES] if ref.stray else []
    if ref.reference.numel() != test.numel():
        return OutputCheck(
            ref.index,
            {},
            False,
            [SHAPE, *stray],
            "; ".join(
                [f"the reference has shape {list(ref.reference.shape)}, the dumped output {list(test.shape)}", *notes]
            ),
        )
    # compare_tensors works in float32 chunks; an in-memory copy of the dumped output (no bigger than the
    # reference) is several times faster to scan than the memory map
    reference = ref.reference.reshape(test.shape).float()
    test = test.clone()
    pm = compare_tensors(reference, test, dtype)
    g_counts = {"nan_count": pm.golden.nan_count, "inf_count": pm.golden.inf_count}
    t_counts = {"nan_count": pm.test.nan_count, "inf_count": pm.test.inf_count}
    mismatch = nan_inf_mismatch(g_counts, t_counts)
    if pm.reason:
        notes.insert(0, pm.reason)
    if (
        all(v is None for v in pm.values.values())
        and not mismatch
        and test.numel()
        and _same_nonfinite(reference, test)
    ):
        passed: bool | None = not stray
        failed = list(stray)
        notes.append("every element is NaN/Inf, exactly where the reference has them")
    else:
        passed, failed = judge_pair(th, pm.values, g_counts, t_counts, dtype, node_name=name, node_type=op_type)
        if stray:
            passed, failed = False, [*failed, *stray]
    return OutputCheck(ref.index, pm.values, passed, failed, "; ".join(notes) or None)


def _same_nonfinite(a: Tensor, b: Tensor) -> bool:
    a32, b32 = a.float(), b.float()
    return bool(
        torch.equal(a32.isnan(), b32.isnan())
        and torch.equal(a32.isposinf(), b32.isposinf())
        and torch.equal(a32.isneginf(), b32.isneginf())
    )


def _summary(outputs: list[OutputCheck]) -> bool | None:
    if any(o.passed is False for o in outputs):
        return False
    if not outputs or any(o.passed is None for o in outputs):
        return None
    return True


def _describe(outputs: list[OutputCheck]) -> str:
    worst = []
    for o in outputs:
        cos, red = o.values.get("cosine_similarity"), o.values.get("relative_euclidean_distance")
        if cos is not None and red is not None:
            worst.append(f"out{o.index} cosine {cos:.6f}, rel. distance {red:.3g}")
        elif o.failed_metrics:
            worst.append(f"out{o.index} {', '.join(o.failed_metrics)}")
        if STRAY_WRITES in o.failed_metrics and o.reason:
            worst.append(f"out{o.index}: {o.reason}")
    return "; ".join(worst)


# ---------------------------------------------------------------------------------------- public API


def precheck_op(op_dir: str | Path, *, thresholds: Thresholds | None = None) -> PrecheckResult:
    """Recompute one ATB leaf op from its dumped inputs and params and judge each dumped output."""
    return _check(Path(op_dir), thresholds or Thresholds.load(), _Peers())


def precheck_group(group_dir: str | Path, *, thresholds: Thresholds | None = None) -> list[PrecheckResult]:
    """Precheck every leaf op under a group (or token) folder, in execution order (depth first); a folder whose
    op folders nest too deeply comes last, not judged, its line as the reason.

    Raises `DumpError` when `group_dir` is not a folder.
    """
    folder = Path(group_dir)
    if not folder.is_dir():
        raise DumpError(folder, "missing folder" if not folder.exists() else "not a folder")
    th, peers = thresholds or Thresholds.load(), _Peers()
    too_deep: list[Path] = []
    results = [_check(leaf, th, peers) for leaf in leaf_op_folders(folder, too_deep)]
    return results + [PrecheckResult(str(d), "", True, None, reason=TOO_DEEP) for d in too_deep]


def _check(op_dir: Path, th: Thresholds, peers: _Peers) -> PrecheckResult:
    token_dir = token_folder_of(op_dir)
    name = op_dir.relative_to(token_dir).as_posix() if token_dir is not None else op_dir.name
    parsed = parse_op_folder(op_dir.name)
    op_type = parsed[1] if parsed else ""

    def result(
        supported: bool,
        passed: bool | None,
        reason: str | None,
        outputs: list[OutputCheck] | None = None,
        issues: list[str] | None = None,
    ) -> PrecheckResult:
        return PrecheckResult(str(op_dir), op_type, supported, passed, outputs or [], reason, name, issues or [])

    if parsed is None:
        return result(False, None, f"{op_dir}: not an ATB op folder ({{index}}_{{OpType}})")
    if not op_dir.is_dir():
        return result(op_type in CHECKERS, None, f"{op_dir}: missing folder")
    checker = CHECKERS.get(op_type)
    if checker is None:
        return result(False, None, f"no reference for {op_type} (supported: {', '.join(SUPPORTED_OPS)})")
    try:
        param = _read_param(op_dir)
        files = op_tensor_files(op_dir)
        in_files, out_files, before = files.inputs, files.outputs, files.inputs_before
        if not in_files:
            return result(True, None, f"{op_dir}: no intensor*.bin in before/ or after/ (outputs-only dump?)")
        if not out_files:
            return result(True, None, f"{op_dir / 'after'}: no outtensor*.bin (inputs-only dump?)")
        ins = [_load(p) for p in in_files]
        outs = [_load(p) for p in out_files]
        ctx = _Ctx(inputs_before=before)
        issues: list[str] = []
        used = param
        spec = _audit_key(op_type, param)
        own = _get_path(param, spec[1]) if spec else None
        if spec is not None and own is not None and token_dir is not None:
            agreed = peers.consensus(token_dir, spec[0], spec[1], _canonical(op_type, param, ins))
            if agreed is not None and not math.isclose(own, agreed[0], rel_tol=1e-5):
                value, n, total, tie = agreed
                issues.append(
                    f"param {'.'.join(spec[1])} {own:g} differs from the {value:g} of {n} of the "
                    f"{total} {spec[0]} ops of this token" + (" (and the textbook value)" if tie else "")
                )
                used = _with_path(param, spec[1], value)
        outputs = [_judge(r, th, name, op_type) for r in checker(ins, outs, used, ctx)]
        reasons = []
        if issues:
            own_outputs = [_judge(r, th, name, op_type) for r in checker(ins, outs, param, ctx)]
            follows = _summary(own_outputs)
            reasons.append(
                issues[0]
                + (
                    ": the kernel follows its own param, the param is wrong"
                    if follows
                    else ": the kernel matches neither value"
                )
            )
        if len(outputs) < len(outs):
            reasons.append(f"{len(outs) - len(outputs)} of {len(outs)} outputs have no reference")
    except DumpError as exc:
        return result(True, None, str(exc))
    except _Unsupported as exc:
        return result(False, None, f"{op_type}: {exc}")
    except _Misfit as exc:
        return result(True, None, f"{op_dir}: cannot check: {exc}")
    passed = _summary(outputs)
    judged = {o.index for o in outputs if o.passed is not None}
    unchecked = [f"out{i}" for i in range(len(outs)) if i not in judged]
    if issues:
        passed = False
    elif passed and unchecked:
        passed = None
    if passed is False and not issues:
        reasons.insert(0, _describe([o for o in outputs if o.passed is False]))
    res = result(True, passed, "; ".join(r for r in reasons if r) or None, outputs, issues)
    if unchecked and outputs:
        res.not_checked = unchecked
        res.why = "no reference for these outputs"
    return res
