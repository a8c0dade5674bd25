"""Reading one tensor file as a numpy array, without importing torch where the file allows it.

`.pth`/`.pt` files that hold one plain saved tensor are memory-mapped straight from the zip (the
header is read by `pth_header`'s restricted unpickler); anything else goes to torch's weights-only
loader (imported only then), which refuses a pickle that would run code. `.bin` is memory-mapped
after its header is validated; `.npy` is memory-mapped by numpy with pickles refused. A caller that reads
pair after pair (a compare worker) passes a `Staging` buffer: a contiguous payload that fits is then read into
it instead of mapped (`formats/staging.py`). Every failure is a `DumpError` whose message names the file and the
reason in one line.

numpy has no bfloat16: a bfloat16 tensor is held as its raw uint16 words, and `RawTensor.dtype`
says what they are.
"""

from __future__ import annotations

import math
import os
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from workbench.formats import atb_bin
from workbench.formats.model import DumpError, Payload, dtype_name
from workbench.formats.pth_header import PlainTensor, contiguous_strides, payload_of, plain_tensor
from workbench.formats.staging import Staging

NUMPY_STORAGE: dict[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "float64": "<f8",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "i1",
    "uint8": "u1",
    "bool": "?",
}


@dataclass(frozen=True, slots=True)
class RawTensor:
    """A tensor as numpy holds it: `array` with the logical `dtype` name (bfloat16 as its uint16 words)."""

    array: np.ndarray
    dtype: str

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.array.shape)

    @property
    def numel(self) -> int:
        return int(self.array.size)


def as_float64(words: np.ndarray, dtype: str) -> np.ndarray:
    """A tensor's values (or a chunk of them) as float64, from the array `RawTensor` holds (bfloat16: its uint16
    words)."""
    if dtype == "bfloat16":
        return (np.asarray(words, dtype=np.uint32) << 16).view(np.float32).astype(np.float64)
    return np.asarray(words, dtype=np.float64)


def as_raw(x: Any) -> RawTensor:
    """A `RawTensor` view of a `RawTensor`, numpy array or torch tensor (no copy where the layout allows)."""
    if isinstance(x, RawTensor):
        return x
    if isinstance(x, np.ndarray):
        return RawTensor(x, dtype_name(x.dtype))
    if type(x).__module__.startswith("torch"):  # a torch.Tensor: torch is loaded already, by whoever made it
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return RawTensor(t.view(torch.int16).numpy().view(np.uint16), "bfloat16")
        try:
            return RawTensor(t.numpy(), dtype_name(t.dtype))
        except TypeError:  # float8 and other types numpy lacks: compare their float32 values
            return RawTensor(t.float().numpy(), dtype_name(t.dtype))
    return RawTensor(np.asarray(x), dtype_name(np.asarray(x).dtype))


def _plain_pth(path: str, file_size: int, staging: Staging | None) -> RawTensor | None:
    """Memory-map (or read into `staging`) a plain `torch.save(tensor)` zip; None when it is not plain (torch's
    loader decides then)."""
    found = plain_tensor(path, file_size)
    return None if found is None else plain_array(path, found, staging)


