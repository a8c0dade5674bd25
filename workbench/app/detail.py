"""The detail pane: every metric with pass/fail, both sides' statistics, histogram, top-k, verdict."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from workbench.analysis.explorer.views import (
    BORN_ADVISOR,
    BORN_PRECHECK,
    LayerGroupSummary,
    NodeTensors,
    PairDetail,
    PairRow,
    TensorDiff,
)
from workbench.analysis.verdicts.born import INPUTS_UNCHECKED
from workbench.core.advice import NO_PEERS, STANDS_OUT, added_inside, born_in_noise, elsewhere, score_text
from workbench.core.metrics import BY_NAME, METRICS, STAT_BOUND, STAT_KEYS
from workbench.core.tokens import token_text

BARS = " ▁▂▃▄▅▆▇█"
STATISTICS = (
    ("dtype", "dtype"),
    ("shape", "shape"),
    ("min", "min"),
    ("max", "max"),
    ("mean", "mean"),
    ("std", "std"),
    ("norm", "norm"),
    ("nan_count", "NaN"),
    ("inf_count", "Inf"),
)
# the statistics metrics a pair compared on statistics only shows: the bound that judges it, then each statistic's
# relative difference (the absolute ones are in the statistics table's two columns)
DETAIL_STAT_METRICS = (STAT_BOUND, *(f"{k}_stat_relative_error" for k in STAT_KEYS))


def pair_labels(pairs: list[PairRow]) -> list[str]:
    """A column label per pair: `out0`, and `in0⇄out0 OpName` where one golden tensor meets several test ones."""
    seen: dict[tuple[str, int], int] = {}
    for p in pairs:
        seen[(p.io, p.golden_index)] = seen.get((p.io, p.golden_index), 0) + 1
    labels = []
    for p in pairs:
        label = f"{p.io}{p.golden_index}"
        if seen[(p.io, p.golden_index)] > 1:
            op = p.test_node.rsplit("/", 1)[-1].rsplit(".", 1)[-1]
            label += f"⇄{p.test_io or p.io}{p.test_index}" + (f" {op}" if op else "")
        labels.append(label)
    return labels


def _pass_mark(passed: bool | None) -> str:
    """A pair's mark: passes, fails, or not judged."""
    return "✓" if passed else ("✗" if passed is False else "?")


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
    test_nodes = list(dict.fromkeys(p.test_node for p in detail.pairs if p.test_node))
    if len(test_nodes) > 1:
        head.append(", ".join(test_nodes))
    elif detail.test_name:
        head.append(f"{detail.test_name} ({detail.test_type})")
    else:
        head.append("unmatched: no counterpart on the test side", style=styles.get("unmatched", "grey50"))
    parts.append(head)
    parts.append(_verdict(detail, styles))
    if not detail.pairs:
        parts.append(Text("no compared tensor pairs for this node at this token", style="dim"))
        return Group(*parts)

    metrics = Table(box=None, pad_edge=False, show_header=True, header_style="bold", expand=False)
    labels = pair_labels(detail.pairs)
    metrics.add_column("metric")
    marks = [_pass_mark(p.passed) for p in detail.pairs]
    for p, label, mark in zip(detail.pairs, labels, marks, strict=True):
        metrics.add_column(
            f"{label} {mark}",
            justify="right",
            style=ok if p.passed else (bad if p.passed is False else ""),
        )
    # a pair with a statistics-only side has no tensor metric: its verdict rests on the statistics bound, so that row
    # (and the statistics' relative differences) are shown; tensor metric rows only where some pair has one
    on_tensors = any(p.metrics.get(spec.name) is not None for p in detail.pairs for spec in METRICS)
    on_statistics = any(all(p.metrics.get(spec.name) is None for spec in METRICS) for p in detail.pairs)
    rows = [spec for spec in METRICS if on_tensors or not on_statistics]
    rows += [BY_NAME[name] for name in DETAIL_STAT_METRICS if on_statistics]
    for spec in rows:
        cells: list[Text | str] = []
        for p in detail.pairs:
            failed = spec.name in p.failed_metrics
            cells.append(Text(fmt(p.metrics.get(spec.name)) + (" ✗" if failed else ""), style=bad if failed else ""))
        metrics.add_row(spec.label, *cells)
    parts.append(metrics)
    reasons = [f"{label}: {p.fail_reason}" for p, label in zip(detail.pairs, labels) if p.fail_reason]
    for r in reasons:
        parts.append(Text(r, style=bad))
    for p, label, mark in zip(detail.pairs, labels, marks, strict=True):
        if p.judged_note:
            parts.append(Text(f"{label} {mark}: {p.judged_note}", style="dim"))

    stats = Table(box=None, pad_edge=False, header_style="bold")
    stats.add_column("statistic")
    for p, label in zip(detail.pairs, labels):
        stats.add_column(f"{label} golden", justify="right")
        stats.add_column(f"{p.test_io or p.io}{p.test_index} test", justify="right")
    for key, label in STATISTICS:
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
        pair_i = next((i for i, p in enumerate(detail.pairs) if p.pair_id == diff.pair_id), None)
        name = labels[pair_i] if pair_i is not None else "pair"
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


