"""Statistics metrics of a pair: compares max, min, mean and L2 norm when a side kept only those.

Definitions (and why `stat_rel_euclid_bound` can decide a verdict) are in `workbench.core.metrics` next
to `STAT_METRICS`; users read them in docs/metrics.md. Plain floats only: no numpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from workbench.core.metrics import STAT_BOUND, STAT_KEYS

FP32_EPS = 1.1920928955078125e-07  # msit divides by max(|golden|, this)
# the summaries our kernel writes call the L2 norm `norm`
_FIELD = {"max": "max", "min": "min", "mean": "mean", "l2norm": "norm"}

StatValues = Mapping[str, float | None]


def _num(v: object) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return f


def stat_metrics(golden: StatValues, test: StatValues, numel: int | None) -> dict[str, float | None]:
    """Every `STAT_METRICS` value of one pair from both sides' statistics (keys max/min/mean/norm).

    A statistic missing on either side leaves its two values None; a NaN/Inf statistic the other side lacks gives
    NaN, which fails a verdict (as msprobe marks them); the same NaN or Inf on both sides is no difference. A side
    may carry `step`, the resolution its statistics were printed with (`STAT_STEP_KEY`): the bound then takes off
    what the printing may have added to each difference.
    """
    out: dict[str, float | None] = {}
    slack = (_num(golden.get("step")) or 0.0) / 2 + (_num(test.get("step")) or 0.0) / 2
    diffs: dict[str, float | None] = {}
    for key in STAT_KEYS:
        g, t = _num(golden.get(_FIELD[key])), _num(test.get(_FIELD[key]))
        if g is None or t is None:
            out[f"{key}_stat_absolute_error"] = out[f"{key}_stat_relative_error"] = diffs[key] = None
            continue
        if math.isfinite(t) and math.isfinite(g):
            d = abs(t - g)
        else:  # NaN on both sides (the golden run overflowed too) or the same Inf is no difference
            d = 0.0 if t == g or (math.isnan(t) and math.isnan(g)) else math.nan
        diffs[key] = d
        out[f"{key}_stat_absolute_error"] = d
        out[f"{key}_stat_relative_error"] = d / max(abs(g), FP32_EPS) if math.isfinite(g) else d
    g_norm = _num(golden.get("norm"))
    if slack:
        diffs = {k: (max(0.0, d - slack) if d is not None and not math.isnan(d) else d) for k, d in diffs.items()}
        g_norm = g_norm + (_num(golden.get("step")) or 0.0) / 2 if g_norm is not None else None
    out[STAT_BOUND] = _rel_euclid_bound(diffs, g_norm, numel)
    return out


def _rel_euclid_bound(diffs: dict[str, float | None], g_norm: float | None, numel: int | None) -> float | None:
    """max(|d norm|, |d mean| * sqrt(n), |d max|, |d min|) / ||golden||: never above the relative euclidean
    distance, since each term is at most ||test - golden||_2 (triangle and Cauchy-Schwarz inequalities)."""
    terms = [diffs.get("l2norm"), diffs.get("max"), diffs.get("min")]
    mean = diffs.get("mean")
    if mean is not None and numel:
        terms.append(mean * math.sqrt(numel))
    known = [x for x in terms if x is not None]
    if not known:
        return None
    if all(x == 0.0 for x in known):  # equal statistics (NaN alike on both sides too) bound nothing
        return 0.0
    if g_norm is None:  # no norm recorded (msprobe leaves it out for integer tensors)
        return None
    if any(math.isnan(x) for x in known) or not math.isfinite(g_norm):
        return math.nan
    top = max(known)
    if g_norm == 0.0:
        return 0.0 if top == 0.0 else math.inf
    return top / g_norm
