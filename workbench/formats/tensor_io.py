"""Reading one tensor file as a torch tensor, safely and without copying where possible.

The files are read by `workbench.formats.arrays` (memory-mapped, torch-free for plain saved
tensors, `.bin` and `.npy`); this module turns those arrays into torch tensors and holds the one
place where torch's own loader runs: `torch.load(weights_only=True)`, so a pickle that would run
code is refused, never executed. Every failure is a `DumpError` naming the file and the reason.
"""

from __future__ import annotations

import pickle
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from workbench.formats.arrays import RawTensor, read_array, read_pth_array
from workbench.formats.model import DumpError, check_shape, dtype_name  # noqa: F401 - dtype_name re-exported
from workbench.formats.pth_header import check_repeat

_WIDEN = {"uint16": np.int32, "uint32": np.int64, "uint64": np.float64}  # torch's unsigned support is partial


def torch_load_pth(path: str, mmap: bool) -> torch.Tensor:
    """torch's weights-only loader on a file that is not a plain saved tensor; errors become `DumpError`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols before refusing them
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines()
        glob = next((ln.strip() for ln in lines if "GLOBAL" in ln or "Unsupported global" in ln), None)
        if glob is not None:
            raise DumpError(path, f"refused: the pickle would run code ({glob[:140]})") from None
        detail = next((ln.strip() for ln in lines if "Unsupported" in ln or "nvalid" in ln), "")
        raise DumpError(
            path, "refused: not a tensor file torch can load safely" + (f" ({detail[:120]})" if detail else "")
        ) from None
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
    ) as exc:
        text = str(exc).strip()
        msg = text.splitlines()[0] if text else type(exc).__name__
        raise DumpError(path, f"not a readable torch file ({msg[:160]})") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpError(path, f"holds a {type(obj).__name__}, not a tensor")
    check_shape(path, tuple(int(d) for d in obj.shape), "tensor shape")
    stored = max(obj.untyped_storage().nbytes() // max(obj.element_size(), 1), 1)
    check_repeat(str(path), tuple(int(d) for d in obj.shape), obj.numel(), stored)
    return obj


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
