"""FX dumps on the CPU: a `torch.compile` backend that interprets the aten graph and saves every node.

`FxDumper(dump_path)` is a compile backend (`torch.compile(model, backend=dumper)`, through AOT autograd,
so the graph is at aten level as TorchAir's is). Each compiled graph is run node by node by
`NodeInterpreter`, which hands every `call_function` node's tensor inputs and outputs to a sink: here
`FxDumper` writes them in msit's FX layout (PTA > 7.1, rank folders)::

    {dump_path}/msit_fx_dump/worldsize{N}_global_rank{R}/{model}/{token}/
        {node}-{aten target}.{INPUT|OUTPUT}.{i}.{ts}.npy

plus `fx_node_modules.json` (node -> the module it ran in; msit's reader ignores it). A token is one call of
the compiled model (`FxDumper.step()` before each, or `dump_fx` that does it). bfloat16 tensors are saved
as float32 (`.npy` has no bfloat16). A tensor that is, at the same place (node, input/output, index), the very
tensor an earlier token saved and unchanged since (a weight or buffer: the same object or a view of it, same
version counter, the same digest of every byte, which a write through `.data` changes without the counter)
is a hard link to that file: every token folder keeps its full set of plain files, as msit's
reader wants them, and the bytes are stored once (the weights are `t`/`mm` inputs at every token). The test
side of the TorchAir demo (`workbench.backends.torchair`) runs the same interpreter with another sink.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import fx

from workbench.core.files import MANIFEST_NAME
from workbench.formats.fx_dump import FX_MODULES_FILE, file_name
from workbench.formats.torchair import FX_DUMP_DIR

_MODULE_PREFIX = re.compile(r"^L\['[^']*'\](?:\[[0-9]+\])*\.?")


def is_op(node: fx.Node) -> bool:
    """A node that computes (an aten op), not an input, an output or a tuple projection (`getitem`)."""
    return node.op == "call_function" and node.target is not operator.getitem


def fx_name(node: fx.Node) -> str:
    """The FX dump's name of a node: `{node}-{aten target}` (`mm-aten.mm.default`)."""
    return f"{node.name}-{node.target}"


def node_module(node: fx.Node) -> str | None:
    """The module path a node ran in (`model.layers.0.mlp.down_proj`), from dynamo's `nn_module_stack`."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = str(list(stack.values())[-1][0])
    return _MODULE_PREFIX.sub("", path) or None


def graph_outputs(gm: fx.GraphModule) -> list[fx.Node]:
    """The op nodes whose results the graph returns, in order (a model's logits first, for a causal LM)."""
    out: list[fx.Node] = []
    for n in gm.graph.nodes:
        if n.op == "output":
            for a in _flat_nodes(n.args):
                if is_op(a) and a not in out:
                    out.append(a)
    return out


def _flat_nodes(value: Any) -> list[fx.Node]:
    if isinstance(value, fx.Node):
        return [value]
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _flat_nodes(v)]
    return []


def tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors of a node argument or result, flattened in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []


def record_token_ids(manifest: dict[str, Any], token: int, input_ids: list[int], folder: Path) -> None:
    """Record the ids a compiled run was fed at `token` in `manifest` and (re)write it as `folder`'s manifest:
    a comparison then tells whether two runs were fed the same tokens (the FX and the GE dumpers both)."""
    manifest.setdefault("token_ids", {})[str(token)] = list(input_ids)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest))


class NodeSink(Protocol):
    def __call__(self, node: fx.Node, inputs: list[torch.Tensor], output: Any) -> Any:
        """See one node run (its tensor inputs and its result); return the result to carry on with."""
        ...


