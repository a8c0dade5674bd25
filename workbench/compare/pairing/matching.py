"""Pairing golden nodes with test nodes, then golden tensors with test tensors.

`MATCHERS` holds one matching method per entry, highest priority first, all with one signature
(`MatchContext -> list[NodeMatch]`). A golden node matched by a method is not matched again by a
later one (a mapping's pair with a test op of some tokens only, a prefill op, leaves the golden node open to the
later methods at its other tokens); a test node paired by a mapping file is left out of the automatic methods:

1. `mapping-file`: explicit pairs of a mapping file,
2. `mapping-rule`: layer-wildcard rules of a mapping file,
3. `type-map`: type maps (msit's `op_mapping_file.json` or the `types` of ours) zipped per layer when
   the counts agree,
4. `torchair`: a TorchAir GE dump against its FX dump: each GE op to the FX node its graph's `_fx_tensor_name`
   names (a fused `AutomaticBufferFusionOp`: its inputs to the first folded op's, its outputs to the last
   one's); against an unfused GE dump, a fused op's inputs and outputs to its first and last ops by name
   (`workbench.formats.ge_run`); a `Cast`/`TransData` no FX node names: its input and output against the FX
   output that feeds it (`cast`),
5. `quant`: a quantized test run's int tensors paired with the golden float tensors they stand for, to be
   compared dequantized (`workbench.compare.pairing.quant_pairs`; the rule is the manifest's `quant` entry),
6. `aligned`: two dumps of the same kind. Their call streams are aligned as sequences, scope by
   scope (the children of two paired modules, in execution order), on op type (and module name),
   tensor shapes and position (`workbench.compare.pairing.align`): an op one run has and the other has not
   (a hook's extra `Tensor.__mul__`, a missing module call) stays unmatched instead of shifting every
   later call counter onto the wrong op. Pairs with identical names are recorded as `name`, pairs
   whose names differ (shifted counters) as `aligned`,
7. `auto`: torch <-> accelerated-library mapping (`auto-*`, `workbench.compare.pairing.automap`), for two
   dumps of different kinds.

Pairs the user rejected (`unpaired` in the mapping file) are dropped whatever produced them.
`pair_tensors` then pairs tensors and records, per tensor pair, the layout transform that makes
two different shapes comparable (`workbench.compare.pairing.layout`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd

from workbench.compare.pairing.align import StreamSide, align_scope, shape_tuple
from workbench.compare.pairing.layout import layout_rule, shape_after, with_layout
from workbench.compare.pairing.mapping import MappingFile, TensorSel, expand_rule
from workbench.compare.pairing.quant_pairs import quant_matches, resolve_operands
from workbench.formats.fx_dump import FX_KIND
from workbench.formats.ge_run import GE_KIND
from workbench.formats.quant_links import QuantLink
from workbench.formats.torchair import GRAPH_ROOT

NODE_COLUMNS = ["node_id", "name", "type", "parent_id", "depth", "exec_order", "layer", "phase", "params"]


@dataclass(slots=True)
class RunFrames:
    """The nodes and tensors of one run, as loaded from the catalog."""

    run_id: int
    kind: str
    nodes: pd.DataFrame  # NODE_COLUMNS
    tensors: pd.DataFrame  # tensor_id, token_id, node_id, io, idx, dtype, numel, path, error
    quant: list[QuantLink] = field(default_factory=list)  # int tensors and their scales (the manifest's `quant`)

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


def _layer_key(v: object) -> int | None:
    return None if v is None or pd.isna(v) else int(cast(float, v))


def _ordered(nodes: pd.DataFrame) -> pd.DataFrame:
    return nodes.sort_values(["exec_order", "node_id"], na_position="last")


@dataclass(slots=True)
class MatchContext:
    """What every matching method sees: both runs, the mapping file, and what earlier methods matched."""

    golden: RunFrames
    test: RunFrames
    mapping: MappingFile | None
    auto: AutoMatcher | None
    taken: set[int] = field(default_factory=set)  # golden nodes matched by an earlier method
    taken_test: set[int] = field(default_factory=set)  # test nodes paired by a mapping file
    found: list[NodeMatch] = field(default_factory=list)  # every match so far, in order


Matcher = Callable[[MatchContext], list[NodeMatch]]


def _explicit_pairs(ctx: MatchContext) -> list[NodeMatch]:
    """A mapping file's `pairs`: several per node allowed (different tensors)."""
    if not ctx.mapping:
        return []
    g_names, t_names = ctx.golden.by_name(), ctx.test.by_name()
    out = []
    for p in ctx.mapping.pairs:
        g, t = g_names.get(p.golden), t_names.get(p.test)
        if g is not None and t is not None:
            src = ctx.mapping.source or "mapping"
            out.append(NodeMatch(g, t, "mapping-file", 1.0, f"pair in {src}", p.golden_tensor, p.test_tensor))
    return out


