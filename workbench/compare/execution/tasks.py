"""The units of work a compare worker receives, and the plain helpers that plan them: no torch, no DuckDB."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from workbench.core.pickling import by_fields
from workbench.formats.model import Payload

BATCH_BYTES = 48 * 1024 * 1024  # tasks go to a worker in batches of about this much tensor data
BATCH_MAX_TASKS = 64
_ITEMSIZE = {
    "float64": 8,
    "int64": 8,
    "float32": 4,
    "int32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


class Twin(NamedTuple):
    """A pair whose files are likely byte-equal to its task's (equal content digests, or one golden file): the
    worker checks the bytes and reuses the task's result, or computes the twin when they differ."""

    pair_id: int
    golden_path: str
    test_path: str
    golden_at: Payload | None = None
    test_at: Payload | None = None


@by_fields
@dataclass(frozen=True, slots=True)
class PairTask:
    pair_id: int
    golden_path: str | None
    test_path: str | None
    test_dtype: str | None
    golden_tensor_id: int
    test_tensor_id: int
    transform: str | None = None
    # a side without tensor data (statistics-only dump): its recorded max/min/mean/norm, compared on statistics
    golden_stats: dict[str, float | None] | None = None
    test_stats: dict[str, float | None] | None = None
    numel: int | None = None  # golden element count (from the shape) when the golden side has no data
    twins: tuple[Twin, ...] = ()
    # where each side's values lie as the dump's reader found them: the worker reads them there when the file is
    # unchanged, without parsing its header again
    golden_at: Payload | None = None
    test_at: Payload | None = None


@by_fields
@dataclass(frozen=True, slots=True)
class StatsTask:
    run_id: int
    tensor_id: int
    path: str


Task = PairTask | StatsTask
T = TypeVar("T")


def tensor_bytes(numel: Any, dtype: Any) -> int:
    """Bytes of a tensor of `numel` elements of `dtype` (None/NaN numel counts as 0)."""
    n = 0 if numel is None or (isinstance(numel, float) and math.isnan(numel)) else int(numel)
    return n * _ITEMSIZE.get(str(dtype), 4)


def batches(tasks: Sequence[T], sizes: Sequence[int]) -> Iterator[list[T]]:
    """Consecutive tasks grouped up to `BATCH_BYTES` or `BATCH_MAX_TASKS` (fewer round trips to the pool)."""
    batch: list[T] = []
    acc = 0
    for task, size in zip(tasks, sizes):
        batch.append(task)
        acc += size
        if acc >= BATCH_BYTES or len(batch) >= BATCH_MAX_TASKS:
            yield batch
            batch, acc = [], 0
    if batch:
        yield batch


def file_identity(path: str | None) -> tuple[int, int] | None:
    """(device, inode) of a file: two names for one file (a hard link) read the same bytes."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)
