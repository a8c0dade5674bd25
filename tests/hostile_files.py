"""Crafted files for the hostile-input cases: lying tensor headers, odd folder names, deep nesting, dumps."""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.formats import atb_bin


class _StorageRef:
    def __init__(self, numel: int) -> None:
        self.numel = numel


class _View:
    """Pickles as torch's `_rebuild_tensor_v2(storage, offset, size, stride, ...)` with any numbers."""

    def __init__(self, storage: _StorageRef, size: tuple[int, ...], stride: tuple[int, ...]) -> None:
        self.storage, self.size, self.stride = storage, size, stride

    def __reduce__(self) -> tuple[Any, ...]:
        import collections

        return (
            torch._utils._rebuild_tensor_v2,
            (self.storage, 0, self.size, self.stride, False, collections.OrderedDict()),
        )


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, _StorageRef):
            return ("storage", torch.FloatStorage, "0", "cpu", obj.numel)
        return None


def crafted_pth(path: Path, size: tuple[int, ...], stride: tuple[int, ...], storage_numel: int = 4) -> Path:
    """A `torch.save`-layout zip whose header declares any size/stride over a tiny float32 storage."""
    buf = io.BytesIO()
    _Pickler(buf, protocol=2).dump(_View(_StorageRef(storage_numel), size, stride))
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", buf.getvalue())
        z.writestr("archive/data/0", np.arange(storage_numel, dtype=np.float32).tobytes())
        z.writestr("archive/version", "3\n")
    return path


def bin_with_dims(path: Path, dims: list[int], *, stats: bool = False) -> Path:
    """A `.bin` whose header declares `dims` (statistics-only when `stats`, else with a 16-byte payload)."""
    head = "$Version=1.0\n"
    head += "$Object.Count=0\n$Object.Length=0\n" if stats else "$Object.Count=1\n$Object.Length=16\n"
    head += "format=2\ndtype=0\ndims=" + ",".join(str(d) for d in dims) + "\n"
    head += "max=1.0\nmin=0.0\nmean=0.5\nl2norm=1.0\n" if stats else "$Object.data=0,16\n"
    path.write_bytes((head + "$End=1\n").encode() + (b"" if stats else bytes(16)))
    return path


def deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_toml(depth: int) -> str:
    return "x = " + "[" * depth + "]" * depth + "\n"


def torch_dump(dev: Path, modules: list[str], tokens: list[int], *, seed: int = 0, noise: float = 0.0) -> Path:
    """An msit-layout torch dump: `model_tree.json` and `{token}/{module}/input_0.pth|output.pth` (4x8 float32)."""
    dev.mkdir(parents=True, exist_ok=True)
    tree = {"name": "root", "type": "M", "children": [{"name": m, "type": "Linear", "children": []} for m in modules]}
    (dev / "model_tree.json").write_text(json.dumps(tree))
    g = torch.Generator().manual_seed(seed)
    base = torch.Generator().manual_seed(1234)
    for tok in tokens:
        for m in modules:
            d = dev / str(tok) / m
            d.mkdir(parents=True, exist_ok=True)
            x = torch.randn(4, 8, generator=base)
            torch.save(x, d / "input_0.pth")
            torch.save(x * 2 + noise * torch.randn(4, 8, generator=g), d / "output.pth")
    return dev


def atb_dump(root: Path, *, topology: bool = True, pid: str = "77") -> Path:
    """A tiny ATB dump `root/tensors/0_{pid}/0/0_Prefill_layer/0_RmsNormOperation/...` (msit_dump layout)."""
    op = root / "tensors" / f"0_{pid}" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    (op / "before").mkdir(parents=True)
    (op / "after").mkdir()
    atb_bin.write_bin(op / "before" / "intensor0.bin", np.ones((2, 4), np.float32), "float32")
    atb_bin.write_bin(op / "after" / "outtensor0.bin", np.ones((2, 4), np.float32), "float32")
    if topology:
        (root / "model" / pid).mkdir(parents=True)
        model = {"modelName": "M", "nodes": [{"opName": "Prefill_layer_0", "opType": "Prefill_layer", "nodes": []}]}
        (root / "model" / pid / "prefill.json").write_text(json.dumps(model))
    return root


def nested_folders(base: Path, depth: int, name: str = "0_A") -> None:
    """`depth` folders inside one another (opened relative to each other: the full path exceeds PATH_MAX)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
    finally:
        os.close(fd)
