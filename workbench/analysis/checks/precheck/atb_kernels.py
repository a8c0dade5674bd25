"""The ATB references: each op of `CHECKERS` recomputed from its dumped inputs and params, following ATB semantics.

Inside a fused ATB group some ops have no torch counterpart, so a golden/test comparison can only name the group;
the precheck names the op. A checker recomputes an op in float64 (float32 where float64 would be costly) and
returns, for each dumped output, the reference it must match (`Ref`; `judge.judge_by_thresholds` judges it). A
new op: a checker here, registered in `CHECKERS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from workbench.analysis.checks.precheck.judge import Ref

Tensor = torch.Tensor

FLOAT64_MAC_LIMIT = 1 << 27  # multiply-adds below which a reference is computed in float64
LINEAR_CHUNK_BYTES = 64 << 20  # weight slice converted at a time (bounds the copy of a huge lm_head)
ROW_CHUNK = 1 << 14  # cache rows compared at a time for stray in-place writes


class Unsupported(Exception):
    """The op (or this use of it) has no reference here."""


class Misfit(Exception):
    """The dumped tensors do not fit the op as its params describe it."""


@dataclass(slots=True)
class Ctx:
    """What a checker knows beyond the tensors and params."""

    inputs_before: bool  # inputs were dumped before the op ran (in-place inputs not yet overwritten)


Checker = Callable[[list[Tensor], list[Tensor], dict[str, Any], Ctx], list[Ref]]


# ---------------------------------------------------------------------------------------- helpers


def _need(ins: list[Tensor], n: int, what: str) -> None:
    if len(ins) != n:
        raise Unsupported(f"expects {n} inputs ({what}), the dump has {len(ins)}")


def _prec(macs: int) -> torch.dtype:
    return torch.float64 if macs <= FLOAT64_MAC_LIMIT else torch.float32


def int_param(param: dict[str, Any], key: str, default: int) -> int:
    """An integer param (`default` when absent or null); raises `Misfit` when it is not one."""
    value = param.get(key, default)
    try:
        return int(value if value is not None else default)
    except (TypeError, ValueError):
        raise Misfit(f"param {key}={value!r} is not an integer") from None


def float_param(param: dict[str, Any], key: str, default: float) -> float:
    """A number param (`default` when absent or null); raises `Misfit` when it is not one."""
    value = param.get(key, default)
    try:
        return float(value if value is not None else default)
    except (TypeError, ValueError):
        raise Misfit(f"param {key}={value!r} is not a number") from None


def _heads_view(t: Tensor, tokens: int, heads: int, what: str) -> Tensor:
    """`[T, H, D]` or `[T, H*D]` -> `[T, H, D]`."""
    if t.dim() == 3 and t.shape[1] == heads:
        return t
    if t.numel() % (tokens * heads):
        raise Misfit(f"{what} {list(t.shape)} does not split into {tokens} tokens x {heads} heads")
    return t.reshape(tokens, heads, -1)


# ---------------------------------------------------------------------------------------- references


def _rms_norm(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    layer_type = int_param(param, "layerType", 1)
    norm = param.get("normParam") or {}
    if layer_type == 1:
        sub = norm
    elif layer_type in (2, 3):
        sub = param.get("preNormParam" if layer_type == 2 else "postNormParam") or {}
    else:
        raise Unsupported(f"layerType {layer_type}")
    if int_param(sub, "quantType", 0) or int_param(norm, "quantType", 0):
        raise Unsupported("quantized RmsNorm")
    if sub.get("hasBias") or norm.get("rstd"):
        raise Unsupported("RmsNorm with bias or rstd output")
    eps = float_param(sub, "epsilon", 1e-5)
    if layer_type == 1:
        _need(ins, 2, "x, gamma")
        x, gamma = ins[0].double(), ins[1]
    else:
        _need(ins, 3, "x, residual, gamma")
        x, gamma = ins[0].double() + ins[1].double(), ins[2]
    g = gamma.double()
    if int_param(norm, "modelType", 0) == 1:  # Gemma: the weight is stored minus one
        g = g + 1.0
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    refs = [Ref(0, y, outs[0])]
    if layer_type == 2 and len(outs) > 1:
        refs.append(Ref(1, x, outs[1]))
    return refs


def _linear(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    has_bias, accum = bool(param.get("hasBias", False)), bool(param.get("enAccum", False))
    _need(ins, 2 + has_bias + accum, "x, weight" + (", bias" if has_bias else "") + (", accum" if accum else ""))
    x, w = ins[0], ins[1]
    if param.get("transposeA", False):
        x = x.transpose(-1, -2)
    if x.dim() < 2 or w.dim() != 2:
        raise Unsupported(f"x {list(x.shape)} with weight {list(w.shape)} (only 2-D weights)")
    trans_b = bool(param.get("transposeB", False))
    k_dim, n_out = (w.shape[1], w.shape[0]) if trans_b else (w.shape[0], w.shape[1])
    if x.shape[-1] != k_dim:
        raise Misfit(f"x {list(x.shape)} does not multiply weight {list(w.shape)} (transposeB {trans_b})")
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
    return [Ref(0, y, outs[0])]


def _split(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    _need(ins, 1, "x")
    x = ins[0]
    dim = int_param(param, "splitDim", 0)
    if not -x.dim() <= dim < x.dim():
        raise Misfit(f"splitDim {dim} out of range for x {list(x.shape)}")
    sizes = [int(s) for s in param.get("splitSizes") or []]
    num = int_param(param, "splitNum", 2)
    if sizes:
        if sum(sizes) != x.shape[dim]:
            raise Misfit(f"splitSizes {sizes} do not add up to dim {dim} of x {list(x.shape)}")
        parts = torch.split(x, sizes, dim=dim)
    else:
        if num < 1 or x.shape[dim] % num:
            raise Misfit(f"splitNum {num} does not divide dim {dim} of x {list(x.shape)}")
        parts = torch.chunk(x, num, dim=dim)
    return [Ref(i, p.double(), outs[i]) for i, p in enumerate(parts) if i < len(outs)]


def _rope(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    _need(ins, 5, "q, k, cos, sin, seqLen")
    coeff = int_param(param, "rotaryCoeff", 4)
    if coeff != 2:
        raise Unsupported(f"rotaryCoeff {coeff} (only 2, rotate-half, is implemented)")
    if int_param(param, "cosFormat", 0) != 0:
        raise Unsupported(f"cosFormat {param.get('cosFormat')}")
    q, k, cos, sin, _seqlen = ins
    tokens = q.shape[0]
    if cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != tokens or cos.shape[1] % 2:
        raise Misfit(f"cos {list(cos.shape)} / sin {list(sin.shape)} do not fit q {list(q.shape)}")
    d = cos.shape[1]
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]

    def rotate(t: Tensor, what: str) -> Tensor:
        if t.shape[0] != tokens or t.numel() % (tokens * d):
            raise Misfit(f"{what} {list(t.shape)} does not split into heads of {d} (cos {list(cos.shape)})")
        h = t.reshape(tokens, -1, d).double()
        half = d // 2
        rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
        return (h * c + rotated * s).reshape(t.shape)

    return [Ref(0, rotate(q, "q"), outs[0]), Ref(1, rotate(k, "k"), outs[1])][: len(outs)]


def _reshape_and_cache(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    _need(ins, 5, "k, v, kCache, vCache, slots")
    if int_param(param, "compressType", 0) or int_param(param, "kvCacheCfg", 0):
        raise Unsupported("compressed or k-only caches")
    slots = ins[4].long().reshape(-1)
    keep = slots >= 0  # -1 marks padding tokens, which ATB skips
    refs = []
    for i, (src, cache_in) in enumerate(((ins[0], ins[2]), (ins[1], ins[3]))):
        if i >= len(outs):
            break
        out = outs[i]
        if out.dim() < 2 or out.shape != cache_in.shape:
            raise Misfit(f"cache {i} in {list(cache_in.shape)} vs out {list(out.shape)}")
        rows = out.shape[0] * out.shape[1]
        flat_out = out.reshape(rows, -1)
        if src.shape[0] != slots.numel() or src.numel() != slots.numel() * flat_out.shape[1]:
            raise Misfit(
                f"{'kv'[i]} {list(src.shape)} does not fill {slots.numel()} cache rows of {flat_out.shape[1]} elements"
            )
        if slots.numel() and int(slots.max()) >= rows:
            raise Misfit(f"slot {int(slots.max())} beyond the {rows} rows of the cache")
        written = slots[keep]
        ref = src.reshape(slots.numel(), -1)[keep].double()
        stray, note = None, None
        if ctx.inputs_before:
            changed = _stray_rows(cache_in.reshape(rows, -1), flat_out, written)
            if changed:
                stray = f"{changed} cache rows outside the slot indices changed"
        else:
            note = "inputs dumped after the op: writes outside the slots not checked"
        refs.append(Ref(i, ref, flat_out.index_select(0, written), stray, note))
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
        raise Misfit(f"{heads} query heads do not group over {kv_heads} kv heads")
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


def _self_attention(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    calc = int_param(param, "calcType", 0)
    if calc not in (1, 3):
        raise Unsupported(f"calcType {calc} (only the encoder / PA encoder forms are implemented)")
    mask_type = int_param(param, "maskType", 0)
    if mask_type not in (0, 1):
        raise Unsupported(f"maskType {mask_type}")
    if int_param(param, "quantType", 0) or int_param(param, "clampType", 0):
        raise Unsupported("quantized or clamped attention")
    _need(ins, 5 if mask_type else 4, "q, k, v, " + ("mask, " if mask_type else "") + "seqLen")
    q_in, k_in, v_in = ins[:3]
    mask = ins[3] if mask_type else None
    seqlen = [int(s) for s in ins[-1].reshape(-1).tolist()]
    tokens = q_in.shape[0]
    if sum(seqlen) != tokens or any(s < 0 for s in seqlen):
        raise Misfit(f"seqLen {seqlen} does not add up to the {tokens} tokens of q")
    heads = int_param(param, "headNum", 0)
    kv_heads = int_param(param, "kvHeadNum", 0) or heads
    if heads <= 0:
        raise Misfit(f"headNum {param.get('headNum')!r}")
    q = _heads_view(q_in, tokens, heads, "q")
    k = _heads_view(k_in, tokens, kv_heads, "k")
    v = _heads_view(v_in, tokens, kv_heads, "v")
    scale = float_param(param, "qkScale", 1.0) * float_param(param, "qScale", 1.0)
    parts, off = [], 0
    for b, n in enumerate(seqlen):
        m = None
        if mask is not None:
            mb = mask if mask.dim() == 2 else mask[b if mask.shape[0] > 1 else 0]
            if mb.dim() != 2 or mb.shape[0] < n or mb.shape[1] < n:
                raise Unsupported(f"mask {list(mask.shape)} for a sequence of {n} (compressed masks)")
            m = mb[:n, :n]
        parts.append(_attend(q[off : off + n], k[off : off + n], v[off : off + n], scale, m))
        off += n
    return [Ref(0, torch.cat(parts, dim=0), outs[0])]


def _paged_attention(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    if int_param(param, "maskType", 0) or int_param(param, "quantType", 0):
        raise Unsupported("masked or quantized paged attention")
    _need(ins, 5, "q, kCache, vCache, blockTables, contextLens")
    q_in, k_cache, v_cache, tables, lens = ins
    if k_cache.dim() != 4 or v_cache.dim() != 4 or tables.dim() != 2:
        raise Misfit(f"caches {list(k_cache.shape)}/{list(v_cache.shape)} or block tables {list(tables.shape)}")
    blocks, bs = k_cache.shape[0], k_cache.shape[1]
    batch = q_in.shape[0]
    heads = int_param(param, "headNum", 0) or (q_in.shape[1] if q_in.dim() == 3 else 0)
    if heads <= 0:
        raise Misfit(f"headNum {param.get('headNum')!r}")
    q = _heads_view(q_in, batch, heads, "q")
    lens_l = [int(n) for n in lens.reshape(-1).tolist()]
    if len(lens_l) != batch or tables.shape[0] != batch:
        raise Misfit(f"{batch} queries vs contextLens {lens_l} and block tables {list(tables.shape)}")
    scale = float_param(param, "qkScale", 1.0) * float_param(param, "qScale", 1.0)
    k_rows, v_rows = k_cache.reshape(blocks * bs, *k_cache.shape[2:]), v_cache.reshape(blocks * bs, *v_cache.shape[2:])
    parts = []
    for b, n in enumerate(lens_l):
        pos = torch.arange(n)
        if n > tables.shape[1] * bs:
            raise Misfit(f"context length {n} exceeds the {tables.shape[1]} blocks of its table")
        blk = tables[b].long()[pos // bs]
        if n and (int(blk.min()) < 0 or int(blk.max()) >= blocks):
            raise Misfit(f"block table of sequence {b} points outside the {blocks} cache blocks")
        slots = blk * bs + pos % bs
        parts.append(_attend(q[b : b + 1], k_rows.index_select(0, slots), v_rows.index_select(0, slots), scale, None))
    return [Ref(0, torch.cat(parts, dim=0), outs[0])]


_ELEWISE_UNARY: dict[int, Callable[[Tensor, dict[str, Any]], Tensor]] = {
    1: lambda x, p: x,  # CAST: the value survives, the dtype is the output's
    2: lambda x, p: x * float_param(p.get("mulsParam") or {}, "varAttr", 0.0),  # MULS
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


def _elewise(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    kind = int_param(param, "elewiseType", 0)
    if kind in _ELEWISE_UNARY:
        _need(ins, 1, "x")
        return [Ref(0, _ELEWISE_UNARY[kind](ins[0].double(), param), outs[0])]
    if kind in _ELEWISE_BINARY:
        _need(ins, 2, "a, b")
        return [Ref(0, _ELEWISE_BINARY[kind](ins[0].double(), ins[1].double()), outs[0])]
    raise Unsupported(f"elewiseType {kind} (quantization and others are not implemented)")


def _activation(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    kind = int_param(param, "activationType", 0)
    _need(ins, 1, "x")
    x = ins[0].double()
    f = torch.nn.functional
    if kind == 1:
        y = f.relu(x)
    elif kind == 2:
        y = f.gelu(x, approximate="tanh" if int_param(param, "geluMode", 0) == 0 else "none")
    elif kind == 3:
        y = x * torch.sigmoid(1.702 * x)
    elif kind == 4:
        y = x * torch.sigmoid(float_param(param, "scale", 1.0) * x)
    elif kind == 5:
        y = torch.log(x)
    elif kind == 6:
        dim = int_param(param, "dim", -1)
        if x.shape[dim] % 2:
            raise Misfit(f"SwiGLU over odd dim {dim} of x {list(x.shape)}")
        gate, up = x.chunk(2, dim=dim)
        y = f.silu(gate) * up
    elif kind == 8:
        y = torch.sigmoid(x)
    else:
        raise Unsupported(f"activationType {kind}")
    return [Ref(0, y, outs[0])]


def _gather(ins: list[Tensor], outs: list[Tensor], param: dict[str, Any], ctx: Ctx) -> list[Ref]:
    _need(ins, 2, "table, indices")
    if int_param(param, "batchDims", 0):
        raise Unsupported("batchDims != 0")
    table, idx = ins
    axis = int_param(param, "axis", 0)
    if not -table.dim() <= axis < table.dim():
        raise Misfit(f"axis {axis} out of range for {list(table.shape)}")
    axis %= table.dim()
    flat = idx.long().reshape(-1)
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= table.shape[axis]):
        raise Misfit(f"indices outside [0, {table.shape[axis]}) of axis {axis}")
    rows = table.index_select(axis, flat)
    shape = (*table.shape[:axis], *idx.shape, *table.shape[axis + 1 :])
    return [Ref(0, rows.double().reshape(shape), outs[0])]


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
