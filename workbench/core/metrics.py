"""The one table of comparison metrics: name, label, better direction, node roll-up, whether it can decide.

Everything that names a metric derives from `METRICS`: the catalog schema's columns, the msit CSV
columns, the judge, the `node_results` roll-ups, the heatmap and the detail pane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["higher", "lower"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric of a golden/test tensor pair."""

    name: str  # column name in `metrics` (msit's name where msit has the metric)
    label: str  # short label for tables and legends
    better: Direction  # "higher": fails below its bound (cosine, SNR); "lower": fails above it
    msit: bool  # one of the seven metrics of msit's report
    rollup: str | None = None  # `node_results` column holding its worst value over a node's outputs
    can_decide: bool = False  # may be named in a thresholds file's `verdict` list

    @property
    def higher_is_better(self) -> bool:
        return self.better == "higher"

    def worst(self, a: float, b: float) -> float:
        """The worse of two values of this metric."""
        return min(a, b) if self.higher_is_better else max(a, b)


# msit's seven metrics in msit's column order, then ours (docs/metrics.md).
METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("cosine_similarity", "cosine", "higher", True, "min_cosine", True),
    MetricSpec("max_relative_error", "max rel err", "lower", True, "max_rel_err", True),
    MetricSpec("mean_relative_error", "mean rel err", "lower", True, "mean_rel_err", True),
    MetricSpec("max_absolute_error", "max abs err", "lower", True, "max_abs_err", True),
    MetricSpec("mean_absolute_error", "mean abs err", "lower", True, None, True),
    MetricSpec("kl_divergence", "KL", "lower", True, "max_kl", True),
    MetricSpec("relative_euclidean_distance", "rel euclid", "lower", True, "max_rel_euclid", True),
    MetricSpec("max_ulp_error", "max ULP", "lower", False, None, True),
    MetricSpec("snr_db", "SNR dB", "higher", False, None, True),
    MetricSpec("one_thousandth_err_ratio", "1‰ err ratio", "higher", False, None, True),
    MetricSpec("five_thousandths_err_ratio", "5‰ err ratio", "higher", False, None, True),
)
MSIT_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS if m.msit)
ALL_METRICS: tuple[str, ...] = tuple(m.name for m in METRICS)
# The failed-metric name of a NaN/Inf mismatch (test side has NaN/Inf the golden side lacks).
NAN_INF = "nan_inf"


def spec(name: str) -> MetricSpec:
    """The spec of a metric by name; KeyError names the known ones."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; known: {', '.join(BY_NAME)}") from None


# Statistics metrics: what can be compared when one side (or both) kept only max/min/mean/L2 norm
# (statistics-only dumps: msit `statistics.csv`, msprobe summary mode, ATB `.bin` statistics headers).
# For each statistic s: `{s}_stat_absolute_error` = |s(test) - s(golden)| and `{s}_stat_relative_error` =
# that / max(|s(golden)|, float32 eps) (msit's `compare_statistics` names and formula; msprobe's
# `{S} diff` / `{S}RelativeErr` are the signed difference and the same ratio in percent). They are computed
# for every pair (from the tensors when both sides have them). `stat_rel_euclid_bound` is
# max(|d l2norm|, |d mean| * sqrt(numel), |d max|, |d min|) / l2norm(golden), a LOWER BOUND of the relative
# euclidean distance (each term is at most ||test - golden||_2): a statistics-only pair fails when the bound
# already exceeds the relative euclidean distance's bound for its dtype, so every such failure is certain.
STAT_KEYS: tuple[str, ...] = ("max", "min", "mean", "l2norm")
# the statistics of one tensor a worker computes and the catalog stores (`tensors` columns)
SUMMARY_FIELDS = ("numel", "min", "max", "mean", "std", "norm", "nan_count", "inf_count")
STAT_BOUND = "stat_rel_euclid_bound"
STAT_METRICS: tuple[MetricSpec, ...] = (
    *(
        MetricSpec(f"{k}_stat_{kind}_error", f"{k} {label}", "lower", False)
        for k in STAT_KEYS
        for kind, label in (("absolute", "abs diff"), ("relative", "rel diff"))
    ),
    MetricSpec(STAT_BOUND, "rel euclid >=", "lower", False, None, False),
)
STAT_METRIC_NAMES: tuple[str, ...] = tuple(m.name for m in STAT_METRICS)
# The relative euclidean distance: the metric an error's size is read from (`STAT_BOUND` is judged by its bound, an
# output's carried-in error is compared with its inputs' in it: `compare.judging.judge.judge_carried`).
REL_EUCLID = "relative_euclidean_distance"
STAT_BOUND_JUDGED_AS = REL_EUCLID
# A run's meta key: the resolution its recorded statistics were printed with (msprobe's ATB probe prints six
# decimals, so 1e-6); each statistic is then known to +-step/2 and the bound subtracts that from every difference.
STAT_STEP_KEY = "stat_print_step"
BY_NAME: dict[str, MetricSpec] = {m.name: m for m in (*METRICS, *STAT_METRICS)}