def _layer_rules(ctx: MatchContext) -> list[NodeMatch]:
    """A mapping file's layer-wildcard `rules`: one test node of the golden node's layer, or none."""
    if not ctx.mapping:
        return []
    g_nodes = list(zip(ctx.golden.nodes["name"], map(_layer_key, ctx.golden.nodes["layer"])))
    t_nodes = list(zip(ctx.test.nodes["name"], map(_layer_key, ctx.test.nodes["layer"])))
    g_ids = dict(zip(ctx.golden.nodes["name"], ctx.golden.nodes["node_id"]))
    t_ids = dict(zip(ctx.test.nodes["name"], ctx.test.nodes["node_id"]))
    out: list[NodeMatch] = []
    taken = {name for name, nid in g_ids.items() if int(nid) in ctx.taken}
    for r in ctx.mapping.rules:
        why = f"rule {r.golden} <-> {r.test}"
        for g, t in expand_rule(r, g_nodes, t_nodes, taken):
            out.append(
                NodeMatch(int(g_ids[g]), int(t_ids[t]), "mapping-rule", 1.0, why, r.golden_tensor, r.test_tensor)
            )
            taken.add(g)
    return out


def _type_maps(ctx: MatchContext) -> list[NodeMatch]:
    """A mapping file's type maps, zipped per layer when the counts agree."""
    if not ctx.mapping:
        return []
    golden, test = ctx.golden, ctx.test
    out: list[NodeMatch] = []
    taken = set(ctx.taken)
    for tr in ctx.mapping.types:
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
                    if int(gid) not in taken:
                        why = f"type {golden_type} <-> {tr.test_type}, layer {layer}"
                        out.append(NodeMatch(int(gid), int(tid), "type-map", 0.9, why, g_sel, t_sel))
        taken |= {m.golden_node_id for m in out}
    return out


