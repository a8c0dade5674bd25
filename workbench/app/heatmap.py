"""The token x layer heatmap: one line-API widget (rendered strip by strip, cached), never a widget per cell."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.color import Color
from textual.geometry import Region, Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from workbench.analysis.explorer.severity import (
    HEAT_LEVELS,
    LEVEL_EDGES,
    PASS_LEVELS,
    Scale,
    relative_bound,
    severity_array,
)
from workbench.analysis.explorer.views import Heatmap
from workbench.app.actions import bindings
from workbench.app.themes import DOMAIN_DEFAULTS

MIN_CELL_W = 2  # many tokens: two columns a cell
MAX_CELL_W = 6  # few tokens: wider cells, up to this
HEADER_H = 1
GLYPH_FAIL = "×"
GLYPH_NAN = "!"
GLYPH_NONE = "·"


def cell_width(available: int, tokens: int) -> int:
    """Columns per cell: as wide as the space allows for few tokens, never under MIN_CELL_W."""
    if tokens <= 0:
        return MAX_CELL_W
    return max(MIN_CELL_W, min(MAX_CELL_W, available // tokens))


def _contrast(hex_colour: str) -> str:
    c = Color.parse(hex_colour)
    return "#000000" if c.brightness > 0.55 else "#ffffff"


class HeatmapView(ScrollView, can_focus=True):
    """Rows (layers or ops) x tokens; a cell cursor; Enter selects; failing cells carry a glyph."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor(-1, 0)", "Up", show=False),
        Binding("down", "cursor(1, 0)", "Down", show=False),
        Binding("left", "cursor(0, -1)", "Left", show=False),
        Binding("right", "cursor(0, 1)", "Right", show=False),
        Binding("pageup", "cursor(0, -10)", "-10 tokens", show=False),
        Binding("pagedown", "cursor(0, 10)", "+10 tokens", show=False),
        Binding("home", "cursor_home", "First token", show=False),
        Binding("end", "cursor_end", "Last token", show=False),
        *bindings("heatmap"),
    ]

    class CellHighlighted(Message):
        """The cursor moved to (row, column)."""

        def __init__(self, view: HeatmapView, row: int, col: int) -> None:
            super().__init__()
            self.view = view
            self.row = row
            self.col = col

    class CellSelected(Message):
        """Enter (or a click) on a cell."""

        def __init__(self, view: HeatmapView, row: int, col: int) -> None:
            super().__init__()
            self.view = view
            self.row = row
            self.col = col

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.data: Heatmap | None = None
        self.bound = 1.0  # severity 1 (the given bound, or the largest value shown when there is none)
        self.scale = Scale(1.0, True)
        self.cell_w = MAX_CELL_W
        self.cursor = (0, 0)
        self._levels = np.zeros((0, 0), dtype=np.int8)
        self._cache: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._generation = 0
        self._palette: list[Style] = []
        self._glyph_fg: list[str] = []
        self._styles: dict[str, Style] = {}
        self._gutter = 6
        self._base = Style()

    # ------------------------------------------------------------------ data
    def set_data(self, data: Heatmap, scale: Scale, cursor: tuple[int, int] | None = None) -> None:
        """Show a new heatmap (keeps the cursor in range). Without a bound, shades are relative to the
        largest value shown and stay within the passing colours: only the verdict marks a failure."""
        self.data = data
        self.scale = scale
        self.bound = scale.bound if scale.bound is not None else relative_bound(data.values, data.metric)
        sev = severity_array(data.values, data.metric, self.bound)
        lv: np.ndarray = np.full(data.values.shape, -1, dtype=np.int8)
        finite = ~np.isnan(sev)
        if finite.any():
            lv[finite] = np.searchsorted(np.array(LEVEL_EDGES), sev[finite], side="right").astype(np.int8)
        if scale.bound is None:
            np.minimum(lv, PASS_LEVELS - 1, out=lv)
        self._levels = lv
        self._gutter = max([4, *(len(x) for x in data.row_labels)]) + 1
        r, c = cursor if cursor is not None else self.cursor
        rows, cols = data.values.shape
        self.cursor = (min(max(r, 0), max(rows - 1, 0)), min(max(c, 0), max(cols - 1, 0)))
        self._resize_virtual()
        self._invalidate()
        self.scroll_to_cursor()

    def preferred_width(self, limit: int) -> int:
        """Columns the heatmap needs (gutter, cells as wide as allowed, a scrollbar) within `limit`."""
        if self.data is None:
            return limit
        ntok = len(self.data.tokens)
        cw = cell_width(max(limit - self._gutter - 1, 0), ntok)
        return min(limit, self._gutter + ntok * cw + 1)

    def _resize_virtual(self) -> None:
        if self.data is None:
            return
        rows, cols = self.data.values.shape
        self.cell_w = cell_width(max(self.scrollable_content_region.width - self._gutter, 0), cols)
        self.virtual_size = Size(self._gutter + cols * self.cell_w, rows + HEADER_H)

    def on_resize(self) -> None:
        old = self.cell_w
        self._resize_virtual()
        if self.cell_w != old:
            self._invalidate()
        self.scroll_to_cursor()

    def _invalidate(self) -> None:
        self._generation += 1
        self._cache.clear()
        self.refresh()

    def on_mount(self) -> None:
        self._load_palette()
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self, _theme: str) -> None:
        self._load_palette()
        self._invalidate()

    def _load_palette(self) -> None:
        variables = {**DOMAIN_DEFAULTS, **self.app.get_css_variables()}
        self._palette = [Style(bgcolor=variables[f"heat-{i}"]) for i in range(HEAT_LEVELS)]
        self._glyph_fg = [_contrast(variables[f"heat-{i}"]) for i in range(HEAT_LEVELS)]
        fg = variables.get("foreground", "#e6edf3")
        self._base = Style(bgcolor=variables.get("background"), color=fg)
        self._styles = {
            "none": Style(bgcolor=variables["heat-none"], color=variables["unmatched"]),
            "nan": Style(bgcolor=variables["nan"], color=_contrast(variables["nan"]), bold=True),
            "label": Style(color=fg),
            "label_cursor": Style(color=variables.get("accent", fg), bold=True, reverse=True),
            "header": Style(color=variables.get("secondary", fg)),
            "header_cursor": Style(color=variables.get("accent", fg), bold=True),
        }

    # ------------------------------------------------------------------ cursor
    @property
    def shape(self) -> tuple[int, int]:
        if self.data is None:
            return (0, 0)
        rows, cols = self.data.values.shape
        return int(rows), int(cols)

    def move_cursor(self, row: int, col: int, notify: bool = True) -> None:
        """Put the cursor on a cell (clamped); repaints only the lines that changed. `notify=False` when the
        screen moves it to follow a selection made elsewhere (no CellHighlighted)."""
        rows, cols = self.shape
        if not rows or not cols:
            return
        new = (min(max(row, 0), rows - 1), min(max(col, 0), cols - 1))
        old = self.cursor
        if new == old:
            return
        self.cursor = new
        self._refresh_row(old[0])
        self._refresh_row(new[0])
        if new[1] != old[1]:
            self.refresh(Region(0, 0, self.size.width, HEADER_H))
        self.scroll_to_cursor()
        if notify:
            self.post_message(self.CellHighlighted(self, *new))

    def _refresh_row(self, row: int) -> None:
        y = row + HEADER_H - int(self.scroll_offset.y)
        if HEADER_H <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    def scroll_to_cursor(self) -> None:
        row, col = self.cursor
        x = self._gutter + col * self.cell_w
        view = self.scrollable_content_region  # excludes the scrollbars
        cells_w = max(view.width - self._gutter, self.cell_w)
        sx, sy = self.scroll_offset
        if x - self._gutter < sx:
            sx = x - self._gutter
        elif x + self.cell_w - self._gutter > sx + cells_w:
            sx = x + self.cell_w - self._gutter - cells_w
        body_h = max(view.height - HEADER_H, 1)
        if row < sy:
            sy = row
        elif row >= sy + body_h:
            sy = row - body_h + 1
        if (sx, sy) != tuple(self.scroll_offset):
            self.scroll_to(sx, sy, animate=False, immediate=True)

    def action_cursor(self, drow: int, dcol: int) -> None:
        self.move_cursor(self.cursor[0] + drow, self.cursor[1] + dcol)

    def action_cursor_home(self) -> None:
        self.move_cursor(self.cursor[0], 0)

    def action_cursor_end(self) -> None:
        self.move_cursor(self.cursor[0], self.shape[1] - 1)

    def action_select_cell(self) -> None:
        if self.data is not None and self.shape[0] and self.shape[1]:
            self.post_message(self.CellSelected(self, *self.cursor))

    def on_click(self, event: events.Click) -> None:
        if self.data is None:
            return
        x, y = event.x, event.y
        if y < HEADER_H or x < self._gutter:
            return
        row = int(self.scroll_offset.y) + y - HEADER_H
        col = (int(self.scroll_offset.x) + x - self._gutter) // self.cell_w
        self.move_cursor(row, col)
        if event.chain >= 2:
            self.action_select_cell()

    # ------------------------------------------------------------------ rendering
    def render_line(self, y: int) -> Strip:
        width = self.size.width
        data = self.data
        if data is None:
            return Strip.blank(width, self._base)
        sx = int(self.scroll_offset.x)
        col0 = sx // self.cell_w
        ncols = max((width - self._gutter) // self.cell_w + 1, 0)
        if y < HEADER_H:
            key: tuple[object, ...] = ("h", col0, width, self.cursor[1], self._generation)
            row = -1
        else:
            row = int(self.scroll_offset.y) + y - HEADER_H
            if row >= data.values.shape[0]:
                return Strip.blank(width, self._base)
            on_row = self.cursor[0] == row
            key = (row, col0, width, self.cursor[1] if on_row else -1, on_row, self._generation)
        strip = self._cache.get(key)
        if strip is None:
            strip = self._render_header(col0, ncols, width) if row < 0 else self._render_row(row, col0, ncols, width)
            self._cache[key] = strip
        return strip

    def _render_header(self, col0: int, ncols: int, width: int) -> Strip:
        assert self.data is not None
        tokens = self.data.tokens
        w = self.cell_w
        chars = [" "] * (ncols * w + 1)
        cur = self.cursor[1]
        for j in range(col0, min(col0 + ncols, len(tokens))):
            label = ("▼" if j == cur else "") + str(tokens[j])
            if w > len(label) or j % 5 == 0 or j == cur:
                pos = (j - col0) * w + max((w - len(label)) // 2, 0)
                if j == cur or all(c == " " for c in chars[pos : pos + len(label) + 1]):
                    chars[pos : pos + len(label)] = list(label)
        text = "".join(chars)
        segs = [Segment("tok".ljust(self._gutter), self._styles["header"])]
        cpos = text.find("▼")
        if cpos >= 0:
            end = cpos + 1
            while end < len(text) and text[end] != " ":
                end += 1
            segs += [
                Segment(text[:cpos], self._styles["header"]),
                Segment(text[cpos:end], self._styles["header_cursor"]),
                Segment(text[end:], self._styles["header"]),
            ]
        else:
            segs.append(Segment(text, self._styles["header"]))
        return Strip(segs).adjust_cell_length(width, self._base).apply_style(self._base)

    def _render_row(self, row: int, col0: int, ncols: int, width: int) -> Strip:
        assert self.data is not None
        data = self.data
        on_row = self.cursor[0] == row
        label_style = self._styles["label_cursor" if on_row else "label"]
        segs = [Segment(data.row_labels[row][: self._gutter - 1].rjust(self._gutter - 1) + " ", label_style)]
        levels = self._levels[row]
        decides = self.scale.decides
        failed = data.failed[row]
        nan_inf = data.nan_inf[row]
        end = min(col0 + ncols, levels.shape[0])
        for j in range(col0, end):
            lv = int(levels[j])
            if nan_inf[j]:
                style, glyph = self._styles["nan"], GLYPH_NAN
            elif lv < 0:
                style, glyph = self._styles["none"], GLYPH_NONE
            else:
                style = self._palette[lv]
                glyph = GLYPH_FAIL if (failed[j] or (decides and lv >= PASS_LEVELS)) else " "
                if glyph != " ":
                    style = style + Style(color=self._glyph_fg[lv], bold=True)
            segs.append(Segment(*self._cell(glyph, style, lv, on_row and j == self.cursor[1])))
        return Strip(segs).adjust_cell_length(width, self._base).apply_style(self._base)

    def _cell(self, glyph: str, style: Style, level: int, cursor: bool) -> tuple[str, Style]:
        """One cell's text: its glyph centred; the cursor cell brackets the glyph (`▶×◀`), or on two
        columns shows the glyph reversed next to `◀`, so a failing cursor never reads like two cells."""
        w = self.cell_w
        if not cursor:
            left = (w - 1) // 2
            return " " * left + glyph + " " * (w - 1 - left), style
        fg = self._glyph_fg[max(level, 0)] if level >= 0 else None
        mark = style + Style(color=fg, bold=True)
        if w >= 3:
            left = (w - 3) // 2
            return " " * left + "▶" + glyph + "◀" + " " * (w - 3 - left), mark
        return ("◀▶" if glyph == " " else glyph + "◀"), mark + Style(reverse=glyph != " ", underline=True)
