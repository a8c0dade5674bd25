"""Pilot tests of the app on a quantized comparison: the trees coloured by the error beyond the expected int8
noise (`a` cycles heatmap colouring -> added error -> beyond int8 noise), the fallback list in the advisor."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from textual.widgets import OptionList, Static

from tests.app.test_app_pilot import ready, trees, wait_for
from tests.fixtures.app_catalogs import SIZE
from workbench.app.launch import make_app
from workbench.app.screens import PickerScreen
from workbench.core.advice import STANDS_OUT
from workbench.demo import make_demo
from workbench.jobs.compare import run_compare

pytestmark = pytest.mark.anyio
PLANTED = "root.model.layers.2.mlp.down_proj"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def quant_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("quant_app")
    plan = make_demo(out, stack="quant", defect="act_clip", scheme="w8a8", log=lambda _s: None)
    catalog = out / "catalog.duckdb"
    run_compare(plan.golden, plan.test, catalog, workers=1)
    return catalog


def _planted(catalog: Path) -> tuple[int, float]:
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        row = con.execute(
            "SELECT a.golden_node_id, a.score FROM advice a JOIN nodes n ON n.run_id = 1 "
            "AND n.node_id = a.golden_node_id WHERE n.name = ? AND a.token_id = 0",
            [PLANTED],
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), float(row[1])


async def test_trees_coloured_by_the_error_beyond_int8_noise(quant_catalog: Path) -> None:
    node, score = _planted(quant_catalog)
    assert score >= STANDS_OUT
    app = make_app(catalog=quant_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, _ = trees(screen)
        await pilot.press("a")
        await wait_for(pilot, lambda: golden.color_by_added and not screen.color_by_quant)
        await pilot.press("a")
        await wait_for(pilot, lambda: screen.color_by_quant and golden.added_bound == STANDS_OUT)
        await pilot.app.workers.wait_for_complete()
        await wait_for(pilot, lambda: screen.status.get(node) is not None and screen.status[node].added_error == score)
        assert "beyond int8 noise" in str(screen.query_one("#status", Static).render())
        await pilot.press("a")  # back to the heatmap's colouring
        await wait_for(pilot, lambda: not golden.color_by_added and not screen.color_by_quant)


async def test_advisor_lists_the_fallback_layers(quant_catalog: Path) -> None:
    node, _ = _planted(quant_catalog)
    app = make_app(catalog=quant_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        await pilot.press("v")
        await wait_for(pilot, lambda: isinstance(app.screen, PickerScreen))
        picker = app.screen
        assert isinstance(picker, PickerScreen)
        labels = [e.label for e in picker.entries]
        assert labels[0].startswith("  1  token 0    " + PLANTED) and "clipping" in labels[0]
        keep = [lb for lb in labels if lb.startswith("keep in float")]
        assert keep and keep[0].startswith(f"keep in float #1: {PLANTED}") and "est. gain" in keep[0]
        lst = picker.query_one(OptionList)
        lst.highlighted = labels.index(keep[0])
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.screen is screen)
        await wait_for(pilot, lambda: screen.selected == node)