def _aligned(ctx: MatchContext) -> list[NodeMatch]:
    """Two dumps of one kind: call streams aligned scope by scope (`workbench.compare.pairing.align`)."""
    golden, test = ctx.golden, ctx.test
    if golden.kind != test.kind:
        return []
    roles = _roles(golden.tensors) & _roles(test.tensors)
    g = StreamSide.build(golden.kind, golden.nodes, golden.tensors, roles)
    t = StreamSide.build(test.kind, test.nodes, test.tensors, roles)
    out: list[NodeMatch] = []
    paired_g: set[int] = set()
    paired_t: set[int] = set()
    # scopes to align: the top level, then the children of every pair (a mapping file's pairs included)
    scopes: list[tuple[int | None, int | None]] = [(None, None)]
    scopes += [(m.golden_node_id, m.test_node_id) for m in ctx.found]
    seen_scopes: set[tuple[int | None, int | None]] = set()
    while scopes:
        gp, tp = scopes.pop(0)
        if (gp, tp) in seen_scopes:
            continue
        seen_scopes.add((gp, tp))
        gs = [n for n in g.children.get(gp, []) if n not in ctx.taken and n not in paired_g]
        ts = [n for n in t.children.get(tp, []) if n not in ctx.taken_test and n not in paired_t]
        where = "the top level" if gp is None else g.name[gp]
        for gid, tid, how in align_scope(g, t, gs, ts):
            paired_g.add(gid)
            paired_t.add(tid)
            scopes.append((gid, tid))
            out.append(_aligned_match(g, t, gid, tid, how, where))
        # the same module under the same parent whose class was swapped (a wrong activation): still itself
        left_t = {t.name[n]: n for n in ts if n not in paired_t}
        for gid in gs:
            swapped = left_t.get(g.name[gid]) if gid not in paired_g else None
            if swapped is not None:
                tid = swapped
                paired_g.add(gid)
                paired_t.add(tid)
                scopes.append((gid, tid))
                why = f"identical name under {where}, other type ({g.type[gid]} vs {t.type[tid]})"
                out.append(NodeMatch(gid, tid, "name", 0.9, why))
    # nodes outside every aligned scope (a parent that only one run has): identical names and types
    t_names = {name: nid for nid, name in t.name.items() if nid not in paired_t and nid not in ctx.taken_test}
    for gid, name in g.name.items():
        other = t_names.get(name)
        if gid in paired_g or gid in ctx.taken or other is None or g.type[gid] != t.type[other]:
            continue
        out.append(NodeMatch(gid, other, "name", 1.0, "identical name"))
    return out


def _aligned_match(g: StreamSide, t: StreamSide, gid: int, tid: int, how: str, where: str) -> NodeMatch:
    if g.name[gid] == t.name[tid]:
        return NodeMatch(gid, tid, "name", 1.0, "identical name")
    if how == "key":
        why = f"call-stream alignment under {where}: same type and shapes, another position or counter"
        return NodeMatch(gid, tid, "aligned", 0.9, why)
    why = f"call-stream alignment under {where}: same type between aligned neighbours, other shapes"
    return NodeMatch(gid, tid, "aligned", 0.6, why)


def _quant(ctx: MatchContext) -> list[NodeMatch]:
    """A quantized test run's int tensors with the golden float tensors they stand for (`pairing.quant_pairs`)."""
    if not ctx.test.quant:
        return []
    found = quant_matches(ctx.golden.by_name(), ctx.test.by_name(), ctx.test.quant, ctx.taken)
    return [
        NodeMatch(g, t, method, conf, why, TensorSel(*gs), TensorSel(*ts), tr)
        for g, t, method, conf, why, gs, ts, tr in found
    ]


def _roles(tensors: pd.DataFrame) -> set[str]:
    return set(tensors["io"].unique()) if "io" in tensors and len(tensors) else set()


TORCHAIR_GE, TORCHAIR_FX = GE_KIND, FX_KIND


def _params(value: object) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        try:
            loaded = json.loads(value)
        except ValueError:
            return {}
        return loaded if isinstance(loaded, dict) else {}
    return {}


