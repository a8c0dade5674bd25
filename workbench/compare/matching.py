"""Pairing golden nodes with test nodes, then golden tensors with test tensors.

The ladder, highest priority first (a golden node matched by a higher rung is not matched
again by a lower one):

1. explicit pairs of a mapping file (`mapping-file`),
2. layer-wildcard rules of a mapping file (`mapping-rule`),
3. type maps (msit's `op_mapping_file.json` or the `types` of ours) zipped per layer when
   the counts agree (`type-map`),
4. identical node names, for two dumps of the same kind (`name`),
5. automatic torch <-> accelerated-library mapping (`auto-*`, `workbench.compare.automap`).

Pairs the user rejected (`unpaired` in the mapping file) are dropped whatever produced them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.compare.mapping import MappingFile, TensorSel

NODE_COLUMNS = ["node_id", "name", "type", "parent_id", "depth", "exec_order", "layer", "phase", "params"]


@dataclass(slots=True)
class RunFrames:
    """The nodes and tensors of one run, as loaded from the catalog."""

    run_id: int
    kind: str
    nodes: pd.DataFrame  # NODE_COLUMNS
    tensors: pd.DataFrame  # tensor_id, token_id, node_id, io, idx, dtype, shape, numel, path, ...

    def by_name(self) -> dict[str, int]:
        return dict(zip(self.nodes["name"], self.nodes["node_id"]))


@dataclass(slots=True)
class NodeMatch:
    golden_node_id: int
    test_node_id: int
    method: str
    confidence: float = 1.0
    evidence: str = ""
    golden_sel: TensorSel = TensorSel()
    test_sel: TensorSel = TensorSel()
    transform: str | None = None


AutoMatcher = Callable[[RunFrames, RunFrames, set[int]], list[NodeMatch]]


def _layer_key(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _ordered(nodes: pd.DataFrame) -> pd.DataFrame:
    return nodes.sort_values(["exec_order", "node_id"], na_position="last")


def match_nodes(
    golden: RunFrames, test: RunFrames, mapping: MappingFile | None = None, auto: AutoMatcher | None = None
) -> list[NodeMatch]:
    """Node pairs by the ladder above."""
    out: list[NodeMatch] = []
    taken: set[int] = set()  # golden nodes matched with all tensors
    g_names, t_names = golden.by_name(), test.by_name()
    rejected = set(mapping.unpaired) if mapping else set()
    g_name_of = dict(zip(golden.nodes["node_id"], golden.nodes["name"]))
    t_name_of = dict(zip(test.nodes["node_id"], test.nodes["name"]))

    def add(m: NodeMatch) -> None:
        if (g_name_of[m.golden_node_id], t_name_of[m.test_node_id]) in rejected:
            return
        out.append(m)

    if mapping:
        # 1. explicit pairs: several per node allowed (different tensors)
        explicit: set[int] = set()
        for p in mapping.pairs:
            g, t = g_names.get(p.golden), t_names.get(p.test)
            if g is None or t is None:
                continue
            add(
                NodeMatch(
                    g, t, "mapping-file", 1.0, f"pair in {mapping.source or 'mapping'}", p.golden_tensor, p.test_tensor
                )
            )
            explicit.add(g)
        taken |= explicit
        # 2. layer-wildcard rules
        for r in mapping.rules:
            gre, tre = r.golden_regex(), r.test_regex()
            g_hits = golden.nodes[golden.nodes["name"].map(lambda s, rx=gre: bool(rx.match(s)))]
            t_hits = test.nodes[test.nodes["name"].map(lambda s, rx=tre: bool(rx.match(s)))]
            t_by_layer: dict[int | None, list[int]] = defaultdict(list)
            for nid, layer in zip(t_hits["node_id"], t_hits["layer"]):
                t_by_layer[_layer_key(layer)].append(int(nid))
            for nid, layer in zip(g_hits["node_id"], g_hits["layer"]):
                if int(nid) in taken:
                    continue
                cands = t_by_layer.get(_layer_key(layer), [])
                if len(cands) == 1:
                    add(
                        NodeMatch(
                            int(nid),
                            cands[0],
                            "mapping-rule",
                            1.0,
                            f"rule {r.golden} <-> {r.test}",
                            r.golden_tensor,
                            r.test_tensor,
                        )
                    )
            taken |= {m.golden_node_id for m in out}
        # 3. type maps, zipped per layer when counts agree
        for tr in mapping.types:
            t_sel = tr.test_tensor
            for golden_type, g_sel in zip(tr.golden_types, tr.golden_tensors):
                g_hits = golden.nodes[golden.nodes["type"].fillna("").str.contains(golden_type, regex=False)]
                t_hits = test.nodes[test.nodes["type"].fillna("").str.contains(tr.test_type, regex=False)]
                g_groups = {k: _ordered(v) for k, v in g_hits.groupby(g_hits["layer"].map(_layer_key), dropna=False)}
                t_groups = {k: _ordered(v) for k, v in t_hits.groupby(t_hits["layer"].map(_layer_key), dropna=False)}
                for layer, g_grp in g_groups.items():
                    t_grp = t_groups.get(layer)
                    if t_grp is None or len(t_grp) != len(g_grp):
                        continue
                    for gid, tid in zip(g_grp["node_id"], t_grp["node_id"]):
                        if int(gid) in taken:
                            continue
                        add(
                            NodeMatch(
                                int(gid),
                                int(tid),
                                "type-map",
                                0.9,
                                f"type {golden_type} <-> {tr.test_type}, layer {layer}",
                                g_sel,
                                t_sel,
                            )
                        )
            taken |= {m.golden_node_id for m in out}

    # 4. identical names (same kind of dump)
    if golden.kind == test.kind:
        for name, gid in g_names.items():
            if gid in taken:
                continue
            tid = t_names.get(name)
            if tid is not None:
                add(NodeMatch(gid, tid, "name", 1.0, "identical name"))
        taken |= {m.golden_node_id for m in out}
    # 5. automatic cross-stack mapping
    elif auto is not None:
        for m in auto(golden, test, taken):
            if m.golden_node_id not in taken:
                add(m)
    return out


def _resolve(m: NodeMatch) -> tuple[str, str | None, int | None, str | None, int | None]:
    """(mode, golden role, golden index, test role, test index) of a node match's tensor selectors."""
    g, t = m.golden_sel, m.test_sel
    if g.role is None and t.role is None:
        return "all", None, None, None, None
    g_role, t_role = g.role or t.role, t.role or g.role
    if g.index is None and t.index is None:
        return "role", g_role, None, t_role, None
    g_idx = g.index if g.index is not None else t.index
    t_idx = t.index if t.index is not None else g.index
    return "one", g_role, g_idx, t_role, t_idx


