"""GE dump files (TorchAir's graph runs on the NPU): the header, the payloads, reading and writing.

One file per executed graph op, named `{OpType}.{OpName}.{taskId}.{streamId}.{timestampUs}`::

    uint64 little-endian   header length H
    H bytes                protobuf `toolkit.dumpdata.DumpData` (formats/proto/ge_dump.proto)
    payloads               input 0, input 1, ..., output 0, ..., buffer 0, ...; each `size` bytes

One tensor of a file is addressed as msit addresses it: `{file},inputs,{i}` / `{file},outputs,{i}`
(`tensor_path`). Every size is checked against the file before anything is read; plain layouts (ND,
NCHW, NHWC, ...) are read directly, device layouts (FRACTAL_NZ, NC1HWC0, ...) are named and not converted.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workbench.formats.model import DumpError, TensorRole, check_shape

MAX_HEADER_BYTES = 64 * 1024 * 1024

# GE OutputDataType code -> (dtype name, numpy storage dtype, bytes per element)
GE_DTYPES: dict[int, tuple[str, str, int]] = {
    1: ("float32", "<f4", 4),
    2: ("float16", "<f2", 2),
    3: ("int8", "i1", 1),
    4: ("uint8", "u1", 1),
    5: ("int16", "<i2", 2),
    6: ("uint16", "<u2", 2),
    7: ("int32", "<i4", 4),
    8: ("int64", "<i8", 8),
    9: ("uint32", "<u4", 4),
    10: ("uint64", "<u8", 8),
    11: ("bool", "?", 1),
    12: ("float64", "<f8", 8),
    27: ("bfloat16", "<u2", 2),  # raw bf16 words
}
DTYPE_TO_GE: dict[str, int] = {name: code for code, (name, _np, _size) in GE_DTYPES.items()}
# GE OutputFormat code -> name; PLAIN_FORMATS hold the elements row-major in the order the shape gives
GE_FORMATS: dict[int, str] = {
    0: "NCHW",
    1: "NHWC",
    2: "ND",
    3: "NC1HWC0",
    4: "FRACTAL_Z",
    12: "NC1HWC0_C04",
    13: "FRACTAL_Z_C04",
    14: "CHWN",
    16: "HWCN",
    27: "NDHWC",
    28: "FRACTAL_ZZ",
    29: "FRACTAL_NZ",
    30: "NCDHW",
    32: "NDC1HWC0",
    33: "FRACTAL_Z_3D",
}
PLAIN_FORMATS = frozenset({0, 1, 2, 14, 16, 27, 30})
FORMAT_ND = 2
FUSION_OP_TYPE = "AutomaticBufferFusionOp"
ROLE_NAMES = {"in": "inputs", "out": "outputs"}
_FIRST_READ = 64 * 1024  # bytes read at once from the start of a file: the header, and small files whole
_HEADER_CACHE = 64  # headers kept per process: the pairs of one file's tensors are read one after the other
_HEADERS: dict[str, tuple[tuple[int, int, int, int], GeHeader]] = {}
_SELECTOR_RE = re.compile(r"^(?P<file>.+),(?P<role>inputs|outputs),(?P<idx>[0-9]{1,6})$")


@dataclass(frozen=True, slots=True)
class GeTensor:
    """One input or output of a GE dump file, as its header describes it."""

    role: TensorRole  # "in" / "out"
    index: int
    dtype: str | None  # None: a data type code we do not know
    shape: tuple[int, ...]
    layout: str
    offset: int  # absolute offset of the payload in the file
    size: int
    error: str | None = None  # why this tensor cannot be read as it is (device layout, unknown dtype)


@dataclass(frozen=True, slots=True)
class GeHeader:
    """The parsed header of one GE dump file."""

    path: str
    op_name: str
    tensors: tuple[GeTensor, ...]

    def of(self, role: str) -> list[GeTensor]:
        return [t for t in self.tensors if t.role == role]


@dataclass(frozen=True, slots=True)
class GeFileName:
    """What a GE dump file's name says: `{OpType}.{OpName}.{taskId}.{streamId}.{timestampUs}`."""

    op_type: str
    op_name: str
    task_id: int
    stream_id: int
    timestamp: int


