"""The GE graph text TorchAir writes (`dynamo_original_graph_{n}_rank_{r}_pid_{p}_ts_{t}.txt`).

The file is a `ge.proto.GraphDef` (or a `ModelDef` holding graphs) in protobuf text format, parsed with
`google.protobuf.text_format` against the schema of `formats/proto/ge_ir.proto`; fields the schema does
not declare are skipped. What `wb` takes from it: the ops in graph order, their inputs, and the
`_fx_tensor_name` attribute of each output (`{fx node}-{aten target}.OUTPUT.{i}`), which links a GE op
to the FX node it was lowered from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.formats.model import DumpError

# protobuf (and `ge_proto`) load when a graph is parsed or written: finding graph files needs neither (~10 ms)

GRAPH_PREFIX = "dynamo_original_graph_"
FX_TENSOR_ATTR = "_fx_tensor_name"
MAX_GRAPH_BYTES = 512 * 1024 * 1024
_FX_OUT_RE = re.compile(r"\.OUTPUT\.[0-9]+$")
_RANK_RE = re.compile(r"_rank_([0-9]+)_")


@dataclass(frozen=True, slots=True)
class GeOp:
    """One op of a GE graph."""

    name: str
    type: str
    position: int  # index in the graph (execution order as the graph lists it)
    inputs: tuple[str, ...]  # producer op names ("x:0" -> "x")
    fx_nodes: tuple[str, ...]  # FX node names (`{node}-{aten target}`) of its outputs, first seen first


@dataclass(slots=True)
class GeGraph:
    """The ops of one GE graph file."""

    path: str
    name: str
    ops: list[GeOp] = field(default_factory=list)

    def by_name(self) -> dict[str, GeOp]:
        return {o.name: o for o in self.ops}

    @property
    def fx_nodes(self) -> set[str]:
        return {n for o in self.ops for n in o.fx_nodes}


def is_graph_file(name: str) -> bool:
    """A TorchAir GE graph text file (msit: `dynamo_original_graph_*.txt`)."""
    return name.startswith(GRAPH_PREFIX) and name.endswith(".txt")


def graph_rank(name: str) -> int | None:
    """The rank a graph file's name gives (`..._rank_{r}_...`)."""
    m = _RANK_RE.search(name)
    return int(m.group(1)) if m else None


def fx_node_of(tensor_name: str) -> str:
    """`add_1-aten.add.Tensor.OUTPUT.0` -> `add_1-aten.add.Tensor` (the FX dump's node name)."""
    return _FX_OUT_RE.sub("", tensor_name)


def read_graph(path: str | Path) -> GeGraph:
    """Parse one GE graph text file; `DumpError` with the line and column when it is not valid text format."""
    p = Path(path)
    try:
        if p.stat().st_size > MAX_GRAPH_BYTES:
            raise DumpError(p, f"graph file larger than {MAX_GRAPH_BYTES >> 20} MiB: not read")
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DumpError(p, "graph file is not UTF-8 text") from None
    except OSError as exc:
        raise DumpError(p, f"cannot read: {exc.strerror or exc}") from None
    return parse_graph(text, str(p))


def parse_graph(text: str, path: str = "<graph>") -> GeGraph:
    """A GE graph from its protobuf text (a GraphDef, or a ModelDef whose graphs are read in order)."""
    from google.protobuf import text_format

    from workbench.formats import ge_proto

    stripped = text.lstrip()
    try:
        if stripped.startswith("graph ") or stripped.startswith("graph{"):
            model = text_format.Parse(text, ge_proto.model_def()(), allow_unknown_field=True)
            graphs = list(model.graph)
            name = str(model.name)
        else:
            graphs = [text_format.Parse(text, ge_proto.graph_def()(), allow_unknown_field=True)]
            name = str(graphs[0].name)
    except text_format.ParseError as exc:
        raise DumpError(path, f"not a GE graph in protobuf text format ({str(exc)[:160]})") from None
    out = GeGraph(path, name)
    for g in graphs:
        for op in g.op:
            out.ops.append(_op(op, len(out.ops)))
    return out


def _op(op: Any, position: int) -> GeOp:
    fx: list[str] = []
    for desc in op.output_desc:
        attr = desc.attr.get(FX_TENSOR_ATTR)
        if attr is None or attr.WhichOneof("value") != "s":
            continue
        node = fx_node_of(attr.s.decode("utf-8", "replace"))
        if node and node not in fx:
            fx.append(node)
    inputs = tuple(str(i).rsplit(":", 1)[0] for i in op.input if str(i))
    return GeOp(str(op.name), str(op.type), position, inputs, tuple(fx))


def graph_text(name: str, ops: list[tuple[str, str, list[str], list[str]]]) -> str:
    """The protobuf text of a GraphDef: `(op name, op type, inputs "op:i", FX output tensor names)` per op."""
    from google.protobuf import text_format

    from workbench.formats import ge_proto

    g = ge_proto.graph_def()(name=name)
    for op_name, op_type, inputs, fx_outputs in ops:
        op = g.op.add(name=op_name, type=op_type)
        op.input.extend(inputs)
        for fx in fx_outputs:
            desc = op.output_desc.add(layout="ND")
            desc.attr[FX_TENSOR_ATTR].s = fx.encode("utf-8")
    return str(text_format.MessageToString(g))
