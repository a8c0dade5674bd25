"""The app's rank selector on a 2-rank comparison (`wb demo --tp 2`): the rank bar, `r`/`R`, and every pane
following the rank shown; hidden and harmless on a single-rank comparison."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.app.test_app_pilot import ready, settle, wait_for
from workbench.app.launch import make_app
from workbench.app.main_screen import MainScreen
from workbench.app.rank_bar import RankBar


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _app(catalog: Path):  # type: ignore[no-untyped-def]
    return make_app(catalog=catalog, mapping=Path("wb_mapping.json"))  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_rank_keys_switch_every_pane(tp_demo_catalog: Path, tmp_path: Path) -> None:
    # a copy: the app writes to the catalog it shows (the snapshot below must see the demo's catalog as made)
    catalog = tmp_path / tp_demo_catalog.name
    shutil.copy(tp_demo_catalog, catalog)
    app = _app(catalog)
    async with app.run_test(size=(140, 44)) as pilot:
        screen = await ready(pilot, app)
        bar = screen.query_one(RankBar)
        await wait_for(pilot, lambda: len(bar.entries) == 2)
        assert bar.display and [e.rank for e in bar.entries] == [0, 1]
        assert all(e.allreduce_failed > 0 and e.culprit_rank == 1 for e in bar.entries)
        start = screen.explorer.info.cmp_id
        token, selected = screen.token, screen.selected
        assert selected is not None
        name = screen._tree("golden").rows[selected].name
        assert name == "root.model.layers.1.self_attn.o_proj"  # the advisor's origin, the all-reduce's op
        other = next(e.cmp_id for e in bar.entries if e.cmp_id != start)

        await pilot.press("r")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen) and app.screen is not screen)
        switched = await ready(pilot, app)
        assert switched.explorer.info.cmp_id == other and app.cmp_id == other
        assert switched.token == token  # same token, same golden op, in the other rank's comparison
        assert switched._tree("golden").rows[switched.selected].name == name
        # the test tree, the heatmap and the advisor read the other rank's run
        test_run = switched.explorer.info.test_run
        assert test_run != screen.explorer.info.test_run
        rows, _ = switched.explorer.advice(top=1)
        assert rows and rows[0].golden_node == name
        await wait_for(pilot, lambda: switched.query_one(RankBar).current == other)
        assert "▶" in str(switched.query_one(RankBar).render())

        await pilot.press("R")
        await wait_for(pilot, lambda: isinstance(app.screen, MainScreen) and app.screen is not switched)
        back = await ready(pilot, app)
        assert back.explorer.info.cmp_id == start


@pytest.mark.anyio
async def test_single_rank_has_no_rank_bar(demo_catalog: Path) -> None:
    app = _app(demo_catalog)
    async with app.run_test(size=(140, 44)) as pilot:
        screen = await ready(pilot, app)
        await pilot.app.workers.wait_for_complete()
        assert not screen.query_one(RankBar).display
        await pilot.press("r")
        await pilot.pause(0.2)
        assert app.screen is screen  # nothing to switch to


def test_snapshot_tp_ranks_80x24(snap_compare, tp_demo_catalog: Path) -> None:  # type: ignore[no-untyped-def]
    app = _app(tp_demo_catalog)

    async def before(pilot) -> None:  # type: ignore[no-untyped-def]
        screen = await ready(pilot, app)
        await wait_for(pilot, lambda: len(screen.query_one(RankBar).entries) == 2)
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=before)
