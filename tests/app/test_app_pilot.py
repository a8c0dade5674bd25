"""Pilot tests: every interaction of the app, driven through the real app on a real catalog."""

from __future__ import annotations

import json
import time
from pathlib import Path

import duckdb
import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, OptionList, Static, TextArea

from tests.fixtures.app_catalogs import DEFECT, DEFECT_ID, REPO, SIZE
from workbench.analysis.explorer.views import BORN_ADVISOR
from workbench.app.actions import ACTIONS
from workbench.app.app import WorkbenchApp, WorkbenchCommands
from workbench.app.heatmap import HeatmapView
from workbench.app.launch import make_app
from workbench.app.main_screen import MainScreen
from workbench.app.mapping_screen import MappingScreen
from workbench.app.screens import HelpScreen, MessageScreen
from workbench.app.trees import TopologyTree
from workbench.catalog.schema import SCHEMA_VERSION
from workbench.compare.pairing.mapping import MappingFile

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def wait_for(pilot, cond, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    """Pause until `cond()` holds (workers post their results asynchronously)."""
    for _ in range(int(timeout / 0.02)):
        await pilot.pause(0.02)
        if cond():
            return
    raise AssertionError("condition not reached in time")


async def settle(pilot, quiet: int = 3, step: float = 0.05, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    """Wait until the app is idle before a snapshot: no worker running, and every scrollable widget's size and
    scroll offset unchanged over `quiet` checks in a row (a fixed pause was too short under load). Then each
    topology tree shows its start-up branches and its cursor's path only, centred on the cursor: which other branches
    a follow had opened on the way, and so the tree's line count and scrollbar, could differ with the order in which
    the rows, the token's status and the trees' cursor events arrived (seen in fresh clones, whose first imports are
    slower), and the picture is of the rendering, not of that order."""
    app = pilot.app
    await _settled(pilot, quiet, step, timeout)
    for tree in app.screen.query(TopologyTree):
        node = tree.cursor_node
        if node is None or node.data is None:
            continue
        for top in tree.root.children:
            top.collapse_all()
            if top.data is not None and top.data.parent_id is None:
                top.expand()  # what `set_rows` opens
        tree.reveal(node.data.node_id)
    await _settled(pilot, quiet, step, timeout)


async def _settled(pilot, quiet: int, step: float, timeout: float) -> None:  # type: ignore[no-untyped-def]
    app = pilot.app
    last: object = None
    same = 0
    deadline = time.monotonic() + timeout
    while same < quiet and time.monotonic() < deadline:
        await app.workers.wait_for_complete()
        await pilot.pause(step)
        state = [(w.id, w.size, w.virtual_size, w.scroll_offset) for w in app.screen.query("*") if w.is_scrollable]
        same = same + 1 if state == last else 0
        last = state


async def ready(pilot, app: WorkbenchApp) -> MainScreen:  # type: ignore[no-untyped-def]
    await wait_for(
        pilot,
        lambda: (
            isinstance(app.screen, MainScreen) and app.screen.first_paint_at is not None and bool(app.screen.status)
        ),
    )
    # settle: a finished worker can start follow-on work (the linked tree selects and scrolls to the
    # counterpart), so wait until a round of waiting finds no worker running and no animation left
    for _ in range(50):
        await pilot.app.workers.wait_for_complete()
        await pilot.wait_for_scheduled_animations()
        await pilot.pause(0.05)
        if not any(w.is_running for w in pilot.app.workers):
            break
    screen = app.screen
    assert isinstance(screen, MainScreen)
    return screen


def trees(screen: MainScreen) -> tuple[TopologyTree, TopologyTree]:
    return screen.query_one("#golden-tree", TopologyTree), screen.query_one("#test-tree", TopologyTree)


def cursor_id(tree: TopologyTree) -> int | None:
    node = tree.cursor_node
    return None if node is None or node.data is None else node.data.node_id


async def test_opens_on_first_failing_token_and_moves_tokens(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        assert screen.token == 1 and screen.born_id == DEFECT_ID  # first token where something fails
        status = str(screen.query_one("#status", Static).render())
        assert f"error born at: {DEFECT}" in status
        heat = screen.query_one(HeatmapView)
        assert heat.has_focus and heat.cursor == (2, 1)  # on the born op's layer (L1) at its token
        assert screen.selected == DEFECT_ID  # the born op is selected at start-up
        await pilot.press("left")
        # nothing fails at token 0: the verdict is the advisor's op standing out, said as such (not "error born")
        await wait_for(pilot, lambda: screen.token == 0 and screen.verdict.why == BORN_ADVISOR and bool(screen.status))
        assert "most likely origin: " in str(screen.query_one("#status", Static).render())
        golden, _ = trees(screen)
        assert golden.status is screen.status  # the trees were recoloured for token 0
        await pilot.press("right_square_bracket", "right_square_bracket")
        await wait_for(pilot, lambda: screen.token == 2 and screen.born_id == DEFECT_ID)
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: screen.token == 1)
        await pilot.press("down", "down")
        assert heat.cursor == (4, 1)


async def test_enter_drills_into_a_layer_and_selects_the_op_everywhere(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        heat = screen.query_one(HeatmapView)
        await pilot.press("right", "enter")  # layer 1 (where the cursor starts), token 2
        await wait_for(pilot, lambda: screen.drill_layer == 1 and screen.selected == DEFECT_ID)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.token == 2
        assert heat.data is not None and heat.data.layer == 1 and "down_proj" in heat.data.row_labels
        golden, test = trees(screen)
        assert cursor_id(golden) == DEFECT_ID and cursor_id(test) == DEFECT_ID
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "distribution of out0" in _text(detail))
        text = _text(detail)
        assert DEFECT in text and "error born here" in text and "top 8 worst elements" in text
        # Enter on an op row selects that op
        row = heat.data.row_labels.index("up_proj")
        heat.move_cursor(row, heat.cursor[1])
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.selected == DEFECT_ID - 2)
        assert cursor_id(golden) == DEFECT_ID - 2 and cursor_id(test) == DEFECT_ID - 2
        await pilot.press("u")
        await wait_for(pilot, lambda: heat.data is not None and heat.data.layer is None)
        assert screen.drill_layer is None and heat.data.row_labels[heat.cursor[0]] == "L1"


async def test_linked_selection_next_failing_and_born(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, test = trees(screen)
        golden.focus()
        await pilot.press("home")
        await pilot.press("n")  # first failing node in execution order at token 1
        await wait_for(pilot, lambda: screen.selected is not None)
        first = cursor_id(golden)
        assert first is not None and golden.failing(golden.rows[first])
        assert golden.rows[first].exec_order <= golden.rows[DEFECT_ID].exec_order  # type: ignore[operator]
        assert cursor_id(test) == golden.rows[first].counterpart
        await pilot.press("b")
        await wait_for(pilot, lambda: cursor_id(golden) == DEFECT_ID)
        assert cursor_id(test) == DEFECT_ID
        # moving in the golden tree moves the test tree to the counterpart
        await pilot.press("down")
        await wait_for(pilot, lambda: cursor_id(golden) != DEFECT_ID)
        moved = golden.rows[cursor_id(golden)]  # type: ignore[index]
        await wait_for(pilot, lambda: cursor_id(test) == moved.counterpart)
        # and the other way round
        test.focus()
        await pilot.press("up")
        await wait_for(pilot, lambda: cursor_id(golden) == DEFECT_ID)
        # an unmatched node says so
        golden.focus()
        golden.reveal(DEFECT_ID - 1)
        await wait_for(pilot, lambda: "unmatched" in _text(screen.query_one("#detail", Static)))


async def test_colour_toggle_and_metric_cycle(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, _ = trees(screen)
        await pilot.press("a")
        await wait_for(pilot, lambda: golden.color_by_added)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        st = screen.status[DEFECT_ID]
        assert st.worst == pytest.approx(st.added_error)  # coloured by the error the op adds
        assert "added error" in str(screen.query_one("#status", Static).render())
        heat = screen.query_one(HeatmapView)
        assert heat.data is not None and heat.data.metric == "verdict"  # coloured by the verdict by default
        legend = str(screen.query_one("#legend", Static).render())
        assert "worst of cosine ≥ 0.99, rel euclid ≤ 0.05" in legend
        for _ in range(6):
            await pilot.press("m")
            await wait_for(pilot, lambda: heat.data is not None and heat.data.metric == screen.metric)
        assert heat.data.metric == "relative_euclidean_distance"
        assert "rel euclid ≤ 0.05 passes" in str(screen.query_one("#legend", Static).render())


async def open_mapping_editor(pilot: Pilot[None], app: WorkbenchApp, golden_ops: int | None = 3) -> MappingScreen:
    """Press `e` and wait for the editor's golden list to hold `golden_ops` ops (None: any; the small catalog has
    three unmatched ops a side)."""
    await ready(pilot, app)
    await pilot.press("e")

    def listed() -> bool:
        if not app.screen.query("#golden-list"):
            return False
        n = app.screen.query_one("#golden-list", OptionList).option_count
        return n > 0 if golden_ops is None else n == golden_ops

    await wait_for(pilot, listed)
    assert isinstance(app.screen, MappingScreen)
    return app.screen


async def test_mapping_editor_pairs_unpairs_and_saves(small_catalog: Path, tmp_path: Path) -> None:
    target = tmp_path / "my_mapping.json"
    app = make_app(catalog=small_catalog, mapping=target)
    async with app.run_test(size=SIZE) as pilot:
        mapping = await open_mapping_editor(pilot, app)
        tlist = mapping.query_one("#test-list", OptionList)
        assert tlist.option_count == 3
        # filter the lists, then pair layer 2's act_fn with act
        mapping.query_one("#golden-filter", Input).value = "layers.2"
        mapping.query_one("#test-filter", Input).value = "layers.2"
        await pilot.pause()
        assert mapping.query_one("#golden-list", OptionList).option_count == 1
        mapping.query_one("#golden-sel", Input).value = "out:0"
        mapping.query_one("#test-sel", Input).value = "out:0"
        mapping.query_one("#golden-list", OptionList).focus()
        await pilot.press("p")
        assert mapping.mapping.pairs[0].golden == "root.model.layers.2.act_fn"
        try:
            import workbench.jobs.compare  # noqa: F401

            pipeline = True
        except ImportError:
            pipeline = False
        if pipeline:  # metrics of the new pair are computed at once and shown
            await wait_for(
                pilot, lambda: any(p.golden == "root.model.layers.2.act_fn" for p in mapping.pairs), timeout=60
            )
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert target.exists()
        saved = MappingFile.load(target)  # what `wb compare -mf` reads
        assert [(p.golden, p.test, str(p.golden_tensor)) for p in saved.pairs] == [
            ("root.model.layers.2.act_fn", "root.model.layers.2.act", "out:0")
        ]
        data = json.loads(target.read_text())
        assert data["format"] == "wb-mapping"
        # unpair a wrong pair
        plist = mapping.query_one("#pairs-list", OptionList)
        mapping.query_one("#pairs-filter", Input).value = "layers.0.q_proj"
        await pilot.pause()
        assert plist.option_count == 1
        plist.focus()
        await pilot.press("x")
        assert ("root.model.layers.0.q_proj", "root.model.layers.0.q_proj") in mapping.mapping.unpaired
        if pipeline:
            await wait_for(pilot, lambda: plist.option_count == 0, timeout=60)
        await pilot.press("ctrl+s", "escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
    saved = MappingFile.load(target)
    assert ("root.model.layers.0.q_proj", "root.model.layers.0.q_proj") in saved.unpaired


async def test_mapping_editor_pairs_every_layer_with_one_rule(small_catalog: Path, tmp_path: Path) -> None:
    """`l` on one layer's unmatched ops pairs them in every layer through a layer rule: metrics for all three pairs,
    the rule (not three pairs) in the saved file; `x` on the rule unpairs them all again."""
    target = tmp_path / "rules.json"
    app = make_app(catalog=small_catalog, mapping=target)
    async with app.run_test(size=SIZE) as pilot:
        mapping = await open_mapping_editor(pilot, app)
        mapping.query_one("#golden-filter", Input).value = "layers.2"
        mapping.query_one("#test-filter", Input).value = "layers.0"  # an example of each kind: any layers
        await pilot.pause()
        mapping.query_one("#golden-list", OptionList).focus()
        await pilot.press("l")
        assert [(r.golden, r.test) for r in mapping.mapping.rules] == [
            ("root.model.layers.*.act_fn", "root.model.layers.*.act")
        ]
        assert mapping.mapping.pairs == []
        await wait_for(pilot, lambda: sum(p.golden.endswith(".act_fn") for p in mapping.pairs) == 3, timeout=60)
        assert mapping.golden == [] and mapping.test == []
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = MappingFile.load(target)
        assert [(r.golden, r.test) for r in saved.rules] == [("root.model.layers.*.act_fn", "root.model.layers.*.act")]
        assert saved.pairs == []
        plist = mapping.query_one("#pairs-list", OptionList)
        mapping.query_one("#pairs-filter", Input).value = "rule"
        await pilot.pause()
        assert plist.option_count == 1 and plist.get_option_at_index(0).id == "r0"
        plist.focus()
        await pilot.press("x")
        assert mapping.mapping.rules == [] and mapping.mapping.unpaired == []
        await wait_for(pilot, lambda: len(mapping.golden) == 3, timeout=60)
        assert not any(p.golden.endswith(".act_fn") for p in mapping.pairs)


async def test_sql_console_results_errors_saved_queries_history(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("s")
        await wait_for(pilot, lambda: bool(app.screen.query("#editor")))
        sql = app.screen
        editor = sql.query_one("#editor", TextArea)
        editor.text = "SELECT token_id, golden_node FROM comparison WHERE NOT passed ORDER BY token_id, data_id"
        await pilot.press("ctrl+r")
        table = sql.query_one("#results", DataTable)
        await wait_for(pilot, lambda: table.row_count > 0)
        assert [str(c.label) for c in table.columns.values()] == ["token_id", "golden_node"]
        assert "row(s)" in str(sql.query_one("#sql-info", Static).render())
        editor.text = "DROP TABLE metrics"
        await pilot.press("ctrl+r")
        error = sql.query_one("#sql-error", Static)
        await wait_for(pilot, lambda: "read-only" in str(error.render()))
        # no earlier result under the error: it would read as this query's (issue 26 item 5)
        assert table.row_count == 0 and not table.columns
        assert "the query failed" in str(sql.query_one("#sql-info", Static).render())
        saved = sql.query_one("#saved", OptionList)
        await wait_for(pilot, lambda: saved.option_count > 0)
        names = sorted(p.stem for p in (REPO / "queries").glob("*.sql"))
        assert [saved.get_option_at_index(i).id for i in range(saved.option_count)] == (names or [None])
        if names:
            saved.focus()
            saved.highlighted = 0
            await pilot.press("enter")
            await wait_for(pilot, lambda: editor.text.startswith("--"))
        history = sql.query_one("#history", OptionList)
        await wait_for(pilot, lambda: history.option_count >= 2)
        editor.focus()
        await pilot.press("ctrl+up")
        assert editor.text == sql.history[0]
        await pilot.press("escape")
        assert isinstance(app.screen, MainScreen)


async def test_themes_switch_from_flag_palette_and_key(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog, theme="light")
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        assert app.theme == "wb-light"
        heat = screen.query_one(HeatmapView)
        light = heat._palette[0]
        await pilot.press("f2")
        await pilot.pause()
        assert app.theme != "wb-light"
        app.theme = "wb-high-contrast"
        await pilot.pause()
        assert heat._palette[0] != light and app.get_css_variables()["heat-6"] == "#ffe945"
        # the command palette offers every action of this screen and every theme
        provider = WorkbenchCommands(screen)
        titles = [t for t, _cb, _h in provider._commands()]
        for a in ACTIONS:
            if a.palette and a.scope in ("app", "main"):
                assert a.description in titles
        assert "Theme: wb-dark" in titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"mapping editor")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "MappingScreen")


async def test_the_palette_goes_to_an_op_by_name(small_catalog: Path) -> None:
    """Typed words that an op's full name holds, in the command palette, offer `Go to op: <name>`: chosen, the op is
    selected everywhere, as a click in a tree would (an L1 dump's thousand calls had no way in but scrolling)."""
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, test = trees(screen)
        target = golden.rows[DEFECT_ID]
        words = target.name.split(".")[-2:]  # its last two segments, typed as two words
        assert target in screen.ops_named(" ".join(words).upper())  # any case
        found = screen.ops_named(" ".join(words))
        assert target in found and all(all(w in r.name for w in words) for r in found), found
        assert screen.ops_named("   ") == [] and screen.ops_named("no-such-op-anywhere") == []
        golden.focus()
        await pilot.press("home")
        await wait_for(pilot, lambda: cursor_id(golden) != DEFECT_ID)
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*target.name)
        await pilot.pause(0.5)
        await pilot.press("enter")
        await wait_for(pilot, lambda: screen.selected == DEFECT_ID and cursor_id(golden) == DEFECT_ID)
        assert cursor_id(test) == target.counterpart
        await wait_for(pilot, lambda: target.name in _text(screen.query_one("#detail", Static)))


async def test_help_lists_every_key(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot, app)
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, MainScreen)
    from workbench.app.screens import help_table

    table = help_table()
    text = _text(table)
    for a in ACTIONS:
        assert a.description in text and a.label in text
    where = [str(cell) for cell in table.columns[0]._cells if str(cell)]
    assert len(where) == len(set(where)), where  # each scope's title once ("Heatmap" was listed twice)
    assert "Move the cell cursor (columns are tokens)" in text and "Mouse" in where


async def test_mouse_click_moves_the_heatmap_cursor(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        heat = screen.query_one(HeatmapView)
        gutter = heat._gutter
        await pilot.click(HeatmapView, offset=(gutter + heat.cell_w * 3, 1 + 3))  # token 3, row L2
        await wait_for(pilot, lambda: screen.token == 3)
        assert heat.cursor == (3, 3)


async def test_demo_born_op_and_its_atb_counterpart(demo_catalog: Path) -> None:
    con = duckdb.connect(str(demo_catalog), read_only=True)
    first = con.execute(
        "SELECT b.token_id, g.name, t.name FROM error_born b JOIN comparisons c USING (cmp_id) "
        "JOIN nodes g ON g.run_id = c.golden_run AND g.node_id = b.golden_node_id "
        "JOIN nodes t ON t.run_id = c.test_run AND t.node_id = b.test_node_id "
        "WHERE b.cmp_id = (SELECT max(cmp_id) FROM comparisons) ORDER BY b.token_id LIMIT 1"
    ).fetchone()
    con.close()
    assert first is not None
    token, golden_name, test_name = first
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        assert screen.token == token
        golden, test = trees(screen)
        await pilot.press("b")
        await wait_for(pilot, lambda: cursor_id(golden) == screen.born_id)
        assert golden.rows[cursor_id(golden)].name == golden_name  # type: ignore[index]
        await wait_for(pilot, lambda: cursor_id(test) is not None and test.rows[cursor_id(test)].name == test_name)  # type: ignore[index]
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "distribution of out0" in _text(detail), timeout=20)
        assert "error born here" in _text(detail) and test_name in _text(detail)


async def test_decode_tokens_link_to_the_decoder_graph(demo_catalog: Path) -> None:
    """A golden module pairs with the prefill graph's op at token 0 and the decoder graph's at later tokens:
    the linked tree and the detail pane follow the token."""
    con = duckdb.connect(str(demo_catalog), read_only=True)
    rows = con.execute(
        "SELECT b.token_id, t.name FROM error_born b JOIN comparisons c USING (cmp_id) "
        "JOIN nodes t ON t.run_id = c.test_run AND t.node_id = b.test_node_id "
        "WHERE b.cmp_id = (SELECT max(cmp_id) FROM comparisons) AND b.token_id IN (0, 1) ORDER BY 1"
    ).fetchall()
    con.close()
    expected = dict(rows)
    assert "Prefill_layer" in expected[0] and "Decoder_layer" in expected[1]
    app = make_app(catalog=demo_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, test = trees(screen)
        for token in (0, 1):
            while screen.token != token:
                await pilot.press("]" if screen.token < token else "[")
                await wait_for(pilot, lambda: screen.status_token == screen.token)
            await pilot.press("b")
            await wait_for(pilot, lambda: cursor_id(golden) == screen.born_id)
            await wait_for(
                pilot, lambda t=token: cursor_id(test) is not None and test.rows[cursor_id(test)].name == expected[t]
            )
            detail = screen.query_one("#detail", Static)
            await wait_for(pilot, lambda t=token, d=detail: f"test: {expected[t]}" in _text(d), timeout=20)


async def test_open_two_dumps_compares_with_progress_then_opens(demo_catalog: Path, tmp_path: Path) -> None:
    from workbench.app.messages import CompareProgress
    from workbench.app.screens import ProgressScreen

    seen: list[object] = []
    golden, test = demo_catalog.parent / "golden", demo_catalog.parent / "test"
    app = make_app(catalog=tmp_path / "catalog.duckdb", golden=golden, test=test)
    async with app.run_test(size=SIZE, message_hook=seen.append) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, (ProgressScreen, MainScreen)))
        screen = await ready(pilot, app)
        assert screen.born_id is not None
        progress = [m for m in seen if isinstance(m, CompareProgress)]
        assert progress and all(p.progress.done <= p.progress.total for p in progress)
    assert (tmp_path / "catalog.duckdb").exists()


