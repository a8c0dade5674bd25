"""ATB operations in plain torch, and the graph executor that runs them as ATB does.

An ATB model is a graph of operations. A leaf operation (`LeafOp`: `RmsNormOperation`,
`LinearOperation`, ...) has an op type, a `param` dict (what ATB's topology JSON and
`op_param.json` record) and a kernel. A graph operation (`Graph`: a layer, `Attention`,
`QKVLinearSplitPack`, ...) owns a tensor table laid out as ATB's `GraphParam` does:
`[inputs..., outputs..., internals...]`; each `Node` names the table ids it reads and writes.
Tensors are unpadded `[tokens, ...]` (no batch dim); ops that see heads get `[tokens, heads,
head_dim]` through a per-node view, as ATB's `reshapeFunc` does.

`run_op` executes an operation, calling an `OpHook` before and after every operation
(graph operations included) with the folder path ATB's probe would use.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

Tensor = torch.Tensor

# ATB enum values recorded in params (atb/infer_op_params.h)
ELEWISE_ADD = 8
ACTIVATION_SWIGLU_FORWARD = 6
NORM_TYPE_RMS_NORM = 1
SELF_ATTENTION_CALC_PA_ENCODER = 3
SELF_ATTENTION_MASK_NORM = 1


@dataclass(slots=True)
class RunContext:
    """What one execution of a model graph knows besides its tensors."""

    token: int  # execute count as the dump folder shows it
    step: int  # 0 prefill, k the k-th decode step (warmup is -1)
    phase: str  # "prefill" | "decode"
    positions: Tensor  # int64 [tokens], the RoPE positions of this execution
    hook: OpHook | None = None


class OpHook(Protocol):
    """Called around every operation; `path` is the op folder below the token folder."""

    def before(self, path: str, op: LeafOp | Graph, ins: list[Tensor]) -> None: ...

    def after(self, path: str, op: LeafOp | Graph, ins: list[Tensor], outs: list[Tensor]) -> None: ...


OpFn = Callable[[list[Tensor], RunContext], list[Tensor]]


@dataclass(slots=True)
class LeafOp:
    """One ATB operation: op type, param (as ATB records it), kernel."""

    op_type: str
    param: dict[str, Any]
    fn: OpFn
    n_in: int
    n_out: int
    inplace: dict[int, int] = field(default_factory=dict)  # out index -> the in index it aliases


@dataclass(slots=True)
class Node:
    """One operation inside a graph: which table ids it reads and writes."""

    op: LeafOp | Graph
    in_ids: list[int]
    out_ids: list[int]
    views: dict[int, Callable[[Tensor], Tensor]] = field(default_factory=dict)  # input reshapes


@dataclass(slots=True)
class Graph:
    """A graph operation; tensor ids index `[inputs..., outputs..., internals...]`."""

    op_type: str
    param: dict[str, Any]
    in_labels: list[str]  # what each input is (documentation; the JSON uses ATB names)
    n_out: int
    n_internal: int
    nodes: list[Node]
    inplace: dict[int, int] = field(default_factory=dict)
    # output index -> the shape the graph gives it (ATB's inferShapeFunc: a gathered `[T, ranks, V/ranks]`
    # is the graph's `[T, V]`), a view of the same tensor
    out_views: dict[int, Callable[[Tensor], Tensor]] = field(default_factory=dict)

    @property
    def n_in(self) -> int:
        return len(self.in_labels)

    def check(self) -> None:
        """Raise `ValueError` if a node reads a tensor that nothing wrote before it."""
        ready = set(range(self.n_in))
        total = self.n_in + self.n_out + self.n_internal
        for i, node in enumerate(self.nodes):
            if len(node.in_ids) != node.op.n_in or len(node.out_ids) != node.op.n_out:
                raise ValueError(f"{self.op_type} node {i} ({node.op.op_type}): tensor count mismatch")
            missing = [t for t in node.in_ids if t not in ready]
            if missing or any(not 0 <= t < total for t in node.out_ids):
                raise ValueError(f"{self.op_type} node {i} ({node.op.op_type}): bad tensor ids {missing}")
            ready.update(node.out_ids)
            if isinstance(node.op, Graph):
                node.op.check()
        absent = [t for t in range(self.n_in, self.n_in + self.n_out) if t not in ready]
        if absent:
            raise ValueError(f"{self.op_type}: outputs {absent} are never written")


def run_op(op: LeafOp | Graph, ins: list[Tensor], ctx: RunContext, path: str) -> list[Tensor]:
    """Execute one operation (recursively for a graph), calling `ctx.hook` around each op."""
    if ctx.hook is not None:
        ctx.hook.before(path, op, ins)
    if isinstance(op, LeafOp):
        outs = op.fn(ins, ctx)
    else:
        outs = run_graph_body(op, ins, ctx, path + "/", 0)
    if ctx.hook is not None:
        ctx.hook.after(path, op, ins, outs)
    return outs


def run_graph_body(graph: Graph, ins: list[Tensor], ctx: RunContext, prefix: str, id_base: int) -> list[Tensor]:
    """Run a graph's nodes; child `i` gets the folder `{prefix}{id_base + i}_{OpType}`."""
    table: list[Tensor | None] = [*ins, *([None] * (graph.n_out + graph.n_internal))]
    for i, node in enumerate(graph.nodes):
        child_ins: list[Tensor] = []
        for k, tid in enumerate(node.in_ids):
            t = table[tid]
            assert t is not None, f"{graph.op_type}: tensor {tid} read before written"
            view = node.views.get(k)
            child_ins.append(view(t) if view is not None else t)
        outs = run_op(node.op, child_ins, ctx, f"{prefix}{id_base + i}_{node.op.op_type}")
        for tid, t in zip(node.out_ids, outs, strict=True):
            table[tid] = t
    result = table[graph.n_in : graph.n_in + graph.n_out]
    assert all(t is not None for t in result)
    return [graph.out_views[i](t) if i in graph.out_views else t for i, t in enumerate(result) if t is not None]


