"""What a new user hit the second time in the app (issue 26 items 1-3, 7), through the real app via Pilot."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Static

from tests.app.test_app_pilot import ready, wait_for
from tests.fixtures.app_catalogs import DEFECT_ID, SIZE
from workbench.app.heatmap import HeatmapView
from workbench.app.launch import make_app
from workbench.app.trees import TopologyTree

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _plain(widget: Static) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


def _html(widget: Static) -> str:
    """The widget's content with its colours (inline styles), as drawn."""
    console = Console(width=200, record=True, file=io.StringIO(), color_system="truecolor")
    console.print(widget.content)
    return console.export_html(inline_styles=True).lower()


async def test_theme_change_redraws_the_detail_pane(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog, theme="dark")
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        await pilot.press("b")  # where the error is born: the detail pane says so in the theme's `born` colour
        await wait_for(pilot, lambda: screen.selected == DEFECT_ID, timeout=30)
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "error born" in _html(detail), timeout=30)
        dark_born = app.get_css_variables()["born"].lower()
        assert dark_born in _html(detail)
        app.theme = "wb-light"
        await pilot.pause()
        light_born = app.get_css_variables()["born"].lower()
        assert light_born != dark_born
        # no selection change: the pane is drawn again in the new theme's colours
        await wait_for(pilot, lambda: light_born in _html(detail), timeout=10)
        assert dark_born not in _html(detail)


def _screen_text(app: object) -> str:
    svg = app.export_screenshot()  # type: ignore[attr-defined]
    return svg.replace("&#160;", " ").replace("\u00a0", " ")


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (200, 50)])
async def test_precheck_result_is_seen_at_once(demo_catalog: Path, size: tuple[int, int]) -> None:
    from textual.containers import VerticalScroll

    from workbench.app.opcause import PrecheckPanel

    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=size) as pilot:
        screen = await ready(pilot, app)
        await pilot.press("b")
        await wait_for(pilot, lambda: screen.selected is not None and screen.selected == screen.born_id, timeout=30)
        await wait_for(pilot, lambda: "error born" in _plain(screen.query_one("#detail", Static)), timeout=30)
        await pilot.press("p")
        panel = screen.query_one(PrecheckPanel)
        await wait_for(pilot, lambda: "precheck disagree" in _plain(panel), timeout=120)
        await pilot.pause(0.3)
        # the panel is in view whole, or scrolled to the detail pane's top when longer: its verdict and the judged
        # outputs are seen, not only its first line at the pane's bottom
        pane, region = screen.query_one("#detail-pane", VerticalScroll).content_region, panel.region
        assert region.y >= pane.y and (region.bottom <= pane.bottom or region.y <= pane.y + 1), (region, pane)
        # each judged output says whether it is within tolerance (no bare `-` for an ATB op's metrics)
        text = _plain(panel)
        assert "no: " in text or "yes" in text or "%" in text
        # the verdict is said where it is seen at once, and the trees show the badge without a cursor move
        assert any("precheck FAILS" in n.message for n in app._notifications)
        golden = screen.query_one("#golden-tree", TopologyTree)
        assert golden.badges and golden.token == screen.token
        # before the op's name, so an 80-column tree shows it too
        assert "P✗ " in _screen_text(app)


async def test_a_wide_terminal_gives_the_heatmap_pane_its_width(demo_catalog: Path) -> None:
    from workbench.app.logits_strip import LogitsStrip
    from workbench.app.main_screen import WIDE_HEAT_SHARE

    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await ready(pilot, app)
        pane = screen.query_one("#heat-pane")
        await wait_for(pilot, lambda: pane.size.width >= int(200 * WIDE_HEAT_SHARE) - 2, timeout=30)
        strip = screen.query_one(LogitsStrip)
        await wait_for(pilot, lambda: "top-1" in str(strip.render()), timeout=30)
        line = str(strip.render())
        assert "KL" in line and "cosine" in line, line
        title = str(pane.border_title or "")
        assert "…" not in title, title


async def test_trees_show_the_shapes_of_the_token_shown(demo_catalog: Path) -> None:

    from workbench.analysis.explorer.explore import Explorer

    ex = Explorer(demo_catalog)
    try:
        born = ex.born(0)[0]
        assert born is not None
        first, second = ex.shapes_at("golden", 0)[born], ex.shapes_at("golden", 1)[born]
    finally:
        ex.close()
    assert first != second  # the prompt's 24 positions, then one
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await ready(pilot, app)
        await pilot.press("b")
        await wait_for(pilot, lambda: screen.selected == born, timeout=30)
        golden = screen.query_one("#golden-tree", TopologyTree)

        def label() -> str:
            node = golden.tree_nodes[born]
            return golden.render_label(node, golden.rich_style, golden.rich_style).plain

        await wait_for(pilot, lambda: first in label(), timeout=30)
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: screen.token == 1 and second in label(), timeout=30)
        assert first not in label()


