"""The app as a new user drives it (issue 14): every pane on one selection and the current token, the verdict's
pinned test op and evidence, pre/post rows, the mapping editor on decode-only ops, pickers, narrow terminals."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from rich.style import Style
from textual.widgets import Input, OptionList, Static

from tests.app.test_app_pilot import _text, cursor_id, ready, trees, wait_for
from tests.fixtures.app_catalogs import DEFECT_ID, SIZE
from workbench.analysis.explorer.explore import POST, PRE
from workbench.app.actions import ACTIONS
from workbench.app.heatmap import HeatmapView
from workbench.app.launch import make_app
from workbench.app.main_screen import MainScreen
from workbench.app.screens import PickerScreen

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _demo_copy(demo_catalog: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "catalog.duckdb"
    shutil.copyfile(demo_catalog, dst)
    return dst


def _test_id(screen: MainScreen, name: str) -> int:
    _, test = trees(screen)
    return next(r.node_id for r in test.rows.values() if r.name == name)


async def test_every_pane_follows_the_token_and_the_pinned_op(demo_catalog: Path) -> None:
    """Demo: prefill graph at token 0, decoder graph later; the verdict pins a test op by precheck."""
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, test = trees(screen)
        assert screen.token == 0 and screen.selected == screen.born_id  # start-up: the born op, selected
        prefill = _test_id(screen, "3_Prefill_layer/3_RmsNormOperation")
        decoder = _test_id(screen, "11_Decoder_layer/3_RmsNormOperation")
        assert screen.born_test_id == prefill and cursor_id(test) == prefill
        assert cursor_id(golden) == screen.born_id
        status = str(screen.query_one("#status", Static).render())
        assert "→ test op 3_Prefill_layer/3_RmsNormOperation (precheck)" in status
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "evidence: precheck:" in _text(detail))
        assert "test op pinned down: 3_Prefill_layer/3_RmsNormOperation" in _text(detail)
        await pilot.press("right_square_bracket")
        await wait_for(pilot, lambda: screen.status_token == 1)
        await wait_for(pilot, lambda: cursor_id(test) == decoder)
        assert screen.born_test_id == decoder
        assert test.status_of(test.rows[prefill]) is None  # the prefill op did not run at token 1
        assert test._signature(test.rows[prefill]) == ("·", -1, False)
        assert test._signature(test.rows[decoder])[2]  # ◆ on the decoder op
        await wait_for(
            pilot, lambda: "11_Decoder_layer/3_RmsNormOperation" in _text(detail) and "token 1" in _text(detail)
        )
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: screen.status_token == 0)
        await wait_for(pilot, lambda: cursor_id(test) == prefill)
        assert test._signature(test.rows[decoder]) == ("·", -1, False)  # no marks, no ◆ where nothing ran


async def test_heatmap_cursor_follows_selection_and_pre_post_drill(demo_catalog: Path) -> None:
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        heat = screen.query_one(HeatmapView)
        assert heat.data is not None and heat.data.row_layers[heat.cursor[0]] == 1  # the born op's layer
        golden, _ = trees(screen)
        golden.focus()
        await pilot.press("n")  # next failing node: the heatmap cursor goes to its row group
        await wait_for(pilot, lambda: screen.selected != screen.born_id)
        group = screen.explorer.group_of(screen.selected)  # type: ignore[arg-type]
        await wait_for(pilot, lambda: heat.data is not None and heat.data.row_layers[heat.cursor[0]] == group)
        heat.focus()
        heat.move_cursor(len(heat.data.row_layers) - 1, heat.cursor[1])  # `post`
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.drill_layer == POST and heat.data is not None and heat.data.layer == POST)
        assert "lm_head" in heat.data.row_labels and "embed_tokens" not in heat.data.row_labels
        await wait_for(pilot, lambda: screen.selected in heat.data.row_nodes)
        await pilot.press("u")
        await wait_for(pilot, lambda: heat.data is not None and heat.data.layer is None)
        heat.move_cursor(0, heat.cursor[1])  # `pre`
        await pilot.press("enter")
        await wait_for(pilot, lambda: heat.data is not None and heat.data.layer == PRE)
        await wait_for(pilot, lambda: screen.selected in heat.data.row_nodes)
        names = {r.node_id: r.name for r in golden.rows.values()}
        assert "norm" not in names[screen.selected].rsplit(".", 1)[-1]  # never root.model.norm (a post op)
        # the detail pane follows the cursor on op rows, and starts at its header
        await pilot.press("down")
        row_node = heat.data.row_nodes[heat.cursor[0]]
        await wait_for(pilot, lambda: screen.selected == row_node)
        assert screen.query_one("#detail-pane").scroll_offset.y == 0


async def test_duplicate_input_columns_are_labelled(demo_catalog: Path) -> None:
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=(200, 50)) as pilot:
        screen = await ready(pilot, app)
        golden, _ = trees(screen)
        node = next(r.node_id for r in golden.rows.values() if r.name == "root.model.layers.0.mlp.down_proj")
        screen.select(node)
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "down_proj" in _text(detail) and "in0⇄" in _text(detail))
        text = _text(detail)
        assert "in0⇄out0 1_ActivationOperation" in text and "in0⇄in0 2_LinearOperation" in text


async def test_unmatched_op_shows_its_own_statistics(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, _ = trees(screen)
        golden.focus()
        golden.reveal(DEFECT_ID - 1)  # act_fn: no counterpart
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "unmatched at token" in _text(detail))
        text = _text(detail)
        assert "act_fn" in text and "norm" in text and "out0" in text and "in0" in text


async def test_mapping_editor_decode_only_ops_focus_labels_and_size_warning(demo_catalog: Path, tmp_path: Path) -> None:
    catalog = _demo_copy(demo_catalog, tmp_path)
    app = make_app(catalog=catalog, mapping=tmp_path / "m.json")
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(pilot, app)
        await pilot.press("e")
        await wait_for(pilot, lambda: bool(app.screen.query("#test-list")))
        mapping = app.screen
        assert isinstance(mapping.focused, Input) and mapping.focused.id == "golden-filter"
        labels = [str(w.render()) for w in mapping.query(".sel-label")]
        assert any("golden tensors" in x for x in labels) and any("test tensors" in x for x in labels)
        tlist = mapping.query_one("#test-list", OptionList)
        await wait_for(pilot, lambda: tlist.option_count > 24)
        assert any(u.first_token > 0 for u in mapping.test)  # decode-only ops can be paired too
        g = next(u for u in mapping.golden if u.out_numel)
        t = next(u for u in mapping.test if u.out_numel and u.out_numel != g.out_numel)
        mapping.query_one("#golden-filter", Input).value = g.name
        mapping.query_one("#test-filter", Input).value = t.name
        await pilot.pause()
        mapping.query_one("#golden-list", OptionList).highlighted = 0
        tl = mapping.query_one("#test-list", OptionList)
        tl.highlighted = next(i for i in range(tl.option_count) if tl.get_option_at_index(i).id == t.name)
        tl.focus()
        await pilot.press("p")
        await wait_for(pilot, lambda: any("differ in size" in str(n.message) for n in app._notifications), 60)


async def test_comparison_picker_and_cmp_option(small_catalog: Path) -> None:
    con = duckdb.connect(str(small_catalog))
    for table in ("comparisons", "node_matches", "matches", "metrics", "node_results", "error_born"):
        con.execute(f"INSERT INTO {table} SELECT * REPLACE (2 AS cmp_id) FROM {table} WHERE cmp_id = 1")
    con.close()
    app = make_app(catalog=small_catalog, cmp_id=1)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        assert screen.explorer.info.cmp_id == 1 and screen.explorer.info.comparisons == [1, 2]
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        picker = app.screen
        assert picker.query_one(OptionList).option_count == 2
        await pilot.press("down", "enter")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen) and app.screen is not screen)
        new = await ready(pilot, app)
        assert new.explorer.info.cmp_id == 2 and "cmp 2" in str(new.query_one("#status", Static).render())


async def test_advisor_panel(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        picker = app.screen
        lst = picker.query_one(OptionList)
        assert lst.option_count > 0
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen)
        assert screen.selected is not None


async def test_narrow_status_keeps_the_verdict_and_footer_words_whole(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot, app)
        status = str(screen.query_one("#status", Static).render())
        assert status.index("error born at:") < 20  # first, so 80 columns still show it
        heat = screen.query_one(HeatmapView)
        assert heat.data is not None and heat.size.height >= heat.data.values.shape[0] + 1  # every row visible
    for a in (a for a in ACTIONS if a.show):  # what the footer shows
        label = a.footer_label
        assert label == a.description or a.description.lower().startswith(label.split()[0].lower()) or a.footer
        assert len(label) <= 40


async def test_cursor_cell_and_light_theme_backgrounds(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog, theme="light")
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        heat = screen.query_one(HeatmapView)
        bg = app.get_css_variables()["background"]
        for y in range(heat.data.values.shape[0] + 1):  # type: ignore[union-attr]
            for seg in heat.render_line(y):
                style = seg.style or Style()
                assert style.bgcolor is not None, (y, seg)  # labels never fall back to the terminal's colours
        row, _col = heat.cursor
        strip = heat.render_line(row + 1)
        text = "".join(s.text for s in strip)
        if heat.cell_w >= 3:
            assert "▶×◀" in text  # the failing cursor cell reads as one bracketed cell
        assert bg
