"""Reading one tensor file of any supported kind, safely and without copying where possible.

`.pth`/`.pt` go through `torch.load(weights_only=True, mmap=True)`: a pickle that would run
code is refused, never executed. `.bin` is memory-mapped after its header is validated.
`.npy` is memory-mapped by numpy (no pickles allowed). Every failure is a `DumpError`
whose message names the file and the reason in one line.
"""

from __future__ import annotations

import os
import pickle
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np
import torch

from workbench.formats import atb_bin
from workbench.formats.model import DumpError, dtype_name  # noqa: F401 - dtype_name re-exported
from workbench.formats.pth_header import check_bounds, plain_entry

TORCH_DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
    torch.float64: "float64", torch.int8: "int8", torch.uint8: "uint8", torch.int16: "int16",
    torch.int32: "int32", torch.int64: "int64", torch.bool: "bool",
}
NAME_TO_TORCH: dict[str, torch.dtype] = {v: k for k, v in TORCH_DTYPE_NAMES.items()}


_TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}


def _fast_pth(path: str, file_size: int) -> torch.Tensor | None:
    """Memory-map a plain `torch.save(tensor)` zip without torch.load's machinery; None when not plain."""
    try:
        found = plain_entry(path)
        if found is None:
            return None
        (dtype_s, itemsize, _key, numel, offset, size, stride, _prefix), entry = found
        if entry.compress_type != zipfile.ZIP_STORED:
            return None
        with open(path, "rb") as fh:
            fh.seek(entry.header_offset)
            local = fh.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04":
            return None
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        data_offset = entry.header_offset + 30 + name_len + extra_len
        dtype = _TORCH_DTYPES[dtype_s]
        span = check_bounds(path, dtype_s, itemsize, numel, offset, size, stride, entry.file_size,
                            data_offset + entry.file_size, file_size)
        if numel == 0 or span == 0:
            return torch.empty(size, dtype=dtype)
        np_dtype = np.uint16 if dtype == torch.bfloat16 else torch.empty((), dtype=dtype).numpy().dtype
        flat = np.memmap(path, dtype=np_dtype, mode="r", offset=data_offset, shape=(numel,))
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-writable.*")
            base = torch.from_numpy(flat)
        if dtype == torch.bfloat16:
            base = base.view(torch.bfloat16)
        return torch.as_strided(base, size, stride, offset)
    except (zipfile.BadZipFile, KeyError, ValueError, EOFError, TypeError, IndexError, struct.error):
        return None


def load_pth(path: str) -> torch.Tensor:
    """A `.pth`/`.pt` holding one tensor; the payload stays on disk (memory-mapped) until touched."""
    try:
        size = os.path.getsize(path)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    if size == 0:
        raise DumpError(path, "empty file")
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        fast = _fast_pth(path, size)
        if fast is not None:
            return fast
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about pickle protocols before refusing them
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines()
        glob = next((ln.strip() for ln in lines if "GLOBAL" in ln or "Unsupported global" in ln), None)
        if glob is not None:
            raise DumpError(path, f"refused: the pickle would run code ({glob[:140]})") from None
        detail = next((ln.strip() for ln in lines if "Unsupported" in ln or "nvalid" in ln), "")
        raise DumpError(path, "refused: not a tensor file torch can load safely"
                        + (f" ({detail[:120]})" if detail else "")) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError, OSError, KeyError, IndexError,
            TypeError, AttributeError) as exc:
        text = str(exc).strip()
        msg = text.splitlines()[0] if text else type(exc).__name__
        raise DumpError(path, f"not a readable torch file ({msg[:160]})") from None
    if not isinstance(obj, torch.Tensor):
        raise DumpError(path, f"holds a {type(obj).__name__}, not a tensor")
    return obj


def _load_npy(path: str) -> torch.Tensor:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DumpError(path, f"not a readable .npy file ({str(exc)[:160]})") from None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*non-writable.*")  # read-only map, never written
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
        return load_pth(p)
    if suffix == ".bin":
        hdr = atb_bin.read_header(p)
        return bin_to_tensor(atb_bin.read_bin(p, hdr), hdr.dtype)
    if suffix == ".npy":
        return _load_npy(p)
    raise DumpError(p, f"unknown tensor file type {suffix!r}")
