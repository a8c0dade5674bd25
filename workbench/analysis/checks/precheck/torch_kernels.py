"""The torch references: each module or API call of `CHECKERS` re-run alone, in float64, from its dumped tensors.

A checker recomputes the op in float64 on the CPU, rounding to the op's dtype only where the module itself
materialises a tensor in that dtype (HF's RMSNorm casts the normalised activations back before the weight
multiply; a rotary embedding's angles are float32), and returns each tensor to judge (`Check`;
`judge.judge_by_opcheck` judges it).

Composite modules (self-attention, the gated MLP) are checked stage by stage when their children were
dumped: each projection as a Linear, then the module's own arithmetic between the children's dumped
outputs and inputs (rotary + attention core, `act(gate) * up`), so a verdict names the stage that breaks.
Decode steps rebuild the KV cache from the earlier tokens' dumped `k_proj`/`v_proj` outputs.

Module attributes (epsilon, rotary base, softmax dim) are not dumped: the checker tries the usual values
and names the one it used. A new module or API: a checker here, registered in `CHECKERS` and `checker_key`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from workbench.analysis.checks.precheck.judge import REL_PASS_RATE, Check, judge_by_opcheck, standard
from workbench.analysis.checks.precheck.result import NO_REFERENCE, WEIGHTS_NOT_DUMPED
from workbench.analysis.checks.precheck.torch_inputs import CannotRun, TorchOp, attr_name
from workbench.formats.model import dtype_name

Tensor = torch.Tensor

RMS_EPS = (1e-6, 1e-5, 1e-12, 1e-8)
LN_EPS = (1e-5, 1e-12, 1e-6)
ROPE_BASES = (10000.0, 1000000.0, 500000.0, 100000.0, 50000.0)

TorchChecker = Callable[[TorchOp], list[Check]]


# ---------------------------------------------------------------------------------------- helpers


def _d(t: Tensor) -> Tensor:
    return t.detach().to(torch.float64)


def _rd(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Round a float64 value to `dtype` and back: what materialising it in that dtype does."""
    if not dtype.is_floating_point or dtype == torch.float64:
        return t
    return t.to(dtype).to(torch.float64)


def _one_in(op: TorchOp, what: str = "x") -> Tensor:
    if not op.ins:
        raise CannotRun(f"{op.name}: no input dumped ({what})")
    return op.ins[0]


def _best(candidates: list[tuple[str, list[Check]]]) -> list[Check]:
    """The candidate (an epsilon, a base) whose checks fit best; its note names it."""
    scored = []
    for note, checks in candidates:
        score = min((judge_by_opcheck(c, i).values.get(REL_PASS_RATE) or 0.0) for i, c in enumerate(checks))
        scored.append((score, note, checks))
    score, note, checks = max(scored, key=lambda s: s[0])
    for c in checks:
        c.note = "; ".join(x for x in (c.note, note) if x)
    return checks


# ---------------------------------------------------------------------------------------- references


def _linear_ref(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise CannotRun(f"x {list(x.shape)} does not multiply weight {list(w.shape)}")
    y = _d(x) @ _d(w).T
    return y + _d(b) if b is not None else y


def _acc_floor(x: Tensor, w_t: Tensor, b: Tensor | None = None) -> Tensor:
    """What float32 accumulation may add to `x @ w_t`: ~sqrt(K) roundings of 2^-24 of the summed magnitudes."""
    mag = _d(x).abs() @ _d(w_t).abs()
    if b is not None:
        mag = mag + _d(b).abs()
    return mag * (2.0 * math.sqrt(max(1, x.shape[-1])) * 2.0**-24)


def _linear_check(label: str, x: Tensor, w: Tensor, b: Tensor | None, out: Tensor, note: str | None = None) -> Check:
    return Check(label, _linear_ref(x, w, b), out, note, floor=_acc_floor(x, w.T, b))


def _linear(op: TorchOp) -> list[Check]:
    return [_linear_check("out", _one_in(op), op.weight(), op.params.get("bias"), op.outs[0])]


def _api_linear(op: TorchOp) -> list[Check]:
    if len(op.ins) < 2:
        raise CannotRun("linear needs x and weight as tensors")
    return [_linear_check("out", op.ins[0], op.ins[1], op.ins[2] if len(op.ins) > 2 else None, op.outs[0])]


def _embedding_ref(ids: Tensor, w: Tensor) -> Tensor:
    if ids.dtype.is_floating_point:
        raise CannotRun(f"embedding indices are {ids.dtype}, not integers")
    flat = ids.long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= w.shape[0]):
        raise CannotRun(f"indices outside the {w.shape[0]} rows of the table")
    return _d(w)[flat]


