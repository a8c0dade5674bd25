"""The main screen: heatmap + legend, detail pane, side-by-side topology trees, status line.

One selection drives every pane: `select()` puts a golden node (and the current token) in both
trees, under the heatmap cursor and in the detail pane, whichever pane or key asked for it.
"""

from __future__ import annotations

import time
from dataclasses import replace

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.timer import Timer
from textual.widgets import Static, Tree

from workbench.analysis.explorer.explore import POST, PRE, Explorer
from workbench.analysis.explorer.ranks import step
from workbench.analysis.explorer.severity import (
    ADDED_ERROR,
    COLOURINGS,
    HEAT_LEVELS,
    HEATMAP_COLOURINGS,
    LEVEL_EDGES,
    VERDICT,
    Scale,
    value_at,
)
from workbench.analysis.explorer.views import BORN_ADVISOR, Heatmap, NodeStatus, TokenStatus, TokenVerdict, TreeRow
from workbench.app.actions import bindings
from workbench.app.detail import render_detail, render_layer_group, render_node_tensors
from workbench.app.footer import KeysFooter
from workbench.app.heatmap import GLYPH_FAIL, GLYPH_NAN, GLYPH_NONE, HeatmapView
from workbench.app.logits_strip import LogitsStrip
from workbench.app.messages import (
    AdviceReady,
    CallDrift,
    ComparisonChosen,
    DetailReady,
    GroupOf,
    HeatmapReady,
    MappingStale,
    NodeTensorsReady,
    RanksReady,
    SelectNode,
    StatusReady,
    TreesReady,
)
from workbench.app.opcause import OpCauseActions, PrecheckPanel
from workbench.app.rank_bar import RankBar
from workbench.app.screens import PickerEntry, PickerScreen, Session, WorkbenchScreen
from workbench.app.themes import DOMAIN_DEFAULTS
from workbench.app.trees import TopologyTree
from workbench.core.advice import STANDS_OUT, score_text

MIN_TREES_H = 6  # rows the trees keep whatever the terminal
LEGEND_W = 30  # the heatmap pane is at least this wide, for the legend
WIDE_FROM = 160  # columns from which the heatmap pane takes at least WIDE_HEAT_SHARE of the width
WIDE_HEAT_SHARE = 0.45
DETAIL_AFTER_TOKEN_S = 2 / 60  # two frames at Textual's 60 per second: the token's repaint comes first
TOP_SHARE = 0.6  # of the rows below the status line: heatmap and detail pane


OPS_FOUND = 50  # the ops the command palette lists for a name typed


