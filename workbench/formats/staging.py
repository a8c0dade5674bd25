"""A reusable buffer a tensor file's payload is read into, instead of being memory-mapped.

Mapping a file costs a page fault per few pages and tearing the map down again; reading its payload with one system
call into memory that is reused pair after pair costs a copy, and the copy stays in the CPU's caches for the metric
pass that follows: on this project's msit-made dumps a compare worker needs 7-15% less CPU for the same bytes
(docs/performance.md, issue 23). Payloads above the buffer's cap are still mapped, so a process holds at most
`cap` bytes per buffer whatever the dump.

A view handed out by `fill` is valid until the next `fill` of the same buffer: the caller keeps one buffer per
tensor it holds at once.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from workbench.formats.model import DumpError

STAGING_BYTES = 32 * 1024 * 1024  # the largest payload one buffer takes; larger ones are mapped
_GROW_STEP = 1 << 20  # a buffer grows in whole MiB: a dump's sizes vary a little around a few sizes


class Staging:
    """One reusable read buffer of at most `cap` bytes (allocated at its first use, grown as payloads need)."""

    def __init__(self, cap: int = STAGING_BYTES) -> None:
        self.cap = cap
        self._buf: bytearray | None = None

    def values(
        self, path: str, offset: int, dtype: np.dtype[Any], shape: tuple[int, ...], fd: int | None = None
    ) -> np.ndarray | None:
        """The C-ordered `shape` x `dtype` values at byte `offset` of `path` (read from `fd` when the caller holds the
        file open), read into this buffer; None when they are empty or exceed the cap (the caller maps them)."""
        view = self.fill(path, offset, dtype.itemsize * math.prod(shape), fd)
        return None if view is None else np.frombuffer(view, dtype).reshape(shape)

    def fill(self, path: str, offset: int, nbytes: int, fd: int | None = None) -> memoryview | None:
        """`nbytes` of `path` from byte `offset` (read from `fd` when given, the file open as `path`), read into
        this buffer; None when they are none or exceed the cap. `DumpError` when the file ends before them or cannot
        be read."""
        if nbytes > self.cap or nbytes <= 0:
            return None
        if fd is None:
            try:
                own = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
            try:
                return self._read(own, path, offset, nbytes)
            finally:
                os.close(own)
        return self._read(fd, path, offset, nbytes)

    def _read(self, fd: int, path: str, offset: int, nbytes: int) -> memoryview:
        if self._buf is None or len(self._buf) < nbytes:
            # a new buffer, never a resize: arrays over the old one (a caller's last tensor) keep their memory
            self._buf = bytearray(min(self.cap, -(-nbytes // _GROW_STEP) * _GROW_STEP))
        view = memoryview(self._buf)[:nbytes]
        try:
            done = 0
            while done < nbytes:
                got = os.preadv(fd, [view[done:]], offset + done)
                if got <= 0:
                    raise DumpError(path, "payload unreadable (file shorter than its header says)")
                done += got
        except OSError as exc:
            raise DumpError(path, f"payload unreadable ({exc.strerror or exc})") from None
        return view

    def release(self) -> None:
        """Give the buffer's memory back (arrays still viewing it keep it until they go)."""
        self._buf = None
