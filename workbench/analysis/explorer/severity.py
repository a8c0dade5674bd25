"""How the app colours a value: the colourings it offers and the severity of a value against its bound.

Derived from `core.metrics` (names, labels, directions, roll-up columns) and the comparison's own
thresholds (`compare.judging.thresholds.Thresholds`, the bounds stored with the comparison): nothing here
spells a metric or a bound of its own. Severity is 0 for no error, 1 at the pass/fail bound and
above 1 beyond it, whatever the metric's direction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.compare.judging.thresholds import Thresholds
from workbench.core.metrics import BY_NAME, METRICS

VERDICT = "verdict"  # the worst severity over the comparison's verdict metrics
ADDED_ERROR = "added_error"  # a node's output rel. euclidean distance minus its inputs' (node_results)
ADDED_ERROR_METRIC = "relative_euclidean_distance"  # added error is measured, and bounded, in this metric


@dataclass(frozen=True, slots=True)
class Colouring:
    """One way to colour the heatmap and the trees: a `node_results` column and its direction."""

    name: str
    label: str
    column: str | None  # None for VERDICT (computed from the verdict metrics' columns)
    higher_is_better: bool


def _colourings() -> dict[str, Colouring]:
    out = {VERDICT: Colouring(VERDICT, "verdict", None, False)}
    for m in METRICS:
        if m.rollup is not None:
            out[m.name] = Colouring(m.name, m.label, m.rollup, m.higher_is_better)
    out[ADDED_ERROR] = Colouring(ADDED_ERROR, "added error", ADDED_ERROR, False)
    return out


COLOURINGS: dict[str, Colouring] = _colourings()
# what `m` cycles through in the heatmap (added error colours the trees only, key `a`)
HEATMAP_COLOURINGS: tuple[str, ...] = tuple(c for c in COLOURINGS if c != ADDED_ERROR)


def colouring(name: str) -> Colouring:
    """A colouring by name; KeyError names the known ones."""
    try:
        return COLOURINGS[name]
    except KeyError:
        raise KeyError(f"unknown colouring {name!r}; known: {', '.join(COLOURINGS)}") from None


@dataclass(frozen=True, slots=True)
class Scale:
    """Where a colouring's severity 1 lies, and whether crossing it fails a pair."""

    bound: float | None  # None: no bound in the thresholds (shaded relative to the largest value shown)
    decides: bool  # a verdict metric (or the verdict itself): beyond the bound fails


def scale_for(thresholds: Thresholds, name: str, dtype: str | None) -> Scale:
    """The bound of a colouring for a test dtype, from the comparison's thresholds."""
    verdict = thresholds.verdict_metrics(dtype)
    if name == VERDICT:
        return Scale(1.0, True)
    metric = ADDED_ERROR_METRIC if name == ADDED_ERROR else name
    lo, hi = thresholds.bounds_for(metric, dtype)
    bound = lo if BY_NAME[metric].higher_is_better else hi
    return Scale(bound, metric in verdict)


def verdict_columns(thresholds: Thresholds, dtype: str | None) -> list[tuple[str, str, float]]:
    """(metric, node_results column, bound) of each verdict metric the roll-ups can colour by."""
    out = []
    for name in thresholds.verdict_metrics(dtype):
        spec = BY_NAME.get(name)
        if spec is None or spec.rollup is None:
            continue
        scale = scale_for(thresholds, name, dtype)
        if scale.bound is not None:
            out.append((name, spec.rollup, scale.bound))
    return out


def _higher_is_better(name: str) -> bool:
    c = COLOURINGS.get(name)
    if c is not None:
        return c.higher_is_better
    spec = BY_NAME.get(name)
    return spec is not None and spec.higher_is_better


# severity bins of the heatmap palette (the app's and the HTML report's): the bound is at 1.0, the four
# first levels pass, the last three fail
LEVEL_EDGES = (0.25, 0.5, 0.75, 1.0, 2.0, 5.0)
HEAT_LEVELS = len(LEVEL_EDGES) + 1
PASS_LEVELS = 4  # levels 0-3 lie within the bound


def level_of(sev: float) -> int:
    """Palette level (0..HEAT_LEVELS-1) of a severity; -1 for no data."""
    if math.isnan(sev):
        return -1
    for i, edge in enumerate(LEVEL_EDGES):
        if sev < edge:
            return i
    return HEAT_LEVELS - 1


def severity(value: float | None, metric: str, bound: float) -> float:
    """Error severity of a value: 0 perfect, 1 at the pass/fail bound, >1 failing; NaN stays NaN."""
    if value is None or math.isnan(value):
        return math.nan
    if _higher_is_better(metric):
        gap = max(1.0 - bound, 1e-12)
        return max(0.0, (1.0 - value) / gap)
    if bound <= 0:
        return 0.0 if value <= 0 else math.inf
    return max(0.0, value / bound)


def severity_array(values: np.ndarray, metric: str, bound: float) -> np.ndarray:
    """`severity` over an array (NaN stays NaN)."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if _higher_is_better(metric):
            out = (1.0 - v) / max(1.0 - bound, 1e-12)
        elif bound <= 0:
            out = np.where(v <= 0, 0.0, np.inf)
            out[np.isnan(v)] = np.nan
        else:
            out = v / bound
    return np.where(np.isnan(out), np.nan, np.maximum(out, 0.0))


def relative_bound(values: np.ndarray, metric: str) -> float:
    """A stand-in bound for a metric with none: the worst finite value shown (so shades are relative)."""
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)]
    if not finite.size:
        return 1.0
    if _higher_is_better(metric):
        return float(finite.min())
    return float(finite.max()) or 1.0


def value_at(sev: float, metric: str, bound: float) -> float:
    """The metric value at a severity (for the legend)."""
    if _higher_is_better(metric):
        return 1 - sev * (1 - bound)
    return sev * bound
