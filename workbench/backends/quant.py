"""The quantized test stack: the demo Llama's linears fake-quantized to int8 in torch (W8A16 or W8A8).

`quantize(model, scheme, defect)` replaces each `nn.Linear` the recipe quantizes by a `QuantLinear` whose
children are what a real quantized kernel computes, so that the msit torch dumper writes what a real quantized
run dumps:

    {lin}                 QuantLinear   input 0: float x            output 0: the dequantized float output
    {lin}.quant_input     ActQuant      (W8A8) output 0: int8 x_q, 1: per-token scale [.., T, 1], 2: offset (asym.)
    {lin}.matmul          QuantMatmul   W8A8: inputs x_q, int8 weight [out, in], weight scale [out], offset;
                                        output 0: the int32 accumulator
                                        W8A16: inputs float x, int8 weight, weight scale; output 0: float

The recipe: weights per-channel symmetric int8 (scale = max|w| / 127 per output channel); activations (W8A8)
per-token int8, symmetric, except the MLP down projection's input (the SwiGLU output is skewed), quantized
asymmetric with an offset; `lm_head` and `KEEP_FLOAT` stay in float. Which int tensor dequantizes with which
scale is written into the dump's manifest (`quant_manifest`, key `quant`; the rule is `formats/quant_links.py`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

Tensor = torch.Tensor

SCHEMES = ("w8a16", "w8a8")
QMAX = 127
QMIN = -128

# layer index -> linears the good recipe keeps in float (the demo model's layer 3 down projection has a few
# weight columns 32x larger than the rest: a symmetric per-channel int8 grid spread over them loses the others)
OUTLIER_LAYER = 3
OUTLIER_COLUMNS = (5, 77, 301)
OUTLIER_FACTOR = 32.0
KEEP_FLOAT = (f"model.layers.{OUTLIER_LAYER}.mlp.down_proj", "lm_head")


@dataclass(frozen=True, slots=True)
class QuantDefect:
    """One planted quantization defect: `kind`, the linear it lives in, the schemes it exists in."""

    kind: str
    linear: str
    text: str
    schemes: tuple[str, ...] = SCHEMES


QUANT_DEFECTS: dict[str, QuantDefect] = {
    d.kind: d
    for d in (
        QuantDefect(
            "act_clip",
            "model.layers.2.mlp.down_proj",
            "layer 2's down_proj input quantized on a range clipped to a quarter of its max (outliers clipped)",
            ("w8a8",),
        ),
        QuantDefect(
            "weight_scale",
            "model.layers.1.mlp.up_proj",
            "layer 1's up_proj with 16 per-channel weight scales 8x too small (its weights saturate at +-127)",
        ),
        QuantDefect(
            "offset_twice",
            "model.layers.1.mlp.down_proj",
            "layer 1's down_proj subtracts its asymmetric activation offset twice",
            ("w8a8",),
        ),
        QuantDefect(
            "float_layer",
            KEEP_FLOAT[0],
            f"layer {OUTLIER_LAYER}'s down_proj quantized (the recipe keeps it in float: outlier weight columns)",
        ),
    )
}


def check_defect(kind: str | None, scheme: str) -> QuantDefect | None:
    """The defect `kind` (None: none); ValueError for an unknown scheme, kind, or a kind the scheme lacks."""
    if scheme not in SCHEMES:
        raise ValueError(f"--scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    if kind is None:
        return None
    d = QUANT_DEFECTS.get(kind)
    if d is None:
        raise ValueError(f"--defect {kind!r}: --stack quant plants one of {', '.join(QUANT_DEFECTS)}")
    if scheme not in d.schemes:
        raise ValueError(f"--defect {kind}: lives in the int8 activations; give --scheme {d.schemes[0]}")
    return d


def add_outliers(model: nn.Module) -> None:
    """Give the demo model's layer `OUTLIER_LAYER` down projection outlier weight columns (the function is kept:
    the matching up_proj rows shrink by the same factor)."""
    mlp = model.model.layers[OUTLIER_LAYER].mlp  # type: ignore[union-attr,index]
    with torch.no_grad():
        for k in OUTLIER_COLUMNS:
            mlp.up_proj.weight[k, :] /= OUTLIER_FACTOR
            mlp.down_proj.weight[:, k] *= OUTLIER_FACTOR


def weight_scale(w: Tensor) -> Tensor:
    """Per-output-channel symmetric int8 scale: max|w| / 127 per row."""
    return (w.abs().amax(dim=1) / QMAX).clamp_min(1e-12)


class ActQuant(nn.Module):
    """Per-token int8 activation quantization; returns (int8, scale[, offset])."""

    def __init__(self, asymmetric: bool, clip: float | None) -> None:
        super().__init__()
        self.asymmetric = asymmetric
        self.clip = clip  # planted: the range taken as this fraction of the token's max

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        xf = x.float()
        if self.asymmetric:
            hi, lo = xf.amax(dim=-1, keepdim=True), xf.amin(dim=-1, keepdim=True)
            if self.clip is not None:
                hi, lo = hi * self.clip, lo * self.clip
            scale = ((hi - lo) / (QMAX - QMIN)).clamp_min(1e-12)
            offset = (QMIN - torch.round(lo / scale)).clamp(QMIN, QMAX)
            q = torch.clamp(torch.round(xf / scale) + offset, QMIN, QMAX)
            return q.to(torch.int8), scale, offset.to(torch.int32)
        amax = xf.abs().amax(dim=-1, keepdim=True)
        if self.clip is not None:
            amax = amax * self.clip
        scale = (amax / QMAX).clamp_min(1e-12)
        q = torch.clamp(torch.round(xf / scale), -QMAX, QMAX)
        return q.to(torch.int8), scale


class QuantMatmul(nn.Module):
    """The int8 matmul: W8A8 int32 accumulator of (x_q - offset) . w_q; W8A16 x . (w_q * scale)."""

    def __init__(self, offset_times: int = 1) -> None:
        super().__init__()
        self.offset_times = offset_times  # planted: 2 subtracts the activation offset twice

    def forward(self, x: Tensor, w_q: Tensor, w_scale: Tensor, offset: Tensor | None = None) -> Tensor:
        if x.dtype == torch.int8:
            xq = x.double()
            if offset is not None:
                xq = xq - self.offset_times * offset.double()
            return (xq @ w_q.double().t()).to(torch.int32)  # exact: |sum| < 2**53
        return x @ (w_q.to(x.dtype) * w_scale.to(x.dtype)[:, None]).t()


class QuantLinear(nn.Module):
    """A bias-free Linear computed on int8 weights (and int8 activations under W8A8), output dequantized."""

    def __init__(
        self,
        linear: nn.Linear,
        scheme: str,
        *,
        asymmetric: bool = False,
        clip: float | None = None,
        offset_times: int = 1,
        scale_fault: tuple[int, float] | None = None,
    ) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = weight_scale(w)
        if scale_fault is not None:  # planted: the first `n` channels' scales divided by `factor`
            n, factor = scale_fault
            scale = scale.clone()
            scale[:n] /= factor
        self.register_buffer("w_q", torch.clamp(torch.round(w / scale[:, None]), -QMAX, QMAX).to(torch.int8))
        self.register_buffer("w_scale", scale)
        self.scheme = scheme
        self.in_features, self.out_features = linear.in_features, linear.out_features
        if scheme == "w8a8":
            self.quant_input = ActQuant(asymmetric, clip)
        self.matmul = QuantMatmul(offset_times)

    def forward(self, x: Tensor) -> Tensor:
        if self.scheme == "w8a16":
            return self.matmul(x, self.w_q, self.w_scale)
        parts = self.quant_input(x)
        offset = parts[2] if len(parts) > 2 else None
        acc = self.matmul(parts[0], self.w_q, self.w_scale, offset)
        return (acc.double() * parts[1].double() * self.w_scale.double()).to(x.dtype)


def quantize(model: nn.Module, scheme: str, defect: QuantDefect | None, keep_float: tuple[str, ...] = ()) -> list[str]:
    """Replace the recipe's linears of `model` in place by `QuantLinear`; returns their names (module paths).

    The recipe keeps `KEEP_FLOAT` and `keep_float` in float; the `float_layer` defect quantizes `KEEP_FLOAT[0]`."""
    kept = set(KEEP_FLOAT)
    if defect is not None and defect.kind == "float_layer":
        kept.discard(defect.linear)
    kept |= set(keep_float)
    done: list[str] = []
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, nn.Linear) or name in kept:
            continue
        if mod.bias is not None:
            raise ValueError(f"{name}: the quantized stack handles bias-free linears only")
        here = defect if defect is not None and defect.linear == name else None
        kind = here.kind if here else ""
        q = QuantLinear(
            mod,
            scheme,
            asymmetric=name.endswith("mlp.down_proj"),
            clip=0.25 if kind == "act_clip" else None,
            offset_times=2 if kind == "offset_twice" else 1,
            scale_fault=(16, 8.0) if kind == "weight_scale" else None,
        )
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, q)
        done.append(name)
    return done


def quant_manifest(model: nn.Module, scheme: str, root: str = "root") -> dict[str, Any]:
    """The manifest's `quant` entry: per int tensor, its scales, offset and the float tensor it stands for
    (node, io, index triples in the dump's names; the rule `formats/quant_links.py` reads)."""
    links: list[dict[str, Any]] = []
    linears: dict[str, dict[str, Any]] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, QuantLinear):
            continue
        lin = f"{root}.{name}"
        w_scale = {"node": f"{lin}.matmul", "io": "input", "index": 2, "axis": -1}
        weight = {"node": f"{lin}.matmul", "io": "input", "index": 1}
        linears[lin] = {"weight": weight, "weight_scale": w_scale, "in_features": mod.in_features}
        if scheme == "w8a8":
            asym = mod.quant_input.asymmetric
            x_scale = {"node": f"{lin}.quant_input", "io": "output", "index": 1}
            offset = {"node": f"{lin}.quant_input", "io": "output", "index": 2} if asym else None
            act = {"node": f"{lin}.quant_input", "io": "output", "index": 0}
            linears[lin].update(activation=act, activation_scale=x_scale, activation_offset=offset)
            links.append(
                {
                    **act,
                    "dtype": "int8",
                    "scales": [x_scale],
                    "offset": offset,
                    "float": {"node": lin, "io": "input", "index": 0},
                }
            )
            links.append(
                {
                    "node": f"{lin}.matmul",
                    "io": "output",
                    "index": 0,
                    "dtype": "int32",
                    "scales": [x_scale, w_scale],
                    "offset": None,
                    "float": {"node": lin, "io": "output", "index": 0},
                }
            )
    return {"scheme": scheme, "linears": linears, "tensors": links}


@torch.no_grad()
def logits_agreement(golden: nn.Module, test: nn.Module, ids: Tensor, first: int) -> tuple[float, float]:
    """(mean KL(golden || test) of the next-token distributions, top-1 agreement) over positions `first`-1 ..
    end of `ids` (one forward pass each, the same ids fed to both)."""
    g = golden(input_ids=ids).logits[0, first - 1 :].double()
    t = test(input_ids=ids).logits[0, first - 1 :].double()
    lg, lt = torch.log_softmax(g, dim=-1), torch.log_softmax(t, dim=-1)
    kl = float((lg.exp() * (lg - lt)).sum(dim=-1).mean())
    top1 = float((g.argmax(dim=-1) == t.argmax(dim=-1)).double().mean())
    return (kl if math.isfinite(kl) else float("inf")), top1