def _embedding(op: TorchOp) -> list[Check]:
    return [Check("out", _embedding_ref(_one_in(op, "indices"), op.weight()), op.outs[0])]


def _aten_embedding(op: TorchOp) -> list[Check]:
    """`aten.embedding(weight, indices)`: the table first."""
    if len(op.ins) < 2:
        raise CannotRun("embedding needs weight and indices as tensors")
    return [Check("out", _embedding_ref(op.ins[1], op.ins[0]), op.outs[0])]


def _api_embedding(op: TorchOp) -> list[Check]:
    if len(op.ins) < 2:
        raise CannotRun("embedding needs indices and weight as tensors")
    return [Check("out", _embedding_ref(op.ins[0], op.ins[1]), op.outs[0])]


def _rms_norm(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    w = op.weight()
    g = _d(w) + (1.0 if "gemma" in op.type.lower() else 0.0)
    x64 = _d(x)
    var = x64.pow(2).mean(-1, keepdim=True)
    # HF: normalise in float32, cast back to the input dtype, then multiply by the weight
    cands = [
        (
            f"eps {eps:g} assumed (not dumped)",
            [Check("out", g * _rd(x64 * torch.rsqrt(var + eps), x.dtype), op.outs[0])],
        )
        for eps in RMS_EPS
    ]
    return _best(cands)


def _layer_norm_ref(x: Tensor, w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    return F.layer_norm(_d(x), (x.shape[-1],), _d(w) if w is not None else None, _d(b) if b is not None else None, eps)


def _ln_floor(x: Tensor, w: Tensor | None, eps: float) -> Tensor:
    """What float32 mean and variance may add: the mean's rounding (of the summed magnitudes) over the spread."""
    x64 = _d(x)
    sd = torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + eps)
    scale = x64.abs().amax(-1, keepdim=True) / sd * (2.0 * math.sqrt(x.shape[-1]) * 2.0**-24)
    return scale * (_d(w).abs() if w is not None else 1.0) + torch.zeros_like(x64)


def _ln_checks(x: Tensor, w: Tensor | None, b: Tensor | None, out: Tensor) -> list[Check]:
    return _best(
        [
            (
                f"eps {eps:g} assumed (not dumped)",
                [Check("out", _layer_norm_ref(x, w, b, eps), out, floor=_ln_floor(x, w, eps))],
            )
            for eps in LN_EPS
        ]
    )


def _layer_norm(op: TorchOp) -> list[Check]:
    return _ln_checks(_one_in(op), op.params.get("weight"), op.params.get("bias"), op.outs[0])


def _api_layer_norm(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    return _ln_checks(x, op.ins[1] if len(op.ins) > 1 else None, op.ins[2] if len(op.ins) > 2 else None, op.outs[0])


def _silu(x: Tensor) -> Tensor:
    x64 = _d(x)
    return x64 * torch.sigmoid(x64)


def _gelu(x: Tensor) -> Tensor:
    x64 = _d(x)
    return 0.5 * x64 * (1.0 + torch.erf(x64 / math.sqrt(2.0)))


def _gelu_tanh(x: Tensor) -> Tensor:
    x64 = _d(x)
    return 0.5 * x64 * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64.pow(3))))


def _new_gelu(x: Tensor) -> Tensor:
    """HF's NewGELUActivation: five torch ops, each rounded to the input dtype."""
    dt = x.dtype
    x64 = _d(x)
    inner = _rd(x64 + _rd(0.044715 * _rd(x64.pow(3), dt), dt), dt)
    t = _rd(torch.tanh(_rd(math.sqrt(2.0 / math.pi) * inner, dt)), dt)
    return _rd(0.5 * x64, dt) * _rd(1.0 + t, dt)


