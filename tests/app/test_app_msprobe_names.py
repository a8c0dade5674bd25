"""msprobe's dumps in the app. Every name ends with the call's direction (`...down_proj.Linear.forward`,
`Functional.linear.13.forward`), and the trees labelled every node `forward`: a module shows its attribute, an API
call its function and count. At `level: L1` (calls only) the heatmap had no row: no call named a layer, and every
call, a top-level node, was left out as the model's own. Real dumps by msprobe's `PrecisionDebugger`, the real app
by Pilot."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from textual.widgets import Static

from tests.app.test_app_pilot import cursor_id, ready, trees, wait_for
from tests.fixtures import stats_dumps
from tests.fixtures.app_catalogs import SIZE
from workbench.app.heatmap import HeatmapView
from workbench.app.launch import make_app
from workbench.formats.node_names import short_name, type_beside

pytestmark = pytest.mark.skipif(importlib.util.find_spec("msprobe") is None, reason="msprobe not installed")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _compared(base: Path, level: str, born: str, weight: str = "", call: str = "") -> Path:
    """A golden and a planted bf16 msprobe dump at `level`, compared; `born` is checked in the summary."""
    tokens = stats_dumps.dump("msprobe", "full", base / "golden", level=level)
    stats_dumps.dump("msprobe", "full", base / "bad", bf16=True, forced=tokens, level=level, weight=weight, call=call)
    out, con = stats_dumps.compare(base / "golden" / "dump", base / "bad" / "dump", base / "o")
    con.close()
    assert f"error born at: {born}" in out, out
    return base / "o" / "catalog.duckdb"


@pytest.fixture(scope="module")
def msprobe_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("msprobe_names")
    born = "Module.model.layers.1.mlp.down_proj.Linear.forward (token 0)"
    return _compared(base, "mix", born, weight="model.layers.1.mlp.down_proj=1.03")


@pytest.mark.anyio
async def test_the_trees_name_msprobe_modules_and_calls(msprobe_catalog: Path) -> None:
    app = make_app(catalog=msprobe_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, _test = trees(screen)
        node = golden.cursor_node
        assert node is not None and node.data is not None and cursor_id(golden) is not None
        assert node.data.name == "Module.model.layers.1.mlp.down_proj.Linear.forward"  # opens on the born op
        assert str(node.label) == "down_proj", node.label
        shown: list[str] = []
        stack = [golden.root]
        while stack:
            tree_node = stack.pop()
            stack.extend(tree_node.children)
            if tree_node.data is not None:
                shown.append(str(tree_node.label))
        assert "forward" not in shown and {"down_proj", "mlp", "layers"} & set(shown), shown
        calls = [label for label in shown if label.startswith(("linear.", "__mul__.", "pow."))]
        assert calls, shown  # the calls inside the modules, by function and count


@pytest.fixture(scope="module")
def l1_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """msprobe `level: L1`, bf16 test whose layer-1 input norm's rsqrt is 2 % off."""
    base = tmp_path_factory.mktemp("msprobe_l1_app")
    return _compared(base, "L1", "Torch.rsqrt.2.forward (token 0)", call="rsqrt=1.02@model.layers.1.input_layernorm")


