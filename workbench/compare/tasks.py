"""The units of work a compare worker receives: plain data, importable without torch."""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_FIELDS = ("numel", "min", "max", "mean", "std", "norm", "nan_count", "inf_count")


@dataclass(frozen=True, slots=True)
class PairTask:
    pair_id: int
    golden_path: str | None
    test_path: str | None
    test_dtype: str | None
    golden_tensor_id: int
    test_tensor_id: int
    transform: str | None = None


@dataclass(frozen=True, slots=True)
class StatsTask:
    run_id: int
    tensor_id: int
    path: str
