"""Planted defects of the ATB-structured Llama: each one lives inside exactly one ATB op.

kind            op (inside the defect's layer)               what goes wrong
rmsnorm_eps     3_RmsNormOperation (post-attention norm)     epsilon `value` (default 1.0), in `param` too
rope_base       1_Attention/1_RopeOperation                  angles from a wrong base (theta * 0.01)
rope_halves     1_Attention/1_RopeOperation                  rotate-half with its halves swapped
fp16_overflow   4_Mlp/2_LinearOperation (down)               input scaled by 2**24 before the matmul:
                                                             inf/NaN in fp16, exact (no effect) in bf16
kv_slot         1_Attention/2_ReshapeAndCacheOperation       k/v written one slot early
attn_scale      1_Attention/3_{Self,Paged}AttentionOperation `qkScale` 1.0 instead of 1/sqrt(d)
allreduce_scale 1_Attention/5_AllReduceOperation (o_proj's)  rank `rank`'s contribution (default the last rank)
                                                             summed times `value` (default 0.97), on every rank
allreduce_drop  1_Attention/5_AllReduceOperation             rank `rank`'s contribution left out of the sum

The all-reduce defects need a tensor-parallel stack (`AtbLlama.shard`, 2+ ranks); each rank dumps its own
true partial sum as the op's input, so the sum of the inputs no longer matches the outputs.

A defect acts from decode step `from_token` on (0 = prefill; `kv_slot` defaults to 1) and
`expected_op` names the op folder where it is born: the first op, in execution order, whose
outputs differ from a clean run of the same stack.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from workbench.backends import atb_ops as ops
from workbench.backends.atb_ops import LeafOp, RunContext

if TYPE_CHECKING:
    from workbench.backends.atb_llama import AtbLlama

Tensor = torch.Tensor

DEFECT_KINDS: dict[str, str] = {
    "none": "no defect",
    "rmsnorm_eps": "wrong RMSNorm epsilon in one layer's post-attention norm",
    "rope_base": "RoPE angles from a wrong base in one layer",
    "rope_halves": "RoPE rotate-half with its halves swapped in one layer",
    "fp16_overflow": "down projection with an unscaled intermediate that overflows fp16 (inf/NaN)",
    "kv_slot": "KV cache written one slot early from a given decode step",
    "attn_scale": "attention without its 1/sqrt(head_dim) scale in one layer",
    "allreduce_scale": "one rank's contribution to one layer's attention all-reduce scaled by 0.97 (tensor parallel)",
    "allreduce_drop": "one rank's contribution left out of one layer's attention all-reduce (tensor parallel)",
}
TP_KINDS = ("allreduce_scale", "allreduce_drop")
DEFAULT_LAYER = 1
DEFAULT_VALUES: dict[str, float] = {
    "rmsnorm_eps": 1.0,
    "rope_base": 0.01,
    "fp16_overflow": 24.0,
    "allreduce_scale": 0.97,
    "allreduce_drop": 0.0,
}


@dataclass(frozen=True, slots=True)
class Defect:
    """One planted defect; `layer`/`from_token`/`value` default per kind (see the module table).

    For `rope_base`, `value` is the wrong base as a fraction of the true one when below 1
    (default 0.01), else the wrong base itself. `rank`: the tensor-parallel rank whose all-reduce contribution
    an all-reduce defect corrupts (default the last rank).
    """

    kind: str = "none"
    layer: int | None = None
    from_token: int | None = None
    value: float | None = None
    rank: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in DEFECT_KINDS:
            raise ValueError(f"defect {self.kind!r}: expected one of {', '.join(DEFECT_KINDS)}")
        if self.layer is not None and self.layer < 0:
            raise ValueError(f"defect layer {self.layer}: must be >= 0")
        if self.from_token is not None and self.from_token < 0:
            raise ValueError(f"defect from_token {self.from_token}: must be >= 0")
        if self.rank is not None and self.rank < 0:
            raise ValueError(f"defect rank {self.rank}: must be >= 0")

    @property
    def needs_tp(self) -> bool:
        """Whether the defect lives in a communication op (a tensor-parallel stack only)."""
        return self.kind in TP_KINDS

    def culprit_rank(self, size: int) -> int:
        """The rank whose all-reduce contribution goes wrong (default the last one)."""
        rank = size - 1 if self.rank is None else self.rank
        if rank >= size:
            raise ValueError(f"defect rank {rank}: the run has {size} ranks")
        return rank

    # ------------------------------------------------------------ resolution
    def resolved_layer(self, num_layers: int) -> int:
        """The layer the defect sits in (default 1, clamped to the model)."""
        layer = DEFAULT_LAYER if self.layer is None else self.layer
        if self.layer is not None and layer >= num_layers:
            raise ValueError(f"defect layer {layer}: the model has {num_layers} layers")
        return min(layer, num_layers - 1)

    @property
    def start(self) -> int:
        """First decode step (0 = prefill) at which the defect acts."""
        if self.from_token is not None:
            return self.from_token
        return 1 if self.kind == "kv_slot" else 0

    @property
    def param_value(self) -> float:
        return self.value if self.value is not None else DEFAULT_VALUES.get(self.kind, 0.0)

    def relative_op(self, phase: str) -> str | None:
        """The defective op's folder path inside its layer folder, for a phase."""
        return {
            "none": None,
            "rmsnorm_eps": "3_RmsNormOperation",
            "rope_base": "1_Attention/1_RopeOperation",
            "rope_halves": "1_Attention/1_RopeOperation",
            "fp16_overflow": "4_Mlp/2_LinearOperation",
            "kv_slot": "1_Attention/2_ReshapeAndCacheOperation",
            "attn_scale": "1_Attention/3_"
            + ("SelfAttentionOperation" if phase == "prefill" else "PagedAttentionOperation"),
            "allreduce_scale": "1_Attention/5_AllReduceOperation",
            "allreduce_drop": "1_Attention/5_AllReduceOperation",
        }[self.kind]

    def active(self, step: int) -> bool:
        return self.kind != "none" and step >= self.start

    def expected_op(
        self, token: int, num_layers: int, *, dtype: torch.dtype | None = None, warmup: bool = False
    ) -> str | None:
        """The op folder (below the token folder) where the defect is born at dump folder `token`.

        None where it does not act: before `from_token`, in the warmup execution, for `none`,
        and for `fp16_overflow` unless the dtype is float16.
        """
        from workbench.backends.atb_naming import layer_folder

        step = token - 1 if warmup else token
        if step < 0 or not self.active(step):
            return None
        if self.kind == "fp16_overflow" and dtype is not None and dtype != torch.float16:
            return None
        phase = "prefill" if step == 0 else "decode"
        rel = self.relative_op(phase)
        return f"{layer_folder(phase, self.resolved_layer(num_layers), num_layers)}/{rel}"

    def describe(self) -> str:
        """One line for logs and manifests."""
        if self.kind == "none":
            return "none"
        extra = f", value {self.value}" if self.value is not None else ""
        extra += f", rank {self.rank}" if self.rank is not None else ""
        layer = self.layer if self.layer is not None else "default"
        return f"{self.kind}: {DEFECT_KINDS[self.kind]} (layer {layer}, from step {self.start}{extra})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------ planting
    def patch(self, op: LeafOp, *, layer: int, rel_path: str, model: AtbLlama) -> LeafOp:
        """The op to use at `rel_path` of `layer`: `op` itself unless this defect lives there."""
        if self.kind == "none" or layer != self.resolved_layer(model.dims.num_layers):
            return op
        if rel_path not in (self.relative_op("prefill"), self.relative_op("decode")):
            return op
        return _PLANTERS[self.kind](self, op, model)


