"""How a long operation reports where it stands, and how it says it was cancelled (no dependency)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Progress:
    """Where a long operation stands: `done` of `total` items in `stage`, at `rate` items/s."""

    stage: str
    done: int
    total: int
    rate: float = 0.0
    message: str = ""


ProgressFn = Callable[[Progress], None]


class CompareCancelled(Exception):
    """The user cancelled; everything committed so far is kept and consistent."""
