"""Pilot test of the logits strip: one cell per token above the heatmap, red where the logits fail, grey where
the runs were fed different tokens (with the reason), KL of the current token in its label; hover and click."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from textual.widgets import Static

from tests.app.test_app_pilot import _text, ready, wait_for
from tests.conftest import run_wb, tiny_llama
from tests.fixtures.app_catalogs import SIZE
from workbench.app.heatmap import HeatmapView
from workbench.app.launch import make_app
from workbench.app.logits_strip import LABEL, LogitsStrip

pytestmark = pytest.mark.anyio
NEW = 4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _dump(model: torch.nn.Module, base: Path) -> tuple[Path, list[int]]:
    from workbench.dump import DumpConfig, register_hook

    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    handle = register_hook(model, DumpConfig(dump_path=base, token_range=list(range(NEW))))
    try:
        out = model.generate(  # type: ignore[operator]
            prompt, max_new_tokens=NEW, do_sample=False, attention_mask=torch.ones_like(prompt)
        )
    finally:
        handle.remove()
    return next(base.glob("msit_dump_*")), [int(t) for t in out[0, 8:]]


@pytest.fixture(scope="module")
def diverging_catalog(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int], list[int]]:
    """A comparison whose test run (wrong norm epsilon, free-running) is fed other tokens from token 1 on."""
    base = tmp_path_factory.mktemp("strip")
    model = tiny_llama()
    golden, g_ids = _dump(model, base / "golden")
    bad = copy.deepcopy(model)
    bad.model.layers[1].input_layernorm.variance_epsilon = 1.0  # type: ignore[index,union-attr]
    test, t_ids = _dump(bad, base / "test")
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(base / "out"))
    assert res.returncode == 0, res.stderr
    return base / "out" / "catalog.duckdb", g_ids, t_ids


async def test_logits_strip_cells_label_hover_and_click(diverging_catalog: tuple[Path, list[int], list[int]]) -> None:
    catalog, g_ids, t_ids = diverging_catalog
    app = make_app(catalog=catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        strip = screen.query_one(LogitsStrip)
        await wait_for(pilot, lambda: len(strip.cells) == NEW)
        assert strip.display and strip.region.y < screen.query_one(HeatmapView).region.y  # above the heatmap
        assert [strip.style_of(c) for c in strip.cells] == ["fail"] + ["differ"] * (NEW - 1)
        assert strip.cells[0].kl is not None and strip.cells[0].kl > 0
        assert f"golden token id {g_ids[0]}, test token id {t_ids[0]}" in str(strip.cells[1].inputs_reason)
        assert screen.token == 0
        shown = str(strip.render_text())
        assert shown.startswith(LABEL) and "FAIL" in shown and len(shown) <= strip.content_size.width
        current = strip.cell(0)
        assert current is not None and "token 0: logits FAIL; KL" in current.describe()
        # the line is cut at a part's end to fit the pane, never inside a part
        assert current.describe_within(24) == "token 0: logits FAIL"
        assert current.describe_within(10) == "FAIL"

        await pilot.press("right")
        await wait_for(pilot, lambda: screen.token == 1)
        assert "token 1: logits" in strip.cell(1).describe() and "inputs differ" in strip.cell(1).describe()  # type: ignore[union-attr]
        assert len(str(strip.render_text())) <= strip.content_size.width
        # the status line and the detail's verdict say why no op is named there, not "none stands out"
        differ = f"inputs differ (golden token id {g_ids[0]}, test token id {t_ids[0]})"
        status, detail = screen.query_one("#status", Static), screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: f"token 1 {differ}" in str(status.render()))
        assert "no op named" in str(status.render()) and "none stands out" not in str(status.render())
        await wait_for(pilot, lambda: "token 1" in _text(detail) and "metric" in _text(detail))
        assert f"token 1: {differ}: no op named" in " ".join(_text(detail).split()), _text(detail)

        x = 1 + len(LABEL) + 3 * strip.width_per_cell  # the cell of token 3
        await pilot.hover(strip, offset=(x, 0))
        await wait_for(pilot, lambda: strip.tooltip is not None and "token 3" in str(strip.tooltip))
        await pilot.click(strip, offset=(x, 0))
        await wait_for(pilot, lambda: screen.token == 3)
        assert screen.query_one(HeatmapView).cursor[1] == 3


def test_a_long_strip_shows_a_window_around_the_current_token_and_its_line() -> None:
    """A 1,000-token comparison: the strip is one line, so it shows the cells around the current token and keeps
    room for that token's line (KL, cosine, top-1), which the cells used to push off the line."""
    from workbench.analysis.explorer.token_view import StripCell
    from workbench.app.logits_strip import LABEL, LINE_ROOM, LogitsStrip

    strip = LogitsStrip()
    strip.cells = [StripCell(t, t % 7 != 3, 0.01 * t, 0.99, 5, 5, False, None) for t in range(1000)]
    strip.width_per_cell = 4
    width = 120
    fit = (width - len(LABEL) - LINE_ROOM) // strip.width_per_cell
    for token in (0, 500, 501, 999, 20):
        strip.token = token
        shown = [c.token for c in strip._shown(width)]
        assert token in shown and len(shown) == fit, (token, shown)
        assert len(LABEL) + len(shown) * strip.width_per_cell + LINE_ROOM <= width
    strip.token = 500
    first = strip._shown(width)[0].token
    strip.token = 501  # a step inside the window does not scroll it
    assert strip._shown(width)[0].token == first
    strip.cells = strip.cells[:5]  # few tokens: all of them, from the first
    assert [c.token for c in strip._shown(width)] == [0, 1, 2, 3, 4]
