"""Reading one tensor file as a torch tensor, safely and without copying where possible.

The files are read by `workbench.formats.arrays` (memory-mapped, torch-free for plain saved
tensors, `.bin` and `.npy`; torch's own loader for the other `.pth` files is `torch_load.py`); this
module turns those arrays into torch tensors. Every failure is a `DumpError` naming the file and the reason.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from workbench.formats.arrays import RawTensor, read_array, read_pth_array
from workbench.formats.model import dtype_name  # noqa: F401 - re-exported

_WIDEN = {"uint16": np.int32, "uint32": np.int64, "uint64": np.float64}  # torch's unsigned support is partial


def to_torch(raw: RawTensor) -> torch.Tensor:
    """The torch tensor over a `RawTensor`'s memory (bfloat16 words reinterpreted, unsigned ints widened)."""
    with warnings.catch_warnings():
        # read-only memory maps: we never write through these tensors
        warnings.filterwarnings("ignore", message=".*non-writable.*")
        if raw.dtype == "bfloat16":
            return torch.from_numpy(np.asarray(raw.array)).view(torch.bfloat16)
        if raw.dtype in _WIDEN:
            return torch.from_numpy(np.asarray(raw.array, dtype=_WIDEN[raw.dtype]))
        return torch.from_numpy(np.asarray(raw.array))


def bin_to_tensor(arr: np.ndarray, dtype: str) -> torch.Tensor:
    """Turn a `.bin` payload array into a torch tensor of the recorded dtype (bf16 words reinterpreted)."""
    return to_torch(RawTensor(arr, dtype))


def load_pth(path: str) -> torch.Tensor:
    """A `.pth`/`.pt` holding one tensor; the payload stays on disk (memory-mapped) until touched."""
    return to_torch(read_pth_array(path))


def load_tensor(path: str | Path) -> torch.Tensor:
    """Load one tensor file (.pth/.pt/.bin/.npy) on the CPU; raises `DumpError` on any problem."""
    return to_torch(read_array(path))
