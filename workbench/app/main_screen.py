"""The main screen: heatmap + legend, detail pane, side-by-side topology trees, status line."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Static, Tree

from workbench.analysis.explore import (
    METRICS,
    Explorer,
    Heatmap,
    NodeStatus,
    PairDetail,
    TensorDiff,
    TreeRow,
)
from workbench.app.actions import bindings
from workbench.app.detail import render_detail
from workbench.app.heatmap import GLYPH_FAIL, GLYPH_NAN, GLYPH_NONE, LEVEL_EDGES, HeatmapView
from workbench.app.opcause import OpCauseActions, PrecheckPanel
from workbench.app.themes import DOMAIN_DEFAULTS, HEAT_LEVELS
from workbench.app.trees import TopologyTree

METRIC_ORDER = [m for m in METRICS if m != "added_error"]


@dataclass
class HeatmapReady(Message):
    data: Heatmap
    cursor: tuple[int, int] | None


@dataclass
class TreesReady(Message):
    golden: list[TreeRow]
    test: list[TreeRow]


@dataclass
class StatusReady(Message):
    token: int
    status: dict[int, NodeStatus]
    born: int | None


@dataclass
class DetailReady(Message):
    detail: PairDetail | None
    diff: TensorDiff | None


@dataclass
class SelectNode(Message):
    """Select a golden node (drill result or verdict) once its data arrives."""

    node_id: int | None


class MainScreen(OpCauseActions, Screen[None]):
    """Where the user finds the token, the layer and the op where the error is born."""

    BINDINGS = bindings("main")
    DEFAULT_CSS = """
    MainScreen #status { height: 1; background: $panel; padding: 0 1; }
    MainScreen #top { height: 45%; }
    MainScreen #heat-pane { width: 1fr; border: round $secondary 50%; }
    MainScreen #heat-pane:focus-within { border: round $primary; }
    MainScreen #heat-title { height: 1; padding: 0 1; text-style: bold; }
    MainScreen #legend { height: 2; padding: 0 1; }
    MainScreen #detail-pane { width: 48%; border: round $secondary 50%; padding: 0 1; scrollbar-gutter: stable; }
    MainScreen #detail-pane:focus-within { border: round $primary; }
    MainScreen #trees { height: 1fr; }
    MainScreen TopologyTree { width: 1fr; border: round $secondary 50%; }
    MainScreen TopologyTree:focus { border: round $primary; }
    """

    def __init__(self, explorer: Explorer, token: int | None = None) -> None:
        super().__init__()
        self.explorer = explorer
        info = explorer.info
        self.token = token if token is not None and token in info.tokens else (info.tokens[0] if info.tokens else 0)
        self.metric = "cosine_similarity"
        self.color_by_added = False
        self.drill_layer: int | None = None  # drilled-down layer, None = layers view
        self.selected: int | None = None  # golden node id
        self.born_id: int | None = None
        self.status: dict[int, NodeStatus] = {}
        self.status_token: int | None = None  # token the trees are coloured for
        self._legend_key: tuple[object, ...] = ()
        self._vars: dict[str, str] = {}
        self.first_paint_at: float | None = None
        self._pending_select: int | None = None
        self._cursor_node: int | None = None  # op row to put the heatmap cursor on once it arrives
        self._layer_rows: Heatmap | None = None  # last layers view, to return to the same row
        self._loaded = {"heatmap": False, "trees": False}

    # ------------------------------------------------------------------ layout
    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        with Horizontal(id="top"):
            with Vertical(id="heat-pane"):
                yield Static("", id="heat-title")
                yield HeatmapView(id="heatmap")
                yield Static("", id="legend")
            with VerticalScroll(id="detail-pane"):
                yield Static(render_detail(None, None, {}), id="detail")
                yield PrecheckPanel("", id="precheck")
        with Horizontal(id="trees"):
            golden = TopologyTree("golden", id="golden-tree")
            golden.border_title = "golden"
            yield golden
            test = TopologyTree("test", id="test-tree")
            test.border_title = "test"
            yield test
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#detail-pane").border_title = "detail"
        self.query_one(HeatmapView).focus()
        self.watch(self.app, "theme", lambda _theme: self._update_titles(), init=False)
        self._update_titles()
        self.load_heatmap(self.metric, self.drill_layer, None)
        self.load_trees()
        self.load_status(self.token)

    def set_explorer(self, explorer: Explorer) -> None:
        """Switch to a reopened catalog (after an edit): reload everything shown."""
        self.explorer = explorer
        self.load_heatmap(self.metric, self.drill_layer, self.query_one(HeatmapView).cursor)
        self.load_trees()
        self.load_status(self.token)
        if self.selected is not None:
            self.load_detail(self.selected, self.token)

    # ------------------------------------------------------------------ workers (never touch widgets)
    @work(thread=True, exclusive=True, group="heatmap", exit_on_error=False)
    def load_heatmap(self, metric: str, layer: int | None, cursor: tuple[int, int] | None) -> None:
        self.post_message(HeatmapReady(self.explorer.heatmap(metric, layer), cursor))

    @work(thread=True, exclusive=True, group="trees", exit_on_error=False)
    def load_trees(self) -> None:
        self.post_message(TreesReady(self.explorer.tree_rows("golden"), self.explorer.tree_rows("test")))

    @work(thread=True, exclusive=True, group="status", exit_on_error=False)
    def load_status(self, token: int) -> None:
        metric = "added_error" if self.color_by_added else self.metric
        status = self.explorer.node_status(token, metric if metric in METRICS else "cosine_similarity")
        self.post_message(StatusReady(token, status, self.explorer.born(token)[0]))

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_detail(self, node_id: int, token: int) -> None:
        detail = self.explorer.pair_detail(node_id, token)
        self.post_message(DetailReady(detail, None))
        outs = [p for p in detail.pairs if p.io == "out"] or detail.pairs
        if not outs:
            return
        worst = next((p for p in outs if p.passed is False), outs[0])
        self.post_message(DetailReady(detail, self.explorer.tensor_diff(worst)))

    @work(thread=True, exclusive=True, group="drill", exit_on_error=False)
    def find_worst(self, token: int, layer: int | None) -> None:
        self.post_message(SelectNode(self.explorer.worst_node(token, layer, self.metric)))

    # ------------------------------------------------------------------ results
    def on_heatmap_ready(self, msg: HeatmapReady) -> None:
        view = self.query_one(HeatmapView)
        cursor = msg.cursor
        if cursor is None and msg.data.tokens:
            col = msg.data.tokens.index(self.token) if self.token in msg.data.tokens else 0
            cursor = (view.cursor[0] if msg.data.layer is None else 0, col)
        if msg.data.layer is not None and self._cursor_node in msg.data.row_nodes:
            cursor = (msg.data.row_nodes.index(self._cursor_node), cursor[1] if cursor else 0)
            self._cursor_node = None
        view.set_data(msg.data, self._bound(msg.data.metric), cursor)
        if msg.data.layer is None:
            self._layer_rows = msg.data
        self._update_titles()
        self._mark_loaded("heatmap")

    def on_trees_ready(self, msg: TreesReady) -> None:
        for tree, rows in ((self._tree("golden"), msg.golden), (self._tree("test"), msg.test)):
            tree.set_rows(rows)
        self._recolour()
        self._update_titles()
        if self._pending_select is not None:
            self.select_node(self._pending_select)
        self._mark_loaded("trees")

    def on_status_ready(self, msg: StatusReady) -> None:
        if msg.token != self.token:
            return
        self.status = msg.status
        self.status_token = msg.token
        self.born_id = msg.born
        self._recolour()
        self._update_titles()

    def on_detail_ready(self, msg: DetailReady) -> None:
        styles = self._domain_colours()
        self.query_one("#detail", Static).update(render_detail(msg.detail, msg.diff, styles))

    def on_select_node(self, msg: SelectNode) -> None:
        if msg.node_id is None:
            return
        self.select_node(msg.node_id)
        view = self.query_one(HeatmapView)
        if view.data is not None and msg.node_id in view.data.row_nodes:
            view.move_cursor(view.data.row_nodes.index(msg.node_id), view.cursor[1])
        else:
            self._cursor_node = msg.node_id  # the op rows have not arrived yet

    def _mark_loaded(self, what: str) -> None:
        self._loaded[what] = True
        if self.first_paint_at is None and all(self._loaded.values()):
            self.call_after_refresh(self._painted)

    def _painted(self) -> None:
        if self.first_paint_at is None:
            self.first_paint_at = time.perf_counter()

    # ------------------------------------------------------------------ helpers
    def _tree(self, side: str) -> TopologyTree:
        return self.query_one(f"#{side}-tree", TopologyTree)

    def _bound(self, metric: str) -> float:
        return self.explorer.info.bound(metric)

    def _variables(self) -> dict[str, str]:
        """Theme variables, computed once per theme (building them costs a few milliseconds)."""
        if self._vars.get("__theme__") != self.app.theme:
            self._vars = {**DOMAIN_DEFAULTS, **self.app.get_css_variables(), "__theme__": self.app.theme}
        return self._vars

    def _domain_colours(self) -> dict[str, str]:
        v = self._variables()
        return {k: v[k] for k in ("ok", "warn", "fail", "nan", "unmatched", "born")}

    def _recolour(self) -> None:
        for side in ("golden", "test"):
            self._tree(side).set_status(
                self.status,
                self.metric,
                self._bound(self.metric),
                self._bound("added_error"),
                self.color_by_added,
                self.born_id,
            )

    def _update_titles(self) -> None:
        info = self.explorer.info
        view = self.query_one(HeatmapView)
        label = METRICS[self.metric][1]
        where = "layers" if self.drill_layer is None else f"ops of layer {self.drill_layer} (u: back)"
        self.query_one("#heat-title", Static).update(f"{label} by token x {where}", layout=False)
        born = "…"
        if self.born_id is not None:
            row = self._tree("golden").rows.get(self.born_id)
            born = row.name if row else f"node {self.born_id}"
        elif self.status:
            born = "nothing fails"
        colour = "added error" if self.color_by_added else label
        status = Text.assemble(
            (f"cmp {info.cmp_id} ", "bold"),
            f"{info.golden_kind} vs {info.test_kind}  ",
            ("token ", "bold"),
            f"{self.token} ",
            ("metric ", "bold"),
            f"{label}  ",
            ("trees ", "bold"),
            f"{colour}  ",
            ("error born at: ", "bold"),
            (born, self._domain_colours()["born"]),
        )
        self.query_one("#status", Static).update(status, layout=False)
        legend_key = (self.metric, self._bound(self.metric), self.app.theme)
        if legend_key != self._legend_key:
            self._legend_key = legend_key
            self.query_one("#legend", Static).update(self._legend(view), layout=False)

    def _legend(self, view: HeatmapView) -> Text:
        v = self._variables()
        metric = self.metric
        bound = self._bound(metric)
        higher = METRICS[metric][2]
        text = Text()
        rule = f"{METRICS[metric][1]} {'≥' if higher else '≤'} {bound:g} passes  "
        text.append(rule, style="bold")
        edges = (0.0, *LEVEL_EDGES)
        for i in range(HEAT_LEVELS):
            lo = edges[i]
            text.append("  ", style=f"on {v[f'heat-{i}']}")
            text.append(f"{_edge_value(lo, metric, bound)} " if i in (0, 4, 6) else " ")
        text.append("\n")
        text.append(f" {GLYPH_FAIL} ", style=f"bold on {v['heat-5']}")
        text.append(" fails ")
        text.append(f" {GLYPH_NAN} ", style=f"bold on {v['nan']}")
        text.append(" NaN/Inf ")
        text.append(f" {GLYPH_NONE} ", style=v["unmatched"])
        text.append(" not compared   enter: select  m: metric  a: tree colour")
        return text

    # ------------------------------------------------------------------ selection
    def select_node(self, golden_id: int) -> None:
        """Select a golden node everywhere: both trees (the test side follows) and the detail pane."""
        golden = self._tree("golden")
        if not golden.rows:
            self._pending_select = golden_id
            return
        self._pending_select = None
        self.selected = golden_id
        golden.reveal(golden_id)
        self._follow("golden", golden_id)
        self.load_detail(golden_id, self.token)

    def _follow(self, side: str, node_id: int) -> None:
        """Make the other tree show the counterpart of `node_id` (of `side`)."""
        src = self._tree(side)
        other = self._tree("test" if side == "golden" else "golden")
        row = src.rows.get(node_id)
        if row is None:
            return
        counterpart = self._counterpart_now(side, node_id, row.counterpart)
        if counterpart is None:
            return
        cur = other.cursor_node
        if cur is None or cur.data is None or cur.data.node_id != counterpart:
            other.reveal(counterpart)

    def _counterpart_now(self, side: str, node_id: int, fallback: int | None) -> int | None:
        """The counterpart at the current token (a golden module pairs with the prefill graph's op at token 0
        and the decoder graph's at later tokens); the first match when the token says nothing."""
        if side == "golden":
            st = self.status.get(node_id)
            return st.counterpart if st is not None and st.counterpart is not None else fallback
        return next((st.node_id for st in self.status.values() if st.counterpart == node_id), fallback)

    @on(Tree.NodeHighlighted)
    def _tree_highlighted(self, event: Tree.NodeHighlighted[TreeRow]) -> None:
        tree = event.control
        row = event.node.data
        if not isinstance(tree, TopologyTree) or row is None or not tree.has_focus:
            return
        self._follow(tree.side, row.node_id)
        gid = tree.golden_id(row)
        if gid is not None and gid != self.selected:
            self.selected = gid
            self.load_detail(gid, self.token)
        elif gid is None:
            self.query_one("#detail", Static).update(
                Text(f"{row.name} ({row.type}): unmatched on the test side; pair it in the mapping editor (e).")
            )

    @on(HeatmapView.CellHighlighted)
    def _cell_highlighted(self, event: HeatmapView.CellHighlighted) -> None:
        data = event.view.data
        if data is None or not data.tokens:
            return
        token = data.tokens[event.col]
        if token != self.token:
            self.set_token(token)

    def set_token(self, token: int) -> None:
        """Change the current token: recolour trees, refresh the detail pane."""
        self.token = token
        self._update_titles()
        self.load_status(token)
        if self.selected is not None:
            self.load_detail(self.selected, token)

    @on(HeatmapView.CellSelected)
    def _cell_selected(self, event: HeatmapView.CellSelected) -> None:
        data = event.view.data
        if data is None:
            return
        token = data.tokens[event.col]
        if token != self.token:
            self.set_token(token)
        if data.layer is None:
            layer = data.row_layers[event.row]
            if layer is not None:
                self.drill_layer = layer
                self.load_heatmap(self.metric, layer, None)
            self.find_worst(token, layer)
        else:
            node = data.row_nodes[event.row]
            if node is not None:
                self.select_node(node)

    # ------------------------------------------------------------------ actions
    def action_next_token(self) -> None:
        view = self.query_one(HeatmapView)
        view.move_cursor(view.cursor[0], view.cursor[1] + 1)

    def action_prev_token(self) -> None:
        view = self.query_one(HeatmapView)
        view.move_cursor(view.cursor[0], view.cursor[1] - 1)

    def _focused_tree(self) -> TopologyTree:
        focused = self.focused
        return focused if isinstance(focused, TopologyTree) else self._tree("golden")

    def _step_failing(self, step: int) -> None:
        tree = self._focused_tree()
        cur = tree.cursor_node.data.node_id if tree.cursor_node and tree.cursor_node.data else None
        nid = tree.next_failing(cur, step)
        if nid is None:
            self.notify(f"no failing node at token {self.token}")
            return
        tree.reveal(nid)
        gid = tree.golden_id(tree.rows[nid])
        self._follow(tree.side, nid)
        if gid is not None:
            self.selected = gid
            self.load_detail(gid, self.token)

    def action_next_failing(self) -> None:
        self._step_failing(1)

    def action_prev_failing(self) -> None:
        self._step_failing(-1)

    def action_goto_born(self) -> None:
        if self.born_id is None:
            self.notify(f"token {self.token}: every output passes")
            return
        self.select_node(self.born_id)

    def action_toggle_color(self) -> None:
        self.color_by_added = not self.color_by_added
        self.load_status(self.token)
        self._update_titles()

    def action_next_metric(self) -> None:
        i = METRIC_ORDER.index(self.metric) if self.metric in METRIC_ORDER else -1
        self.metric = METRIC_ORDER[(i + 1) % len(METRIC_ORDER)]
        self.load_heatmap(self.metric, self.drill_layer, self.query_one(HeatmapView).cursor)
        self.load_status(self.token)
        self._update_titles()

    def action_drill_up(self) -> None:
        if self.drill_layer is None:
            return
        layer = self.drill_layer
        self.drill_layer = None
        view = self.query_one(HeatmapView)
        rows = self._layer_rows.row_layers if self._layer_rows is not None else []
        row = rows.index(layer) if layer in rows else 0
        self.load_heatmap(self.metric, None, (row, view.cursor[1]))

    def action_focus_next_pane(self) -> None:
        self.focus_next()

    def action_open_mapping(self) -> None:
        from workbench.app.mapping_screen import MappingScreen

        self.app.push_screen(MappingScreen())

    def action_open_sql(self) -> None:
        from workbench.app.sql_screen import SqlScreen

        self.app.push_screen(SqlScreen())


def _edge_value(sev: float, metric: str, bound: float) -> str:
    """The metric value at a severity edge, for the legend."""
    if METRICS[metric][2]:
        return f"{1 - sev * (1 - bound):.4g}"
    return f"{sev * bound:.3g}"
