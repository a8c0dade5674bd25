"""Filesystem helpers shared by the readers: listing folders, reading JSON and tensor headers.

Every helper turns a failure into a `DumpError` (one line naming the file) so that a reader can
record it as a problem and go on with the other files.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from workbench.core.capped import DUMP_JSON, FileRefused, read_text
from workbench.formats.arrays import npy_header_of
from workbench.formats.model import DumpError, Payload, check_shape, dtype_name
from workbench.formats.pth_header import payload_of, plain_tensor

if TYPE_CHECKING:  # torch is imported only when a payload is read
    import torch

# tensors above this size are hashed on evenly spaced samples (data-flow matching only needs identity, and
# activations that agree on 16 spread runs of 1 KiB, 256 float32 values each, are the same tensor; twins are
# compared byte for byte before one result stands for both). Runs of 1 KiB, not 4: reading an msit dump hashes
# its first token's files, and the larger runs were a fifth of its read (46 against 37 ms, 836 files)
SMALL_HASH_BYTES = 64 * 1024
_SAMPLES = 16
_SAMPLE_BYTES = 1024


@dataclass(slots=True)
class DirEntry:
    name: str
    path: str
    is_dir: bool  # a real folder: a symbolic link to a folder is never followed (loops, escapes)
    is_link: bool = False


_CONFINE: ContextVar[str | None] = ContextVar("wb_confine", default=None)


@contextlib.contextmanager
def confined(root: str | Path | None) -> Iterator[None]:
    """While reading a dump: symbolic links to files outside `root` are refused (`check_link`); None follows all."""
    token = _CONFINE.set(os.path.realpath(root) if root is not None else None)
    try:
        yield
    finally:
        _CONFINE.reset(token)


def check_link(path: str) -> None:
    """Raise `DumpError` when `path`, a symbolic link, leads outside the dump being read (see `confined`)."""
    root = _CONFINE.get()
    if root is None:
        return
    real = os.path.realpath(path)
    if not os.path.exists(real):
        return  # dangling: the read that follows says "missing"
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise DumpError(path, "symbolic link to a file outside the dump: not followed (--follow-symlinks reads it)")


def link_problem(e: DirEntry) -> str | None:
    """The problem line for a symbolic link to a folder (never followed), None for anything else."""
    if e.is_link and os.path.isdir(e.path):
        return f"{e.path}: symbolic link to a folder: not followed"
    return None


def list_dir(path: str | Path) -> list[DirEntry]:
    """Entries of a folder sorted by name; raises `DumpError` when it cannot be listed."""
    try:
        with os.scandir(path) as it:
            out = []
            for e in it:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    is_link = not is_dir and e.is_symlink()
                except OSError:
                    is_dir = is_link = False
                out.append(DirEntry(e.name, e.path, is_dir, is_link))
    except OSError as exc:
        raise DumpError(path, f"cannot list folder: {exc.strerror or exc}") from None
    out.sort(key=lambda e: e.name)
    return out


def read_json(path: str | Path) -> Any:
    """Parse a JSON file; raises `DumpError` naming the file on any problem."""
    try:
        if os.path.islink(path):
            check_link(str(path))
        return json.loads(read_text(path, DUMP_JSON))
    except FileRefused as exc:
        raise DumpError(path, exc.reason) from None
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpError(path, f"not valid JSON ({str(exc)[:120]})") from None
    except RecursionError:
        raise DumpError(path, "JSON nested too deeply to read") from None


_HEADER_CACHE: dict[tuple[int, int, int, int], tuple[str, tuple[int, ...], Payload | None]] = {}
_CACHE_MAX = 16384


def load_pth_lazy(path: str) -> torch.Tensor:
    """One tensor file, memory-mapped: the payload stays on disk until touched (see `tensor_io`)."""
    from workbench.formats.tensor_io import load_pth

    return load_pth(path)


def pth_header(path: str) -> tuple[str, tuple[int, ...], Payload | None]:
    """dtype name, shape and (for a plain saved tensor whose values are contiguous) where the values lie in a `.pth`
    tensor file, without torch when the file is a plain saved tensor.

    Our dumper hard-links a tensor seen twice in a token, so most names of a dump share a few
    files: each file (device, inode, size, mtime) is parsed once.
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise DumpError(path, "is a folder, not a tensor file")
    if st.st_size == 0:
        raise DumpError(path, "empty file")
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _HEADER_CACHE.get(key)
    if hit is None:
        found = plain_tensor(path, st.st_size)
        if found is not None:
            hit = (found.dtype, found.size, payload_of(found, key))
        else:  # not a plain tensor zip: torch's weights-only loader decides, and explains
            t = load_pth_lazy(path)
            hit = (dtype_name(t.dtype), tuple(int(d) for d in t.shape), None)
        if len(_HEADER_CACHE) >= _CACHE_MAX:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[key] = hit
    return hit