_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": _silu,
    "gelu": _gelu,
    "gelu_tanh": _gelu_tanh,
    "new_gelu": _new_gelu,
    "relu": lambda x: _d(x).clamp_min(0.0),
    "quick_gelu": lambda x: _d(x) * torch.sigmoid(1.702 * _d(x)),
    "sigmoid": lambda x: torch.sigmoid(_d(x)),
    "tanh": lambda x: torch.tanh(_d(x)),
    "exp": lambda x: torch.exp(_d(x)),
    "rsqrt": lambda x: torch.rsqrt(_d(x)),
    "sqrt": lambda x: torch.sqrt(_d(x)),
    "neg": lambda x: -_d(x),
}
_ACTIVATION_TYPES = {
    "SiLU": "silu",
    "SiLUActivation": "silu",
    "GELU": "gelu",
    "GELUActivation": "gelu",
    "GELUTanh": "gelu_tanh",
    "PytorchGELUTanh": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",
    "NewGELUActivation": "new_gelu",
    "QuickGELUActivation": "quick_gelu",
    "ReLU": "relu",
    "Sigmoid": "sigmoid",
    "Tanh": "tanh",
}


def activation_kind(type_name: str) -> str | None:
    """The activation a module type or API name computes (`silu`, `gelu`, ...), None if it is not one."""
    if type_name in _ACTIVATION_TYPES:
        return _ACTIVATION_TYPES[type_name]
    api = type_name.rsplit(".", 1)[-1].strip("_")
    return api if api in _ACTIVATIONS else None


def _activation(op: TorchOp) -> list[Check]:
    kind = activation_kind(op.type) or activation_kind(_api_name(op.type))
    assert kind is not None
    return [Check("out", _ACTIVATIONS[kind](_one_in(op)), op.outs[0])]


def _softmax(op: TorchOp) -> list[Check]:
    x = _one_in(op)
    return [Check("out", torch.softmax(_d(x), dim=-1), op.outs[0], note="softmax over the last dim assumed")]


_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mul": torch.mul,
    "add": torch.add,
    "sub": torch.sub,
    "div": torch.div,
    "truediv": torch.div,
    "matmul": torch.matmul,
    "mm": torch.matmul,
    "bmm": torch.matmul,
    "rmul": torch.mul,
    "radd": torch.add,
}


def _binary(op: TorchOp) -> list[Check]:
    api = _api_name(op.type).strip("_")
    if len(op.ins) < 2:
        raise CannotRun(f"{api}: one operand is not a tensor and was not kept by the dump")
    a, b = _d(op.ins[0]), _d(op.ins[1])
    if api in ("rsub", "rtruediv", "rdiv"):
        a, b = b, a
    fn = _BINARY.get(api, torch.div if api in ("rtruediv", "rdiv") else torch.sub if api == "rsub" else None)
    if fn is None:
        raise CannotRun(f"{NO_REFERENCE} for {api}")
    try:
        if fn is torch.matmul:
            return [Check("out", fn(a, b), op.outs[0], floor=_acc_floor(op.ins[0], op.ins[1]))]
        return [Check("out", fn(a, b), op.outs[0])]
    except RuntimeError as exc:
        raise CannotRun(f"{api}: the dumped operands do not fit ({str(exc).splitlines()[0][:100]})") from None