# ---- the second walk-through (80x24, 120x30, 200x50): what it still found


@pytest.mark.parametrize("size", [(80, 24), (120, 30)])
async def test_mapping_editor_tensor_labels_are_whole(small_catalog: Path, size: tuple[int, int]) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=size) as pilot:
        await ready(pilot, app)
        await pilot.press("e")
        await wait_for(pilot, lambda: bool(app.screen.query("#test-sel")), timeout=30)
        await pilot.pause(0.2)
        from rich.text import Text
        from textual.widgets import Label

        labels = list(app.screen.query(".sel-label").results(Label))
        assert len(labels) == 2
        for label in labels:
            # within its column and tall enough for its wrapped lines: not cut after "pair" (80) or "out:0" (120)
            column = label.parent.content_region  # type: ignore[union-attr]
            assert column.x <= label.region.x and label.region.right <= column.right, (label.region, column)
            words = str(label.render())
            lines = Text(words).wrap(app.console, label.content_region.width)
            assert label.content_region.height >= len(lines) and "in:1)" in words, (words, label.region)


async def test_picker_footer_shows_enter(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await pilot.press("c")
        await wait_for(pilot, lambda: bool(app.screen.query("#picker")), timeout=30)
        await pilot.pause(0.2)
        footer = _screen_text(app)
        assert "enter" in footer and "Go" in footer, footer  # it showed only `esc Back`
        await pilot.press("enter")  # and Enter still chooses the highlighted entry
        await wait_for(pilot, lambda: not app.screen.query("#picker"), timeout=10)


async def test_help_gives_the_action_column_the_width(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await pilot.press("f1")
        await pilot.pause(0.3)
        text = _screen_text(app)
        # the key column was as wide as its longest entry, so short descriptions wrapped at 80 columns
        assert "Previous failing node" in text and "Go to where the error is born" in text, text


@pytest.fixture(scope="module")
def quant_catalogs(tmp_path_factory: pytest.TempPathFactory) -> dict[str | None, Path]:
    """The quantized demo, clean (W8A16) and with its act_clip defect (W8A8), compared."""
    from workbench.demo import make_demo
    from workbench.jobs.compare import run_compare

    out: dict[str | None, Path] = {}
    for defect, scheme in ((None, "w8a16"), ("act_clip", "w8a8")):
        folder = tmp_path_factory.mktemp(f"walk_quant_{defect}")
        plan = make_demo(folder, stack="quant", defect=defect, scheme=scheme, log=lambda _s: None)
        run_compare(plan.golden, plan.test, folder / "catalog.duckdb", workers=1)
        out[defect] = folder / "catalog.duckdb"
    return out


def _status_line(screen: object) -> str:
    return str(screen.query_one("#status", Static).render())  # type: ignore[attr-defined]


async def test_quantized_run_verdict_is_the_advisors_as_in_the_summary(quant_catalogs: dict[str | None, Path]) -> None:
    """The app said `error born at: ...layers.0.self_attn.q_proj` (the first quantized linear, failing the float
    thresholds as every one does) where `wb compare` names the op beyond its int8 noise, or none."""
    planted = "root.model.layers.2.mlp.down_proj"
    app = make_app(catalog=quant_catalogs["act_clip"])
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await ready(pilot, app)
        await wait_for(pilot, lambda: "most likely origin: " + planted in _status_line(screen), timeout=30)
        assert "error born at" not in _status_line(screen)
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "◆ most likely origin at token 0" in _plain(detail), timeout=30)
        text = " ".join(_plain(detail).split())
        # its outputs fail the float thresholds too: the verdict does not say they pass
        assert "no output fails" not in text and "the error it adds has advisor score" in text, text
        # its score is over the int8 rounding its own scales predict, not over its peers' noise
        assert "beyond its expected int8 rounding" in text and "peers' noise" not in text, text
        origin = screen.born_id  # the advisor's op standing out: the verdict where no op is born
        golden = screen.query_one("#golden-tree", TopologyTree)
        await pilot.press("b")
        await wait_for(pilot, lambda: origin in golden.tree_nodes, timeout=30)
        row = golden.tree_nodes[origin]
        label = golden.render_label(row, golden.rich_style, golden.rich_style).plain
        # the tree calls it what the verdict does (it said "error born here")
        assert "◆" in label and label.endswith("most likely origin") and "born" not in label, label
        await pilot.press("down", "down", "enter")  # somewhere else, then `b` goes back to the origin
        await pilot.pause(0.3)
        await pilot.press("b")
        await wait_for(pilot, lambda: screen.selected == origin, timeout=30)
    app = make_app(catalog=quant_catalogs[None])
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await ready(pilot, app)
        await wait_for(pilot, lambda: "none stands out" in _status_line(screen), timeout=30)
        line = _status_line(screen)
        assert "error born at" not in line and "nothing fails" not in line, line  # every quantized linear fails
        await pilot.press("b")
        await wait_for(pilot, lambda: any("none stands out" in str(n.message) for n in app._notifications), 10)
        assert not any("every output passes" in str(n.message) for n in app._notifications)
        # the ops before the first layer pass (the embedding, the rotary tables: the model's own node, failing at its
        # output, is in no row); layer 0's quantized linears fail: into it
        view = screen.query_one(HeatmapView)
        assert view.data is not None and view.data.row_labels[:2] == ["pre", "L0"], view.data.row_labels
        assert not view.data.failed[0].any() and view.data.failed[1].all(), view.data.failed
        await pilot.press(*["up"] * len(view.data.row_labels), "down", "enter")
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "no op where the error is born" in _plain(detail), timeout=30)
        assert "✗" in _plain(detail) and "every output passes" not in _plain(detail)


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (200, 50)])
async def test_heatmap_title_is_whole_for_every_colouring_and_drill(demo_catalog: Path, size: tuple[int, int]) -> None:
    """At 80 columns `max rel err by token x laye…`, at 120 `verdict by token x ops of the ops…` were cut."""
    from workbench.analysis.explorer.severity import HEATMAP_COLOURINGS

    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=size) as pilot:
        screen = await ready(pilot, app)
        pane = screen.query_one("#heat-pane")

        def whole() -> bool:
            title = str(pane.border_title or "")
            return bool(title) and len(title) <= pane.outer_size.width - 6  # corners, padding, spaces

        seen = set()
        for _ in HEATMAP_COLOURINGS:
            await pilot.press("m")
            await wait_for(pilot, lambda: screen.metric not in seen, timeout=10)
            seen.add(screen.metric)
            await pilot.pause(0.1)
            assert whole(), (pane.border_title, pane.outer_size.width)
        for row in ("home", "end"):  # the ops before the layers, then after them
            await pilot.press("u", row, "enter")
            await wait_for(pilot, lambda: screen.drill_layer is not None, timeout=30)
            await pilot.pause(0.2)
            assert whole() and "(u" in str(pane.border_title), (pane.border_title, pane.outer_size.width)


