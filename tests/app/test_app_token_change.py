"""A token change on a token already read recolours the trees at once, with no worker (issue 26 item 10).

The explorer keeps each token's view (roll-ups, verdict, shapes); the main screen reads the tokens either side of
the one shown ahead, so walking the tokens finds them cached; an answer to an earlier status load is dropped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.app.test_app_pilot import ready, trees, wait_for
from workbench.analysis.explorer.explore import Explorer
from workbench.analysis.explorer.views import TokenVerdict
from workbench.app.launch import make_app
from workbench.app.messages import StatusReady

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def test_cached_token_status_is_none_until_read_then_the_same_view(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        token = ex.info.tokens[1]
        assert ex.cached_token_status(token) is None  # nothing read yet: the UI thread must not query
        view = ex.token_status(token)
        cached = ex.cached_token_status(token)
        assert cached == view and cached is not None
        assert cached.status is ex.node_status(token)  # the cache's own roll-up, not a second read
        assert cached.verdict == ex.verdict(token) and cached.verdict.golden == ex.born_evidence(token)[0]
        assert cached.shapes == {"golden": ex.shapes_at("golden", token), "test": ex.shapes_at("test", token)}
        assert ex.cached_token_status(token, "cosine_similarity") is None  # keyed by colouring
    finally:
        ex.close()


def status_workers(app) -> int:  # type: ignore[no-untyped-def]
    return sum(1 for w in app.workers if w.group == "status")


async def test_neighbours_are_read_ahead_and_shown_without_a_worker(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await ready(pilot, app)
        tokens = screen.explorer.info.tokens
        start = screen.token
        i = tokens.index(start)
        neighbours = [tokens[j] for j in (i - 1, i + 1) if 0 <= j < len(tokens)]
        await wait_for(
            pilot, lambda: all(screen.explorer.cached_token_status(t) is not None for t in neighbours)
        )  # read ahead
        before = status_workers(app)
        await pilot.press("right")
        # recoloured in the key's own handler: no status worker, the trees show the new token's roll-ups
        assert screen.token == tokens[i + 1] and screen.status_token == tokens[i + 1]
        assert status_workers(app) == before
        golden, test = trees(screen)
        assert golden.status is screen.explorer.node_status(tokens[i + 1])
        assert screen.born_id == screen.explorer.born(tokens[i + 1])[0]
        assert test.shapes == screen.explorer.shapes_at("test", tokens[i + 1])
        # and its own neighbours are read in turn
        await wait_for(pilot, lambda: screen.explorer.cached_token_status(tokens[i + 2]) is not None)


async def test_an_answer_to_an_earlier_status_load_is_dropped(small_catalog: Path) -> None:
    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(120, 30)) as pilot:
        screen = await ready(pilot, app)
        shown = screen.status
        stale = StatusReady(
            screen.token, {}, TokenVerdict(None, None, None, None, None), {}, request=screen._status_request - 1
        )
        screen.on_status_ready(stale)  # e.g. the last colouring's worker, finishing after the colouring changed
        assert screen.status is shown and screen.born_id is not None


async def test_detail_pane_follows_the_last_token_after_the_repaint(small_catalog: Path) -> None:
    """The detail pane loads a frame after a token change (its layout pass would hold back the trees' repaint); keys
    pressed in a row end with the detail of the last token and the op still selected, never an earlier one."""
    from textual.widgets import Static

    from tests.app.test_app_pilot import _text

    app = make_app(catalog=small_catalog)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await ready(pilot, app)
        selected, tokens = screen.selected, screen.explorer.info.tokens
        assert selected is not None and screen.token == tokens[1]
        await pilot.press("left", "right", "right")
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: f"token {tokens[2]}" in _text(detail) and screen._detail_timer is None)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.token == tokens[2] and screen.selected == selected
        assert f"token {tokens[2]}" in _text(detail) and f"token {tokens[0]}" not in _text(detail)
