"""A lazy topology tree (golden or test) coloured by the per-token node roll-ups."""

from __future__ import annotations

import math
from collections import defaultdict

from rich.style import Style
from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from workbench.analysis.explorer.layer_groups import summarize_group
from workbench.analysis.explorer.severity import ADDED_ERROR, HEAT_LEVELS, LEVEL_EDGES, VERDICT, severity
from workbench.analysis.explorer.views import (
    BORN_ADVISOR,
    BORN_FAILS,
    BORN_PRECHECK,
    LayerGroupSummary,
    NodeStatus,
    Side,
    TreeRow,
)
from workbench.app.themes import DOMAIN_DEFAULTS

# what a row's suffix calls the node the token's verdict names, as the detail pane does
_BORN_LABELS = {
    BORN_FAILS: "error born here",
    BORN_PRECHECK: "error pinned here",
    BORN_ADVISOR: "most likely origin",
}


class TopologyTree(Tree[TreeRow]):
    """One side's modules in execution order; children are created when a node is first expanded."""

    def __init__(self, side: Side, *, id: str | None = None) -> None:
        super().__init__(side, id=id)
        self.guide_depth = 2  # deep models: narrow guides leave room for the names
        self.side = side
        self.show_root = False
        self.auto_expand = False
        self.rows: dict[int, TreeRow] = {}
        self.children_of: dict[int | None, list[TreeRow]] = defaultdict(list)
        self.order: list[int] = []  # node ids in execution order
        self.tree_nodes: dict[int, TreeNode[TreeRow]] = {}
        self.status: dict[int, NodeStatus] = {}  # by golden node id
        self.by_test: dict[int, NodeStatus] = {}  # the same roll-ups by the test node compared at this token
        self.metric = VERDICT
        self.bound: float | None = 1.0
        self.added_bound: float | None = None
        self.color_by_added = False
        self.born_id: int | None = None  # node of THIS side where the error is born at this token
        self.born_label = _BORN_LABELS[BORN_FAILS]  # what the verdict calls it (the advisor's origin: no op fails)
        self.badges: dict[tuple[int, int], tuple[str, str]] = {}  # (golden id, token) -> (text, style key)
        self.token: int | None = None  # the token the badges are shown for
        self.shapes: dict[int, str] = {}  # node id -> output shape at the token shown (else the row's first)
        self._styles: dict[str, Style] = {}
        self._revealed: TreeNode[TreeRow] | None = None  # the node the last reveal centred

    # ------------------------------------------------------------------ data
    def set_rows(self, rows: list[TreeRow]) -> None:
        """Load the topology (top level shown at once, the rest on expand)."""
        self.clear()
        self.rows = {r.node_id: r for r in rows}
        self.children_of = defaultdict(list)
        for r in rows:
            parent = r.parent_id if r.parent_id in self.rows else None
            self.children_of[parent].append(r)
        self.order = [r.node_id for r in rows]
        self.tree_nodes = {}
        self._populate(self.root, None)
        # open the top so the user sees the model's main modules (a layer's group of calls stays closed: it is
        # there to fold a long list)
        for child in list(self.root.children):
            if child.data is not None and child.data.parent_id is None and not child.data.is_layer_group:
                self._expand(child)

    def _populate(self, node: TreeNode[TreeRow], node_id: int | None) -> None:
        for r in self.children_of.get(node_id, []):
            has_children = bool(self.children_of.get(r.node_id))
            child = node.add(r.short_name, data=r, allow_expand=has_children)
            self.tree_nodes[r.node_id] = child

    def _expand(self, node: TreeNode[TreeRow]) -> None:
        if node.data is not None and not node.children and self.children_of.get(node.data.node_id):
            self._populate(node, node.data.node_id)
        node.expand()

    def _on_tree_node_expanded(self, event: Tree.NodeExpanded[TreeRow]) -> None:
        node = event.node
        if node.data is not None and not node.children:
            self._populate(node, node.data.node_id)

    def set_status(
        self,
        status: dict[int, NodeStatus],
        metric: str,
        bound: float | None,
        added_bound: float | None,
        by_added: bool,
        born_id: int | None,
        born_why: str | None = None,
    ) -> None:
        """Recolour for a token: `status` is keyed by golden node id, `born_id` is a node of this side, named by the
        token's verdict for `born_why` (`views.BORN_*`: where the error is born, pinned by the precheck, or, no op
        failing, the advisor's most likely origin).

        The test side reads each op's roll-up through the test node compared at this token, so an op
        that did not run at this token (a prefill op at a decode token) shows `·` and no verdict."""
        before = {nid: self._signature(tn.data) for nid, tn in self.tree_nodes.items() if tn.data is not None}
        self.status = status
        by_test: dict[int, NodeStatus] = {}
        for st in status.values():
            if st.counterpart is None:
                continue
            old = by_test.get(st.counterpart)
            # several golden nodes can meet one test op: the verdict's, else a failing one, wins
            if old is None or (st.born, st.passed is False) > (old.born, old.passed is False):
                by_test[st.counterpart] = st
        self.by_test = by_test
        self.born_id = born_id
        label = _BORN_LABELS.get(born_why or "", _BORN_LABELS[BORN_FAILS])
        born_row = self.tree_nodes.get(born_id) if born_id is not None else None
        if label != self.born_label and born_row is not None:
            born_row.refresh()
        self.born_label = label
        mode_changed = (metric, bound, added_bound, by_added) != (
            self.metric,
            self.bound,
            self.added_bound,
            self.color_by_added,
        )
        self.metric, self.bound, self.added_bound, self.color_by_added = metric, bound, added_bound, by_added
        # repaint only the lines whose mark or colour changed (no layout pass, no full redraw)
        for nid, tn in self.tree_nodes.items():
            if tn.data is not None and (mode_changed or before.get(nid) != self._signature(tn.data)):
                tn.refresh()

    def golden_id(self, row: TreeRow) -> int | None:
        """The golden node a row stands for at the current token (the test side: its counterpart now); None for a
        layer's group row."""
        if row.is_layer_group:
            return None
        if self.side == "golden":
            return row.node_id
        st = self.by_test.get(row.node_id)
        return st.node_id if st is not None else row.counterpart

    def status_of(self, row: TreeRow) -> NodeStatus | None:
        if self.side == "test":
            return self.by_test.get(row.node_id)
        return self.status.get(row.node_id)

    def failing(self, row: TreeRow) -> bool:
        """Whether a node fails at the token shown (a layer's group row never: `n`/`N` go from call to call)."""
        st = self.status_of(row)
        return st is not None and (st.passed is False or st.has_nan_inf)

    def group_summary(self, row: TreeRow, token: int | None = None) -> LayerGroupSummary:
        """A layer's group row at the token whose statuses are shown (`layer_groups.summarize_group`)."""
        calls = self.children_of.get(row.node_id, [])
        return summarize_group(row, self.side, calls, self.status_of, self._severity, self.born_id, token)

    def _severity(self, st: NodeStatus) -> float | None:
        """The status's severity by the colouring shown (None: no bound, or nothing measured)."""
        bound = self.added_bound if self.color_by_added else self.bound
        raw = st.added_error if self.color_by_added else st.worst
        if bound is None or raw is None or math.isnan(raw):
            return None
        return severity(raw, ADDED_ERROR if self.color_by_added else self.metric, bound)

    # ------------------------------------------------------------------ navigation
    def reveal(self, node_id: int) -> bool:
        """Expand the ancestors of a node, move the cursor to it and scroll it into view."""
        if node_id not in self.rows:
            return False
        chain: list[int] = []
        cur: int | None = node_id
        while cur is not None and cur in self.rows:
            chain.append(cur)
            cur = self.rows[cur].parent_id
        for nid in reversed(chain[1:]):
            tn = self.tree_nodes.get(nid)
            if tn is not None and not tn.is_expanded:
                self._expand(tn)
        target = self.tree_nodes.get(node_id)
        if target is None:
            return False
        _ = self._tree_lines  # rebuild line numbers after expanding
        if self.cursor_node is not target:
            self.move_cursor(target, animate=False)
        self._revealed = target
        self._center_on(target)
        # a reveal right after start-up can run before layout gives this tree its final height, and the
        # scroll above is clamped to the size it has now: scroll again once the screen has been laid out
        self.call_after_refresh(self._center_on, target)
        return True

    def watch_virtual_size(self) -> None:
        # lines added or removed after a reveal (a branch expanded as the other side follows, rows arriving) move
        # the revealed node: centre it again while the cursor still rests on it, as after a resize
        revealed = getattr(self, "_revealed", None)  # (the tree sets its size before this class's __init__ ends)
        if revealed is not None and self.cursor_node is revealed:
            self.call_after_refresh(self._center_on, revealed)

    def watch_show_vertical_scrollbar(self, shown: bool) -> None:
        # Textual moves a scrollbar's thumb on a scroll only while the bar is shown: a bar that appears after the tree
        # scrolled (a reveal at start-up, before the rows filled the tree) kept its thumb at the top
        if shown:
            self.vertical_scrollbar.position = self.scroll_y

    def watch_show_horizontal_scrollbar(self, shown: bool) -> None:
        if shown:
            self.horizontal_scrollbar.position = self.scroll_x

    def on_resize(self) -> None:
        # the tree's height changes after a reveal when a bar above it appears (the rank bar, once its data
        # is in): keep the revealed node centred while the cursor still rests on it
        if self._revealed is not None and self.cursor_node is self._revealed:
            self.call_after_refresh(self._center_on, self._revealed)

    def _center_on(self, node: TreeNode[TreeRow]) -> None:
        """Scroll so that `node` is in the middle: where it lands then depends only on the tree's final
        height, not on where the view was (a minimal scroll left it one line apart between runs)."""
        before, self.center_scroll = self.center_scroll, True
        try:
            self.scroll_to_node(node, animate=False)
        finally:
            self.center_scroll = before

    def next_failing(self, start: int | None, step: int = 1) -> int | None:
        """The next (or previous) failing node after `start` in execution order, wrapping around."""
        if not self.order:
            return None
        idx = self.order.index(start) if start in self.rows else -1
        n = len(self.order)
        for k in range(1, n + 1):
            nid = self.order[(idx + k * step) % n]
            if self.failing(self.rows[nid]):
                return nid
        return None

    def set_shapes(self, shapes: dict[int, str]) -> None:
        """The output shapes at the token shown; lines are drawn again only when they differ from the last token's."""
        if shapes != self.shapes:
            self.shapes = shapes
            self._invalidate()

    def set_badge(self, golden_id: int, token: int, badge: tuple[str, str]) -> None:
        """Show `badge` (text, style key) on a node at `token`, drawn now (not at the next cursor move)."""
        self.badges[(golden_id, token)] = badge
        self.token = token
        self._invalidate()

    # ------------------------------------------------------------------ rendering
    def on_mount(self) -> None:
        self._load_styles()
        self.watch(self.app, "theme", self._theme_changed, init=False)

    def _theme_changed(self, _theme: str) -> None:
        self._load_styles()
        self._invalidate()

    def _load_styles(self) -> None:
        v = {**DOMAIN_DEFAULTS, **self.app.get_css_variables()}
        self._styles = {k: Style(color=v[k]) for k in ("ok", "warn", "fail", "nan", "unmatched", "born")}
        self._styles["heat"] = Style()
        for i in range(HEAT_LEVELS):
            self._styles[f"heat-{i}"] = Style(color=v[f"heat-{i}"]) if i >= 2 else Style(color=v["ok"])
        self._styles["dim"] = Style(dim=True)

    def _signature(self, row: TreeRow) -> tuple[str, int, bool]:
        """What a label shows of the status: mark, colour level, verdict flag (a group row: its calls' worst)."""
        if row.is_layer_group:
            return self._group_signature(row)
        st = self.status_of(row)
        if row.counterpart is None and row.has_tensors:
            mark = "?"
        elif st is None or (st.passed is None and not st.has_nan_inf):
            mark = "·"
        elif st.has_nan_inf:
            mark = "!"
        else:
            mark = "✗" if st.passed is False else "✓"
        return mark, _level(None if st is None else self._severity(st)), row.node_id == self.born_id

    def _group_signature(self, row: TreeRow, summary: LayerGroupSummary | None = None) -> tuple[str, int, bool]:
        """A group row's mark and colour: its worst call's (NaN/Inf, then failing, then passing)."""
        s = summary or self.group_summary(row)
        mark = "!" if s.nan_inf else "✗" if s.failed else "✓" if s.compared else "·"
        return mark, _level(s.worst_severity), s.born is not None

    def render_label(self, node: TreeNode[TreeRow], base_style: Style, style: Style) -> Text:
        row = node.data
        if row is None:
            return super().render_label(node, base_style, style)
        prefix = ("▼ " if node.is_expanded else "▶ ") if node.allow_expand else "  "
        if row.is_layer_group:
            return self._group_label(row, prefix, base_style, style)
        mark, level, born = self._signature(row)
        key = {"?": "unmatched", "·": "unmatched", "!": "nan", "✗": "fail", "✓": "ok"}[mark]
        mstyle = self._styles.get(key, Style())
        name_style = self._styles.get(f"heat-{level}", mstyle) if level >= 0 else mstyle
        gid = self.golden_id(row)
        badge = self.badges.get((gid, self.token)) if gid is not None and self.token is not None else None
        badge_style = self._styles.get(badge[1], Style()) + Style(bold=True) if badge else Style()
        text = Text.assemble(
            (prefix, base_style),
            (mark + " ", mstyle + Style(bold=True)),
            ("◆ " if born else "", self._styles.get("born", Style()) + Style(bold=True)),
            # before the name: an 80-column tree has no room after it
            (f"{badge[0]} " if badge else "", badge_style),
            (row.short_name, name_style + style),
            (f" {row.type_shown}" if row.type_shown else "", self._styles.get("dim", Style())),
            (
                f" {shape}" if (shape := self.shapes.get(row.node_id, row.shape)) else "",
                self._styles.get("dim", Style()),
            ),
        )
        if mark == "?":
            text.append(" unmatched", self._styles.get("unmatched", Style()))
        if born:
            text.append(f" {self.born_label}", self._styles.get("born", Style()) + Style(bold=True))
        return text

    def _group_label(self, row: TreeRow, prefix: str, base_style: Style, style: Style) -> Text:
        """`▶ ✗ ◆ layer 1  30 calls, 9 fail`: the mark and colour of its worst call, ◆ when the error is born in it."""
        summary = self.group_summary(row)
        mark, level, born = self._group_signature(row, summary)
        key = {"·": "unmatched", "!": "nan", "✗": "fail", "✓": "ok"}[mark]
        mstyle = self._styles.get(key, Style())
        name_style = self._styles.get(f"heat-{level}", mstyle) if level >= 0 else mstyle
        counts = f"  {summary.calls} calls"
        if summary.failed:
            counts += f", {summary.failed} fail"
        if summary.nan_inf:
            counts += f", {summary.nan_inf} NaN/Inf"
        return Text.assemble(
            (prefix, base_style),
            (mark + " ", mstyle + Style(bold=True)),
            ("◆ " if born else "", self._styles.get("born", Style()) + Style(bold=True)),
            (row.name, name_style + Style(bold=True) + style),
            (counts, self._styles.get("dim", Style())),
        )


def _level(sev: float | None) -> int:
    """The colour step of a severity (-1: none)."""
    return -1 if sev is None else sum(1 for e in LEVEL_EDGES if sev >= e)