def _torchair(ctx: MatchContext) -> list[NodeMatch]:
    """TorchAir GE ops to FX nodes through `_fx_tensor_name`, and fused GE ops to unfused ones by name."""
    golden, test = ctx.golden, ctx.test
    if test.kind != TORCHAIR_GE or golden.kind not in (TORCHAIR_FX, TORCHAIR_GE):
        return []
    g_ids = golden.by_name()
    by_tail: dict[str, list[int]] = {}
    for name, nid in g_ids.items():
        by_tail.setdefault(name.rsplit("/", 1)[-1], []).append(int(nid))

    def find(name: str) -> int | None:
        if name in g_ids:
            return int(g_ids[name])
        hits = by_tail.get(name, [])
        return hits[0] if len(hits) == 1 else None

    out: list[NodeMatch] = []
    t_root = test.by_name().get(GRAPH_ROOT)
    if GRAPH_ROOT in g_ids and t_root is not None and int(t_root) not in ctx.taken_test:
        out.append(NodeMatch(int(g_ids[GRAPH_ROOT]), int(t_root), "graph-output", 1.0, "the graphs' outputs"))
    for tid, params in zip(test.nodes["node_id"], test.nodes["params"]):
        tid = int(tid)
        if tid in ctx.taken_test:
            continue
        p = _params(params)
        fused = [str(x) for x in p.get("fused") or []]
        if golden.kind == TORCHAIR_FX:
            single = [str(x) for x in p.get("fx") or []]
            first = [str(x) for x in p.get("fx_first") or []]
            last = [str(x) for x in p.get("fx_last") or []]
            gid = find(single[0]) if single else None
            if gid is not None:
                out.append(NodeMatch(gid, tid, "fx-name", 1.0, f"_fx_tensor_name {single[0]}"))
                continue
            feeding = [str(x) for x in p.get("fx_input") or []]
            gid = find(feeding[0]) if feeding else None
            if gid is not None:  # msit: a Cast/TransData's input against its output; here both against the FX value
                why = f"Cast/TransData fed by {feeding[0]}: its "
                src = TensorSel("out", 0)
                out.append(NodeMatch(gid, tid, "cast", 0.9, why + "input", src, TensorSel("in", 0)))
                out.append(NodeMatch(gid, tid, "cast", 0.9, why + "output", src, TensorSel("out", 0)))
                continue
            g_first, g_last = (find(first[0]) if first else None), (find(last[0]) if last else None)
        elif fused:
            g_first, g_last = find(fused[0]), find(fused[-1])
        else:
            continue
        why = f"fused {' + '.join(fused)}: "
        if g_first is not None:
            out.append(
                NodeMatch(g_first, tid, "fused", 1.0, why + "inputs of the first op", TensorSel("in"), TensorSel("in"))
            )
        if g_last is not None:
            out.append(
                NodeMatch(g_last, tid, "fused", 1.0, why + "outputs of the last op", TensorSel("out"), TensorSel("out"))
            )
    return out


def _auto(ctx: MatchContext) -> list[NodeMatch]:
    """Torch module tree <-> accelerated library op graph (`workbench.compare.pairing.automap`)."""
    if ctx.golden.kind == ctx.test.kind or ctx.auto is None:
        return []
    if TORCHAIR_GE in (ctx.golden.kind, ctx.test.kind) or TORCHAIR_FX in (ctx.golden.kind, ctx.test.kind):
        return []
    return ctx.auto(ctx.golden, ctx.test, set(ctx.taken))


# The matching methods, highest priority first; every one has the signature `Matcher`.
MATCHERS: dict[str, Matcher] = {
    "mapping-file": _explicit_pairs,
    "mapping-rule": _layer_rules,
    "type-map": _type_maps,
    "torchair": _torchair,
    "quant": _quant,
    "aligned": _aligned,
    "auto": _auto,
}
MAPPING_METHODS = ("mapping-file", "mapping-rule", "type-map")


def match_nodes(
    golden: RunFrames, test: RunFrames, mapping: MappingFile | None = None, auto: AutoMatcher | None = None
) -> list[NodeMatch]:
    """Node pairs by the methods of `MATCHERS`, in priority order; rejected pairs dropped."""
    ctx = MatchContext(golden, test, mapping, auto)
    rejected = set(mapping.unpaired) if mapping else set()
    g_name_of = dict(zip(golden.nodes["node_id"], golden.nodes["name"]))
    t_name_of = dict(zip(test.nodes["node_id"], test.nodes["name"]))
    # a golden node a mapping pairs with a test op of some tokens only (a prefill op) stays open to the later
    # methods at its other tokens: a pair for one token never changes what another token compares
    covered: dict[int, set[int]] = {}
    tokens_of = _TokenSets(golden, test)
    for method, matcher in MATCHERS.items():
        found = [
            m
            for m in matcher(ctx)
            if m.golden_node_id not in ctx.taken
            and (m.golden_node_id not in covered or not covered[m.golden_node_id] & tokens_of.test(m.test_node_id))
        ]
        kept = [m for m in found if (g_name_of[m.golden_node_id], t_name_of[m.test_node_id]) not in rejected]
        ctx.found.extend(kept)
        if method in MAPPING_METHODS or method == "quant":
            ctx.taken_test |= {m.test_node_id for m in kept}
            for m in kept:
                covered.setdefault(m.golden_node_id, set()).update(tokens_of.test(m.test_node_id))
            ctx.taken |= {g for g, toks in covered.items() if toks >= tokens_of.golden(g)}
        else:
            ctx.taken |= {m.golden_node_id for m in kept}
    return ctx.found


