"""Turning hook arguments into named tensors, host copies and statistics (on the model's thread).

Naming follows msit: a tuple/list adds `_{index}` per element (`input_0`, `output_1`, `input_0_1`),
a lone tensor keeps the bare name (`output`). We also descend into mappings (Hugging Face
`ModelOutput`, dicts): their tensor-bearing fields are numbered in order and the field names are
returned so the manifest can record them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from workbench.dump.writer import Ready


def has_tensor(obj: Any) -> bool:
    """Whether `obj` is a tensor or a tuple/list/mapping holding one."""
    if isinstance(obj, torch.Tensor):
        return True
    if isinstance(obj, (tuple, list)):
        return any(has_tensor(x) for x in obj)
    if isinstance(obj, Mapping):
        return any(has_tensor(x) for x in obj.values())
    return False


def flatten(obj: Any, stem: str, base: str, fields: dict[str, str], out: list[tuple[str, torch.Tensor]]) -> None:
    """Append `(file stem, tensor)` for every tensor in `obj`; mapping field names go to `fields`.

    `fields` is keyed by the stem suffix after `base` (`"0"` for `output_0`).
    """
    if isinstance(obj, torch.Tensor):
        out.append((stem, obj))
    elif isinstance(obj, (tuple, list)):
        for i, item in enumerate(obj):
            flatten(item, f"{stem}_{i}", base, fields, out)
    elif isinstance(obj, Mapping):
        i = 0
        for key, value in obj.items():
            if has_tensor(value):
                child = f"{stem}_{i}"
                fields[child[len(base) + 1 :]] = str(key)
                flatten(value, child, base, fields, out)
                i += 1


def flatten_inputs(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[tuple[str, torch.Tensor]], dict[str, str]]:
    """Positional inputs as msit names them, then tensor-bearing kwargs as further `input_{i}`.

    Returns the tensors and `{"<i>": kwarg name}` for the kwargs (nested mapping fields as `"<i>_<j>"`).
    """
    out: list[tuple[str, torch.Tensor]] = []
    names: dict[str, str] = {}
    flatten(args, "input", "input", names, out)
    index = len(args)
    for key, value in kwargs.items():
        if has_tensor(value):
            stem = f"input_{index}"
            nested: dict[str, str] = {}
            flatten(value, stem, stem, nested, out)
            names[str(index)] = key
            names.update({f"{index}_{k}": f"{key}.{v}" for k, v in nested.items()})
            index += 1
    return out, names


def flatten_outputs(output: Any) -> tuple[list[tuple[str, torch.Tensor]], dict[str, str]]:
    """Outputs as msit names them (`output`, `output_{i}`), including ModelOutput fields."""
    out: list[tuple[str, torch.Tensor]] = []
    fields: dict[str, str] = {}
    flatten(output, "output", "output", fields, out)
    return out, fields


class CudaReady(Ready):
    """A CUDA event recorded after an asynchronous device-to-host copy."""

    def __init__(self) -> None:
        self.event = torch.cuda.Event()
        self.event.record()

    def synchronize(self) -> None:
        self.event.synchronize()


def dumpable(t: torch.Tensor) -> bool:
    """Tensors with data we can copy (not meta / fake tensors)."""
    return not t.is_meta and t.layout == torch.strided


def to_host(t: torch.Tensor, fresh: bool = False) -> tuple[torch.Tensor, Ready | None]:
    """A contiguous CPU copy of `t` that later in-place ops cannot change; CUDA copies are asynchronous.

    `fresh` says `t` is already a private contiguous result (no clone needed on CPU).
    """
    t = t.detach()
    if t.device.type == "cpu":
        if fresh and t.is_contiguous():
            return t, None
        return t.clone(memory_format=torch.contiguous_format), None
    if t.device.type == "cuda":
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host, CudaReady()
    return t.to("cpu", memory_format=torch.contiguous_format), None


def statistics(t: torch.Tensor, with_var: bool) -> torch.Tensor | None:
    """max, min, mean, L2 norm (and variance) of `t` in float32, as one small tensor; None if empty.

    Three vectorised passes (`aminmax`, `mean`, `vector_norm`), the same reductions msit runs on
    `feat.float()` (`torch.max/min/mean/norm`), so the values are identical. `torch.var_mean` would be
    one pass fewer but is many times slower on CPU.
    """
    x = t.detach()
    n = x.numel()
    if n == 0:
        return None
    if x.dtype != torch.float32:
        x = x.float()
    mn, mx = torch.aminmax(x)
    parts = [mx, mn, x.mean(), torch.linalg.vector_norm(x)]
    if with_var:
        parts.append(x.var() if n > 1 else torch.full_like(mx, float("nan")))
    return torch.stack(parts)