def _gated(defect: Defect, good: ops.OpFn, bad: ops.OpFn) -> ops.OpFn:
    def fn(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return bad(ins, ctx) if defect.active(ctx.step) else good(ins, ctx)

    return fn


def _rmsnorm_eps(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    wrong = defect.param_value
    good_eps = model.dims.eps
    param = ops.rms_norm_param(wrong)  # the wrong epsilon is what the op's param records

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [ops.rms_norm(ins[0], ins[1], wrong)]

    def good(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [ops.rms_norm(ins[0], ins[1], good_eps)]

    return replace(op, param=param, fn=_gated(defect, good, bad))


def _rope_base(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    d = model.dims
    base = defect.param_value * d.rope_theta if defect.param_value < 1 else defect.param_value
    inv_freq = 1.0 / (base ** (torch.arange(0, d.head_dim, 2, dtype=torch.float32) / d.head_dim))

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        q, k, cos, _sin, _seqlen = ins
        freqs = ctx.positions.float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos_w = (emb.cos() * model.rope_scaling).to(cos.dtype)
        sin_w = (emb.sin() * model.rope_scaling).to(cos.dtype)
        return [ops.apply_rope(q, cos_w, sin_w, d.head_dim), ops.apply_rope(k, cos_w, sin_w, d.head_dim)]

    return replace(op, fn=_gated(defect, op.fn, bad))


def _swapped_rotate(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((x[..., half:], -x[..., :half]), dim=-1)


def _rope_halves(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    hd = model.dims.head_dim

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        q, k, cos, sin, _seqlen = ins
        return [ops.apply_rope(t, cos, sin, hd, _swapped_rotate) for t in (q, k)]

    return replace(op, fn=_gated(defect, op.fn, bad))


def _fp16_overflow(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    scale = 2.0**defect.param_value  # a power of two: exact wherever it does not overflow

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        x, w = ins
        return [torch.nn.functional.linear(x * scale, w) / scale]

    return replace(op, fn=_gated(defect, op.fn, bad))


def _kv_slot(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        k, v, k_cache, v_cache, slots = ins
        ops.reshape_and_cache(k, v, k_cache, v_cache, (slots.long() - 1).clamp(min=0))
        return [k_cache, v_cache]

    return replace(op, fn=_gated(defect, op.fn, bad))


def _attn_scale(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    kernel = ops.self_attention if op.op_type == "SelfAttentionOperation" else ops.paged_attention

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [kernel(ins, 1.0)]

    return replace(op, param={**op.param, "qkScale": 1.0}, fn=_gated(defect, op.fn, bad))


def _allreduce(defect: Defect, op: LeafOp, model: AtbLlama) -> LeafOp:
    comm, rank = model.comm, model.tp_rank
    if comm is None:
        raise ValueError(f"defect {defect.kind}: needs a tensor-parallel stack")
    scales = {defect.culprit_rank(model.tp_size): defect.param_value}

    def bad(ins: list[Tensor], ctx: RunContext) -> list[Tensor]:
        return [comm.all_reduce(rank, ins[0], scales)]

    return replace(op, fn=_gated(defect, op.fn, bad))


_PLANTERS = {
    "rmsnorm_eps": _rmsnorm_eps,
    "rope_base": _rope_base,
    "rope_halves": _rope_halves,
    "fp16_overflow": _fp16_overflow,
    "kv_slot": _kv_slot,
    "attn_scale": _attn_scale,
    "allreduce_scale": _allreduce,
    "allreduce_drop": _allreduce,
}