def plain_array(path: str, found: PlainTensor, staging: Staging | None = None) -> RawTensor | None:
    """The array of a plain saved tensor `plain_tensor` located (memory-mapped unless the file was read whole, or
    its contiguous payload read into `staging`); None for a dtype numpy cannot hold."""
    if found.dtype not in NUMPY_STORAGE:
        return None
    np_dtype = np.dtype(NUMPY_STORAGE[found.dtype])
    size = found.size
    if found.numel == 0 or found.span == 0:
        return RawTensor(np.empty(size, dtype=np_dtype), found.dtype)
    contiguous = found.stride == contiguous_strides(size)
    if found.whole_file is not None:  # already in memory: a map would cost more than the bytes
        flat = np.frombuffer(found.whole_file, np_dtype, count=found.numel, offset=found.data_offset)
    elif (
        contiguous
        and staging is not None
        and (staged := staging.values(path, found.first_byte, np_dtype, size)) is not None
    ):
        return RawTensor(staged, found.dtype)
    else:
        # a plain ndarray over the map: memmap's subclass hooks cost on every operation
        flat = np.asarray(np.memmap(path, dtype=np_dtype, mode="r", offset=found.data_offset, shape=(found.numel,)))
    if contiguous:
        arr = flat[found.offset : found.offset + found.span].reshape(size)
    else:
        arr = np.lib.stride_tricks.as_strided(
            flat[found.offset :], shape=size, writeable=False, strides=tuple(s * found.itemsize for s in found.stride)
        )
    return RawTensor(arr, found.dtype)


def read_pth_array(path: str, file_size: int | None = None, staging: Staging | None = None) -> RawTensor:
    """A `.pth`/`.pt` holding one tensor; the payload stays on disk (memory-mapped) until touched, or is read into
    `staging` when it is contiguous and fits."""
    if file_size is None:
        try:
            st = os.stat(path)
        except OSError as exc:
            raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
        if stat.S_ISDIR(st.st_mode):
            raise DumpError(path, "is a folder, not a tensor file")
        file_size = st.st_size
    if file_size == 0:
        raise DumpError(path, "empty file")
    fast = _plain_pth(path, file_size, staging)
    if fast is not None:
        return fast
    from workbench.formats.torch_load import torch_load_pth  # only for files that are not plain saved tensors

    return as_raw(torch_load_pth(path, mmap=zipfile.is_zipfile(path)))


def _read_npy(path: str, staging: Staging | None = None) -> RawTensor:
    staged = None if staging is None else _staged_npy(path, staging)
    if staged is not None:
        return staged
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DumpError(path, f"not a readable .npy file ({str(exc)[:160]})") from None
    return RawTensor(arr, dtype_name(arr.dtype))


def npy_header_of(fh: BinaryIO) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """(shape, Fortran order, dtype) from the header of an open `.npy` file (numpy's own parser, no pickle); `fh` is
    left at the first value. Raises numpy's `ValueError` on a malformed header."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    return np.lib.format.read_array_header_2_0(fh)


def _staged_npy(path: str, staging: Staging) -> RawTensor | None:
    """A plain C-ordered `.npy`'s values read into `staging`; None for anything else (numpy's own loader then
    reads it, or says what is wrong)."""
    try:
        with open(path, "rb") as fh:
            shape, fortran, dtype = npy_header_of(fh)
            start = fh.tell()
            file_size = os.fstat(fh.fileno()).st_size
    except (ValueError, OSError, EOFError):
        return None
    if fortran or dtype.hasobject or not shape:
        return None
    if start + math.prod(shape) * dtype.itemsize > file_size:
        return None
    values = staging.values(path, start, dtype, shape)
    return None if values is None else RawTensor(values, dtype_name(dtype))


def open_unchanged(path: str, at: Payload, nbytes: int) -> int | None:
    """A descriptor of `path` (the caller closes it) when the file is still the one `at` describes (same device,
    inode, size and modification time) and holds `nbytes` from `at.offset`; None when it is not, or cannot be
    opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) == at.file_key and at.offset + nbytes <= st.st_size:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def read_payload(path: str, at: Payload, staging: Staging | None = None) -> RawTensor | None:
    """The values where the dump's reader found them (`Payload`), when the file is still the one it read (same
    device, inode, size and modification time): no header parsed again. None when it is not, or the values are
    not something numpy holds: `read_array` then reads the file from scratch."""
    np_name = NUMPY_STORAGE.get(at.dtype)
    if np_name is None:
        return None
    np_dtype = np.dtype(np_name)
    nbytes = np_dtype.itemsize * math.prod(at.shape)
    fd = open_unchanged(path, at, nbytes)
    if fd is None:
        return None
    try:
        if nbytes == 0:
            return RawTensor(np.empty(at.shape, dtype=np_dtype), at.dtype)
        staged = None if staging is None else staging.values(path, at.offset, np_dtype, at.shape, fd)
        if staged is not None:
            return RawTensor(staged, at.dtype)
        with open(fd, "rb", closefd=False) as fh:  # the file checked above, not whatever the name holds by now
            count = nbytes // np_dtype.itemsize
            flat = np.asarray(np.memmap(fh, dtype=np_dtype, mode="r", offset=at.offset, shape=(count,)))
        return RawTensor(flat.reshape(at.shape), at.dtype)
    finally:
        os.close(fd)