_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """`value` with every floating tensor in it cast to `dtype` (lists and tuples rebuilt)."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.dtype in _FLOATS and value.dtype != dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


class NodeInterpreter(fx.Interpreter):
    """Runs an aten graph node by node, showing each `call_function` node to `sink`; with `dtype`, every node
    computes on its floating inputs cast to it and its floating results are cast to it (a run of the same
    graph at that precision, node names unchanged)."""

    def __init__(self, gm: fx.GraphModule, sink: NodeSink, dtype: torch.dtype | None = None) -> None:
        super().__init__(gm)
        self.sink = sink
        self.dtype = dtype

    def run_node(self, n: fx.Node) -> Any:
        if not is_op(n):
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if self.dtype is not None:
                args, kwargs = cast_floats(args, self.dtype), {k: cast_floats(v, self.dtype) for k, v in kwargs.items()}
            out = self.call_function(n.target, args, kwargs)
            if self.dtype is not None:
                out = cast_floats(out, self.dtype)
        return self.sink(n, tensors_of(list(args) + list(kwargs.values())), out)


def interpreting_backend(
    sink: NodeSink, on_graph: Callable[[fx.GraphModule], None] | None = None, dtype: torch.dtype | None = None
) -> Any:
    """A `torch.compile` backend (AOT autograd, aten graphs) that interprets each graph with `sink` (at `dtype`
    when given, see `NodeInterpreter`)."""
    from torch._dynamo.backends.common import aot_autograd

    def compile_fw(gm: fx.GraphModule, _example: list[Any]) -> Callable[..., Any]:
        if on_graph is not None:
            on_graph(gm)

        def run(*args: Any) -> Any:
            return NodeInterpreter(gm, sink, dtype).run(*args)

        return run

    return aot_autograd(fw_compiler=compile_fw)


@dataclass(frozen=True, slots=True)
class _Kept:
    """A file saved for one place of the graph: the tensor it holds (weakly), how it viewed which bytes, and the
    digest of every byte of its owner."""

    base: weakref.ref[torch.Tensor]
    view: tuple[Any, ...]
    digest: bytes
    path: Path


def _view_of(t: torch.Tensor) -> tuple[torch.Tensor, tuple[Any, ...]] | None:
    """(the tensor owning `t`'s bytes, how `t` views them at which version); None for a tensor never taken for
    unchanged: one without a version counter (inference mode), or whose owner is not contiguous."""
    try:
        version = t._version
    except RuntimeError:
        return None
    base = t._base if t._base is not None else t
    if not base.is_contiguous():
        return None
    view = (version, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
    return base, view


def _digest(base: torch.Tensor) -> bytes:
    """A digest of every byte of a contiguous tensor: a write through `.data`, which no version counter sees,
    changes it wherever it lands (reading the bytes once costs far less than writing them again)."""
    raw = base.detach().reshape(-1).view(torch.uint8).numpy()
    return hashlib.blake2b(raw.data, digest_size=16).digest()


class FxDumper:
    """A compile backend writing msit's FX layout; `step()` starts the next token (the first is 0)."""

    def __init__(
        self,
        dump_path: str | Path,
        token_range: Iterable[int] | None = None,
        model_name: str = "model",
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.rank_dir = Path(dump_path) / FX_DUMP_DIR / f"worldsize{world_size}_global_rank{rank}"
        self.root = self.rank_dir / model_name
        self.tokens = set(token_range) if token_range is not None else None
        self.token = -1
        self.modules: dict[str, str] = {}
        self.manifest: dict[str, Any] = {}
        self._last_ts = 0
        self._kept: dict[tuple[str, str, int], _Kept] = {}  # (node, role, index) -> its last written file
        self._backend = interpreting_backend(self._save, self._graph)

    def __call__(self, gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return self._backend(gm, example_inputs)

    def step(self, input_ids: list[int] | None = None) -> None:
        """The next call of the compiled model is the next token; `input_ids` (what it is fed) are recorded in
        the dump's manifest, so a comparison can tell whether two runs were fed the same tokens."""
        self.token += 1
        if input_ids is not None:
            record_token_ids(self.manifest, self.token, input_ids, self.rank_dir)

    def _graph(self, gm: fx.GraphModule) -> None:
        for n in gm.graph.nodes:
            module = node_module(n) if is_op(n) else None
            if module:
                self.modules[fx_name(n)] = module
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        (self.rank_dir / FX_MODULES_FILE).write_text(json.dumps(self.modules, indent=1))
        self.manifest["graph_outputs"] = [fx_name(n) for n in graph_outputs(gm)]  # the model's outputs (logits)
        (self.rank_dir / MANIFEST_NAME).write_text(json.dumps(self.manifest))

    def _timestamp(self) -> int:
        now = int(time.strftime("%Y%m%d%H%M%S")) * 1_000_000 + time.time_ns() // 1000 % 1_000_000
        self._last_ts = max(now, self._last_ts + 1)  # strictly increasing: the reader orders nodes by it
        return self._last_ts

    def _save(self, node: fx.Node, inputs: list[torch.Tensor], output: Any) -> Any:
        token = max(self.token, 0)
        if self.tokens is not None and token not in self.tokens:
            return output
        folder = self.root / str(token)
        folder.mkdir(parents=True, exist_ok=True)
        name, ts = fx_name(node), self._timestamp()
        for role, items in (("in", inputs), ("out", tensors_of(output))):
            for i, t in enumerate(items):
                self._write(t, (name, role, i), folder / file_name(name, role, i, ts))
        return output

    def _write(self, t: torch.Tensor, place: tuple[str, str, int], path: Path) -> None:
        """Save `t` at `path`, or hard-link the file of an earlier token when `t` is the tensor saved at this
        place then, unchanged: its owner still alive (so its bytes cannot have moved), the same version and view,
        and the same bytes (their digest)."""
        seen = _view_of(t)
        kept = self._kept.get(place)
        digest = _digest(seen[0]) if seen is not None else None
        if (
            seen is not None
            and digest is not None
            and kept is not None
            and kept.base() is seen[0]
            and kept.view == seen[1]
            and kept.digest == digest
        ):
            try:
                os.link(kept.path, path)
                return
            except OSError:  # no hard links here (or the earlier file is gone): written again
                pass
        np.save(path, to_numpy(t))
        if seen is not None and digest is not None:
            self._kept[place] = _Kept(weakref.ref(seen[0]), seen[1], digest, path)
        else:
            self._kept.pop(place, None)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor as numpy (bfloat16 widened to float32)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.contiguous().numpy()


class FxHandle:
    """`register_hook(model, DumpConfig(..., fx=True))`: the model's forward compiled with an `FxDumper`, one token
    per call; `.remove()` restores the forward."""

    manifest = None  # the FX layout has no manifest of ours beyond the ids file

    def __init__(self, model: torch.nn.Module, dump_path: Path, token_range: Iterable[int]) -> None:
        self.model = model
        self.dumper = FxDumper(dump_path, token_range)
        self.dump_dir = self.dumper.rank_dir
        original = model.forward
        compiled = torch.compile(original, backend=self.dumper, dynamic=False)

        def forward(*args: Any, **kwargs: Any) -> Any:
            ids = kwargs.get("input_ids", args[0] if args else None)
            seen = (
                [int(i) for i in ids.reshape(-1)]
                if isinstance(ids, torch.Tensor) and not ids.is_floating_point()
                else None
            )
            self.dumper.step(seen)
            return compiled(*args, **kwargs)

        self._had_own = "forward" in vars(model)
        self._original = original
        model.forward = forward

    def remove(self) -> None:
        if self._had_own:
            self.model.forward = self._original
        else:
            del self.model.forward


def register_fx(model: torch.nn.Module, config: Any) -> FxHandle:
    """The FX dump of `DumpConfig(..., fx=True)` (its dump_path and token_range)."""
    return FxHandle(model, Path(config.dump_path), config.token_range)


def dump_fx(model: torch.nn.Module, dump_path: str | Path, calls: Iterable[Callable[[Any], Any]]) -> FxDumper:
    """Compile `model` with an `FxDumper` and run `calls` (each gets the compiled model), one token each."""
    dumper = FxDumper(dump_path)
    compiled = torch.compile(model, backend=dumper, dynamic=False)
    with torch.no_grad():
        for call in calls:
            dumper.step()
            call(compiled)
    return dumper
