"""What a new user hit the second time in the app (issue 26 items 1-3, 7), through the real app via Pilot."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import Static

from tests.conftest_app import DEFECT_ID, SIZE
from tests.test_app_pilot import ready, wait_for
from workbench.app.launch import make_app

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