def npy_header(path: str) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape of a `.npy` file, from its header only."""
    try:
        with open(path, "rb") as fh:
            shape, _fortran, dtype = npy_header_of(fh)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise DumpError(path, f"not a readable .npy file ({str(exc)[:120]})") from None
    if dtype.hasobject:
        raise DumpError(path, "refused: .npy holds Python objects (pickle)")
    return dtype_name(dtype), check_shape(path, tuple(int(d) for d in shape))


def content_key(path: str) -> tuple[str, tuple[int, ...], bytes, Payload | None]:
    """dtype name, shape, a digest of one tensor file's values (for data-flow matching; no torch for plain
    `.pth` files) and, as `pth_header` says it, where the values lie.

    The digest covers dtype, shape and, above `SMALL_HASH_BYTES`, `_SAMPLES` evenly spaced runs of
    `_SAMPLE_BYTES` of the logical (row-major) values, so a view and its contiguous copy hash the same and a
    large tensor costs a few page reads, not a pass over its bytes. Raises `DumpError` when unreadable.
    """
    from workbench.formats.arrays import NUMPY_STORAGE, plain_array, read_pth_array

    try:
        st = os.stat(path)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    size = st.st_size
    found = plain_tensor(path, size) if size > 0 else None
    payload = None if found is None else payload_of(found, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    if (
        found is not None
        and payload is not None
        and found.whole_file is None
        and found.dtype in NUMPY_STORAGE
        and found.span * found.itemsize > SMALL_HASH_BYTES
    ):
        # the same bytes as below, read with one system call per run instead of faulting pages of a map
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{found.dtype}|{found.size}|".encode())
        _hash_runs(h, path, payload.offset, found.span, found.itemsize)
        return found.dtype, found.size, h.digest(), payload
    raw = (plain_array(path, found) if found is not None else None) or read_pth_array(path, size)
    arr = raw.array
    shape = tuple(int(d) for d in arr.shape)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{raw.dtype}|{shape}|".encode())
    try:
        _hash_values(h, arr)
    except (OSError, ValueError) as exc:  # a mapped page that cannot be read (file truncated meanwhile)
        raise DumpError(path, f"payload unreadable ({str(exc).splitlines()[0][:120]})") from None
    return raw.dtype, shape, h.digest(), payload


def _hash_runs(h: Any, path: str, start: int, n: int, itemsize: int) -> None:
    """`_hash_values`'s sampled runs of a contiguous payload of `n` elements at byte `start` of `path`."""
    run = max(1, _SAMPLE_BYTES // itemsize) * itemsize
    step = (n - run // itemsize) // (_SAMPLES - 1) * itemsize
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        for i in range(_SAMPLES):
            chunk = os.pread(fd, run, start + i * step)
            if len(chunk) != run:
                raise DumpError(path, "payload unreadable (file shorter than its header says)")
            h.update(chunk)
    except OSError as exc:
        raise DumpError(path, f"payload unreadable ({exc.strerror or exc})") from None
    finally:
        os.close(fd)


def _hash_values(h: Any, arr: np.ndarray) -> None:
    n = int(arr.size)
    if n == 0:
        return
    itemsize = arr.dtype.itemsize
    if arr.flags.c_contiguous:
        flat = arr.reshape(-1).view(np.uint8)
        if flat.nbytes <= SMALL_HASH_BYTES:
            h.update(flat.data)
            return
        run = max(1, _SAMPLE_BYTES // itemsize) * itemsize
        step = (flat.nbytes // itemsize - run // itemsize) // (_SAMPLES - 1) * itemsize
        for i in range(_SAMPLES):
            h.update(flat[i * step : i * step + run].data)
        return
    if n * itemsize <= SMALL_HASH_BYTES:
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
        return
    run = max(1, _SAMPLE_BYTES // itemsize)
    step = (n - run) // (_SAMPLES - 1)
    for i in range(_SAMPLES):
        idx = np.unravel_index(np.arange(i * step, i * step + run), arr.shape)
        h.update(np.ascontiguousarray(arr[idx]).view(np.uint8).data)