# ---------------------------------------------------------------- kernels
def gather_op() -> LeafOp:
    """GatherOperation: rows of a table (`[V, H]`) at indices (`[T]`)."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        table, idx = ins
        return [table.index_select(0, idx.long())]

    return LeafOp("GatherOperation", {"axis": 0, "batchDims": 0}, fn, 2, 1)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm with the statistics in fp32, scaled in the input dtype (as HF Llama does)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rms_norm_param(eps: float) -> dict[str, Any]:
    return {
        "layerType": NORM_TYPE_RMS_NORM,
        "normParam": {
            "epsilon": eps,
            "quantType": 0,
            "precisionMode": 0,
            "modelType": 0,
            "layerNormEps": 1e-5,
            "rstd": False,
        },
        "preNormParam": {"epsilon": 0, "quantType": 0, "hasBias": False},
        "postNormParam": {"epsilon": 0, "quantType": 0, "hasBias": False},
    }


def rms_norm_op(eps: float) -> LeafOp:
    """RmsNormOperation: (x, weight) -> normed x; the epsilon lives in `param`."""
    param = rms_norm_param(eps)

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [rms_norm(ins[0], ins[1], float(param["normParam"]["epsilon"]))]

    return LeafOp("RmsNormOperation", param, fn, 2, 1)


def linear_op() -> LeafOp:
    """LinearOperation: x `[T, in]` @ weight `[out, in]`^T (`transposeB`), no bias."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [torch.nn.functional.linear(ins[0], ins[1])]

    return LeafOp(
        "LinearOperation",
        {"transposeA": False, "transposeB": True, "hasBias": False, "outDataType": -1, "enAccum": False},
        fn,
        2,
        1,
    )