async def test_tree_colouring_is_named_where_the_status_line_is_cut(small_catalog: Path) -> None:
    """At 80 columns the status line shows only the verdict: `a` recoloured the trees with no word of it."""

    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot, app)
        golden, test = screen.query_one("#golden-tree", TopologyTree), screen.query_one("#test-tree", TopologyTree)
        assert (golden.border_title, test.border_title) == ("golden", "test")
        await pilot.press("a")
        await wait_for(pilot, lambda: golden.border_title == "golden · by added error", timeout=10)
        assert test.border_title == "test · by added error"
        assert "golden · by added error" in _screen_text(app)
        await pilot.press("a")  # a float comparison: back to the heatmap's colouring
        await wait_for(pilot, lambda: golden.border_title == "golden", timeout=10)


def test_nan_inf_the_same_on_both_sides_leaves_the_failing_mark(small_catalog: Path) -> None:
    """On the TorchAir demo every layer's cell showed `!` instead of the `×` of the layer where the error is born:
    the attention mask's -inf, the same on both sides, counted as NaN/Inf. Only NaN/Inf one side lacks is marked."""
    import duckdb

    from tests.fixtures.app_catalogs import DEFECT
    from workbench.analysis.explorer.explore import Explorer
    from workbench.analysis.explorer.severity import VERDICT
    from workbench.analysis.verdicts.born import refresh_verdicts

    con = duckdb.connect(str(small_catalog))
    try:
        cmp_id = int(con.execute("SELECT max(cmp_id) FROM comparisons").fetchone()[0])  # type: ignore[index]
        # the defect's output at token 2 (failing) gets a mask's -inf on both sides, at the same count
        con.execute(
            "UPDATE metrics SET golden_inf_count = 3, my_inf_count = 3 WHERE cmp_id = ? AND pair_id IN ("
            "SELECT m.pair_id FROM matches m JOIN comparisons c USING (cmp_id) JOIN nodes n ON n.run_id = c.golden_run"
            " AND n.node_id = m.golden_node_id WHERE m.cmp_id = ? AND m.token_id = 2 AND m.io = 'out' AND n.name = ?)",
            [cmp_id, cmp_id, DEFECT],
        )
        assert con.execute("SELECT count(*) FROM metrics WHERE golden_inf_count = 3").fetchone()[0] > 0  # type: ignore[index]
        refresh_verdicts(con, cmp_id)
    finally:
        con.close()
    ex = Explorer(small_catalog)
    try:
        hm = ex.heatmap(VERDICT)
        row = hm.row_labels.index("L1")
        assert hm.failed[row, 2] and not hm.nan_inf[row, 2]  # drawn `×`, not `!`
        assert hm.nan_inf[row, 4]  # the NaN planted on the test side alone still is
        status = ex.node_status(2, VERDICT)
        defect = ex.golden_node_id(DEFECT)
        assert defect is not None and status[defect].passed is False and not status[defect].has_nan_inf
    finally:
        ex.close()
