"""The units of work a compare worker receives, and the plain helpers that plan them: no torch, no pandas."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

SUMMARY_FIELDS = ("numel", "min", "max", "mean", "std", "norm", "nan_count", "inf_count")
BATCH_BYTES = 48 * 1024 * 1024  # tasks go to a worker in batches of about this much tensor data
BATCH_MAX_TASKS = 64
MAX_EXPANDED = 1_000_000  # tokens a --tokens text may name when the dumps' own tokens are not known
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
    # (pair id, golden path, test path) of pairs whose files are likely byte-equal to this pair's (equal content
    # digests): the worker checks the bytes and reuses this pair's result, or computes the twin when they differ
    twins: tuple[tuple[int, str, str], ...] = ()


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


def token_text(tokens: Iterable[int]) -> str:
    """[0, 1, 2, 3, 7] -> '0-3,7'."""
    out: list[list[int]] = []
    for t in sorted(set(tokens)):
        if out and t == out[-1][1] + 1:
            out[-1][1] = t
        else:
            out.append([t, t])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


@dataclass(frozen=True, slots=True)
class TokenRanges:
    """A `--tokens` selection as ranges: bound to the tokens a dump holds (`among`), never expanded."""

    ranges: tuple[tuple[int, int], ...]

    def __contains__(self, token: object) -> bool:
        return isinstance(token, int) and any(a <= token <= b for a, b in self.ranges)

    def among(self, *present: Iterable[int]) -> set[int]:
        """The selected tokens among those present (`0-1000000` on a 3-token dump: at most 3)."""
        return {t for tokens in present for t in tokens if t in self}


def token_ranges(text: str | None) -> TokenRanges | None:
    """`0-3,7` -> ranges (0, 3), (7, 7); None or empty -> None (all tokens). Checks the syntax; expands nothing."""
    if not text:
        return None
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        lo, hi = lo.strip(), hi.strip()
        ok = lo.isascii() and lo.isdigit() and (not sep or (hi.isascii() and hi.isdigit()))
        if not ok or len(lo) > 18 or len(hi) > 18:
            raise ValueError(f"--tokens {text!r}: expected numbers and ranges like 0-3,7")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise ValueError(f"--tokens {text!r}: range {part} goes backwards")
        out.append((a, b))
    return TokenRanges(tuple(out))


def parse_tokens(text: str | None, present: Iterable[int] | None = None) -> set[int] | None:
    """`0-3,7` -> {0, 1, 2, 3, 7}; None or empty -> None (all tokens).

    With `present` (the tokens the dumps hold) the result is the selected tokens among them, whatever the
    ranges span (`0-1000000` on a 3-token dump costs nothing); without it a range may span at most
    `MAX_EXPANDED` tokens."""
    sel = token_ranges(text)
    if sel is None:
        return None
    if present is not None:
        return sel.among(present)
    if sum(b - a + 1 for a, b in sel.ranges) > MAX_EXPANDED:
        raise ValueError(f"--tokens {text!r}: more than {MAX_EXPANDED} tokens")
    out: set[int] = set()
    for a, b in sel.ranges:
        out.update(range(a, b + 1))
    return out
