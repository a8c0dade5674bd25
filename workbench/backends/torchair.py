"""A TorchAir-like test side on the CPU: a compiled model's aten graph run in bf16/fp16 and dumped as GE dumps.

What a TorchAir run on the NPU leaves, written from the same aten graph the FX dumper sees
(`workbench.dump.fx`): every `call_function` node becomes a GE op with a GE op type and name
(`mm` -> `MatMulV2_3`), computed at the run's precision (`NodeInterpreter` with a dtype). Written in msit's
GE layout::

    {out}/msit_ge_dump/dynamo_original_graph_1_rank_0_pid_{pid}_ts_{ts}.txt     the GE graph (text format)
    {out}/msit_ge_dump/{time}/0/graph_1/1/{token}/{OpType}.{OpName}.{task}.{stream}.{ts}   one GE dump file per op

The graph links each op's output to its FX node (`_fx_tensor_name`). Each SiLU followed by its gating
multiply is fused into one `AutomaticBufferFusionOp` (first op's inputs plus the second's other input, the
second op's output), as GE's buffer fusion names it. A planted `GeDefect` scales one node's output.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx

from workbench.dump.fx import (
    fx_name,
    graph_outputs,
    interpreting_backend,
    is_op,
    node_module,
    record_token_ids,
    tensors_of,
)
from workbench.formats import ge_dump, ge_run
from workbench.formats.arrays import as_raw
from workbench.formats.ge_graph import graph_text
from workbench.formats.torchair import GE_DUMP_DIR

# aten op -> GE op type (what TorchAir's converters emit); others get their aten name in CamelCase
GE_TYPES: dict[str, str] = {
    "mm": "MatMulV2",
    "addmm": "MatMulV2",
    "bmm": "BatchMatMulV2",
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "RealDiv",
    "rsqrt": "Rsqrt",
    "pow": "Pow",
    "mean": "ReduceMean",
    "neg": "Neg",
    "cat": "ConcatD",
    "embedding": "GatherV2",
    "silu": "Swish",
    "_softmax": "SoftmaxV2",
    "view": "Reshape",
    "_unsafe_view": "Reshape",
    "reshape": "Reshape",
    "t": "Transpose",
    "transpose": "Transpose",
    "permute": "Transpose",
    "expand": "BroadcastTo",
    "clone": "Identity",
    "slice": "StridedSlice",
    "unsqueeze": "Unsqueeze",
    "_to_copy": "Cast",
    "cos": "Cos",
    "sin": "Sin",
    "_scaled_dot_product_flash_attention_for_cpu": "FlashAttentionScore",
}
DEVICE_ID = "0"
MODEL_NAME = "graph_1"
MODEL_ID = "1"


def ge_type(target: object) -> str:
    """The GE op type of an aten target (`aten.mm.default` -> `MatMulV2`)."""
    base = str(target).split(".")[1] if str(target).startswith("aten.") else str(target)
    return GE_TYPES.get(base) or "".join(p[:1].upper() + p[1:] for p in re.split(r"_+", base) if p) or "Op"


@dataclass(frozen=True, slots=True)
class GeDefect:
    """A planted defect: the output of the node running in `module` with aten op `op` (the `nth` such node)
    multiplied by `scale` from token `start` on."""

    module: str
    op: str
    scale: float = 1.25
    nth: int = 0
    start: int = 0
    description: str = ""


@dataclass(slots=True)
class _Op:
    name: str  # GE op name
    type: str
    node: fx.Node
    inputs: list[str] = field(default_factory=list)  # "producer:i"


class GeDumper:
    """A compile backend that runs each graph at `dtype` and writes GE dumps + the GE graph text."""

    def __init__(
        self,
        out: str | Path,
        dtype: torch.dtype = torch.bfloat16,
        defect: GeDefect | None = None,
        fuse: bool = True,
        token_range: Iterable[int] | None = None,
        follow: str | Path | None = None,
    ) -> None:
        self.root = Path(out) / GE_DUMP_DIR
        self.manifest: dict[str, Any] = {"follow_tokens": str(follow)} if follow is not None else {}
        stamp = time.strftime("%Y%m%d%H%M%S")
        self.dump_dir = self.root / stamp / DEVICE_ID / MODEL_NAME / MODEL_ID
        self.stamp = stamp
        self.defect = defect
        self.fuse = fuse
        self.tokens = set(token_range) if token_range is not None else None
        self.token = -1
        self.ops: dict[fx.Node, _Op] = {}
        self.fused: dict[fx.Node, fx.Node] = {}  # SiLU node -> the multiply folded into it
        self.fused_last: dict[fx.Node, fx.Node] = {}  # the multiply -> its SiLU
        self.planted: str | None = None  # the GE op name of the planted node
        self._pending: dict[fx.Node, list[torch.Tensor]] = {}
        self._task = 0
        self._last_ts = 0
        self._graphs = 0
        self._outputs: list[str] = []
        self._backend = interpreting_backend(self._save, self._graph, dtype)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return self._backend(gm, example_inputs)

    def step(self, input_ids: list[int] | None = None) -> None:
        """The next call of the compiled model is the next token; `input_ids` are recorded in the manifest."""
        self.token += 1
        if input_ids is not None:
            record_token_ids(self.manifest, self.token, input_ids, self.root)

    # ------------------------------------------------------------------ the graph
    def _graph(self, gm: fx.GraphModule) -> None:
        """Name the graph's ops, pick the fusions and the planted node, write the graph text (once)."""
        if self.ops:  # a recompilation (another token length): the same graph, the names already given
            self._bind(gm)
            return
        counts: dict[str, int] = {}
        seen_defect = 0
        for n in gm.graph.nodes:
            if not is_op(n):
                continue
            t = ge_type(n.target)
            k = counts.get(t, 0)
            counts[t] = k + 1
            op = _Op(t if k == 0 else f"{t}_{k}", t, n)
            op.inputs = [f"{self.ops[a].name}:0" for a in n.all_input_nodes if a in self.ops]
            self.ops[n] = op
            if self.defect and node_module(n) == self.defect.module and _aten(n) == self.defect.op:
                if seen_defect == self.defect.nth:
                    self.planted = op.name
                seen_defect += 1
            if self.fuse and _aten(n) == "mul" and any(_is_silu(a) for a in n.args):
                silu = next(a for a in n.args if _is_silu(a))
                self.fused[silu], self.fused_last[n] = n, silu
        self._outputs = [self.ops[n].name for n in graph_outputs(gm) if n in self.ops]
        self._write_graph_text()

    def _bind(self, gm: fx.GraphModule) -> None:
        """A recompiled graph (new shapes) has new node objects: give them the first graph's names by FX name."""
        by_name = {fx_name(n): op for n, op in self.ops.items()}
        silu_of = {fx_name(m): fx_name(s) for m, s in self.fused_last.items()}
        nodes = {fx_name(n): n for n in gm.graph.nodes if is_op(n)}
        for key, n in nodes.items():
            if key in by_name:
                old = by_name[key]
                self.ops[n] = _Op(old.name, old.type, n, old.inputs)
        for mul_key, silu_key in silu_of.items():
            if mul_key in nodes and silu_key in nodes:
                self.fused[nodes[silu_key]], self.fused_last[nodes[mul_key]] = nodes[mul_key], nodes[silu_key]

    def _write_graph_text(self) -> None:
        self._graphs += 1
        rows = []
        for n, op in self.ops.items():
            outs = [f"{fx_name(n)}.OUTPUT.0"]
            rows.append((op.name, op.type, op.inputs, outs))
        rows.append((ge_run.NET_OUTPUT, ge_run.NET_OUTPUT, [f"{name}:0" for name in self._outputs], []))
        self.root.mkdir(parents=True, exist_ok=True)
        name = f"dynamo_original_graph_{self._graphs}_rank_0_pid_{os.getpid()}_ts_{self.stamp}.txt"
        (self.root / name).write_text(graph_text(f"graph_{self._graphs}", rows))

    # ------------------------------------------------------------------ the run
    def _save(self, node: fx.Node, inputs: list[torch.Tensor], output: Any) -> Any:
        op = self.ops.get(node)
        if op is None:
            return output
        if self.defect and op.name == self.planted and self.token >= self.defect.start:
            output = output * self.defect.scale
        token = max(self.token, 0)
        if self.tokens is not None and token not in self.tokens:
            return output
        if node in self.fused:  # the first op of a fusion: its inputs wait for the second op
            self._pending[node] = inputs
            return output
        if node in self.fused_last:
            silu = self.fused_last[node]
            first_in = self._pending.pop(silu, [])
            others = [t for a, t in zip(node.args, inputs) if a is not silu]
            name = f"{self.ops[silu].name}{op.name}"
            self._write(token, ge_dump.FUSION_OP_TYPE, name, first_in + others, tensors_of(output))
            return output
        self._write(token, op.type, op.name, inputs, tensors_of(output))
        return output

    def _write(self, token: int, op_type: str, name: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        folder = self.dump_dir / str(token)
        folder.mkdir(parents=True, exist_ok=True)
        self._task += 1
        self._last_ts = max(time.time_ns() // 1000, self._last_ts + 1)
        data = ge_dump.encode(name, [_raw(t) for t in ins], [_raw(t) for t in outs])
        (folder / f"{op_type}.{name}.{self._task}.7.{self._last_ts}").write_bytes(data)


def _is_silu(a: object) -> bool:
    return isinstance(a, fx.Node) and _aten(a) == "silu" and len(a.users) == 1


def _aten(n: fx.Node) -> str:
    text = str(n.target)
    return text.split(".")[1] if text.startswith("aten.") else text


def _raw(t: torch.Tensor) -> tuple[Any, str]:
    raw = as_raw(t.detach().contiguous())
    return raw.array, raw.dtype


def run_ge(
    model: torch.nn.Module,
    out: str | Path,
    calls: Iterable[Callable[[Any], Any]],
    dtype: torch.dtype = torch.bfloat16,
    defect: GeDefect | None = None,
) -> GeDumper:
    """Compile `model` with a `GeDumper` and run `calls` (each gets the compiled model), one token each."""
    dumper = GeDumper(out, dtype=dtype, defect=defect)
    compiled = torch.compile(model, backend=dumper, dynamic=False)
    with torch.no_grad():
        for call in calls:
            dumper.step()
            call(compiled)
    return dumper
