"""The trees' layer rows (`analysis.explorer.layer_groups`): calls that no module encloses go under one row per layer;
a dump with structure of its own keeps it."""

from __future__ import annotations

from workbench.analysis.explorer.layer_groups import summarize_group, with_layer_groups
from workbench.analysis.explorer.views import NodeStatus, TreeRow, layer_group_id


def _row(node_id: int, layer: int | None, parent: int | None = None, counterpart: int | None = None) -> TreeRow:
    return TreeRow(node_id, f"Functional.linear.{node_id}.forward", "Functional.linear", parent, 0, node_id, layer,
                   "[1, 8]", counterpart, True)  # fmt: skip


def test_calls_go_under_one_row_per_layer_in_call_order() -> None:
    rows = [_row(0, None), _row(1, 0), _row(2, 0), _row(3, 1), _row(4, 1), _row(5, None)]
    grouped = with_layer_groups(rows, {1: 0, 2: 0, 3: 2, 4: 2, 5: 9})
    assert [r.node_id for r in grouped] == [0, -1, 1, 2, -2, 3, 4, 5]
    first, second = grouped[1], grouped[4]
    assert (first.name, first.layer, first.is_layer_group, first.exec_order) == ("layer 0", 0, True, 1)
    assert first.short_name == "layer 0" and not first.has_tensors and first.parent_id is None
    assert [r.parent_id for r in grouped if not r.is_layer_group] == [None, -1, -1, -2, -2, None]
    assert [r.depth for r in grouped if r.parent_id is not None] == [1, 1, 1, 1]
    # a group's counterpart: the other side's group of the layer its calls meet
    assert first.counterpart == layer_group_id(0)
    assert second.counterpart == layer_group_id(2)  # (the other side's layers need not be numbered alike)


def test_dumps_with_structure_or_without_layers_keep_their_rows() -> None:
    modules = [_row(0, None), _row(1, 0, parent=0), _row(2, 0, parent=1)]
    assert with_layer_groups(modules, {}) == modules
    flat = [_row(0, None), _row(1, None)]
    assert with_layer_groups(flat, {}) == flat


def test_a_group_counts_its_calls_at_the_token_shown() -> None:
    rows = with_layer_groups([_row(1, 0), _row(2, 0), _row(3, 0), _row(4, 0)], {})
    group, calls = rows[0], rows[1:]

    def status(node_id: int, passed: bool | None, worst: float | None, nan_inf: bool = False) -> NodeStatus:
        return NodeStatus(node_id, node_id, passed, worst, None, nan_inf, False)

    statuses = {1: status(1, True, 0.2), 2: status(2, False, 3.0), 3: status(3, False, 1.5, nan_inf=True)}
    summary = summarize_group(
        group, "golden", calls, lambda r: statuses.get(r.node_id), lambda st: st.worst, born_id=3, token=2
    )
    assert (summary.layer, summary.calls, summary.compared, summary.failed, summary.nan_inf) == (0, 4, 3, 2, 1)
    assert summary.born == "Functional.linear.3.forward" and summary.worst == "Functional.linear.2.forward"
    assert summary.worst_severity == 3.0
    assert summary.token == 2
