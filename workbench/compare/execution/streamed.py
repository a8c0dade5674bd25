"""A pair read from its files a block at a time, each block passed while it is still in the CPU's cache.

Reading a whole payload into a buffer and then passing it moves every byte through memory three times (the copy's
read, its write, the pass's read) once a tensor outgrows the cache; a block of `BLOCK_ELEMENTS` per side is copied
into a small buffer that stays in the core's cache and is passed from there: the pass (`metrics.BlockPass`) gives the
same numbers to the last bit, for less CPU (docs/performance.md, issue 23). The pair's twins (files that likely hold
the same bytes: `tasks.Twin`) are read block by block beside it and compared byte for byte, from the cache too.

Only the common pair is streamed: both payloads at a known place (`Payload`, from the dump's reader or the file's
header: the files unchanged since), of a dtype the kernels read in place, one element count, no transform but a
layout view (`layout_only`), at most two `PART_BYTES` (a larger pair is passed in parts on threads). Anything else,
and any pair whose files fail to read on the way, is left to the whole-tensor path (`worker.run_pair`), which says
what went wrong.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from workbench.compare.execution.tasks import PairTask, Twin
from workbench.compare.judging.metrics import CHUNK, PART_BYTES, BlockPass, PairMetrics, kernel_dtype
from workbench.compare.pairing.layout import LAYOUT_PREFIX, layout_rule
from workbench.formats.arrays import NUMPY_STORAGE, RawTensor, open_unchanged, read_array, read_payload
from workbench.formats.model import DumpError, Payload
from workbench.formats.staging import Staging

BLOCK_ELEMENTS = 8 * CHUNK  # elements of each side read at a time: a float32 block is 1 MiB
_BUFFERS = threading.local()
_EQUAL_CHUNK = 1 << 22  # bytes compared at a time where there is no memcmp: no temporary the size of a tensor


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    """The C library's `memcmp` (it compares at memory speed, numpy's `==` makes a temporary): None where the
    process has no such symbol."""
    try:
        fn = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
    fn.restype = ctypes.c_int
    return fn


MEMCMP = _libc_memcmp()


def equal_arrays(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two C-contiguous arrays hold the same bytes (NaNs compared by their bits)."""
    if x.nbytes != y.nbytes:
        return False
    if x.nbytes == 0:
        return True
    if MEMCMP is not None:
        return MEMCMP(x.ctypes.data, y.ctypes.data, x.nbytes) == 0
    xb, yb = x.reshape(-1).view(np.uint8), y.reshape(-1).view(np.uint8)
    whole = xb.size // 8 * 8  # compared as 64-bit words (3x faster than bytes), the last few bytes as bytes
    return all(
        np.array_equal(
            xb[i : min(i + _EQUAL_CHUNK, whole)].view(np.uint64), yb[i : min(i + _EQUAL_CHUNK, whole)].view(np.uint64)
        )
        for i in range(0, whole, _EQUAL_CHUNK)
    ) and np.array_equal(xb[whole:], yb[whole:])


class _Side:
    """One payload's file, open and checked: still the file its reader described, of a dtype the kernels read in
    place (OSError otherwise)."""

    def __init__(self, path: str, at: Payload) -> None:
        dtype = _stream_dtype(at)
        fd = None if dtype is None else open_unchanged(path, at, math.prod(at.shape) * dtype.itemsize)
        if dtype is None or fd is None:
            raise OSError(f"{path}: changed since the dump was read, or not a payload the kernels read in place")
        self.path, self.at, self.dtype, self.fd = path, at, dtype, fd

    def read(self, buffer: Staging, start: int, count: int) -> np.ndarray:
        """Elements start .. start + count - 1, read into `buffer` (of at least a block); `DumpError` when the file
        ends before them or cannot be read."""
        size = self.dtype.itemsize
        view = buffer.fill(self.path, self.at.offset + start * size, count * size, self.fd)
        assert view is not None  # a block fits the buffer
        return np.frombuffer(view, self.dtype)

    def close(self) -> None:
        os.close(self.fd)


def _stream_dtype(at: Payload) -> np.dtype[Any] | None:
    """The kernels' array dtype for this payload when its stored bytes are that array's as they lie (native order)."""
    storage = NUMPY_STORAGE.get(at.dtype)
    kernel = kernel_dtype(at.dtype)
    if storage is None or kernel is None or not np.dtype(storage).isnative:
        return None
    return kernel


