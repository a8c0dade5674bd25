"""The footer at narrow and wide terminals: keys that do not fit are left out whole, help and quit stay."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets._footer import FooterKey

from tests.app.test_app_pilot import ready
from workbench.app.footer import KeysFooter
from workbench.app.launch import make_app

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def shown(footer: KeysFooter) -> list[FooterKey]:
    return [k for k in footer.query_children(FooterKey) if k.display]


@pytest.mark.parametrize("width", [80, 200])
async def test_footer_keys_fit_whole(small_catalog: Path, width: int) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(width, 24)) as pilot:
        screen = await ready(pilot, app)
        footer = screen.query_one(KeysFooter)
        await pilot.pause(0.2)
        keys = shown(footer)
        actions = [k.action.rsplit(".", 1)[-1] for k in keys]
        assert "help" in actions and "quit" in actions
        assert sum(KeysFooter._width(k) for k in keys) <= footer.size.width
        every = list(footer.query_children(FooterKey))
        if width == 80:
            assert footer.compact and len(keys) < len(every)  # some keys left out, none cut
            assert "next_token" in actions  # the first keys of the table come first
        else:
            # every key of the main screen at 200 columns (compact where that is what fits them all; issue 26 item 4)
            assert len(keys) == len(every)
            for action in ("precheck", "redump", "prev_failing", "next_rank", "focus_next_pane", "cycle_theme"):
                assert action in actions


async def test_footer_shows_keys_again_when_widened(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await ready(pilot, app)
        footer = screen.query_one(KeysFooter)
        await pilot.pause(0.2)
        narrow = len(shown(footer))
        await pilot.resize_terminal(200, 40)
        await pilot.pause(0.3)
        assert len(shown(footer)) > narrow
        assert len(shown(footer)) == len(list(footer.query_children(FooterKey)))