def parse_file_name(name: str) -> GeFileName | None:
    """The parts of a GE dump file name; None when it is not one (msit: at least five dot-separated parts)."""
    parts = name.split(".")
    if len(parts) < 5 or not all(p.isascii() and p.isdigit() for p in parts[-3:]) or not parts[0]:
        return None
    op_name = ".".join(parts[1:-3])
    if not op_name:
        return None
    return GeFileName(parts[0], op_name, int(parts[-3]), int(parts[-2]), int(parts[-1]))


def tensor_path(file: str | Path, role: str, index: int) -> str:
    """The address of one tensor of a GE dump file (msit's notation)."""
    return f"{file},{ROLE_NAMES[role]},{index}"


def split_tensor_path(path: str) -> tuple[str, TensorRole, int] | None:
    """(file, role, index) of a `tensor_path`; None for a path of a file of its own."""
    m = _SELECTOR_RE.match(path)
    if m is None:
        return None
    return m["file"], "in" if m["role"] == "inputs" else "out", int(m["idx"])


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def read_header(path: str | Path) -> GeHeader:
    """Parse and check a GE dump file's header against the file; `DumpError` (one line) when it cannot be read."""
    p = str(path)
    fd = _open(p)
    try:
        return _header(fd, p, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _open(path: str) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO fails at its first read instead of blocking
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None


def _header(fd: int, p: str, size: int) -> GeHeader:
    """The header of the open GE dump file `fd` (`size` bytes), checked against the file."""
    try:
        head = os.pread(fd, min(size, _FIRST_READ), 0)  # the header and, for a small file, its payloads
        if len(head) < 8:
            raise DumpError(p, f"not a GE dump file: {size} bytes, shorter than the 8-byte header length")
        (hlen,) = struct.unpack_from("<Q", head)
        if hlen > size - 8 or hlen > MAX_HEADER_BYTES:
            raise DumpError(p, f"bad header: header length {hlen} runs past the end of the file ({size} bytes)")
        raw = head[8 : 8 + hlen] if 8 + hlen <= len(head) else os.pread(fd, hlen, 8)
    except OSError as exc:
        raise DumpError(p, f"cannot read: {exc.strerror or exc}") from None
    if len(raw) < hlen:
        raise DumpError(p, f"truncated header: {len(raw)} of {hlen} bytes")
    from google.protobuf.message import DecodeError  # protobuf loads when a GE dump is read, not to detect one

    from workbench.formats import ge_proto

    try:
        msg = ge_proto.dump_data().FromString(raw)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise DumpError(p, f"bad header: not a GE DumpData message ({str(exc)[:100]})") from None
    offset = 8 + hlen
    tensors: list[GeTensor] = []
    roles: tuple[tuple[TensorRole, Any], ...] = (("in", msg.input), ("out", msg.output))
    for role, items in roles:
        for i, t in enumerate(items):
            tensors.append(_tensor(p, role, i, t, offset))
            offset += int(t.size)
    buffers = sum(int(b.size) for b in msg.buffer)
    expected = offset + buffers
    if expected > size:
        raise DumpError(p, f"truncated payload: the header accounts for {expected} bytes, the file has {size}")
    if expected < size:
        raise DumpError(p, f"lying sizes: the header accounts for {expected} bytes, the file has {size}")
    return GeHeader(p, str(msg.op_name), tuple(tensors))


def _tensor(path: str, role: TensorRole, index: int, t: Any, offset: int) -> GeTensor:
    what = f"{ROLE_NAMES[role][:-1]} {index}"
    shape = check_shape(path, [int(d) for d in t.shape.dim], f"{what} shape")
    code, fmt, size = int(t.data_type), int(t.format), int(t.size)
    layout = GE_FORMATS.get(fmt, f"format {fmt}")
    known = GE_DTYPES.get(code)
    if known is None:
        return GeTensor(role, index, None, shape, layout, offset, size, f"{what}: unknown data type code {code}")
    dtype, _np, itemsize = known
    if fmt not in GE_FORMATS:
        return GeTensor(role, index, dtype, shape, layout, offset, size, f"{what}: unknown data format code {fmt}")
    if fmt not in PLAIN_FORMATS:
        why = f"{what}: {layout} layout (a device layout): not converted to ND, not compared"
        return GeTensor(role, index, dtype, shape, layout, offset, size, why)
    need = _numel(shape) * itemsize
    if need != size:
        raise DumpError(path, f"lying sizes: {what} {list(shape)} {dtype} needs {need} bytes, the header says {size}")
    return GeTensor(role, index, dtype, shape, layout, offset, size)


def read_tensor(path: str, role: TensorRole, index: int, header: GeHeader | None = None) -> tuple[np.ndarray, str]:
    """One tensor of a GE dump file, memory-mapped (read whole when small): (array, dtype name; bfloat16 as its
    uint16 words). A file's header is parsed once for all its tensors while the file stays the same."""
    fd = _open(path)
    try:
        st = os.fstat(fd)
        hdr = header or _cached_header(fd, path, st)
        found = [t for t in hdr.tensors if t.role == role and t.index == index]
        if not found:
            raise DumpError(tensor_path(path, role, index), f"the file has {len(hdr.of(role))} {ROLE_NAMES[role]}")
        t = found[0]
        if t.error is not None or t.dtype is None:
            raise DumpError(tensor_path(path, role, index), t.error or "unknown data type")
        np_dtype = np.dtype(GE_DTYPES[DTYPE_TO_GE[t.dtype]][1])
        n = _numel(t.shape)
        if n == 0:
            return np.empty(t.shape, dtype=np_dtype), t.dtype
        return _payload(fd, path, t, np_dtype, n).reshape(t.shape), t.dtype
    finally:
        os.close(fd)


def _cached_header(fd: int, path: str, st: os.stat_result) -> GeHeader:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _HEADERS.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    hdr = _header(fd, path, st.st_size)
    if len(_HEADERS) >= _HEADER_CACHE:
        _HEADERS.clear()
    _HEADERS[path] = (key, hdr)
    return hdr


def _payload(fd: int, path: str, t: GeTensor, np_dtype: np.dtype[Any], n: int) -> np.ndarray:
    """The `n` elements of `t`'s payload: read when small (a map costs more than the bytes), else mapped."""
    where = tensor_path(path, t.role, t.index)
    try:
        if t.size <= _FIRST_READ:
            data = os.pread(fd, t.size, t.offset)
            if len(data) < t.size:
                raise DumpError(where, f"truncated payload: {len(data)} of {t.size} bytes")
            return np.frombuffer(data, np_dtype, count=n)
        start = t.offset - t.offset % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(fd, t.offset + t.size - start, access=mmap.ACCESS_READ, offset=start)
    except (OSError, ValueError) as exc:  # ValueError: the file shrank below the header's sizes
        raise DumpError(where, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return np.frombuffer(mapped, np_dtype, count=n, offset=t.offset - start)


def encode(op_name: str, inputs: list[tuple[np.ndarray, str]], outputs: list[tuple[np.ndarray, str]]) -> bytes:
    """A GE dump file's bytes: `(array, dtype name)` per input and output, ND layout (bfloat16 as uint16 words)."""
    from workbench.formats import ge_proto

    msg = ge_proto.dump_data()(version="2.0", op_name=op_name)
    payloads: list[bytes] = []
    for items, field in ((inputs, msg.input), (outputs, msg.output)):
        for arr, dtype in items:
            data = np.ascontiguousarray(arr).astype(GE_DTYPES[DTYPE_TO_GE[dtype]][1], copy=False).tobytes()
            t = field.add(data_type=DTYPE_TO_GE[dtype], format=FORMAT_ND, size=len(data))
            t.shape.dim.extend(int(d) for d in arr.shape)
            payloads.append(data)
    header = msg.SerializeToString()
    return struct.pack("<Q", len(header)) + header + b"".join(payloads)
