"""The detail pane: every metric with pass/fail, both sides' statistics, histogram, top-k, verdict."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from workbench.analysis.explore import PairDetail, TensorDiff

BARS = " ▁▂▃▄▅▆▇█"
METRIC_LABELS: dict[str, str] = {
    "cosine_similarity": "cosine",
    "max_relative_error": "max rel err",
    "mean_relative_error": "mean rel err",
    "max_absolute_error": "max abs err",
    "mean_absolute_error": "mean abs err",
    "kl_divergence": "KL divergence",
    "relative_euclidean_distance": "rel euclid",
    "max_ulp_error": "max ULP",
    "snr_db": "SNR dB",
    "one_thousandth_err_ratio": "1‰ err ratio",
    "five_thousandths_err_ratio": "5‰ err ratio",
}


def fmt(v: Any) -> str:
    """Compact number formatting for the pane."""
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.6g}"
    return str(v)


def sparkline(counts: list[int]) -> str:
    """Counts as block characters, one per bin."""
    top = max(counts) if counts else 0
    if not top:
        return ""
    return "".join(BARS[0 if c == 0 else max(1, round(c / top * (len(BARS) - 1)))] for c in counts)


def render_detail(detail: PairDetail | None, diff: TensorDiff | None, styles: dict[str, str]) -> RenderableType:
    """Build the pane's content; `styles` maps ok/fail/nan/born/unmatched to colours."""
    if detail is None:
        return Text("Select a node (trees) or a cell (heatmap, Enter) to see its tensors.", style="dim")
    ok, bad = styles.get("ok", "green"), styles.get("fail", "red")
    parts: list[RenderableType] = []
    head = Text()
    head.append(detail.golden_name, style="bold")
    head.append(f"  ({detail.golden_type})  token {detail.token}\n")
    head.append("test: ")
    if detail.test_name:
        head.append(f"{detail.test_name} ({detail.test_type})")
    else:
        head.append("unmatched: no counterpart on the test side", style=styles.get("unmatched", "grey50"))
    parts.append(head)
    verdict = Text()
    if detail.born_here:
        verdict.append("◆ error born here", style=f"bold {styles.get('born', 'orange1')}")
        verdict.append(f" at token {detail.token}: outputs fail while inputs pass")
    elif detail.born_name:
        verdict.append(f"error born at: {detail.born_name} (token {detail.token})", style=styles.get("born", "orange1"))
    else:
        verdict.append(f"token {detail.token}: every output passes", style=ok)
    parts.append(verdict)
    if not detail.pairs:
        parts.append(Text("no compared tensor pairs for this node at this token", style="dim"))
        return Group(*parts)

    metrics = Table(box=None, pad_edge=False, show_header=True, header_style="bold", expand=False)
    metrics.add_column("metric")
    for p in detail.pairs:
        mark = "✓" if p.passed else ("✗" if p.passed is False else "?")
        metrics.add_column(
            f"{p.io}{p.golden_index} {mark}",
            justify="right",
            style=ok if p.passed else (bad if p.passed is False else ""),
        )
    for key, label in METRIC_LABELS.items():
        cells: list[Text | str] = []
        for p in detail.pairs:
            failed = key in p.failed_metrics
            cells.append(Text(fmt(p.metrics.get(key)) + (" ✗" if failed else ""), style=bad if failed else ""))
        metrics.add_row(label, *cells)
    parts.append(metrics)
    reasons = [f"{p.io}{p.golden_index}: {p.fail_reason}" for p in detail.pairs if p.fail_reason]
    for r in reasons:
        parts.append(Text(r, style=bad))

    stats = Table(box=None, pad_edge=False, header_style="bold")
    stats.add_column("statistic")
    for p in detail.pairs:
        stats.add_column(f"{p.io}{p.golden_index} golden", justify="right")
        stats.add_column(f"{p.io}{p.test_index} test", justify="right")
    for key, label in (
        ("dtype", "dtype"),
        ("shape", "shape"),
        ("min", "min"),
        ("max", "max"),
        ("mean", "mean"),
        ("std", "std"),
        ("norm", "norm"),
        ("nan_count", "NaN"),
        ("inf_count", "Inf"),
    ):
        cells = []
        for p in detail.pairs:
            for s in (p.golden, p.test):
                value = s.get(key)
                bad_count = key in ("nan_count", "inf_count") and bool(value)
                cells.append(
                    Text(
                        fmt(value) if key not in ("dtype", "shape") else str(value or "-"),
                        style=styles.get("nan", "magenta") if bad_count else "",
                    )
                )
        stats.add_row(label, *cells)
    parts.append(stats)

    if diff is None:
        parts.append(Text("reading the tensors of the worst pair ...", style="dim"))
    elif diff.error:
        parts.append(Text(f"tensors not shown: {diff.error}", style="dim"))
    else:
        pair = next((p for p in detail.pairs if p.pair_id == diff.pair_id), None)
        name = f"{pair.io}{pair.golden_index}" if pair else "pair"
        h = Text()
        h.append(f"|error| distribution of {name} ({diff.numel:,} elements", style="bold")
        h.append(f"; {diff.exact:,} exact; {diff.nonfinite:,} non-finite)\n", style="bold")
        if diff.hist_counts:
            h.append(sparkline(diff.hist_counts), style=styles.get("warn", "yellow"))
            h.append(
                f"\n1e{diff.hist_edges[0]:.0f}".ljust(len(diff.hist_counts)) + f" … 1e{diff.hist_edges[-1]:.0f}",
                style="dim",
            )
        else:
            h.append("no non-zero finite error", style=ok)
        parts.append(h)
        top = Table(
            box=None,
            pad_edge=False,
            header_style="bold",
            title=f"top {len(diff.top)} worst elements",
            title_justify="left",
        )
        for col in ("index", "golden", "test", "|error|"):
            top.add_column(col, justify="right")
        for index, g, t, e in diff.top:
            top.add_row(str(list(index)), fmt(g), fmt(t), Text(fmt(e), style=bad if not math.isfinite(e) else ""))
        parts.append(top)
    return Group(*parts)