class MainScreen(OpCauseActions, WorkbenchScreen[None]):
    """Where the user finds the token, the layer and the op where the error is born."""

    SCOPE = "main"
    BINDINGS = bindings("main")

    def __init__(self, session: Session, token: int | None = None, select: int | None = None) -> None:
        super().__init__(session)
        info = session.explorer.info
        self.token = token if token is not None and token in info.tokens else (info.tokens[0] if info.tokens else 0)
        self.metric = VERDICT  # the heatmap's (and the trees') colouring
        self.color_by_added = False
        self.color_by_quant = False  # a quantized comparison: the trees by the error beyond the expected int8 noise
        self._quantized: bool | None = None
        self.drill_layer: int | None = None  # drilled-down row group (a layer, PRE or POST), None = layers view
        self.selected: int | None = None  # golden node id
        # the status token's verdict: where the error is born and what that rests on (one home for all five facts)
        self.verdict = TokenVerdict(None, None, None, None, None)
        self._detail_timer: Timer | None = None
        self._heat_w = 0  # the heatmap pane's width as last laid out (0: not yet)
        self.status: dict[int, NodeStatus] = {}
        self.status_token: int | None = None  # token the trees are coloured for
        self._status_request = 0  # status loads asked for; StatusReady carries the number it answers
        # drawn again on a theme change; a (side, row id) pair: a layer's group row, counted again at a new token
        self._detail_shown: DetailReady | NodeTensorsReady | tuple[str, int] | None = None
        self._legend_key: tuple[object, ...] = ()
        self._heat_title = ""
        self._vars: dict[str, str] = {}
        self.first_paint_at: float | None = None
        self._pending_select: int | None = select
        self._initial_select = select
        self._cursor_node: int | None = None  # op row to put the heatmap cursor on once it arrives
        self._layer_rows: Heatmap | None = None  # last layers view, to return to the same row
        self._loaded = {"heatmap": False, "trees": False}
        self._last_row: int | None = None  # heatmap row of the last cursor move (a new layer row selects)
        self._follow_born = False  # the selection was the born op when the token changed: take the new token's

    # ------------------------------------------------------------------ layout
    @property
    def born_id(self) -> int | None:
        """The golden node the verdict names at the status token (born there, pinned, or the advisor's origin)."""
        return self.verdict.golden

    @property
    def born_test_id(self) -> int | None:
        """The test op the verdict pins down (a precheck's), if any."""
        return self.verdict.test

    def compose(self) -> ComposeResult:
        yield Static("", id="status")
        yield RankBar(id="ranks")
        with Horizontal(id="top"):
            with Vertical(id="heat-pane"):
                yield LogitsStrip(id="logits-strip")
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
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#detail-pane").border_title = "detail"
        self.query_one(HeatmapView).focus()
        self.watch(self.app, "theme", lambda _theme: self._on_theme(), init=False)
        self._update_titles()
        self.load_heatmap(self.metric, self.drill_layer, None)
        self.load_trees()
        self.load_status(self.token)
        self._load_strip()
        self.load_ranks()
        self.load_mapping_stale()
        self.load_call_drift()

    @work(thread=True, exclusive=True, group="call-drift", exit_on_error=False)
    def load_call_drift(self) -> None:
        lines = self.explorer.call_drift()
        if lines:
            self.post_message(CallDrift(lines))

    def on_call_drift(self, msg: CallDrift) -> None:
        repaired = all(ok for _line, ok in msg.lines)
        text = "\n".join(line for line, _ok in msg.lines)
        self.notify(text, severity="information" if repaired else "warning", timeout=20 if repaired else 30)

    @work(thread=True, exclusive=True, group="mapping-stale", exit_on_error=False)
    def load_mapping_stale(self) -> None:
        entries = self.explorer.mapping_stale()
        if entries:
            self.post_message(MappingStale(entries))

    def on_mapping_stale(self, msg: MappingStale) -> None:
        pairs = [e for e in msg.entries if e[0] == "pair"]
        rules = len(msg.entries) - len(pairs)
        parts = (
            [f"{len(pairs)} stale pair{'s' * (len(pairs) > 1)} (first: {pairs[0][3].split('; ')[0]})"] if pairs else []
        )
        parts += [f"{rules} rule{'s' * (rules > 1)} matching nothing"] if rules else []
        self.notify(
            f"mapping: {', '.join(parts)}; not used. e opens the mapping editor", severity="warning", timeout=10
        )

    def _load_strip(self) -> None:
        strip = self.query_one(LogitsStrip)
        strip.token = self.token
        strip.load(self.explorer)

    @on(LogitsStrip.TokenSelected)
    def _strip_token(self, event: LogitsStrip.TokenSelected) -> None:
        view = self.query_one(HeatmapView)
        if view.data is not None and event.token in view.data.tokens:
            view.move_cursor(view.cursor[0], view.data.tokens.index(event.token))

    def on_resize(self) -> None:
        self._fit_layout()

    def _fit_layout(self) -> None:
        """Size the panes to the data and the terminal: the heatmap pane as wide as its cells need (cells
        widen for few tokens), the detail pane taking the rest; the top row tall enough for the heatmap's
        rows when the terminal allows, the trees keeping a few rows."""
        width, height = self.size
        if not width or not height:
            return
        body = max(height - 2 - (1 if self.query_one(RankBar).display else 0), 1)  # status, ranks, footer
        view = self.query_one(HeatmapView)
        pane_w = view.preferred_width(max(int(width * 0.5), 24)) + 2  # + border
        # a wide terminal gives the heatmap pane room for its titles and the logits strip's whole line
        floor = int(width * WIDE_HEAT_SHARE) if width >= WIDE_FROM else LEGEND_W + 4
        pane_w = min(max(pane_w, floor, LEGEND_W + 4), max(width - 36, 24))
        self.query_one("#heat-pane").styles.width = pane_w
        self._heat_w = pane_w
        self._set_heat_title()  # as long as this width shows it whole
        legend = self.query_one("#legend", Static)
        legend_lines = len(self._legend(view).wrap(self.app.console, max(pane_w - 4, 10)))
        rows = view.data.values.shape[0] if view.data is not None else 4
        needed = rows + 1 + legend_lines + 1 + 2  # token header, legend, logits strip, border
        top = max(int(body * TOP_SHARE), needed)
        top = max(min(top, body - MIN_TREES_H), 6)
        self.query_one("#top").styles.height = top
        legend.styles.height = legend_lines
        ntok = len(view.data.tokens) if view.data is not None else 0
        hscroll = 1 if view.preferred_width(10_000) > pane_w - 2 and ntok else 0
        view.styles.height = max(min(rows + 1 + hscroll, top - 3 - legend_lines), 2)

    def set_explorer(self, explorer: Explorer) -> None:
        """Switch to a reopened catalog (after an edit): reload everything shown."""
        super().set_explorer(explorer)
        self._quantized = None
        self.load_heatmap(self.metric, self.drill_layer, self.query_one(HeatmapView).cursor)
        self.load_trees()
        self.load_status(self.token)
        self._load_strip()
        if self.selected is not None:
            self.load_detail(self.selected, self.token)

    # ------------------------------------------------------------------ workers (never touch widgets)
    @work(thread=True, exclusive=True, group="heatmap", exit_on_error=False)
    def load_heatmap(self, metric: str, layer: int | None, cursor: tuple[int, int] | None) -> None:
        self.post_message(HeatmapReady(self.explorer.heatmap(metric, layer), cursor))

    @work(thread=True, exclusive=True, group="trees", exit_on_error=False)
    def load_trees(self) -> None:
        self.post_message(TreesReady(self.explorer.tree_rows("golden"), self.explorer.tree_rows("test")))

    def load_status(self, token: int) -> None:
        """Colour the trees for `token`: at once when the explorer has the token's roll-ups cached (a token seen
        before, or a neighbour read ahead), else from a worker."""
        self._status_request += 1
        colour = ADDED_ERROR if self.color_by_added or self.color_by_quant else self.metric
        if not self.color_by_quant:
            view = self.explorer.cached_token_status(token, colour)
            if view is not None:
                self.on_status_ready(self._status_ready(view, view.status, self._status_request))
                return
        self._load_status(token, colour, self.color_by_quant, self._status_request)

    @staticmethod
    def _status_ready(view: TokenStatus, status: dict[int, NodeStatus], request: int) -> StatusReady:
        return StatusReady(view.token, status, view.verdict, view.shapes, request)

    @work(thread=True, exclusive=True, group="status", exit_on_error=False)
    def _load_status(self, token: int, colour: str, by_quant: bool, request: int) -> None:
        view = self.explorer.token_status(token, colour)
        status = view.status
        if by_quant:  # the advisor's score against the expected quantization noise, bound STANDS_OUT
            score = self.explorer.beyond_noise(token)
            status = {g: replace(st, added_error=score.get(g)) for g, st in status.items()}
        self.post_message(self._status_ready(view, status, request))

    @work(thread=True, exclusive=True, group="read-ahead", exit_on_error=False)
    def _read_ahead(self, tokens: list[int], colour: str) -> None:
        for token in tokens:
            self.explorer.token_status(token, colour)

    def _read_ahead_neighbours(self, token: int) -> None:
        """Read the tokens either side of `token` in a worker, so that the next token change finds them cached
        (after the first paint: until then the heatmap's and the trees' queries come first)."""
        if self.color_by_quant or self.first_paint_at is None:
            return
        tokens = self.explorer.info.tokens
        colour = ADDED_ERROR if self.color_by_added else self.metric
        i = tokens.index(token) if token in tokens else -1
        near = [tokens[j] for j in (i + 1, i - 1) if i >= 0 and 0 <= j < len(tokens)]
        missing = [t for t in near if self.explorer.cached_token_status(t, colour) is None]
        if missing:
            self._read_ahead(missing, colour)

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_detail(self, node_id: int, token: int) -> None:
        detail = self.explorer.pair_detail(node_id, token)
        if not detail.pairs:
            self.post_message(NodeTensorsReady(self.explorer.node_tensors("golden", node_id, token)))
            return
        self.post_message(DetailReady(detail, None))
        outs = [p for p in detail.pairs if p.io == "out"] or detail.pairs
        worst = next((p for p in outs if p.passed is False), outs[0])
        self.post_message(DetailReady(detail, self.explorer.tensor_diff(worst)))

    @work(thread=True, exclusive=True, group="detail", exit_on_error=False)
    def load_node_tensors(self, side: str, node_id: int, token: int) -> None:
        self.post_message(
            NodeTensorsReady(self.explorer.node_tensors("test" if side == "test" else "golden", node_id, token))
        )

    @work(thread=True, exclusive=True, group="drill", exit_on_error=False)
    def find_worst(self, token: int, layer: int | None) -> None:
        self.post_message(SelectNode(self.explorer.worst_node(token, layer, self.metric)))

    @work(thread=True, exclusive=True, group="group", exit_on_error=False)
    def find_group(self, node_id: int) -> None:
        self.post_message(GroupOf(node_id, self.explorer.group_of(node_id)))

    @work(thread=True, exclusive=True, group="ranks", exit_on_error=False)
    def load_ranks(self) -> None:
        self.post_message(RanksReady(self.explorer.ranks()))

    @work(thread=True, exclusive=True, group="advice", exit_on_error=False)
    def load_advice(self) -> None:
        from workbench.analysis.verdicts.advisor import above_higher

        rows, note = self.explorer.advice()
        marked = above_higher(rows)
        entries = [
            PickerEntry(
                f"{a.rank:>3}  token {a.token_id:<4} {a.golden_node}"
                + (f"  ⇄ {a.test_node}" if a.test_node else "")
                + f"  score {a.score:.3g}"
                + ("^" if (a.token_id, a.rank) in marked else "")
                + f"  {a.reason}",
                (a.token_id, a.golden_node_id),
            )
            for a in rows
        ]
        first_token = rows[0].token_id if rows else self.token
        for f in self.explorer.fallback():  # a quantized run: the linears worth keeping in float
            entries.append(
                PickerEntry(
                    f"keep in float #{f.rank}: {f.linear}  adds {f.added:.3g}, est. gain {f.gain:.3g} "
                    f"(final error {f.final_before:.3g} -> {f.final_after:.3g})",
                    (first_token, f.golden_node_id),
                )
            )
        self.post_message(AdviceReady(entries, note))

    # ------------------------------------------------------------------ results
    def on_heatmap_ready(self, msg: HeatmapReady) -> None:
        view = self.query_one(HeatmapView)
        cursor = msg.cursor
        if cursor is None and msg.data.tokens:
            col = msg.data.tokens.index(self.token) if self.token in msg.data.tokens else 0
            cursor = (view.cursor[0] if msg.data.layer is None else 0, col)
        if msg.data.layer is not None:
            # the op rows arrived: the cursor goes to the selected op (or the one asked for) when it is here
            target = self._cursor_node if self._cursor_node is not None else self.selected
            if target in msg.data.row_nodes:
                cursor = (msg.data.row_nodes.index(target), cursor[1] if cursor else 0)
            self._cursor_node = None
        view.set_data(msg.data, self._scale(msg.data.metric), cursor)
        self._last_row = view.cursor[0]
        if msg.data.layer is None:
            self._layer_rows = msg.data
        self._fit_layout()
        self._update_titles()
        self._mark_loaded("heatmap")
        if self.selected is not None and msg.data.layer is None:
            self.find_group(self.selected)

    def on_trees_ready(self, msg: TreesReady) -> None:
        for tree, rows in ((self._tree("golden"), msg.golden), (self._tree("test"), msg.test)):
            tree.set_rows(rows)
        self._recolour()
        self._update_titles()
        if self._pending_select is not None:
            self.select(self._pending_select)
        self._mark_loaded("trees")

    def on_status_ready(self, msg: StatusReady) -> None:
        if msg.token != self.token or msg.request != self._status_request:
            return  # a load of another token, or of this one in a colouring since changed
        self._read_ahead_neighbours(msg.token)
        self.status = msg.status
        self.status_token = msg.token
        self.verdict = msg.verdict
        for side in ("golden", "test"):
            self._tree(side).set_shapes(msg.shapes.get(side, {}))
        self._recolour()
        self._update_titles()
        if self._follow_born:
            self._follow_born = False
            if msg.verdict.golden is not None and msg.verdict.golden != self.selected:
                self.select(msg.verdict.golden)
                return
        if self.selected is not None:
            # the test tree follows the counterpart at THIS token (prefill and decode graphs differ)
            self._follow("golden", self.selected)
        else:
            self._group_shown_again()

    def on_detail_ready(self, msg: DetailReady) -> None:
        self._detail_shown = msg
        styles = self._domain_colours()
        self.query_one("#detail", Static).update(render_detail(msg.detail, msg.diff, styles))

    def on_node_tensors_ready(self, msg: NodeTensorsReady) -> None:
        self._detail_shown = msg
        self.query_one("#detail", Static).update(render_node_tensors(msg.node, self._domain_colours()))

    def _show_group(self, tree: TopologyTree, row: TreeRow) -> None:
        """A layer's group row in the detail pane (counted from the tree's statuses: no query), and its layer's row
        under the heatmap's cursor."""
        self._detail_shown = (tree.side, row.node_id)
        summary = tree.group_summary(row, self.status_token)
        self.query_one("#detail", Static).update(render_layer_group(summary, self._domain_colours()))
        view = self.query_one(HeatmapView)
        data = view.data
        if data is not None and data.layer is None and row.layer in data.row_layers:
            view.move_cursor(data.row_layers.index(row.layer), view.cursor[1], notify=False)
            self._last_row = view.cursor[0]

    def _group_shown_again(self) -> None:
        """The group row in the detail pane counted again (a new token, colouring or theme)."""
        shown = self._detail_shown
        if isinstance(shown, tuple):
            tree = self._tree(shown[0])
            row = tree.rows.get(shown[1])
            if row is not None:
                self._show_group(tree, row)

    def _on_theme(self) -> None:
        """A new theme: titles and the detail pane are drawn again in its colours (they hold colours as text)."""
        self._update_titles()
        shown = self._detail_shown
        if isinstance(shown, DetailReady):
            self.on_detail_ready(shown)
        elif isinstance(shown, NodeTensorsReady):
            self.on_node_tensors_ready(shown)
        else:
            self._group_shown_again()

    def on_select_node(self, msg: SelectNode) -> None:
        if msg.node_id is not None:
            self.select(msg.node_id)

    def on_group_of(self, msg: GroupOf) -> None:
        view = self.query_one(HeatmapView)
        data = view.data
        if data is None or msg.node_id != self.selected or data.layer is not None:
            return
        if msg.group in data.row_layers:
            view.move_cursor(data.row_layers.index(msg.group), view.cursor[1], notify=False)

    def on_ranks_ready(self, msg: RanksReady) -> None:
        bar = self.query_one(RankBar)
        shown = bar.display
        bar.set_ranks(msg.entries, self.explorer.info.cmp_id, self._domain_colours())
        if bar.display != shown:
            self._fit_layout()

    def _show_rank(self, cmp_id: int) -> None:
        """Show another rank's comparison at this token, on this golden op (where that rank has it)."""
        row = self._tree("golden").rows.get(self.selected) if self.selected is not None else None
        self.post_message(ComparisonChosen(cmp_id, self.token, row.name if row else None))

    def _step_rank(self, delta: int) -> None:
        bar = self.query_one(RankBar)
        target = step(bar.entries, self.explorer.info.cmp_id, delta)
        if target is None:
            self.notify("this comparison has a single rank", timeout=3)
            return
        self._show_rank(target.cmp_id)

    def action_next_rank(self) -> None:
        self._step_rank(1)

    def action_prev_rank(self) -> None:
        self._step_rank(-1)

    @on(RankBar.RankClicked)
    def _rank_clicked(self, event: RankBar.RankClicked) -> None:
        self._show_rank(event.cmp_id)

    def on_advice_ready(self, msg: AdviceReady) -> None:
        def chosen(value: tuple[int, int] | None) -> None:
            if value is not None:
                token, node = value
                if token != self.token:
                    self.set_token(token)
                self.select(node)

        title = "Suspects ranked by the advisor, highest score first (^: ranked above a higher score; Enter: go there)"
        self.app.push_screen(PickerScreen(title, msg.entries, empty=msg.note or "no advice"), chosen)

    def _mark_loaded(self, what: str) -> None:
        self._loaded[what] = True
        if self.first_paint_at is None and all(self._loaded.values()):
            self.call_after_refresh(self._painted)

    def _painted(self) -> None:
        if self.first_paint_at is None:
            self.first_paint_at = time.perf_counter()
            if self.status_token is not None:
                self._read_ahead_neighbours(self.status_token)

    # ------------------------------------------------------------------ helpers
    def _tree(self, side: str) -> TopologyTree:
        return self.query_one(f"#{side}-tree", TopologyTree)

    def _scale(self, colouring: str) -> Scale:
        return self.explorer.info.scale(colouring)

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
                self._scale(self.metric).bound,
                STANDS_OUT if self.color_by_quant else self._scale(ADDED_ERROR).bound,
                self.color_by_added or self.color_by_quant,
                self.born_id if side == "golden" else self.born_test_id,
                self.verdict.why,
            )

    def _born_text(self) -> str:
        if self.born_id is not None:
            row = self._tree("golden").rows.get(self.born_id)
            born = row.name if row else f"node {self.born_id}"
            if self.born_test_id is not None:
                trow = self._tree("test").rows.get(self.born_test_id)
                tname = trow.name if trow else str(self.born_test_id)
                if tname != born:
                    born += f" → test op {tname}"
                if self.verdict.evidence and "precheck" in self.verdict.evidence:
                    born += " (precheck)"
            if self.verdict.why == BORN_ADVISOR and self.verdict.score is not None:
                born += f" (advisor score {score_text(self.verdict.score)})"
            return born
        if self.verdict.inputs_differ:
            return f"{self.verdict.inputs_differ}: no op named"
        if not self.status:
            return "…"
        # no op born: "nothing fails" only when nothing does (a run failing everywhere has no born op either)
        failing = any(st.passed is False for st in self.status.values())
        return "no op where the error is born, none stands out" if failing else "nothing fails"

    def _set_heat_title(self) -> None:
        title = _heat_title(COLOURINGS[self.metric].label, self.drill_layer, self._heat_w)
        if title != self._heat_title:  # setting a border title repaints the whole pane, even to the same text
            self._heat_title = title
            self.query_one("#heat-pane").border_title = title

    def _verdict_label(self) -> str:
        if self.born_id is None:
            return ""
        return "most likely origin: " if self.verdict.why == BORN_ADVISOR else "error born at: "

    def _update_titles(self) -> None:
        info = self.explorer.info
        view = self.query_one(HeatmapView)
        label = COLOURINGS[self.metric].label
        self._set_heat_title()
        colour = "added error" if self.color_by_added else "beyond int8 noise" if self.color_by_quant else label
        by = "added error" if self.color_by_added else "beyond int8 noise" if self.color_by_quant else ""
        for side in ("golden", "test"):  # where the status line is cut (80 columns), `a` still shows what it did
            self._tree(side).border_title = f"{side} · by {by}" if by else side
        # the verdict first: it is what a narrow terminal must still show
        named = self._verdict_label()
        status = Text.assemble(
            ("◆ " if named else "", self._domain_colours()["born"]),
            (f"token {self.token} ", "bold"),
            (self._verdict_label(), "bold"),
            (self._born_text(), self._domain_colours()["born"]),
            "  │ ",
            (f"cmp {info.cmp_id} ", "bold"),
            f"{info.golden_kind} vs {info.test_kind} ({info.test_dtype or '?'})  ",
            ("heatmap ", "bold"),
            f"{label}  ",
            ("trees ", "bold"),
            colour,
        )
        self.query_one("#status", Static).update(status, layout=False)
        from_statistics = view.data is not None and bool(view.data.from_statistics.any())
        legend_key = (self.metric, self._scale(self.metric), self.app.theme, view.bound, from_statistics)
        if legend_key != self._legend_key:
            self._legend_key = legend_key
            self.query_one("#legend", Static).update(self._legend(view))

    def _legend(self, view: HeatmapView) -> Text:
        v = self._variables()
        metric = self.metric
        scale = self._scale(metric)
        text = Text()
        if metric == VERDICT:
            parts = [
                f"{COLOURINGS[m].label if m in COLOURINGS else m} "
                f"{'≥' if COLOURINGS[m].higher_is_better else '≤'} {self._scale(m).bound:g}"
                for m in self.explorer.info.verdict_metrics()
                if m in COLOURINGS and self._scale(m).bound is not None
            ]
            text.append("worst of " + ", ".join(parts), style="bold")
        elif scale.bound is None:
            text.append(f"{COLOURINGS[metric].label}: no bound; shaded up to the largest shown", style="bold")
        else:
            rule = f"{COLOURINGS[metric].label} {'≥' if COLOURINGS[metric].higher_is_better else '≤'} {scale.bound:g}"
            text.append(rule + (" passes" if scale.decides else " (informational: decides nothing)"), style="bold")
        text.append("\n")
        edges = (0.0, *LEVEL_EDGES)
        levels = HEAT_LEVELS if scale.bound is not None else 4
        for i in range(levels):
            text.append("  ", style=f"on {v[f'heat-{i}']}")
            shown = i in (0, 4, 6) or (scale.bound is None and i == 3)
            text.append(f"{_edge_value(edges[i], metric, view.bound)} " if shown else " ")
        text.append("\n")
        text.append(f"{GLYPH_FAIL}", style=f"bold on {v['heat-5']}")
        text.append(" fails ")
        text.append(f"{GLYPH_NAN}", style=f"bold on {v['nan']}")
        text.append(" NaN/Inf ")
        text.append(f"{GLYPH_NONE}", style=v["unmatched"])
        text.append(" none")
        if view.data is not None and view.data.from_statistics.any():
            # statistics-only pairs are shaded by a lower bound of their rel. euclidean distance
            text.append("\nstatistics only: a lower bound", style=v["unmatched"])
        return text

    # ------------------------------------------------------------------ selection
    def ops_named(self, query: str, limit: int = OPS_FOUND) -> list[TreeRow]:
        """The golden ops whose full name holds every word of `query` (any case), in the order they ran: what the
        command palette offers to go to (an L1 dump's thousand calls have no other way in but scrolling)."""
        words = query.lower().split()
        if not words:
            return []
        found = [
            r
            for r in self._tree("golden").rows.values()
            if not r.is_layer_group and all(w in r.name.lower() for w in words)
        ]
        found.sort(key=lambda r: (r.exec_order if r.exec_order is not None else 1 << 60, r.node_id))
        return found[:limit]

    def select(self, golden_id: int, *, from_tree: str | None = None) -> None:
        """Select a golden node everywhere: both trees, the heatmap cursor and the detail pane."""
        golden = self._tree("golden")
        if not golden.rows:
            self._pending_select = golden_id
            return
        self._pending_select = None
        self.selected = golden_id
        if from_tree != "golden":
            golden.reveal(golden_id)
        if from_tree != "test":
            self._follow("golden", golden_id)
        self._cursor_to(golden_id)
        self.query_one("#detail-pane", VerticalScroll).scroll_home(animate=False)
        self.load_detail(golden_id, self.token)

    def select_node(self, golden_id: int) -> None:
        """Kept for callers of the earlier name: same as `select`."""
        self.select(golden_id)

    def _cursor_to(self, golden_id: int) -> None:
        """Put the heatmap cursor on the selected node's op row, else on its layer's row."""
        view = self.query_one(HeatmapView)
        data = view.data
        if data is None:
            return
        if data.layer is not None:
            if golden_id in data.row_nodes:
                view.move_cursor(data.row_nodes.index(golden_id), view.cursor[1], notify=False)
                return
            self._cursor_node = golden_id
            self.drill_layer = None
            self.load_heatmap(self.metric, None, view.cursor)
            return
        self.find_group(golden_id)

    def _follow(self, side: str, node_id: int) -> None:
        """Make the other tree show the counterpart of `node_id` (of `side`) at the current token."""
        if self.status_token != self.token:
            # the counterpart is this token's (prefill and decode graphs differ): followed once its status is in
            # (`on_status_ready`), not first to a fallback whose expanded branch would stay open beside it
            return
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
            if node_id == self.born_id and self.born_test_id is not None:
                return self.born_test_id  # the op precheck pinned down
            st = self.status.get(node_id)
            return st.counterpart if st is not None and st.counterpart is not None else fallback
        st2 = self._tree("test").by_test.get(node_id)
        return st2.node_id if st2 is not None else fallback

    @on(Tree.NodeHighlighted)
    def _tree_highlighted(self, event: Tree.NodeHighlighted[TreeRow]) -> None:
        tree = event.control
        row = event.node.data
        if not isinstance(tree, TopologyTree) or row is None or not tree.has_focus:
            return
        self._follow(tree.side, row.node_id)
        if row.is_layer_group:
            self.selected = None
            self._show_group(tree, row)
            return
        gid = tree.golden_id(row)
        if gid is not None and gid != self.selected:
            self.selected = gid
            self._cursor_to(gid)
            self.query_one("#detail-pane", VerticalScroll).scroll_home(animate=False)
            self.load_detail(gid, self.token)
        elif gid is None:
            self.selected = None
            self.load_node_tensors(tree.side, row.node_id, self.token)

    @on(HeatmapView.CellHighlighted)
    def _cell_highlighted(self, event: HeatmapView.CellHighlighted) -> None:
        data = event.view.data
        if data is None or not data.tokens:
            return
        token = data.tokens[event.col]
        if token != self.token:
            on_born = self.selected is not None and self.selected == self.born_id and self.status_token == self.token
            self.set_token(token)
            if on_born:  # from the born op, a new token selects its born op (once its status says which)
                self._follow_born = True
                self._last_row = event.row
                return
        # the detail pane and the trees follow the cursor: an op row selects its op, a layer row its worst op
        if data.layer is not None:
            node = data.row_nodes[event.row]
            if node is not None and node != self.selected:
                self.select(node)
        elif event.row != self._last_row:
            self.find_worst(token, data.row_layers[event.row])
        self._last_row = event.row

    def set_token(self, token: int) -> None:
        """Change the current token: recolour trees, move the test tree and refresh the detail pane."""
        self.token = token
        view = self.query_one(HeatmapView)
        if view.data is not None and token in view.data.tokens:
            col = view.data.tokens.index(token)
            if col != view.cursor[1]:
                view.move_cursor(view.cursor[0], col, notify=False)
        self._update_titles()
        self.query_one(LogitsStrip).set_token(token)
        self.load_status(token)
        if self.selected is not None:
            self._detail_after_paint()

    def _detail_after_paint(self) -> None:
        """Load the detail pane a frame after a token change: its new content needs a layout pass, which in the
        same frame would hold back the heatmap's and the trees' repaint (what a user stepping through tokens
        watches); the selection and token are read when it fires, so it never shows an earlier one."""
        if self._detail_timer is not None:
            self._detail_timer.stop()

        def load() -> None:
            self._detail_timer = None
            if self.selected is not None:
                self.load_detail(self.selected, self.token)

        self._detail_timer = self.set_timer(DETAIL_AFTER_TOKEN_S, load)

    @on(HeatmapView.CellSelected)
    def _cell_selected(self, event: HeatmapView.CellSelected) -> None:
        data = event.view.data
        if data is None:
            return
        token = data.tokens[event.col]
        if token != self.token:
            self.set_token(token)
        if data.layer is None:
            group = data.row_layers[event.row]
            if group is not None:
                self.drill_layer = group
                self.load_heatmap(self.metric, group, None)
            self.find_worst(token, group)
        else:
            node = data.row_nodes[event.row]
            if node is not None:
                self.select(node)

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
        if gid is not None:
            self.select(gid, from_tree=tree.side)
            if tree.side == "test":
                self._follow("test", nid)

    def action_next_failing(self) -> None:
        self._step_failing(1)

    def action_prev_failing(self) -> None:
        self._step_failing(-1)

    def action_goto_born(self) -> None:
        target = self.born_id  # the op where the error is born, else the advisor's op standing out
        if target is None:
            self.notify(f"token {self.token}: {self._born_text()}")
            return
        self.select(target)

    def action_toggle_color(self) -> None:
        if self._quantized is None:
            self._quantized = self.explorer.quantized()
        if self._quantized:  # heatmap colouring -> added error -> beyond the expected int8 noise -> ...
            self.color_by_added, self.color_by_quant = (
                not self.color_by_added and not self.color_by_quant,
                self.color_by_added,
            )
        else:
            self.color_by_added = not self.color_by_added
        self.load_status(self.token)
        self._update_titles()

    def action_next_metric(self) -> None:
        order = list(HEATMAP_COLOURINGS)
        i = order.index(self.metric) if self.metric in order else -1
        self.metric = order[(i + 1) % len(order)]
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

        self.app.push_screen(MappingScreen(self.session))

    def action_open_sql(self) -> None:
        from workbench.app.sql_screen import SqlScreen

        self.app.push_screen(SqlScreen(self.session))

    def action_open_advice(self) -> None:
        self.load_advice()

    def action_pick_comparison(self) -> None:
        info = self.explorer.info
        entries: list[PickerEntry[int]] = [
            PickerEntry(
                f"{'▶' if c.cmp_id == info.cmp_id else ' '} cmp {c.cmp_id}  {c.created}  {c.pairs:,} pairs, "
                f"{c.failed:,} failed   golden {c.golden}   test {c.test}",
                c.cmp_id,
            )
            for c in self.explorer.comparisons()
        ]

        def chosen(cmp_id: int | None) -> None:
            if cmp_id is not None and cmp_id != info.cmp_id:
                self.post_message(ComparisonChosen(cmp_id))

        self.app.push_screen(PickerScreen("Comparisons in this catalog (Enter: show it)", entries), chosen)


def _heat_title(label: str, group: int | None, width: int) -> str:
    """The heatmap pane's title: what is coloured and what the rows are, as long as the pane's border shows it whole
    (`width` is the pane's; its corners and padding take 6 columns)."""
    if group is None:
        forms = [f"{label} by token x layers", f"{label}: layers"]
    else:
        rows = {PRE: "ops before the layers", POST: "ops after the layers"}.get(group, f"ops of layer {group}")
        brief = {PRE: "pre", POST: "post"}.get(group, f"L{group}")
        forms = [f"{label} by token x {rows} (u: back)", f"{label}: {rows} (u)", f"{label}: {brief} ops (u)"]
    return next((f for f in forms if not width or len(f) <= width - 6), forms[-1])


def _edge_value(sev: float, metric: str, bound: float) -> str:
    """The metric value at a severity edge, for the legend."""
    value = value_at(sev, metric, bound)
    return f"{value:.4g}" if COLOURINGS[metric].higher_is_better else f"{value:.3g}"
