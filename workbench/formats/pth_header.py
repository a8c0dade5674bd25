"""dtype and shape of a `torch.save(tensor)` file without importing torch.

A plain `.pth` is a zip holding `<name>/data.pkl` (a tiny pickle that rebuilds the tensor from a
storage) and `<name>/data/<key>` (the raw bytes). A restricted unpickler that knows exactly the
rebuild function and the storage types reads the header in a few hundred microseconds; any other
global makes it give up (returns None) and the caller falls back to torch's weights-only loader,
which decides (and refuses code). Nothing is ever imported or executed from the file.
"""

from __future__ import annotations

import collections
import io
import pickle
import zipfile
from typing import Any

from workbench.formats.model import DumpError

STORAGE_DTYPES: dict[str, tuple[str, int]] = {
    "FloatStorage": ("float32", 4), "HalfStorage": ("float16", 2), "BFloat16Storage": ("bfloat16", 2),
    "DoubleStorage": ("float64", 8), "LongStorage": ("int64", 8), "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2), "CharStorage": ("int8", 1), "ByteStorage": ("uint8", 1),
    "BoolStorage": ("bool", 1),
}


class NotPlain(Exception):
    """Not a plain saved tensor: torch's own loader must decide."""


class _Storage(str):
    """A storage type seen in the pickle, by name."""


class _HeaderUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "torch" and name in STORAGE_DTYPES:
            return _Storage(name)
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise NotPlain(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _Storage)):
            raise NotPlain("storage")
        return (STORAGE_DTYPES[pid[1]], str(pid[2]), int(pid[4]))


def _rebuild(storage: Any, offset: int, size: Any, stride: Any, *_rest: Any) -> Any:
    return ("tensor", storage, int(offset), tuple(int(x) for x in size), tuple(int(x) for x in stride))


def plain_spec(zf: zipfile.ZipFile) -> tuple[str, int, str, int, int, tuple[int, ...], tuple[int, ...], str] | None:
    """(dtype, itemsize, storage key, storage numel, offset, size, stride, record prefix) of a plain saved tensor."""
    pkl = [n for n in zf.namelist() if n.endswith("/data.pkl")]
    if len(pkl) != 1 or zf.getinfo(pkl[0]).file_size > 1 << 20:
        return None
    try:
        spec = _HeaderUnpickler(io.BytesIO(zf.read(pkl[0]))).load()
    except (NotPlain, pickle.UnpicklingError, EOFError, TypeError, ValueError, IndexError, KeyError):
        return None
    if not (isinstance(spec, tuple) and len(spec) == 5 and spec[0] == "tensor"):
        return None
    _tag, ((dtype, itemsize), key, numel), offset, size, stride = spec
    return dtype, itemsize, key, numel, offset, size, stride, pkl[0][: -len("data.pkl")]


def plain_entry(path: str) -> tuple[tuple[str, int, str, int, int, tuple[int, ...], tuple[int, ...], str],
                                   zipfile.ZipInfo] | None:
    """The spec of a plain saved tensor and the zip entry of its storage; None when not plain (or unreadable:
    torch's loader then reports the problem)."""
    try:
        with zipfile.ZipFile(path) as zf:
            spec = plain_spec(zf)
            if spec is None:
                return None
            return spec, zf.getinfo(f"{spec[7]}data/{spec[2]}")
    except (zipfile.BadZipFile, KeyError, OSError, EOFError):
        return None


def read_pth_header(path: str, file_size: int) -> tuple[str, tuple[int, ...]] | None:
    """(dtype name, shape) of a plain `.pth`, checked against the file's size; None when not plain."""
    found = plain_entry(path)
    if found is None:
        return None
    (dtype, itemsize, _key, numel, offset, size, stride, _prefix), entry = found
    check_bounds(path, dtype, itemsize, numel, offset, size, stride, entry.file_size,
                 entry.header_offset + entry.file_size, file_size)
    return dtype, size


def check_bounds(path: str, dtype: str, itemsize: int, numel: int, offset: int, size: tuple[int, ...],
                 stride: tuple[int, ...], stored: int, end: int, file_size: int) -> int:
    """Raise `DumpError` unless the storage fits the file and the view fits the storage; returns the view's span."""
    if numel * itemsize > stored or end > file_size:
        raise DumpError(path, f"storage of {numel} x {dtype} does not fit the file (truncated?)")
    span = 1 + sum((d - 1) * st for d, st in zip(size, stride)) if all(d > 0 for d in size) else 0
    if offset < 0 or any(st < 0 for st in stride) or offset + span > numel:
        raise DumpError(path, f"tensor view {list(size)} at offset {offset} lies outside its storage")
    return span
