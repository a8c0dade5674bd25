"""Test helpers for the format readers: a tiny msit-layout torch dumper and tiny models.

The dumper mirrors msit's `register_hook` closely enough for the readers: module names `root` +
dotted path, a token counter on the root's forward, positional inputs only, `input_{i}.pth` /
`output.pth` / `output_{i}.pth` (nested `_{j}`), non-tensor leaves skipped, `model_tree.json` in
definition order.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests import tiny_models


def tiny_llama(seed: int = 0) -> nn.Module:
    """The 2-layer Llama of the task (hidden 64), random weights from a fixed seed, eval mode."""
    return tiny_models.tiny_llama(seed, max_positions=2048)


def _tree(module: nn.Module, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": type(module).__name__,
        "children": [_tree(child, f"{name}.{cname}") for cname, child in module.named_children()],
    }


def _save(obj: Any, folder: Path, base: str) -> None:
    if isinstance(obj, torch.Tensor):
        folder.mkdir(parents=True, exist_ok=True)
        torch.save(obj.detach().cpu(), folder / f"{base}.pth")
    elif isinstance(obj, list | tuple):
        for i, item in enumerate(obj):
            _save(item, folder, f"{base}_{i}")


class MsitStyleDumper:
    """Forward hooks writing `{dev_dir}/{token}/{module}/input_*.pth|output*.pth` and `model_tree.json`."""

    def __init__(self, model: nn.Module, dev_dir: Path, *, tensor_part: int = 2) -> None:
        self.dev_dir = dev_dir
        self.token = -1
        self.tensor_part = tensor_part
        self.call_order: list[str] = []
        self.handles = []
        dev_dir.mkdir(parents=True, exist_ok=True)
        (dev_dir / "model_tree.json").write_text(json.dumps(_tree(model, "root"), indent=1))
        self.handles.append(model.register_forward_pre_hook(self._next_token))
        for name, mod in model.named_modules():
            full = "root" + (f".{name}" if name else "")
            self.handles.append(mod.register_forward_pre_hook(self._pre(full)))
            self.handles.append(mod.register_forward_hook(self._post(full)))

    def _next_token(self, _m: nn.Module, _args: Any) -> None:
        self.token += 1

    def _pre(self, name: str):  # type: ignore[no-untyped-def]
        def hook(_m: nn.Module, _args: Any) -> None:
            if self.token == 0:
                self.call_order.append(name)

        return hook

    def _post(self, name: str):  # type: ignore[no-untyped-def]
        def hook(_m: nn.Module, args: Any, output: Any) -> None:
            folder = self.dev_dir / str(self.token) / name
            if self.tensor_part in (0, 2):
                _save(tuple(args), folder, "input")
            if self.tensor_part in (1, 2):
                if isinstance(output, torch.Tensor):
                    _save(output, folder, "output")
                elif isinstance(output, list | tuple):
                    _save(output, folder, "output")

        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def dump_tiny_llama(dev_dir: Path, *, tokens: int = 2, tensor_part: int = 2, seed: int = 0) -> list[str]:
    """Run the tiny Llama for `tokens` forward calls under the msit-style dumper; returns token 0's call order."""
    model = tiny_llama(seed)
    dumper = MsitStyleDumper(model, dev_dir, tensor_part=tensor_part)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (1, 5), generator=gen)
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    dumper.remove()
    return dumper.call_order


# ---------------------------------------------------------------------------------------------- ATB


def write_atb_op(
    folder: Path, op: dict[str, Any], *, seed: int = 0, shape: tuple[int, ...] = (2, 4), layout_code: int = 2
) -> None:
    """Write one ATB op folder as the probe does: op_param.json, before/intensor*, after/outtensor*, children."""
    import numpy as np

    from workbench.formats import atb_bin

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "op_param.json").write_text(json.dumps(op.get("param", {})))
    (folder / "before").mkdir(exist_ok=True)
    (folder / "after").mkdir(exist_ok=True)
    for k in range(len(op.get("inTensors", []))):
        atb_bin.write_bin(
            folder / "before" / f"intensor{k}.bin",
            rng.standard_normal(shape).astype(np.float16),
            "float16",
            layout_code=layout_code,
        )
    for k in range(len(op.get("outTensors", []))):
        atb_bin.write_bin(
            folder / "after" / f"outtensor{k}.bin",
            rng.standard_normal(shape).astype(np.float16),
            "float16",
            layout_code=layout_code,
        )
    for i, child in enumerate(op.get("nodes", []) or []):
        write_atb_op(folder / f"{i}_{child['opType']}", child, seed=seed * 31 + i + 1, shape=shape)


def write_atb_tree(
    dev_dir: Path, count: int, topology: dict[str, Any], start: int | None = None, folder_names: list[str] | None = None
) -> None:
    """Write the op folders of one model topology under `dev_dir/{count}/`, top-level folders `{start+i}_{...}`."""
    import re

    nodes = topology["nodes"]
    if start is None:
        m = re.search(r"_(\d+)$", nodes[0]["opName"])
        start = int(m.group(1)) if m else 0
    for i, op in enumerate(nodes):
        name = folder_names[i] if folder_names else op["opType"]
        write_atb_op(dev_dir / str(count) / f"{start + i}_{name}", op, seed=count * 100 + i)


