"""The rule by which a quantized run's int tensor finds its scales: the `quant` entry of `wb_manifest.json`.

```json
"quant": {"scheme": "w8a8",
          "tensors": [{"node": "root.model.layers.0.mlp.down_proj.quant_input", "io": "output", "index": 0,
                       "dtype": "int8",
                       "scales": [{"node": "...quant_input", "io": "output", "index": 1}],
                       "offset": {"node": "...quant_input", "io": "output", "index": 2},
                       "float": {"node": "root.model.layers.0.mlp.down_proj", "io": "input", "index": 0}}],
          "linears": {"root.model.layers.0.mlp.down_proj": {"weight": {...}, "weight_scale": {...}, ...}}}
```

An int tensor (`node`/`io`/`index`, the dump's own names; `io` is `input` or `output`) stands for the float
tensor `float` (a tensor of the golden run under the same name) as `(q - offset) * scale_1 * scale_2 ...`,
each scale and the offset a tensor of the same run at the same token, broadcast against `q` (a scale of
fewer dimensions lies along the last one). `offset` is null for a symmetric grid; an empty `scales` says the
dump holds no scale: the tensor can only be compared as integers. `linears` lists each quantized linear's
int8 weight, weight scale and (W8A8) activation, scale and offset, which the advisor's noise model reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUANT_KEY = "quant"
_IO = {"input": "in", "output": "out", "in": "in", "out": "out"}


@dataclass(frozen=True, slots=True)
class TensorRef:
    """One tensor of a node at every token: node name, role (`in`/`out`, the catalog's), index."""

    node: str
    io: str
    index: int


@dataclass(frozen=True, slots=True)
class QuantLink:
    """An int tensor, the tensors that dequantize it, and the float tensor it stands for."""

    tensor: TensorRef
    dtype: str
    scales: tuple[TensorRef, ...]
    offset: TensorRef | None
    float: TensorRef


@dataclass(frozen=True, slots=True)
class QuantLinear:
    """One quantized linear: its int8 weight and scale; under W8A8 its int8 activation, scale and offset."""

    name: str
    weight: TensorRef
    weight_scale: TensorRef
    activation: TensorRef | None
    activation_scale: TensorRef | None
    activation_offset: TensorRef | None


def _ref(obj: Any, where: str) -> TensorRef:
    if not isinstance(obj, dict):
        raise ValueError(f"{where}: expected an object with node, io, index")
    node, io, index = obj.get("node"), _IO.get(str(obj.get("io"))), obj.get("index")
    if not isinstance(node, str) or io is None or not isinstance(index, int) or isinstance(index, bool):
        raise ValueError(f"{where}: expected node (text), io (input/output) and index (an integer)")
    return TensorRef(node, io, index)


def _opt(obj: Any, where: str) -> TensorRef | None:
    return None if obj is None else _ref(obj, where)


def quant_links(meta: dict[str, Any]) -> tuple[list[QuantLink], list[QuantLinear]]:
    """The int tensors and quantized linears a dump's manifest declares (none without a `quant` entry).

    ValueError names the first malformed entry (`quant.tensors[3].scales[0]: ...`)."""
    q = meta.get(QUANT_KEY)
    if q is None:
        return [], []
    if not isinstance(q, dict):
        raise ValueError(f"{QUANT_KEY}: expected an object")
    links: list[QuantLink] = []
    for i, t in enumerate(q.get("tensors") or []):
        where = f"{QUANT_KEY}.tensors[{i}]"
        if not isinstance(t, dict) or not isinstance(t.get("scales", []), list):
            raise ValueError(f"{where}: expected an object with a list of scales")
        links.append(
            QuantLink(
                _ref(t, where),
                str(t.get("dtype") or "int8"),
                tuple(_ref(s, f"{where}.scales[{k}]") for k, s in enumerate(t.get("scales") or [])),
                _opt(t.get("offset"), f"{where}.offset"),
                _ref(t.get("float"), f"{where}.float"),
            )
        )
    linears: list[QuantLinear] = []
    for name, lin in (q.get("linears") or {}).items():
        where = f"{QUANT_KEY}.linears[{name!r}]"
        if not isinstance(lin, dict):
            raise ValueError(f"{where}: expected an object")
        linears.append(
            QuantLinear(
                str(name),
                _ref(lin.get("weight"), f"{where}.weight"),
                _ref(lin.get("weight_scale"), f"{where}.weight_scale"),
                _opt(lin.get("activation"), f"{where}.activation"),
                _opt(lin.get("activation_scale"), f"{where}.activation_scale"),
                _opt(lin.get("activation_offset"), f"{where}.activation_offset"),
            )
        )
    return links, linears
