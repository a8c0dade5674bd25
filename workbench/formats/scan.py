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

from workbench.formats.model import DumpError, check_shape, dtype_name
from workbench.formats.pth_header import read_pth_header

if TYPE_CHECKING:  # torch is imported only when a payload is read
    import torch

MAX_JSON_BYTES = 256 * 1024 * 1024
# tensors above this size are hashed on evenly spaced samples (data-flow matching only needs identity)
FULL_HASH_BYTES = 4 * 1024 * 1024
_SAMPLES = 64
_SAMPLE_BYTES = 16 * 1024


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
        size = os.path.getsize(path)
        if size > MAX_JSON_BYTES:
            raise DumpError(path, f"JSON file too large ({size} bytes)")
        if os.path.islink(path):
            check_link(str(path))
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpError(path, f"not valid JSON ({str(exc)[:120]})") from None
    except RecursionError:
        raise DumpError(path, "JSON nested too deeply to read") from None


_HEADER_CACHE: dict[tuple[int, int, int, int], tuple[str, tuple[int, ...]]] = {}
_CACHE_MAX = 16384


def load_pth_lazy(path: str) -> torch.Tensor:
    """One tensor file, memory-mapped: the payload stays on disk until touched (see `tensor_io`)."""
    from workbench.formats.tensor_io import load_pth

    return load_pth(path)


def pth_header(path: str) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape of a `.pth` tensor file, without torch when the file is a plain saved tensor.

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
        hit = read_pth_header(path, st.st_size)
        if hit is None:  # not a plain tensor zip: torch's weights-only loader decides, and explains
            t = load_pth_lazy(path)
            hit = (dtype_name(t.dtype), tuple(int(d) for d in t.shape))
        if len(_HEADER_CACHE) >= _CACHE_MAX:
            _HEADER_CACHE.clear()
        _HEADER_CACHE[key] = hit
    return hit


def npy_header(path: str) -> tuple[str, tuple[int, ...]]:
    """dtype name and shape of a `.npy` file, from its header only."""
    try:
        with open(path, "rb") as fh:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _fortran, dtype = np.lib.format.read_array_header_1_0(fh)
            else:
                shape, _fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise DumpError(path, f"not a readable .npy file ({str(exc)[:120]})") from None
    if dtype.hasobject:
        raise DumpError(path, "refused: .npy holds Python objects (pickle)")
    return dtype_name(dtype), check_shape(path, tuple(int(d) for d in shape))


def content_key(t: Any) -> bytes:
    """A digest of a tensor's dtype, shape and bytes (sampled above `FULL_HASH_BYTES`), for data-flow matching.

    `t` is a `RawTensor`, a numpy array or a torch tensor; the same content gives the same key either way."""
    from workbench.formats.arrays import as_raw

    raw = as_raw(t)
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{raw.dtype}|{raw.shape}|".encode())
    if raw.numel == 0:
        return h.digest()
    flat = np.ascontiguousarray(raw.array).reshape(-1).view(np.uint8)
    n = flat.shape[0]
    if n <= FULL_HASH_BYTES:
        h.update(flat.data)
    else:
        step = (n - _SAMPLE_BYTES) // (_SAMPLES - 1)
        for i in range(_SAMPLES):
            h.update(flat[i * step : i * step + _SAMPLE_BYTES].data)
    return h.digest()