# ---------------------------------------------------------------------------------------------- msprobe


def _desc(t: torch.Tensor, data_name: str | None) -> dict[str, Any]:
    f = t.detach().float()
    d: dict[str, Any] = {
        "type": "torch.Tensor",
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "Max": float(f.max()),
        "Min": float(f.min()),
        "Mean": float(f.mean()),
        "Norm": float(f.norm()),
        "requires_grad": False,
    }
    if data_name is not None:
        d["data_name"] = data_name
    return d


class MsprobeStyleDumper:
    """msprobe's mix level, forward only: module hooks on the model's submodules (not the model itself) and
    `F.silu` as the one hooked API; entries written when a call completes, construct.json = call -> parent."""

    def __init__(self, model: nn.Module, rank_dir: Path, *, save_tensors: bool = True) -> None:
        self.rank_dir = rank_dir
        self.save = save_tensors
        self.data: dict[str, Any] = {}
        self.construct: dict[str, str | None] = {}
        self.stack: list[str] = []
        self.module_count: dict[str, int] = {}
        self.api_count: dict[str, int] = {}
        self.handles = []
        (rank_dir / "dump_tensor_data").mkdir(parents=True, exist_ok=True)
        for name, mod in model.named_modules():
            if not name:
                continue
            self.handles.append(mod.register_forward_pre_hook(self._pre(name, type(mod).__name__)))
            self.handles.append(mod.register_forward_hook(self._post()))
        self._orig_silu = torch.nn.functional.silu
        torch.nn.functional.silu = self._silu  # type: ignore[assignment]

    def _tensors(self, call: str, kind: str, values: Any) -> list[Any]:
        out = []
        flat = values if isinstance(values, list | tuple) else [values]
        for i, v in enumerate(flat):
            if isinstance(v, torch.Tensor):
                name = f"{call}.{kind}.{i}.pt" if self.save else None
                if name is not None:
                    torch.save(v.detach().clone(), self.rank_dir / "dump_tensor_data" / name)
                out.append(_desc(v, name))
            else:
                out.append({"type": type(v).__name__, "value": v if isinstance(v, int | float | str) else None})
        return out

    def _pre(self, name: str, cls: str):  # type: ignore[no-untyped-def]
        def hook(_m: nn.Module, _args: Any) -> None:
            key = f"Module.{name}.{cls}.forward"
            k = self.module_count.get(key, 0)
            self.module_count[key] = k + 1
            call = f"{key}.{k}"
            self.construct[call] = self.stack[-1] if self.stack else None
            self.stack.append(call)

        return hook

    def _post(self):  # type: ignore[no-untyped-def]
        def hook(_m: nn.Module, args: Any, output: Any) -> None:
            call = self.stack.pop()
            self.data[call] = {
                "input_args": self._tensors(call, "input", args),
                "input_kwargs": {},
                "output": self._tensors(call, "output", output),
            }

        return hook

    def _silu(self, x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        k = self.api_count.get("silu", 0)
        self.api_count["silu"] = k + 1
        call = f"Functional.silu.{k}.forward"
        self.construct[call] = self.stack[-1] if self.stack else None
        y = self._orig_silu(x, inplace=inplace)
        self.data[call] = {
            "input_args": self._tensors(call, "input", [x]),
            "input_kwargs": {"inplace": {"type": "bool", "value": inplace}},
            "output": self._tensors(call, "output", [y]),
        }
        return y

    def close(self) -> None:
        torch.nn.functional.silu = self._orig_silu
        for h in self.handles:
            h.remove()
        task = "tensor" if self.save else "statistics"
        (self.rank_dir / "dump.json").write_text(
            json.dumps(
                {
                    "task": task,
                    "level": "mix",
                    "framework": "pytorch",
                    "dump_data_dir": str(self.rank_dir / "dump_tensor_data") if self.save else None,
                    "data": self.data,
                }
            )
        )
        (self.rank_dir / "construct.json").write_text(json.dumps(self.construct))
        (self.rank_dir / "stack.json").write_text("{}")


def dump_msprobe_llama(
    dump_path: Path, *, steps: int = 1, forwards_per_step: int = 2, save_tensors: bool = True, seed: int = 0
) -> None:
    """Run the tiny Llama under the msprobe-style dumper: `steps` steps of `forwards_per_step` forwards."""
    model = tiny_llama(seed)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 256, (1, 4), generator=gen)
    for step in range(steps):
        dumper = MsprobeStyleDumper(model, dump_path / f"step{step}" / "rank0", save_tensors=save_tensors)
        try:
            with torch.no_grad():
                for _ in range(forwards_per_step):
                    logits = model(ids, use_cache=False).logits
                    ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
        finally:
            dumper.close()
