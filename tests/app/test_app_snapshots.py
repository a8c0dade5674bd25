"""SVG snapshots of the app's screens at a fixed size (also the screenshots of docs/app.md).

A screen is compared with its snapshot with every figure of its text masked (`tests/app/conftest.py`'s
`snap_compare`): its layout, styles, colours and words must match, not the figures, which the CPU's own rounding
moves. The figures are checked by the tests that compute them.

Update after an intended change with `pytest tests/app/test_app_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, OptionList, TextArea

from tests.app.test_app_pilot import open_mapping_editor, ready, settle, wait_for
from tests.fixtures.app_catalogs import SIZE
from workbench.app.launch import make_app


def main_app(catalog: Path, **kwargs: object):  # type: ignore[no-untyped-def]
    return make_app(catalog=catalog, mapping=Path("wb_mapping.json"), **kwargs)  # type: ignore[arg-type]


def test_snapshot_demo_main(snap_compare, demo_catalog: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(demo_catalog)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await ready(pilot, app)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_demo_born(snap_compare, demo_catalog: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(demo_catalog)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        screen = await ready(pilot, app)
        await pilot.press("b")
        await wait_for(pilot, lambda: screen.selected is not None)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_main(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await ready(pilot, app)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_drilled_op_detail(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        screen = await ready(pilot, app)
        await pilot.press("right", "enter")  # the cursor starts on the born op's layer (L1)
        await wait_for(pilot, lambda: screen.drill_layer == 1 and screen.selected is not None)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_high_contrast(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master, theme="high-contrast")

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        screen = await ready(pilot, app)
        await pilot.press("b")
        await wait_for(pilot, lambda: screen.selected is not None)
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_mapping_editor(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await open_mapping_editor(pilot, app, golden_ops=None)
        for field in app.screen.query(Input):  # focus starts in the filter: no blinking cursor in the picture
            field.cursor_blink = False
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_sql_console(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await ready(pilot, app)
        await pilot.press("s")
        await wait_for(
            pilot,
            lambda: bool(app.screen.query("#editor")) and app.screen.query_one("#saved", OptionList).option_count > 0,
        )
        app.screen.query_one("#editor", TextArea).text = (
            "SELECT b.token_id, n.name AS error_born_at\nFROM error_born b JOIN nodes n\n"
            "  ON n.run_id = 1 AND n.node_id = b.golden_node_id\nWHERE b.cmp_id = getvariable('cmp_id')\n"
            "ORDER BY 1;"
        )
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: "row(s)" in str(app.screen.query_one("#sql-info").render()))
        # the table measures its columns when idle: wait for the widths of the rows, not a fixed time
        await wait_for(pilot, lambda: app.screen.query_one("#results", DataTable).virtual_size.width > 35)
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_help(snap_compare, small_catalog_master: Path) -> None:  # type: ignore[no-untyped-def]
    app = main_app(small_catalog_master)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await ready(pilot, app)
        await pilot.press("f1")
        await pilot.pause(0.2)

    assert snap_compare(app, terminal_size=SIZE, run_before=before)


def test_snapshot_bad_input(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = make_app(catalog=Path("/nonexistent/catalog.duckdb"))

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await wait_for(pilot, lambda: type(app.screen).__name__ == "MessageScreen")
        await pilot.pause(0.1)

    assert snap_compare(app, terminal_size=(100, 20), run_before=before)


@pytest.mark.parametrize("size", [(80, 24), (120, 30), (200, 50)], ids=["80x24", "120x30", "200x50"])
def test_snapshot_demo_sizes(snap_compare, demo_catalog: Path, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    """The layout sized to the data and the terminal: every heatmap row visible, the detail pane growing."""
    app = main_app(demo_catalog)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        await ready(pilot, app)
        await settle(pilot)

    assert snap_compare(app, terminal_size=size, run_before=before)