def split_op(sizes: list[int]) -> LeafOp:
    """SplitOperation along the last dim into `sizes` (`splitSizes`, for GQA's unequal q/k/v)."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [t.contiguous() for t in torch.split(ins[0], sizes, dim=-1)]

    return LeafOp(
        "SplitOperation", {"splitDim": -1, "splitNum": len(sizes), "splitSizes": list(sizes)}, fn, 1, len(sizes)
    )


def rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    x: Tensor, cos: Tensor, sin: Tensor, head_dim: int, rotate: Callable[[Tensor], Tensor] = rotate_half
) -> Tensor:
    """Rotate `x` `[T, heads*head_dim]` by per-token `cos`/`sin` `[T, head_dim]` (rotaryCoeff 2)."""
    t = x.view(x.shape[0], -1, head_dim)
    out = t * cos[:, None, :] + rotate(t) * sin[:, None, :]
    return out.reshape(x.shape)


def rope_op(head_dim: int) -> LeafOp:
    """RopeOperation: (q, k, cos, sin, seqLen) -> (q, k) rotated; halves rotation (`rotaryCoeff` 2)."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        q, k, cos, sin, _seqlen = ins
        return [apply_rope(q, cos, sin, head_dim), apply_rope(k, cos, sin, head_dim)]

    return LeafOp("RopeOperation", {"rotaryCoeff": 2, "cosFormat": 0}, fn, 5, 2)


def reshape_and_cache(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> None:
    """Write k/v `[T, kv_heads, head_dim]` into the `[blocks, block_size, kv_heads, head_dim]` caches."""
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    idx = slots.long()
    flat_k.index_copy_(0, idx, k.to(k_cache.dtype))
    flat_v.index_copy_(0, idx, v.to(v_cache.dtype))


def reshape_and_cache_op() -> LeafOp:
    """ReshapeAndCacheOperation: (k, v, kCache, vCache, slots) -> (kCache, vCache), in place."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        k, v, k_cache, v_cache, slots = ins
        reshape_and_cache(k, v, k_cache, v_cache, slots)
        return [k_cache, v_cache]

    return LeafOp("ReshapeAndCacheOperation", {"compressType": 0, "kvCacheCfg": 0}, fn, 5, 2, inplace={0: 2, 1: 3})


def attention(q: Tensor, k: Tensor, v: Tensor, scale: float, mask: Tensor | None) -> Tensor:
    """Attention of q `[Tq, H, D]` over k/v `[Tk, Hkv, D]` (GQA), computed in fp32; out `[Tq, H, D]`."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    if mask is not None:
        scores = scores + mask.float()
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype).contiguous()


def attention_param(op: str, heads: int, kv_heads: int, head_dim: int, scale: float) -> dict[str, Any]:
    common = {"headNum": heads, "kvHeadNum": kv_heads, "qkScale": scale, "headDim": head_dim}
    if op == "SelfAttentionOperation":
        return {
            **common,
            "qScale": 1.0,
            "calcType": SELF_ATTENTION_CALC_PA_ENCODER,
            "maskType": SELF_ATTENTION_MASK_NORM,
            "isTriuMask": 1,
            "kernelType": 0,
        }
    return {**common, "maskType": 0, "batchRunStatusEnable": False, "quantType": 0}


def self_attention(ins: list[Tensor], scale: float) -> Tensor:
    """Prefill attention over (q, k, v, mask, seqLen) of one sequence."""
    q, k, v, mask, seqlen = ins
    if int(seqlen.sum()) != q.shape[0]:
        raise ValueError(f"SelfAttentionOperation: seqLen {seqlen.tolist()} != {q.shape[0]} tokens")
    return attention(q, k, v, scale, mask)