def _rotary(op: TorchOp) -> list[Check]:
    if len(op.outs) < 2 or len(op.ins) < 2:
        raise CannotRun("a rotary embedding needs (x, position_ids) in and (cos, sin) out")
    pos = op.named("position_ids")
    pos = pos if pos is not None else op.ins[-1]
    if pos.dtype.is_floating_point:
        raise CannotRun(f"position ids are {pos.dtype}, not integers")
    cos_t, sin_t = op.outs[0], op.outs[1]
    dim = cos_t.shape[-1]
    cands = []
    for base in ROPE_BASES:
        # HF: inv_freq in float32 (or in the model's dtype once `model.to(dtype)` cast the buffer), angles =
        # positions * inv_freq in float32, cos/sin of those, cast to x's dtype
        inv32 = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        for stored in dict.fromkeys((torch.float32, cos_t.dtype)):
            inv = _rd(_d(inv32), stored)
            ang = _rd(_d(pos)[..., None] * inv, torch.float32)
            emb = torch.cat((ang, ang), dim=-1)
            where = "" if stored == torch.float32 else f", inv_freq held in {dtype_name(stored)}"
            cands.append(
                (
                    f"rope base {base:g} assumed (inv_freq is a buffer, not dumped){where}",
                    [Check("cos", emb.cos(), cos_t), Check("sin", emb.sin(), sin_t)],
                )
            )
    return _best(cands)


def _api_name(type_name: str) -> str:
    if type_name.startswith("aten."):  # an aten op of an FX dump (TorchAir): aten.mm.default -> mm
        return type_name.split(".")[1]
    return type_name.rsplit(".", 1)[-1]


# ---------------------------------------------------------------------------------------- composite modules


def _child_linear(op: TorchOp, attrs: tuple[str, ...], x: Tensor, token: int) -> tuple[Tensor, list[Check], str]:
    """A projection's output at `token`: dumped (and checked as a Linear) or recomputed from its weights."""
    src = op.source
    node = src.child(op.name, *attrs)
    if node is None:
        raise CannotRun(f"{op.name}: no child {'/'.join(attrs)}")
    if src.has(node, token):
        child = src.op(node, token)
        checks = []
        if child.params.get("weight") is not None and child.ins:
            checks = [
                _linear_check(attr_name(node), child.ins[0], child.weight(), child.params.get("bias"), child.outs[0])
            ]
        else:
            op.skipped[attr_name(node)] = WEIGHTS_NOT_DUMPED if child.ins else "its input was not dumped"
        return child.outs[0], checks, node
    params = src.op_params(node)
    w = params.get("weight")
    if w is None:
        raise CannotRun(f"{node}: neither dumped at token {token} nor its weight saved")
    y = _rd(_linear_ref(x, w, params.get("bias")), x.dtype)
    return y.to(x.dtype), [], node


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_apply(t: Tensor, cos: Tensor, sin: Tensor, dtype: torch.dtype) -> Tensor:
    """HF `apply_rotary_pos_emb` on `[B, H, T, D]` in `dtype`: three rounded ops."""
    c, s = _d(cos).unsqueeze(1), _d(sin).unsqueeze(1)
    return _rd(_rd(t * c, dtype) + _rd(_rotate_half(t) * s, dtype), dtype)


def _attention_parts(op: TorchOp, token: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None, list[Check]]:
    """q (rotated), k, v (rotated k, v of this token) in float64 `[B, H, T, D]`, the mask, and the projection checks."""
    this = op if token == op.token else op.source.op(op.name, token)
    x = this.named("hidden_states")
    x = x if x is not None else _one_in(this, "hidden_states")
    cos, sin = this.named("position_embeddings.0"), this.named("position_embeddings.1")
    if cos is None or sin is None:
        pairs = [t for t in this.ins[1:] if t.is_floating_point() and t.dim() == 3]
        if len(pairs) < 2:
            raise CannotRun(f"{op.name}: no position embeddings (cos, sin) among the dumped inputs")
        cos, sin = pairs[0], pairs[1]
    head_dim = cos.shape[-1]
    dt = x.dtype
    q, cq, _ = _child_linear(this, ("q_proj", "query"), x, token)
    k, ck, _ = _child_linear(this, ("k_proj", "key"), x, token)
    v, cv, _ = _child_linear(this, ("v_proj", "value"), x, token)
    b, t = x.shape[0], x.shape[1]

    def heads(y: Tensor) -> Tensor:
        if y.numel() % (b * t * head_dim):
            raise CannotRun(f"{op.name}: projection {list(y.shape)} does not split into heads of {head_dim}")
        return _d(y).reshape(b, t, -1, head_dim).transpose(1, 2)

    qh, kh, vh = heads(q), heads(k), heads(v)
    qh, kh = _rope_apply(qh, cos, sin, dt), _rope_apply(kh, cos, sin, dt)
    mask = this.named("attention_mask")
    return qh, kh, vh, mask, cq + ck + cv


