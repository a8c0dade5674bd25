"""The rank selector of a multi-rank comparison: one line naming every rank, the one shown marked.

Each rank is its own comparison (`wb compare` of multi-rank dumps stores one per rank); `r` / `R` (or a
click on a rank) show the next / previous one, keeping the token and the selected op, so the heatmap,
the trees, the detail pane and the advisor all follow the rank. Hidden for a single-rank comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widgets import Static

from workbench.analysis.explorer.ranks import RankEntry


class RankBar(Static):
    """`ranks ▶0 ✗4 ⇄✗4 │ 1 ✗2 ⇄✗4   r/R: rank`, one line, hidden with fewer than two ranks."""

    @dataclass
    class RankClicked(Message):
        cmp_id: int

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.entries: list[RankEntry] = []
        self.current: int | None = None
        self._spans: list[tuple[int, int, int]] = []  # start, end, cmp_id

    def set_ranks(self, entries: list[RankEntry], current: int, styles: dict[str, str]) -> None:
        """Show `entries` (the ranks of the comparison `current`)."""
        self.entries, self.current = entries, current
        self.display = len(entries) >= 2
        text = Text("ranks ", style="bold")
        self._spans = []
        for i, e in enumerate(entries):
            if i:
                text.append(" │ ", style="dim")
            start = len(text)
            shown = e.cmp_id == current
            text.append(f"{'▶' if shown else ' '}{e.rank}", style="reverse bold" if shown else "bold")
            if e.failed:
                text.append(f" ✗{e.failed}", style=styles.get("fail", "red"))
            else:
                text.append(" ✓", style=styles.get("ok", "green"))
            if e.allreduce_failed:
                culprit = "" if e.culprit_rank is None else f" (rank {e.culprit_rank})"
                text.append(f" all-reduce ✗{e.allreduce_failed}{culprit}", style=styles.get("fail", "red"))
            self._spans.append((start, len(text), e.cmp_id))
        text.append("   r/R: rank", style="dim")
        self.update(text)

    def on_click(self, event: events.Click) -> None:
        x = event.x - 1  # padding
        for start, end, cmp_id in self._spans:
            if start <= x < end and cmp_id != self.current:
                self.post_message(self.RankClicked(cmp_id))
                return