def streamable(task: PairTask) -> bool:
    """Whether `stream_pair` takes this pair (the files are checked when it reads them)."""
    g, t = task.golden_at, task.test_at
    if not layout_only(task.transform) or g is None or t is None or task.golden_path is None or task.test_path is None:
        return False
    if task.golden_stats is not None or task.test_stats is not None:
        return False
    g_dt, t_dt = _stream_dtype(g), _stream_dtype(t)
    if g_dt is None or t_dt is None:
        return False
    numel = math.prod(g.shape)
    if numel == 0 or numel != math.prod(t.shape) or numel * (g_dt.itemsize + t_dt.itemsize) > 2 * PART_BYTES:
        return False
    return g.shape == t.shape or layout_rule(list(g.shape), list(t.shape)) is not None


def layout_only(transform: str | None) -> bool:
    """Whether a pair's transform (`worker.apply_transform`) at most views one side in the other's shape: the
    elements compared are then every element of both files, in their order."""
    return not transform or all(step.strip().startswith(LAYOUT_PREFIX) for step in transform.split(";") if step.strip())


def stream_pair(task: PairTask) -> tuple[PairMetrics, list[bool]] | None:
    """The pair's metrics, read and passed block by block, and for each of its twins whether its two files hold the
    pair's bytes; None where the pair is not `streamable` or its files could not be read through (the whole-tensor
    path then reads it and says why)."""
    if not streamable(task):
        return None
    assert task.golden_path is not None and task.test_path is not None
    assert task.golden_at is not None and task.test_at is not None
    with contextlib.ExitStack() as opened:
        try:
            golden = _opened(opened, task.golden_path, task.golden_at)
            test = _opened(opened, task.test_path, task.test_at)
        except OSError:
            return None
        twins = [_twin_sides(opened, Twin(*tw), task) for tw in task.twins]
        same = [tw is not None for tw in twins]
        numel = math.prod(task.golden_at.shape)
        block = BlockPass(task.test_dtype or task.test_at.dtype)
        buffers = _buffers()
        try:
            for start in range(0, numel, BLOCK_ELEMENTS):
                count = min(BLOCK_ELEMENTS, numel - start)
                g = golden.read(buffers[0], start, count)
                m = test.read(buffers[1], start, count)
                block.add(g, m)
                for i, sides in enumerate(twins):
                    if sides is None or not same[i]:
                        continue
                    try:
                        same[i] = equal_arrays(sides[0].read(buffers[2], start, count), g) and equal_arrays(
                            sides[1].read(buffers[3], start, count), m
                        )
                    except DumpError:
                        same[i] = False  # computed on its own, where the read error is reported
        except DumpError:
            return None
        return block.metrics(lambda: _whole(task)), same


def _opened(stack: contextlib.ExitStack, path: str, at: Payload) -> _Side:
    side = _Side(path, at)
    stack.callback(side.close)
    return side


def _twin_sides(stack: contextlib.ExitStack, twin: Twin, task: PairTask) -> tuple[_Side, _Side] | None:
    """A twin's two files, open, when they can hold the pair's bytes (same dtypes and shapes); else None."""
    g_at, t_at = twin.golden_at, twin.test_at
    if g_at is None or t_at is None or task.golden_at is None or task.test_at is None:
        return None
    if (g_at.dtype, g_at.shape, t_at.dtype, t_at.shape) != (
        task.golden_at.dtype,
        task.golden_at.shape,
        task.test_at.dtype,
        task.test_at.shape,
    ):
        return None
    try:
        return _opened(stack, twin.golden_path, g_at), _opened(stack, twin.test_path, t_at)
    except OSError:
        return None


def _buffers() -> list[Staging]:
    """This thread's four block buffers (golden, test, a twin's golden and test), each allocated at its first read."""
    found: list[Staging] | None = getattr(_BUFFERS, "blocks", None)
    if found is None:
        found = _BUFFERS.blocks = [Staging(cap=BLOCK_ELEMENTS * 4) for _ in range(4)]
    return found


def _whole(task: PairTask) -> tuple[RawTensor, RawTensor]:
    """Both sides in full (mapped), for the KL divergence's float64 two-pass form."""
    return _read_whole(task.golden_path, task.golden_at), _read_whole(task.test_path, task.test_at)


def _read_whole(path: str | None, at: Payload | None) -> RawTensor:
    assert path is not None
    found = read_payload(path, at) if at is not None else None
    return found if found is not None else read_array(path)


def release_buffers() -> None:
    """Give this thread's block buffers back (a process that compared in process and lives on: the app)."""
    with contextlib.suppress(AttributeError):
        del _BUFFERS.blocks