def _starts_at_position_zero(op: TorchOp) -> bool:
    """Whether this call's first query is position 0 (a prefill, no cache): from position_ids, else from sin
    (all zero at position 0)."""
    pos = op.named("position_ids")
    if pos is not None and not pos.dtype.is_floating_point and pos.numel():
        return int(pos.min()) == 0
    sin = op.named("position_embeddings.1")
    if sin is not None and sin.dim() >= 2:
        return bool((sin[..., 0, :] == 0).all())
    return op.token == 0


def _attention(op: TorchOp) -> list[Check]:
    qh, kh, vh, mask, checks = _attention_parts(op, op.token)
    x = op.named("hidden_states")
    dt = (x if x is not None else op.ins[0]).dtype
    past = [t for t in op.source.tokens(op.name) if t < op.token]
    note = None
    if not _starts_at_position_zero(op):
        if past != list(range(op.token)):
            missing = sorted(set(range(op.token)) - set(past))
            raise CannotRun(f"decode token {op.token}: the KV cache needs tokens {missing}, which were not dumped")
        ks, vs = [], []
        for t in past:
            _, k_t, v_t, _, _ = _attention_parts(op, t)
            ks.append(k_t)
            vs.append(v_t)
        kh, vh = torch.cat([*ks, kh], dim=2), torch.cat([*vs, vh], dim=2)
        note = f"KV cache rebuilt from tokens 0-{op.token - 1}"
    hq, hkv = qh.shape[1], kh.shape[1]
    if hkv == 0 or hq % hkv:
        raise CannotRun(f"{hq} query heads do not group over {hkv} kv heads")
    kh, vh = kh.repeat_interleave(hq // hkv, dim=1), vh.repeat_interleave(hq // hkv, dim=1)
    tq, tk = qh.shape[2], kh.shape[2]
    scores = (qh @ kh.transpose(-1, -2)) / math.sqrt(qh.shape[-1])
    if mask is not None and mask.dim() == 4:
        m = mask[..., -tq:, -tk:]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + _d(m)
    else:
        causal = torch.ones(tq, tk, dtype=torch.bool).tril(diagonal=tk - tq)
        scores = scores.masked_fill(~causal, float("-inf"))
        if mask is not None and mask.dim() == 2:  # padding mask [B, Tk]
            scores = scores.masked_fill(~mask[:, None, None, -tk:].bool(), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    core = (probs @ vh).transpose(1, 2).reshape(qh.shape[0], tq, -1)
    # a kernel may hold the scores and probabilities in the input dtype: each weight is then off by up to a
    # rounding, so the sum may be off by a rounding of the summed magnitudes
    etol = standard(dtype_name(dt))[0]
    floor = ((probs @ vh.abs()) * (2.0 * etol)).transpose(1, 2).reshape(core.shape)
    o_node = op.source.child(op.name, "o_proj", "dense", "out_proj")
    if o_node is not None and op.source.has(o_node, op.token):
        o = op.source.op(o_node, op.token)
        checks.append(Check("attention core", core, o.ins[0], note, floor=floor))
        if o.params.get("weight") is not None:
            checks.append(_linear_check(attr_name(o_node), o.ins[0], o.weight(), o.params.get("bias"), o.outs[0]))
        else:
            op.skipped[attr_name(o_node)] = WEIGHTS_NOT_DUMPED
        checks.append(Check("out", _d(o.outs[0]), op.outs[0]))
        return checks
    if o_node is None:
        checks.append(Check("out", core, op.outs[0], note))
        return checks
    params = op.source.op_params(o_node)
    if params.get("weight") is None:
        raise CannotRun(f"{o_node}: neither dumped at token {op.token} nor its weight saved")
    out = _linear_ref(_rd(core, dt), params["weight"], params.get("bias"))
    checks.append(Check("out", out, op.outs[0], "; ".join(x for x in (note, "recomputed end to end") if x)))
    return checks


def _gated_mlp(op: TorchOp) -> list[Check]:
    src = op.source
    if src.child(op.name, "gate_proj") is None:
        raise CannotRun(f"{op.type}: only gated MLPs (gate_proj, up_proj, down_proj) are implemented")
    x = _one_in(op)
    gate, checks, _ = _child_linear(op, ("gate_proj",), x, op.token)
    up, c2, _ = _child_linear(op, ("up_proj",), x, op.token)
    checks += c2
    act_node = src.child(op.name, "act_fn", "act")
    kind = activation_kind(src.types.get(act_node or "", "")) or "silu"
    if act_node is not None and src.has(act_node, op.token):
        a = src.op(act_node, op.token)
        checks.append(Check(attr_name(act_node), _ACTIVATIONS[kind](a.ins[0]), a.outs[0]))
        act = a.outs[0]
    else:
        act = _rd(_ACTIVATIONS[kind](gate), gate.dtype).to(gate.dtype)
    prod = _d(act) * _d(up)
    down = src.child(op.name, "down_proj")
    if down is not None and src.has(down, op.token):
        d = src.op(down, op.token)
        checks.append(Check("act(gate) * up", prod, d.ins[0]))
        if d.params.get("weight") is not None:
            checks.append(_linear_check("down_proj", d.ins[0], d.weight(), d.params.get("bias"), d.outs[0]))
        else:
            op.skipped["down_proj"] = WEIGHTS_NOT_DUMPED
        checks.append(Check("out", _d(d.outs[0]), op.outs[0]))
        return checks
    params = src.op_params(down) if down is not None else {}
    if params.get("weight") is None:
        raise CannotRun(f"{op.name}: down_proj neither dumped nor its weight saved")
    checks.append(
        Check(
            "out",
            _linear_ref(_rd(prod, gate.dtype), params["weight"], params.get("bias")),
            op.outs[0],
            "recomputed end to end",
        )
    )
    return checks


# ---------------------------------------------------------------------------------------- the registry

CHECKERS: dict[str, TorchChecker] = {
    "Linear": _linear,
    "Embedding": _embedding,
    "RMSNorm": _rms_norm,
    "LayerNorm": _layer_norm,
    "RotaryEmbedding": _rotary,
    "Attention": _attention,
    "MLP": _gated_mlp,
    "Activation": _activation,
    "Softmax": _softmax,
    "linear": _api_linear,
    "embedding": _api_embedding,
    "layer_norm": _api_layer_norm,
    "softmax": _softmax,
    "binary": _binary,
    "aten_embedding": _aten_embedding,
}
SUPPORTED_TYPES = (
    "Linear, Embedding, *RMSNorm, LayerNorm, *RotaryEmbedding, *Attention (q/k/v/o projections), gated *MLP, "
    "activations (SiLU, GELU, GELU-tanh, NewGELU, ReLU, ...), Softmax; APIs linear, embedding, layer_norm, "
    "softmax, matmul/mm/bmm, mul, add, sub, div and unary activations; the same aten ops of an FX dump (and the GE "
    "ops linked to them)"
)


def checker_key(type_name: str) -> str | None:
    """The `CHECKERS` key for a module type (`LlamaRMSNorm`) or API name (`Functional.linear`, `matmul`)."""
    if type_name in CHECKERS and type_name[0].isupper():
        return type_name
    if activation_kind(type_name) is not None and "." not in type_name and type_name[0].isupper():
        return "Activation"
    for suffix in ("RMSNorm", "RotaryEmbedding", "Attention", "MLP", "LayerNorm"):
        if type_name.endswith(suffix) and type_name[:1].isupper() and "." not in type_name:
            return suffix
    if type_name in ("Linear", "Embedding", "Softmax"):
        return type_name
    if type_name.startswith("aten.embedding."):
        return "aten_embedding"
    api = _api_name(type_name)
    if api in ("linear", "embedding", "layer_norm", "softmax"):
        return api
    if api.strip("_") in _BINARY or api.strip("_") in ("rsub", "rtruediv", "rdiv"):
        return "binary"
    if activation_kind(api) is not None:
        return "Activation"
    return None