def _verdict(detail: PairDetail, styles: dict[str, str]) -> Text:
    """The verdict line, saying what it rests on so that it never contradicts the table below it: failing
    outputs, a precheck that pinned a test op down, or the advisor's score (an op standing out of the noise)."""
    born_style = styles.get("born", "orange1")
    verdict = Text()
    score = f"advisor score {score_text(detail.born_score)}" if detail.born_score is not None else ""
    # a quantized linear's score is its error over what its int8 rounding predicts, a lookup's over one rounding, an
    # op without peers over twice the rounding; any other op's over its peers'
    basis = (
        "beyond its expected int8 rounding"
        if detail.born_quantized
        else "beyond the one rounding a lookup adds"
        if detail.born_lookup
        else f"beyond twice the rounding, {NO_PEERS}"
        if detail.born_peerless
        else "stands out of its peers' noise"
    )
    stands = f"{score} (>= {STANDS_OUT:g}: {basis})" if score else ""
    if detail.born_why == BORN_ADVISOR:
        if detail.born_here:
            verdict.append("◆ most likely origin", style=f"bold {born_style}")
            # its outputs may fail too (a quantized linear, a run failing everywhere): say so only when true
            passing = not any(p.passed is False for p in detail.pairs if p.io == "out")
            but = "no output fails, but " if passing else ""
            verdict.append(f" at token {detail.token}: {but}the error it adds has {stands}")
        else:
            verdict.append(f"token {detail.token}: no op where the error is born; ", style=styles.get("ok", "green"))
            verdict.append(f"most likely origin: {detail.born_name} ({score}, stands out)", style=born_style)
    elif detail.born_here and detail.born_why == BORN_PRECHECK:
        verdict.append("◆ error pinned here", style=f"bold {born_style}")
        passing = not any(p.passed is False for p in detail.pairs)
        verdict.append(
            f" at token {detail.token} by the precheck: "
            + ("its outputs pass the compare, but " if passing else "")
            + "a test op of it disagrees with its own re-run on its dumped inputs"
            + (f"; {stands if detail.born_score >= STANDS_OUT else score}" if detail.born_score is not None else "")
        )
    elif detail.born_here:
        verdict.append("◆ error born here", style=f"bold {born_style}")
        if detail.born_inputs_unchecked:
            verdict.append(f" at token {detail.token}: outputs fail; {INPUTS_UNCHECKED}")
        else:
            verdict.append(f" at token {detail.token}: outputs fail while inputs pass")
        note = None
        if not detail.born_quantized:
            note = added_inside(detail.born_score, detail.born_inside_name, detail.born_inside_score) or born_in_noise(
                detail.born_score, detail.evidence, detail.born_inside_score
            )
        if note:
            verdict.append(f"; {note}")
            if detail.origin_name is not None and detail.origin_score is not None:
                verdict.append(f"; {elsewhere(detail.origin_name, detail.origin_score, detail.token)}")
    elif detail.born_name:
        verdict.append(f"error born at: {detail.born_name} (token {detail.token})", style=born_style)
    elif detail.inputs_differ:  # the pairs below compare different inputs: no verdict is drawn from them
        verdict.append(f"token {detail.token}: {detail.inputs_differ}: no op named", style=styles.get("warn", "yellow"))
    elif detail.evidence:  # none born, and why: an op failing with passing inputs carries their error across
        verdict.append(f"token {detail.token}: {detail.evidence}")
    elif any(p.passed is False for p in detail.pairs if p.io == "out"):  # failing, yet not where it is born
        verdict.append(f"token {detail.token}: no op where the error is born (none fails with passing inputs), none")
        verdict.append(" stands out of the noise")
    else:
        verdict.append(f"token {detail.token}: every output passes", style=styles.get("ok", "green"))
    pinned = detail.born_test_name
    if detail.born_here or detail.born_name:
        # the test op named apart where it is not the golden one's namesake (an ATB op under a torch module)
        if pinned and pinned != detail.born_name:
            verdict.append("\n  test op pinned down: ", style=born_style)
            verdict.append(pinned, style=f"bold {born_style}")
        if detail.evidence:
            verdict.append(f"\n  evidence: {detail.evidence}", style="italic")
    return verdict


