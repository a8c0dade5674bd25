"""The logits strip above the heatmap: one cell per token, green when its logits pass, red when they fail,
grey where the two runs were fed different tokens (with the reason); the current token's KL on the right.

Hovering a cell shows its line as a tooltip; clicking it selects the token (`TokenSelected`).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual import events, work
from textual.message import Message
from textual.widgets import Static

from workbench.analysis.explorer.explore import Explorer
from workbench.analysis.explorer.token_view import StripCell
from workbench.app.themes import DOMAIN_DEFAULTS

LABEL = "logits "
LINE_ROOM = 40  # columns kept for the current token's line (KL, cosine, top-1) when the cells would fill the strip


class LogitsStrip(Static):
    """One cell per token of the comparison (data from `Explorer.logits_strip`)."""

    @dataclass
    class TokenSelected(Message):
        token: int

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("", id=id)
        self.cells: list[StripCell] = []
        self.token: int | None = None
        self.width_per_cell = 2
        self._first = 0  # index of the first cell drawn: the strip shows a window of cells around the current token

    # ------------------------------------------------------------------ data
    def load(self, explorer: Explorer) -> None:
        """Read the cells in a worker thread; the strip redraws when they arrive."""
        self._load(explorer)

    @work(thread=True, exclusive=True, group="logits-strip", exit_on_error=False)
    def _load(self, explorer: Explorer) -> None:
        cells = explorer.logits_strip()
        self.app.call_from_thread(self.show_cells, cells)

    def show_cells(self, cells: list[StripCell]) -> None:
        self.cells = cells
        self.display = bool(cells)
        self.width_per_cell = max((len(str(c.token)) for c in cells), default=1) + 1
        self._redraw()

    def set_token(self, token: int) -> None:
        """Mark the current token and show its line."""
        self.token = token
        self._redraw()

    def cell(self, token: int) -> StripCell | None:
        return next((c for c in self.cells if c.token == token), None)

    # ------------------------------------------------------------------ drawing
    def _colours(self) -> dict[str, str]:
        try:
            variables = self.app.get_css_variables()
        except Exception:  # not mounted in an app yet
            variables = {}
        merged = {**DOMAIN_DEFAULTS, **variables}
        return {k: merged[k] for k in ("ok", "fail", "unmatched")}

    def style_of(self, cell: StripCell) -> str:
        """`differ`, `pass`, `fail` or `none`: what the cell's colour says."""
        if cell.inputs_differ:
            return "differ"
        return {True: "pass", False: "fail", None: "none"}[cell.passed]

    def render_text(self) -> Text:
        colours = self._colours()
        bg = {"pass": colours["ok"], "fail": colours["fail"], "differ": colours["unmatched"], "none": ""}
        text = Text(LABEL, style="bold")
        # the strip is one line high: only the cells that fit are drawn (a 1,000-token comparison drew them all at
        # each token change), a window around the current token that leaves room for its line
        width = self.content_size.width
        shown = self._shown(width) if width else self.cells
        for c in shown:
            kind = self.style_of(c)
            style = f"on {bg[kind]}" if bg[kind] else "dim"
            if kind == "differ":
                style += " strike"
            if c.token == self.token:
                style += " bold reverse"
            text.append(str(c.token).rjust(self.width_per_cell - 1) + " ", style=style)
        current = self.cell(self.token) if self.token is not None else None
        if current is not None:
            room = self.content_size.width - text.cell_len - 2 if self.content_size.width else 200
            text.append("  " + current.describe_within(room))
        return text

    def _shown(self, width: int) -> list[StripCell]:
        """The window of cells drawn at `width` columns: all when they fit with the current token's line, else as
        many as leave `LINE_ROOM` columns for it, the current token kept inside (near the middle when it moves
        past an edge)."""
        cells = self.cells
        if len(cells) * self.width_per_cell + len(LABEL) + LINE_ROOM <= width:
            self._first = 0
            return cells
        fit = max(1, (width - len(LABEL) - min(LINE_ROOM, width // 2)) // self.width_per_cell)
        idx = next((i for i, c in enumerate(cells) if c.token == self.token), 0)
        if not self._first <= idx < self._first + fit:  # scroll only when the current token leaves the window
            self._first = idx - fit // 2
        self._first = max(0, min(self._first, len(cells) - fit))
        return cells[self._first : self._first + fit]

    def on_resize(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        self.update(self.render_text(), layout=False)  # one line high whatever it holds: no layout pass

    def _cell_at(self, x: int) -> StripCell | None:
        pos = x - 1 - len(LABEL)  # padding, then the label
        if pos < 0:
            return None
        idx = self._first + pos // self.width_per_cell
        return self.cells[idx] if idx < len(self.cells) else None

    # ------------------------------------------------------------------ mouse
    def on_mouse_move(self, event: events.MouseMove) -> None:
        c = self._cell_at(event.x)
        self.tooltip = c.describe(why=True) if c is not None else None

    def on_click(self, event: events.Click) -> None:
        c = self._cell_at(event.x)
        if c is not None:
            self.post_message(self.TokenSelected(c.token))