@pytest.mark.anyio
async def test_level_l1_heatmap_has_the_layers_of_the_repeated_calls(l1_catalog: Path) -> None:
    app = make_app(catalog=l1_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        view = screen.query_one(HeatmapView)
        assert view.data is not None and view.data.row_labels == ["pre", "L0", "L1", "post"], view.data
        assert view.data.failed.any(), view.data.failed
        row, col = view.cursor
        assert view.data.row_labels[row] == "L1" and view.data.tokens[col] == 0, view.cursor  # where it is born
        await pilot.press("enter")  # drill into layer 1: its calls by function and count
        await wait_for(pilot, lambda: view.data is not None and view.data.layer == 1)
        assert view.data is not None and "rsqrt.2" in view.data.row_labels, view.data.row_labels
        assert all(not label.endswith("forward") for label in view.data.row_labels), view.data.row_labels


def test_short_names_of_each_dump_kind() -> None:
    assert short_name("Module.model.layers.1.mlp.down_proj.Linear.forward") == "down_proj"
    assert short_name("Module.model.LlamaModel.forward") == "model"
    assert short_name("Module.model.rotary_emb.LlamaRotaryEmbedding.forward#1") == "rotary_emb#1"  # a second call
    assert short_name("Functional.linear.13.forward") == "linear.13"
    assert short_name("Tensor.__mul__.5.backward") == "__mul__.5"
    assert short_name("root.model.layers.0.mlp") == "mlp"  # msit, wb
    assert short_name("3_Prefill_layer/3_RmsNormOperation") == "3_RmsNormOperation"  # ATB
    assert short_name("root") == "root"


def test_a_call_shows_no_type_its_short_name_already_says() -> None:
    assert type_beside("linear.13", "Functional.linear") == ""  # msprobe API calls
    assert type_beside("__mul__.5", "Tensor.__mul__") == "" and type_beside("rsqrt.2", "Torch.rsqrt") == ""
    assert type_beside("down_proj", "Linear") == "Linear"  # modules, msit's and ATB's ops keep theirs
    assert type_beside("mlp", "LlamaMLP") == "LlamaMLP" and type_beside("layer 0", "layer") == "layer"
    assert type_beside("3_RmsNormOperation", "RmsNormOperation") == "RmsNormOperation"


def _text(widget: Static) -> str:
    return str(widget.render())


@pytest.mark.anyio
async def test_level_l1_trees_fold_each_layers_calls_under_a_row(l1_catalog: Path) -> None:
    """Calls no module encloses: each layer's calls sit under a `layer k` row that rolls up their verdicts; the
    trees open on the born call inside its layer, the row of a layer says how its calls fare at the token shown."""
    app = make_app(catalog=l1_catalog)
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        golden, test = trees(screen)
        for tree in (golden, test):
            groups = [r for r in tree.rows.values() if r.is_layer_group]
            assert [g.name for g in sorted(groups, key=lambda g: g.layer or 0)] == ["layer 0", "layer 1"]
            for g in groups:  # a group holds exactly its layer's calls, and the calls of no other
                calls = tree.children_of[g.node_id]
                assert calls and {c.layer for c in calls} == {g.layer}, g
                assert all(c.parent_id == g.node_id and not c.is_layer_group for c in calls)
            top = [r for r in tree.children_of[None] if not r.is_layer_group]
            assert all(r.layer is None for r in top)  # embedding, rotary, final norm, the logits' linear
        born = cursor_id(golden)
        assert born is not None and golden.rows[born].name == "Torch.rsqrt.2.forward", born
        parent = golden.rows[born].parent_id
        assert parent is not None and golden.rows[parent].name == "layer 1"
        mark, _level, born_inside = golden._signature(golden.rows[parent])
        assert (mark, born_inside) == ("✗", True)
        golden.focus()
        await pilot.press("up")  # up through the layer's calls before the rsqrt to its row
        while golden.cursor_node is not None and golden.cursor_node.data is not None:
            if golden.cursor_node.data.is_layer_group:
                break
            await pilot.press("up")
        assert cursor_id(golden) == parent
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: _text(detail).startswith("layer 1"))
        summary = golden.group_summary(golden.rows[parent], screen.status_token)
        assert summary.failed >= 1 and summary.born == "Torch.rsqrt.2.forward"
        shown = _text(detail)
        assert f"{summary.compared} of {summary.calls} calls compared, {summary.failed} fail" in shown, shown
        assert "error born here: Torch.rsqrt.2.forward" in shown, shown
        await wait_for(pilot, lambda: cursor_id(test) == parent)  # the test tree follows to its layer 1
        await pilot.press("n")  # from the row, the next failing call (a call, never a layer's row)
        await wait_for(pilot, lambda: cursor_id(golden) != parent)
        moved = golden.rows[cursor_id(golden)]  # type: ignore[index]
        assert not moved.is_layer_group and golden.failing(moved), moved