class _TokenSets:
    """The tokens at which a node holds tensors, per side (grouped once, on the first question about a side)."""

    def __init__(self, golden: RunFrames, test: RunFrames) -> None:
        self._frames = {"g": golden.tensors, "t": test.tensors}
        self._sets: dict[str, dict[int, frozenset[int]]] = {}

    def _of(self, side: str, node: int) -> frozenset[int]:
        if side not in self._sets:
            t = self._frames[side]
            grouped = t.groupby("node_id")["token_id"].unique() if len(t) else pd.Series(dtype=object)
            self._sets[side] = {int(n): frozenset(int(x) for x in toks) for n, toks in grouped.items()}
        return self._sets[side].get(node, frozenset())

    def golden(self, node: int) -> frozenset[int]:
        return self._of("g", node)

    def test(self, node: int) -> frozenset[int]:
        return self._of("t", node)


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
    out["transform"] = _layout_transforms(out, golden, test)
    if test.quant:
        out["transform"] = resolve_operands(out, test.nodes, test.tensors)
    return out.reset_index(drop=True)


def _shapes(frames: RunFrames, ids: pd.Series) -> list[tuple[int, ...] | None]:
    """The shape of each tensor of `ids` (one shared tuple per distinct shape)."""
    t = frames.tensors
    if "shape" not in t.columns:
        return [None] * len(ids)
    pos = pd.Index(t["tensor_id"]).get_indexer(ids)
    col = t["shape"]
    if isinstance(col.dtype, pd.CategoricalDtype):  # as `load_frames` gives it: each distinct shape parsed once
        parsed = [shape_tuple(c) for c in col.cat.categories]
        codes = col.cat.codes.to_numpy()
        cells: list[tuple[int, ...] | None] = [None if p < 0 or codes[p] < 0 else parsed[codes[p]] for p in pos]
    else:
        values = col.to_numpy()
        cells = [None if p < 0 else shape_tuple(values[p]) for p in pos]
    return cells


def _layout_transforms(pairs: pd.DataFrame, golden: RunFrames, test: RunFrames) -> list[str | None]:
    """Each pair's transform, plus the layout rule (`layout:squeeze`, ...) that relates two different shapes."""
    out: list[str | None] = []
    g_shapes, t_shapes = _shapes(golden, pairs["golden_tensor_id"]), _shapes(test, pairs["test_tensor_id"])
    known: dict[tuple[object, tuple[int, ...] | None, tuple[int, ...] | None], str | None] = {}
    for tr, gs, ts in zip(pairs["transform"], g_shapes, t_shapes):
        tr = None if tr is None or (isinstance(tr, float) and pd.isna(tr)) else str(tr)
        key = (tr, gs, ts)
        if key not in known:  # a dump has few distinct shapes: each combination is worked out once
            g_eff, t_eff = shape_after(gs, tr, "g"), shape_after(ts, tr, "t")
            rule = layout_rule(g_eff, t_eff) if g_eff is not None and t_eff is not None else None
            known[key] = with_layout(tr, rule) if rule else tr
        out.append(known[key])
    return out
