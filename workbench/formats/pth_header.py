"""dtype and shape of a `torch.save(tensor)` file without importing torch.

A plain `.pth` is a zip holding `<name>/data.pkl` (a tiny pickle that rebuilds the tensor from a
storage) and `<name>/data/<key>` (the raw bytes). A restricted unpickler that knows exactly the
rebuild function and the storage types reads the header; the zip's directory is parsed here too, from
one or two reads of the file (tens of microseconds). Any other global, or a zip this reader does not
handle, makes it give up (returns None) and the caller falls back to torch's weights-only loader,
which decides (and refuses code). Nothing is ever imported or executed from the file.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
from dataclasses import dataclass
from typing import Any

from workbench.formats.model import DumpError, Payload, check_shape

STORAGE_DTYPES: dict[str, tuple[str, int]] = {
    "FloatStorage": ("float32", 4),
    "HalfStorage": ("float16", 2),
    "BFloat16Storage": ("bfloat16", 2),
    "DoubleStorage": ("float64", 8),
    "LongStorage": ("int64", 8),
    "IntStorage": ("int32", 4),
    "ShortStorage": ("int16", 2),
    "CharStorage": ("int8", 1),
    "ByteStorage": ("uint8", 1),
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


# Elements a view may show beyond its storage (stride 0 repeats them). A fixed count, not a ratio of the
# storage: the metrics walk every element of the view, so a file's cost must not grow with a repeat factor
# (a 64x allowance let four 4 MB files take 1 GB and 71 s per worker). 2^24 is what a genuine 64 MB float32
# tensor costs anyway, and covers the expanded masks real dumps hold.
REPEAT_BUDGET = 1 << 24

_EOCD = b"PK\x05\x06"
_CENTRAL = b"PK\x01\x02"
_LOCAL = b"PK\x03\x04"
# a central directory entry's 46 bytes, the fields read: signature, flags, method, stored size, the lengths of
# the name, extra field and comment, local header offset (`x` skips the others)
_CD_ENTRY = struct.Struct("<4s2x2xHH2x2x4xI4xHHH2x2x4xI")
_HEAD_BYTES = 4096  # data.pkl and the payload's local header come first in torch's zips
_WHOLE_FILE_BYTES = 64 * 1024  # smaller files are read in one go


@dataclass(frozen=True, slots=True)
class PlainTensor:
    """Where a plain saved tensor's bytes lie: storage `numel` x `dtype` at `data_offset`, viewed by
    (`offset`, `size`, `stride`); checked against the file's size."""

    dtype: str
    itemsize: int
    numel: int
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]
    data_offset: int
    span: int
    whole_file: bytes | None = None  # the file's bytes when it was small enough to read in one go

    @property
    def first_byte(self) -> int:
        """Where in the file the view's first element lies."""
        return self.data_offset + self.offset * self.itemsize


class _Bytes:
    """Reads of one file through a head buffer and a tail buffer (two system calls for most files)."""

    def __init__(self, fd: int, file_size: int) -> None:
        self.fd, self.size = fd, file_size
        if file_size <= _WHOLE_FILE_BYTES:
            self.head = self.tail = os.pread(fd, file_size, 0)
            self.tail_start = 0
        else:
            self.head = os.pread(fd, _HEAD_BYTES, 0)
            self.tail_start = file_size - _HEAD_BYTES
            self.tail = os.pread(fd, _HEAD_BYTES, self.tail_start)

    def read(self, start: int, n: int) -> bytes:
        if start + n <= len(self.head):
            return self.head[start : start + n]
        if start >= self.tail_start:
            return self.tail[start - self.tail_start : start - self.tail_start + n]
        return os.pread(self.fd, n, start)


def _central_directory(buf: _Bytes) -> dict[str, tuple[int, int, int]] | None:
    """name -> (local header offset, compression method, stored size); None for zips this reader does not
    handle (zip64 sizes, a long comment, encryption): torch's loader takes those."""
    at = buf.tail.rfind(_EOCD)
    if at < 0 or len(buf.tail) - at < 22:
        return None
    count, cd_size, cd_offset = struct.unpack_from("<HII", buf.tail, at + 10)
    if 0xFFFFFFFF in (cd_size, cd_offset) or count == 0xFFFF or cd_offset + cd_size > buf.size:
        return None
    cd = buf.read(cd_offset, cd_size)
    entries: dict[str, tuple[int, int, int]] = {}
    pos = 0
    for _ in range(count):
        if len(cd) < pos + 46:
            return None
        sig, flags, method, stored, name_len, extra_len, comment_len, local = _CD_ENTRY.unpack_from(cd, pos)
        if sig != _CENTRAL:
            return None
        if flags & 1 or 0xFFFFFFFF in (stored, local):
            return None
        entries[cd[pos + 46 : pos + 46 + name_len].decode("utf-8", "replace")] = (local, method, stored)
        pos += 46 + name_len + extra_len + comment_len
    return entries