def self_attention_op(heads: int, kv_heads: int, head_dim: int, scale: float) -> LeafOp:
    """SelfAttentionOperation (prefill, PA encoder): (q, k, v, mask, seqLen) -> out `[T, H, D]`."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [self_attention(ins, scale)]

    return LeafOp(
        "SelfAttentionOperation", attention_param("SelfAttentionOperation", heads, kv_heads, head_dim, scale), fn, 5, 1
    )


def gather_cache(cache: Tensor, block_table: Tensor, length: int) -> Tensor:
    """The first `length` entries `[length, Hkv, D]` of one sequence's paged cache."""
    bs = cache.shape[1]
    pos = torch.arange(length)
    slots = block_table.long()[pos // bs] * bs + pos % bs
    return cache.view(-1, *cache.shape[2:]).index_select(0, slots)


def paged_attention(ins: list[Tensor], scale: float) -> Tensor:
    """Decode attention over (q, kCache, vCache, blockTables, contextLens), one row per sequence."""
    q, k_cache, v_cache, block_tables, context_lens = ins
    outs = []
    for b in range(q.shape[0]):
        n = int(context_lens[b])
        k = gather_cache(k_cache, block_tables[b], n)
        v = gather_cache(v_cache, block_tables[b], n)
        outs.append(attention(q[b : b + 1], k, v, scale, None))
    return torch.cat(outs, dim=0)


def paged_attention_op(heads: int, kv_heads: int, head_dim: int, scale: float) -> LeafOp:
    """PagedAttentionOperation (decode): (q, kCache, vCache, blockTables, contextLens) -> out `[B, H, D]`."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [paged_attention(ins, scale)]

    return LeafOp(
        "PagedAttentionOperation",
        attention_param("PagedAttentionOperation", heads, kv_heads, head_dim, scale),
        fn,
        5,
        1,
    )


def add_op() -> LeafOp:
    """ElewiseOperation ELEWISE_ADD: (a, b) -> a + b."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [ins[0] + ins[1]]

    return LeafOp(
        "ElewiseOperation", {"elewiseType": ELEWISE_ADD, "mulsParam": {"varAttr": 0}, "outTensorType": -1}, fn, 2, 1
    )


def swiglu_op() -> LeafOp:
    """ActivationOperation SWIGLU_FORWARD: x `[T, 2I]` -> silu(x[:, :I]) * x[:, I:]."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        gate, up = ins[0].chunk(2, dim=-1)
        return [torch.nn.functional.silu(gate) * up]

    return LeafOp(
        "ActivationOperation",
        {"activationType": ACTIVATION_SWIGLU_FORWARD, "dim": -1, "scale": 1.0, "geluMode": 0},
        fn,
        1,
        1,
    )


def default_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


# ---------------------------------------------------------------- communication (tensor parallelism)
class Communicator(Protocol):
    """The collective calls of one tensor-parallel group; every rank calls them in the same order."""

    size: int

    def all_reduce(self, rank: int, x: Tensor, scales: dict[int, float] | None = None) -> Tensor: ...

    def all_gather(self, rank: int, x: Tensor) -> Tensor: ...


def comm_param(rank: int, size: int) -> dict[str, Any]:
    """The param ATB records for a communication op (`atb::infer::AllReduceParam` / `AllGatherParam`)."""
    return {
        "rank": rank,
        "rankSize": size,
        "rankRoot": 0,
        "backend": "hccl",
        "rankTableFile": "",
        "commMode": 0,
        "commDomain": "",
    }


def all_reduce_op(rank: int, size: int, comm: Communicator) -> LeafOp:
    """AllReduceOperation (sum): this rank's partial `[T, H]` -> the sum over every rank's partial."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [comm.all_reduce(rank, ins[0])]

    return LeafOp("AllReduceOperation", {**comm_param(rank, size), "allReduceType": "sum"}, fn, 1, 1)


def all_gather_op(rank: int, size: int, comm: Communicator) -> LeafOp:
    """AllGatherOperation: this rank's `[T, X]` -> every rank's, stacked `[rankSize, T, X]`."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [comm.all_gather(rank, ins[0])]

    return LeafOp("AllGatherOperation", comm_param(rank, size), fn, 1, 1)


def transpose_op(perm: list[int]) -> LeafOp:
    """TransposeOperation: the dims permuted by `perm` (contiguous, as ATB writes a new tensor)."""

    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [ins[0].permute(*perm).contiguous()]

    return LeafOp("TransposeOperation", {"perm": list(perm)}, fn, 1, 1)