async def test_escape_cancels_the_compare(demo_catalog: Path, tmp_path: Path) -> None:
    from workbench.app.screens import ProgressScreen

    golden, test = demo_catalog.parent / "golden", demo_catalog.parent / "test"
    app = make_app(catalog=tmp_path / "catalog.duckdb", golden=golden, test=test)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: isinstance(app.screen, ProgressScreen))
        await pilot.press("escape")
        assert app.cancel_event.is_set()
        await wait_for(
            pilot,
            lambda: (
                isinstance(app.screen, MainScreen)
                or (isinstance(app.screen, MessageScreen) and len(app.screen.query("#message")) > 0)
            ),
            timeout=60,
        )
        if isinstance(app.screen, MessageScreen):  # cancelled before the end (else it had finished)
            assert "cancelled" in _text(app.screen.query_one("#message", Static))


@pytest.mark.parametrize("case", ["missing", "newer", "broken", "theme", "foreign-dumps"])
async def test_bad_input_shows_a_message_screen(case: str, tmp_path: Path, small_catalog: Path) -> None:
    kwargs: dict[str, object] = {"catalog": tmp_path / "missing.duckdb"}
    expect = "catalog not found"
    if case == "newer":
        newer = tmp_path / "newer.duckdb"
        con = duckdb.connect(str(newer))
        con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION + 5)])
        con.close()
        kwargs, expect = {"catalog": newer}, "newer than this wb supports"
    elif case == "broken":  # right schema version, tables missing
        broken = tmp_path / "broken.duckdb"
        con = duckdb.connect(str(broken))
        con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        con.close()
        kwargs, expect = {"catalog": broken}, "not a usable wb catalog"
    elif case == "theme":
        kwargs, expect = {"catalog": small_catalog, "theme": "no-such-theme"}, "no such theme"
    elif case == "foreign-dumps":
        g, t = tmp_path / "g", tmp_path / "t"
        g.mkdir()
        t.mkdir()
        (g / "notes.txt").write_text("not a dump")
        (t / "notes.txt").write_text("not a dump")
        kwargs, expect = {"catalog": tmp_path / "out.duckdb", "golden": g, "test": t}, str(g)
    app = make_app(**kwargs)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE) as pilot:
        # the screen is pushed before it is composed: wait for the message itself
        await wait_for(
            pilot, lambda: isinstance(app.screen, MessageScreen) and len(app.screen.query("#message")) > 0, timeout=60
        )
        assert expect in _text(app.screen.query_one("#message", Static))
        await pilot.press("q")
    assert app.return_code == 2


def _text(widget: object) -> str:
    import io

    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content if isinstance(widget, Static) else widget)
    return console.export_text()
