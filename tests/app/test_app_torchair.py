"""The app on a TorchAir comparison (FX golden, GE test), through Pilot: it opens on the born op, trees and detail."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Static

from tests.conftest import run_wb
from tests.fixtures.app_catalogs import SIZE
from tests.unit.test_formats_torchair import _dump_both
from workbench.app.launch import make_app
from workbench.app.main_screen import MainScreen
from workbench.backends.torchair import GeDefect

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _until(pilot, cond, timeout: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    for _ in range(int(timeout / 0.05)):
        await pilot.pause(0.05)
        if cond():
            return
    raise AssertionError("condition not reached in time")


async def test_app_opens_a_torchair_comparison(tmp_path: Path) -> None:
    golden, test, _ge, _eager = _dump_both(tmp_path, GeDefect("down", "mm", scale=2.0))
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"))
    assert res.returncode in (0, 1), res.stdout + res.stderr
    app = make_app(catalog=tmp_path / "out" / "catalog.duckdb")
    async with app.run_test(size=SIZE) as pilot:
        await _until(
            pilot, lambda: isinstance(app.screen, MainScreen) and bool(app.screen.status) and app.screen.born_id
        )
        screen = app.screen
        assert isinstance(screen, MainScreen)
        await pilot.app.workers.wait_for_complete()
        # the status names the born op once the trees hold its row (they load in a worker of their own)
        await _until(pilot, lambda: "error born at: mm_2" in str(screen.query_one("#status", Static).render()), 60)
        status = str(screen.query_one("#status", Static).render())
        assert "error born at: mm_2-aten.mm.default" in status, status
        assert screen.selected == screen.born_id  # the born op is selected at start-up