def pair_tensors(
    matches: list[NodeMatch], golden: RunFrames, test: RunFrames, tokens: Collection[int] | None = None
) -> pd.DataFrame:
    """Tensor pairs of the node matches, one row each, same token id on both sides.

    Columns: token_id, test_token_id, golden_tensor_id, test_tensor_id, golden_node_id, test_node_id,
    io, method, confidence, transform.
    """
    cols = [
        "token_id",
        "test_token_id",
        "golden_tensor_id",
        "test_tensor_id",
        "golden_node_id",
        "test_node_id",
        "io",
        "method",
        "confidence",
        "transform",
    ]
    if not matches:
        return pd.DataFrame(columns=cols)
    rows = []
    for i, m in enumerate(matches):
        mode, gr, gi, tr, ti = _resolve(m)
        rows.append((i, m.golden_node_id, m.test_node_id, mode, gr, gi, tr, ti, m.method, m.confidence, m.transform))
    mf = pd.DataFrame(
        rows,
        columns=[
            "mid",
            "g_node",
            "t_node",
            "mode",
            "g_role",
            "g_idx",
            "t_role",
            "t_idx",
            "method",
            "confidence",
            "transform",
        ],
    )
    gt = golden.tensors[["tensor_id", "token_id", "node_id", "io", "idx"]].rename(
        columns={"tensor_id": "golden_tensor_id", "node_id": "g_node", "io": "g_io", "idx": "g_i"}
    )
    tt = test.tensors[["tensor_id", "token_id", "node_id", "io", "idx"]].rename(
        columns={"tensor_id": "test_tensor_id", "node_id": "t_node", "io": "t_io", "idx": "t_i"}
    )
    if tokens is not None:
        tok = list(tokens)
        gt = gt[gt["token_id"].isin(tok)]
        tt = tt[tt["token_id"].isin(tok)]
    parts = []
    for mode, grp in mf.groupby("mode"):
        left = grp.merge(gt, on="g_node")
        if mode == "all":
            both = left.merge(
                tt, left_on=["t_node", "token_id", "g_io", "g_i"], right_on=["t_node", "token_id", "t_io", "t_i"]
            )
        elif mode == "role":
            left = left[left["g_io"] == left["g_role"]]
            both = left.merge(tt, left_on=["t_node", "token_id", "g_i"], right_on=["t_node", "token_id", "t_i"])
            both = both[both["t_io"] == both["t_role"]]
        else:
            left = left[(left["g_io"] == left["g_role"]) & (left["g_i"] == left["g_idx"])]
            both = left.merge(tt, on=["t_node", "token_id"])
            both = both[(both["t_io"] == both["t_role"]) & (both["t_i"] == both["t_idx"])]
        parts.append(both)
    res = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if res.empty:
        return pd.DataFrame(columns=cols)
    res = res.drop_duplicates(["golden_tensor_id", "test_tensor_id"])
    out = pd.DataFrame(
        {
            "token_id": res["token_id"].astype(int),
            "test_token_id": res["token_id"].astype(int),
            "golden_tensor_id": res["golden_tensor_id"].astype(int),
            "test_tensor_id": res["test_tensor_id"].astype(int),
            "golden_node_id": res["g_node"].astype(int),
            "test_node_id": res["t_node"].astype(int),
            "io": res["g_io"],
            "method": res["method"],
            "confidence": res["confidence"].astype(float),
            "transform": res["transform"],
        }
    )
    return out.reset_index(drop=True)