def render_node_tensors(node: NodeTensors, styles: dict[str, str]) -> RenderableType:
    """An op with no counterpart (or not compared at this token): its own tensors and their statistics."""
    head = Text()
    head.append(node.name, style="bold")
    head.append(f"  ({node.type})  {node.side} side\n")
    unmatched = styles.get("unmatched", "grey50")
    if not node.tokens_with_tensors:
        head.append("no tensors dumped for this node", style=unmatched)
        return head
    head.append(
        f"unmatched at token {node.token}: no counterpart on the other side, nothing compared; "
        "pair it in the mapping editor (e)\n",
        style=unmatched,
    )
    toks = node.tokens_with_tensors
    head.append(f"tensors at token(s) {token_text(toks, ', ')}; shown: token {node.token}", style="dim")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("statistic")
    for t in node.tensors:
        table.add_column(f"{t.io}{t.index}", justify="right")
    for key, label in STATISTICS:
        cells = []
        for t in node.tensors:
            if key == "dtype":
                cells.append(Text(t.dtype))
            elif key == "shape":
                cells.append(Text(t.shape or "-"))
            else:
                value = t.stats.get(key)
                bad = key in ("nan_count", "inf_count") and bool(value)
                cells.append(Text(fmt(value), style=styles.get("nan", "magenta") if bad else ""))
        table.add_row(label, *cells)
    return Group(head, table)


def render_layer_group(group: LayerGroupSummary, styles: dict[str, str]) -> RenderableType:
    """A layer's group row: what it holds and how its calls fare at the token shown."""
    text = Text()
    text.append(f"layer {group.layer}", style="bold")
    text.append(f"  {group.side} side, {group.calls} calls\n")
    text.append(
        "The dump names no modules (API calls only): wb takes the block of calls that repeats for a decoder "
        "layer, its copies numbered from 0 in call order.\n",
        style="dim",
    )
    at = "" if group.token is None else f"at token {group.token}: "
    if not group.compared:
        text.append(f"{at}none of its calls compared", style=styles.get("unmatched", "grey50"))
        return text
    text.append(f"{at}{group.compared} of {group.calls} calls compared, ")
    text.append(f"{group.failed} fail", style=styles.get("fail", "red") if group.failed else styles.get("ok", "green"))
    if group.nan_inf:
        text.append(f", {group.nan_inf} with NaN/Inf", style=styles.get("nan", "magenta"))
    if group.born is not None:
        text.append("\n◆ error born here: ", style=styles.get("born", "orange1") + " bold")
        text.append(group.born)
    if group.worst is not None:
        text.append("\nworst by the colouring: ")
        text.append(group.worst, style="bold")
    text.append("\nEnter opens it; n / N go to the next / previous failing call", style="dim")
    return text