def _payload_offset(buf: _Bytes, local: int) -> int | None:
    header = buf.read(local, 30)
    if len(header) != 30 or header[:4] != _LOCAL:
        return None
    name_len, extra_len = struct.unpack_from("<HH", header, 26)
    return local + 30 + name_len + extra_len


def _unpickle_spec(data: bytes) -> tuple[str, int, str, int, int, tuple[int, ...], tuple[int, ...]] | None:
    try:
        spec = _HeaderUnpickler(io.BytesIO(data)).load()
    except (NotPlain, pickle.UnpicklingError, EOFError, TypeError, ValueError, IndexError, KeyError):
        return None
    if not (isinstance(spec, tuple) and len(spec) == 5 and spec[0] == "tensor"):
        return None
    _tag, ((dtype, itemsize), key, numel), offset, size, stride = spec
    return dtype, itemsize, key, numel, offset, size, stride


def plain_tensor(path: str, file_size: int) -> PlainTensor | None:
    """Where the tensor of a plain `torch.save(tensor)` file lies, read with a few system calls and no torch.

    None when the file is not such a zip (torch's weights-only loader decides then); `DumpError` when
    its header promises more bytes than the file has.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        buf = _Bytes(fd, file_size)
        entries = _central_directory(buf)
        if entries is None:
            return None
        pkl = [n for n in entries if n.endswith("/data.pkl")]
        if len(pkl) != 1:
            return None
        local, method, stored = entries[pkl[0]]
        start = _payload_offset(buf, local)
        if method != 0 or start is None or stored > 1 << 20 or start + stored > file_size:
            return None
        spec = _unpickle_spec(buf.read(start, stored))
        if spec is None:
            return None
        dtype, itemsize, key, numel, offset, size, stride = spec
        entry = entries.get(f"{pkl[0][: -len('data.pkl')]}data/{key}")
        if entry is None or entry[1] != 0:
            return None
        data_offset = _payload_offset(buf, entry[0])
        if data_offset is None:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    span = check_bounds(path, dtype, itemsize, numel, offset, size, stride, entry[2], data_offset + entry[2], file_size)
    return PlainTensor(
        dtype,
        itemsize,
        numel,
        offset,
        size,
        stride,
        data_offset,
        span,
        buf.head if file_size <= _WHOLE_FILE_BYTES else None,
    )


def contiguous_strides(size: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a C-contiguous tensor of `size`."""
    strides, step = [], 1
    for d in reversed(size):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def payload_of(found: PlainTensor, file_key: tuple[int, int, int, int]) -> Payload | None:
    """Where `found`'s values lie in its file (None for a view whose elements are not contiguous)."""
    if found.stride != contiguous_strides(found.size):
        return None
    return Payload(file_key, found.first_byte, found.dtype, found.size)


def check_repeat(path: str, size: tuple[int, ...], elements: int, stored: int) -> None:
    """Raise `DumpError` when a view shows more than `REPEAT_BUDGET` elements beyond its `stored` ones."""
    if elements - max(stored, 0) > REPEAT_BUDGET:
        raise DumpError(
            path,
            f"tensor view {list(size)[:8]} repeats its storage of {stored} elements to {elements} "
            f"(more than {REPEAT_BUDGET} beyond it): refused",
        )


def check_bounds(
    path: str,
    dtype: str,
    itemsize: int,
    numel: int,
    offset: int,
    size: tuple[int, ...],
    stride: tuple[int, ...],
    stored: int,
    end: int,
    file_size: int,
) -> int:
    """Raise `DumpError` unless the storage fits the file and the view fits the storage; returns the view's span.

    A view may repeat storage elements (stride 0), but at most `REPEAT_BUDGET` elements beyond its storage:
    a small file cannot make the metrics walk more than a genuine 64 MB tensor would."""
    if numel < 0 or numel * itemsize > stored or end > file_size:
        raise DumpError(path, f"storage of {numel} x {dtype} does not fit the file (truncated?)")
    check_shape(path, size, "tensor shape")
    if len(stride) != len(size):
        raise DumpError(path, f"tensor view has {len(size)} sizes but {len(stride)} strides")
    elements = 1
    for d in size:
        elements *= d
    check_repeat(path, size, elements, numel)
    span = 1 + sum((d - 1) * st for d, st in zip(size, stride)) if all(d > 0 for d in size) else 0
    if offset < 0 or any(st < 0 for st in stride) or offset + span > numel:
        raise DumpError(path, f"tensor view {list(size)} at offset {offset} lies outside its storage")
    return span
