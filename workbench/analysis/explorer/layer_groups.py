"""One row per layer in the trees of a dump whose calls no module encloses.

msprobe's `level: L1` dumps hold API calls only (`Functional.linear.13.forward`): every node is top level, and a
tree of them is one flat list (~30 calls a layer: a thousand rows for a 32-layer model, in which a failing call's
layer is not shown anywhere). The reader numbers their layers by the block of calls that repeats
(`formats.layers.layers_by_repetition`); here each layer's calls go under one row, `layer k`, as a module dump's
decoder layer holds its ops, and the row rolls its calls' verdicts up. A dump with any node inside another (modules,
ATB's layer ops) keeps its own structure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from workbench.analysis.explorer.views import LayerGroupSummary, NodeStatus, Side, TreeRow, layer_group_id


def with_layer_groups(rows: Sequence[TreeRow], counterpart_layers: dict[int, int]) -> list[TreeRow]:
    """`rows` (one side's nodes in execution order) with a group row before each layer's first call and that
    layer's calls under it; the rows unchanged where a node has a parent or no node has a layer.
    `counterpart_layers`: the layer of each row's counterpart on the other side, by row id (a group's counterpart
    is the other side's group of the layer most of its calls meet)."""
    if not any(r.layer is not None for r in rows) or any(r.parent_id is not None for r in rows):
        return list(rows)
    meets: dict[int, Counter[int]] = {}
    for r in rows:
        if r.layer is not None and r.node_id in counterpart_layers:
            meets.setdefault(r.layer, Counter())[counterpart_layers[r.node_id]] += 1
    out: list[TreeRow] = []
    seen: set[int] = set()
    for r in rows:
        if r.layer is None:
            out.append(r)
            continue
        group = layer_group_id(r.layer)
        if r.layer not in seen:
            seen.add(r.layer)
            met = meets.get(r.layer)
            out.append(
                TreeRow(
                    node_id=group,
                    name=f"layer {r.layer}",
                    type="layer",
                    parent_id=None,
                    depth=0,
                    exec_order=r.exec_order,
                    layer=r.layer,
                    shape="",
                    counterpart=layer_group_id(met.most_common(1)[0][0]) if met else None,
                    has_tensors=False,
                )
            )
        out.append(replace(r, parent_id=group, depth=r.depth + 1))
    return out


def summarize_group(
    group: TreeRow,
    side: Side,
    calls: Sequence[TreeRow],
    status_of: Callable[[TreeRow], NodeStatus | None],
    severity_of: Callable[[NodeStatus], float | None],
    born_id: int | None,
    token: int | None,
) -> LayerGroupSummary:
    """A group row's calls at the token shown: how many have a verdict, fail, hold NaN/Inf, where the error is born
    (`born_id`: a node of this side) and which is the worst by the colouring (`severity_of`: higher is worse)."""
    if group.layer is None:
        raise ValueError(f"not a layer's group row: {group.name}")
    compared = failed = nan_inf = 0
    worst: tuple[float, str] | None = None
    born = None
    for row in calls:
        if row.node_id == born_id:
            born = row.name
        st = status_of(row)
        if st is None:
            continue
        compared += st.passed is not None or st.has_nan_inf
        failed += st.passed is False
        nan_inf += st.has_nan_inf
        sev = severity_of(st)
        if sev is not None and sev == sev and (worst is None or sev > worst[0]):
            worst = (sev, row.name)
    return LayerGroupSummary(
        layer=group.layer,
        side=side,
        calls=len(calls),
        compared=compared,
        failed=failed,
        nan_inf=nan_inf,
        born=born,
        worst=None if worst is None else worst[1],
        worst_severity=None if worst is None else worst[0],
        token=token,
    )
