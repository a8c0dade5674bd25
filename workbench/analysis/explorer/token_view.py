"""The app's logits strip, headless: one cell per token with the logits verdict and the token's input status.

Reads the catalog tables `logits` and `token_status` only (no tensor, no pandas), so the app stays light.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import duckdb


@dataclass(frozen=True, slots=True)
class StripCell:
    """One token of the app's logits strip: the logits verdict and, where they differ, why the inputs do."""

    token: int
    passed: bool | None
    kl: float | None
    cosine: float | None
    golden_top1: int | None
    test_top1: int | None
    inputs_differ: bool
    inputs_reason: str | None
    reason: str | None = None  # why the logits were not compared
    on_statistics: bool = False  # the logits were dumped as statistics only: `passed` is their max/min/mean/norm's

    def describe(self, why: bool = False) -> str:
        """One line for the strip's label; `why` adds why the logits were not compared (the tooltip)."""
        return "; ".join(self.parts(why))

    def describe_within(self, width: int) -> str:
        """The line cut to `width` columns at a part's end, never inside one; the bare verdict when nothing fits."""
        line = ""
        for part in self.parts():
            longer = f"{line}; {part}" if line else part
            if len(longer) > width:
                break
            line = longer
        return line or {True: "pass", False: "FAIL", None: "-"}[self.passed][: max(width, 0)]

    def parts(self, why: bool = False) -> list[str]:
        """The line's parts, most important first."""
        if self.on_statistics:
            verdict = {True: "logits' statistics pass", False: "logits' statistics FAIL", None: "logits not compared"}[
                self.passed
            ]
        else:
            verdict = {True: "logits pass", False: "logits FAIL", None: "logits not compared"}[self.passed]
        parts = [f"token {self.token}: {verdict}"]
        if self.kl is not None:
            parts.append(f"KL {self.kl:.3g}, cosine {'-' if self.cosine is None else f'{self.cosine:.6g}'}")
        if self.golden_top1 is not None:
            parts.append(f"top-1 {self.golden_top1}/{self.test_top1}")
        if self.inputs_differ:
            parts.append(self.inputs_reason or "inputs differ")
        if why and self.reason:
            parts.append(self.reason)
        return parts


def strip_cells(con: duckdb.DuckDBPyConnection, cmp_id: int, tokens: Iterable[int]) -> list[StripCell]:
    """One cell per token of a comparison (tokens without logits rows are unjudged); [] for catalogs written
    before the `logits` table existed."""
    have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    if "logits" not in have:
        return []
    rows = {
        int(r[0]): r
        for r in con.execute(
            "SELECT token_id, passed, kl_divergence, cosine_similarity, golden_top1, test_top1, reason FROM logits "
            "WHERE cmp_id = ?",
            [cmp_id],
        ).fetchall()
    }
    status: dict[int, tuple[Any, ...]] = {}
    if "token_status" in have:
        status = {
            int(r[0]): r
            for r in con.execute(
                "SELECT token_id, inputs_differ, reason FROM token_status WHERE cmp_id = ?", [cmp_id]
            ).fetchall()
        }
    if not rows and not status:
        return []
    from workbench.analysis.verdicts.logits import statistics_logits

    on_stats = statistics_logits(con, cmp_id) if not any(r[1] is not None for r in rows.values()) else None
    out = []
    for tok in sorted(set(tokens) | set(rows)):
        r = rows.get(tok)
        s = status.get(tok)
        cell = StripCell(
            tok,
            None if r is None else r[1],
            None if r is None else r[2],
            None if r is None else r[3],
            None if r is None else r[4],
            None if r is None else r[5],
            bool(s and s[1]),
            None if s is None else s[2],
            None if r is None else r[6],
        )
        if on_stats is not None and tok in on_stats.counts:
            why = (
                f"the logits ({on_stats.what}) were dumped as statistics only: their max/min/mean/norm are compared, "
                "no cosine, KL or top-1"
            )
            cell = replace(cell, passed=on_stats.passed(tok), reason=why, on_statistics=True)
        out.append(cell)
    return out