def payload_place(path: str) -> Payload | None:
    """Where a tensor file's values lie (`Payload`: contiguous, C-ordered, in a dtype numpy holds as the file stores
    it), from its header alone; None for any other file, or one that cannot be read (`read_array` then says why).
    A compare worker given a pair without its readers' places finds them here, then reads the values a block at a
    time."""
    suffix = os.path.splitext(path)[1].lower()
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            return None
        key = (before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns)
        if suffix in (".pth", ".pt"):
            found = plain_tensor(path, before.st_size) if before.st_size > 0 else None
            at = None if found is None else payload_of(found, key)
        elif suffix == ".bin":
            hdr = atb_bin.read_header(path)
            at = Payload(key, hdr.payload_offset, hdr.dtype, hdr.shape) if hdr.payload_length else None
        elif suffix == ".npy":
            at = _npy_place(path, key)
        else:
            return None
        after = os.stat(path)
    except (OSError, DumpError):
        return None
    if at is None or (after.st_dev, after.st_ino, after.st_size, after.st_mtime_ns) != key:
        return None  # replaced while its header was read
    storage = NUMPY_STORAGE.get(at.dtype)
    if storage is None or at.offset + np.dtype(storage).itemsize * math.prod(at.shape) > before.st_size:
        return None
    return at


def _npy_place(path: str, key: tuple[int, int, int, int]) -> Payload | None:
    try:
        with open(path, "rb") as fh:
            shape, fortran, dtype = npy_header_of(fh)
            start = fh.tell()
    except (ValueError, OSError, EOFError):
        return None
    name = dtype_name(dtype) if not dtype.hasobject else None
    if fortran or name is None or NUMPY_STORAGE.get(name) is None or np.dtype(NUMPY_STORAGE[name]) != dtype:
        return None
    return Payload(key, start, name, tuple(int(d) for d in shape))


def read_array(path: str | Path, staging: Staging | None = None) -> RawTensor:
    """Read one tensor file (.pth/.pt/.bin/.npy, or one tensor of a GE dump file) as a numpy array; raises
    `DumpError` on any problem. With `staging`, a contiguous payload that fits is read into it (valid until its next
    fill) instead of being memory-mapped."""
    p = str(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        from workbench.formats import ge_dump  # protobuf, only for GE dumps

        ge = ge_dump.split_tensor_path(p)
        if ge is not None and os.path.isfile(ge[0]):  # one tensor of a GE dump file: `{file},outputs,{i}`
            arr, dtype = ge_dump.read_tensor(*ge)
            return RawTensor(arr, dtype)
        raise DumpError(p, "missing file") from None
    except OSError as exc:
        raise DumpError(p, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DumpError(p, "is a folder, not a tensor file")
    suffix = os.path.splitext(p)[1].lower()
    if suffix in (".pth", ".pt"):
        return read_pth_array(p, st.st_size, staging)
    if suffix == ".bin":
        hdr = atb_bin.read_header(p)
        return RawTensor(atb_bin.read_bin(p, hdr, staging), hdr.dtype)
    if suffix == ".npy":
        return _read_npy(p, staging)
    raise DumpError(p, f"unknown tensor file type {suffix!r}")
