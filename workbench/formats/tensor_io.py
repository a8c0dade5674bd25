"""Reading one tensor file of any supported kind, safely and without copying where possible.

`.pth`/`.pt` go through `torch.load(weights_only=True, mmap=True)`: a pickle that would run
code is refused, never executed. `.bin` is memory-mapped after its header is validated.
`.npy` is memory-mapped by numpy (no pickles allowed). Every failure is a `DumpError`
whose message names the file and the reason in one line.
"""

from __future__ import annotations

import os
import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from workbench.formats import atb_bin
from workbench.formats.model import DumpError

TORCH_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
NAME_TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TORCH_DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype | np.dtype | str) -> str:
    """Canonical dtype name (`float16`, `bfloat16`, ...) for a torch/numpy dtype or a string."""
    if isinstance(dtype, torch.dtype):
        return TORCH_DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
    text = str(dtype)
    return text.removeprefix("torch.")


def _load_pth(path: str) -> torch.Tensor:
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    if size == 0:
        raise DumpError(path, "empty file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        lines = str(exc).strip().splitlines()
        detail = next((ln for ln in lines if "Unsupported global" in ln or "GLOBAL" in ln), "")
        if detail:
            raise DumpError(path, "refused: the pickle would run code or load a non-tensor object "
                            f"({detail.strip()[:120]})") from None
        raise DumpError(path, f"not a readable torch file ({(lines[0] if lines else 'bad pickle')[:120]})") from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError) as exc:
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DumpError(path, f"not a readable torch file ({msg[:160]})") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpError(path, f"holds a {type(obj).__name__}, not a tensor")
    return obj


def _load_npy(path: str) -> torch.Tensor:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DumpError(path, f"not a readable .npy file ({str(exc)[:160]})") from None
    return torch.from_numpy(np.ascontiguousarray(arr))


def bin_to_tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """Turn a `.bin` payload array into a torch tensor of the recorded dtype (bf16 words reinterpreted)."""
    with warnings.catch_warnings():
        # read-only memory maps: we never write through these tensors
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        return _bin_to_tensor(arr, dtype)


def _bin_to_tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "bfloat16":
        return torch.from_numpy(np.asarray(arr)).view(torch.bfloat16)
    if dtype in ("uint16", "uint32", "uint64"):
        # torch has limited unsigned support; widen losslessly
        wide = {"uint16": np.int32, "uint32": np.int64, "uint64": np.float64}[dtype]
        return torch.from_numpy(np.asarray(arr, dtype=wide))
    return torch.from_numpy(np.asarray(arr))


def load_tensor(path: str | Path) -> torch.Tensor:
    """Load one tensor file (.pth/.pt/.bin/.npy) on the CPU; raises `DumpError` on any problem."""
    p = str(path)
    if not os.path.exists(p):
        raise DumpError(p, "missing file")
    if os.path.isdir(p):
        raise DumpError(p, "is a folder, not a tensor file")
    suffix = Path(p).suffix.lower()
    if suffix in (".pth", ".pt"):
        return _load_pth(p)
    if suffix == ".bin":
        hdr = atb_bin.read_header(p)
        return bin_to_tensor(atb_bin.read_bin(p, hdr), hdr.dtype)
    if suffix == ".npy":
        return _load_npy(p)
    raise DumpError(p, f"unknown tensor file type {suffix!r}")
