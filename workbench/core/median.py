"""The median of a list of floats, without `statistics` (its import, with `fractions` and `decimal`, is ~0.03 s of
a compare's start, and its checks ran for every op at every token)."""

from __future__ import annotations

from collections.abc import Iterable


def median(values: Iterable[float]) -> float:
    """`statistics.median` of a non-empty collection of floats."""
    s = sorted(values)
    if not s:
        raise ValueError("median of no values")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
