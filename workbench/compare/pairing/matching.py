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
from typing import Any

import numpy as np

from workbench.compare.pairing.align import StreamSide, align_scope, shape_tuple
from workbench.compare.pairing.frames import NodeTable, RunFrames, TensorPairs, TensorTable
from workbench.compare.pairing.layout import layout_rule, shape_after, with_layout
from workbench.compare.pairing.mapping import MappingFile, TensorSel, expand_rule
from workbench.compare.pairing.quant_pairs import quant_matches, resolve_operands
from workbench.formats.model import FX_KIND, GE_KIND, GRAPH_ROOT

__all__ = ["AutoMatcher", "NodeMatch", "RunFrames", "match_nodes", "pair_tensors"]


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


def _ordered(nodes: NodeTable, rows: list[int]) -> list[int]:
    """The node ids of `rows`, in execution order (nodes without one last), then by id."""
    return [
        int(nodes.node_id[r])
        for r in sorted(rows, key=lambda r: (nodes.exec_order[r] is None, nodes.exec_order[r] or 0, nodes.node_id[r]))
    ]


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
    g_nodes = list(zip(ctx.golden.nodes.name, ctx.golden.nodes.layer))
    t_nodes = list(zip(ctx.test.nodes.name, ctx.test.nodes.layer))
    g_ids, t_ids = ctx.golden.by_name(), ctx.test.by_name()
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
            g_groups = _by_layer(golden.nodes, golden_type)
            t_groups = _by_layer(test.nodes, tr.test_type)
            for layer, g_grp in g_groups.items():
                t_grp = t_groups.get(layer)
                if t_grp is None or len(t_grp) != len(g_grp):
                    continue
                for gid, tid in zip(g_grp, t_grp):
                    if int(gid) not in taken:
                        where = f"layer {layer}" if layer is not None else "outside the layers"
                        why = f"type {golden_type} <-> {tr.test_type}, {where}"
                        out.append(NodeMatch(int(gid), int(tid), "type-map", 0.9, why, g_sel, t_sel))
        taken |= {m.golden_node_id for m in out}
    return out


def _by_layer(nodes: NodeTable, type_part: str) -> dict[int | None, list[int]]:
    """The ids of the nodes whose type contains `type_part`, per layer (ascending, no layer last), in execution
    order."""
    rows: dict[int | None, list[int]] = {}
    for r, (typ, layer) in enumerate(zip(nodes.type, nodes.layer)):
        if type_part in (typ or ""):
            rows.setdefault(layer, []).append(r)
    keys = sorted(rows, key=lambda k: (k is None, k or 0))
    return {k: _ordered(nodes, rows[k]) for k in keys}


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
        # the same module under the same parent whose class was swapped (a wrong activation): still itself;
        # msprobe's names hold the class, so what is left is then paired by the name without it, where that name is
        # one node's on each side (`Functional.linear` and `Functional.gelu` would both lose their op)
        left_t = {t.name[n]: n for n in ts if n not in paired_t}
        swapped: dict[int, int] = {}
        taken_t: set[int] = set()
        for n in gs:
            named = left_t.get(g.name[n]) if n not in paired_g else None
            if named is not None and named not in taken_t:
                swapped[n] = named
                taken_t.add(named)
        g_rest = _by_classless(g, [n for n in gs if n not in paired_g and n not in swapped])
        t_rest = _by_classless(t, [n for n in ts if n not in paired_t and n not in taken_t])
        swapped.update((gn, tn) for key, gn in g_rest.items() if gn is not None and (tn := t_rest.get(key)) is not None)
        for g_node, t_node in swapped.items():
            paired_g.add(g_node)
            paired_t.add(t_node)
            scopes.append((g_node, t_node))
            same = "identical name" if g.name[g_node] == t.name[t_node] else "one module, its class in its name"
            why = f"{same} under {where}, other type ({g.type[g_node]} vs {t.type[t_node]})"
            out.append(NodeMatch(g_node, t_node, "name", 0.9, why))
    # nodes outside every aligned scope (a parent that only one run has): identical names and types
    t_names = {name: nid for nid, name in t.name.items() if nid not in paired_t and nid not in ctx.taken_test}
    for gid, name in g.name.items():
        other = t_names.get(name)
        if gid in paired_g or gid in ctx.taken or other is None or g.type[gid] != t.type[other]:
            continue
        out.append(NodeMatch(gid, other, "name", 1.0, "identical name"))
    return out


def _by_classless(side: StreamSide, ids: list[int]) -> dict[str, int | None]:
    """The nodes by their name without their class (`_without_class`); None for a name two of them share."""
    found: dict[str, int | None] = {}
    for n in ids:
        key = _without_class(side.name[n], side.type[n])
        found[key] = None if key in found else n
    return found


def _without_class(name: str, type_name: str | None) -> str:
    """A node's name without its module's class, where the name holds it (msprobe's `Module.mlp.act_fn.SiLU.forward`
    -> `Module.mlp.act_fn.forward`): a module whose class was swapped keeps its name."""
    at = name.rfind(f".{type_name}.") if type_name else -1
    return name if at < 0 else name[: at + 1] + name[at + len(type_name or "") + 2 :]


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


def _roles(tensors: TensorTable) -> set[str]:
    return {tensors.io.values[c] for c in np.unique(tensors.io.codes).tolist() if c >= 0}


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
    for tid, params in zip(test.nodes.node_id.tolist(), test.nodes.params):
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
    g_name_of = dict(zip(golden.nodes.node_id.tolist(), golden.nodes.name))
    t_name_of = dict(zip(test.nodes.node_id.tolist(), test.nodes.name))
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
            pairs = np.unique(np.stack([t.node_id, t.token_id]), axis=1)  # sorted by node, then token
            nodes, starts = np.unique(pairs[0], return_index=True)
            tokens = np.split(pairs[1], starts[1:]) if len(nodes) else []
            self._sets[side] = {n: frozenset(toks.tolist()) for n, toks in zip(nodes.tolist(), tokens)}
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
) -> TensorPairs:
    """Tensor pairs of the node matches, same token id on both sides; `pair_id` left at -1.

    Each match pairs the tensors its selectors name (`_resolve`): every tensor with the test tensor of the same role
    and index (`all`), those of one role (`role`), or one each (`one`). Pairs come per mode (`all`, `one`, `role`),
    then per match, then in golden and test tensor order; a pair two matches make is kept once, first.
    """
    if not matches:
        return TensorPairs.empty()
    gt, tt = golden.tensors, test.tensors
    if tokens is not None:
        wanted = np.asarray(sorted(tokens), dtype=np.int64)
        gt, tt = gt.take(np.isin(gt.token_id, wanted)), tt.take(np.isin(tt.token_id, wanted))
    roles = sorted(set(gt.io.values) | set(tt.io.values) | {r for m in matches for r in _roles_named(m)})
    g_io, t_io = _role_codes(gt, roles), _role_codes(tt, roles)
    resolved = [_resolve(m) for m in matches]
    order = sorted(range(len(matches)), key=lambda i: (resolved[i][0], i))  # mode, then match order
    # left side: (match, golden row) for every golden tensor of the match's node that its selector keeps
    g_by_node = np.argsort(gt.node_id, kind="stable")
    g_nodes = gt.node_id[g_by_node]
    lefts_m, lefts_g, keys_io, keys_idx = [], [], [], []
    for i in order:
        mode, g_role, g_idx, t_role, t_idx = resolved[i]
        m = matches[i]
        lo, hi = np.searchsorted(g_nodes, [m.golden_node_id, m.golden_node_id + 1])
        rows = g_by_node[lo:hi]
        if mode != "all":
            rows = rows[g_io[rows] == roles.index(str(g_role))]
        if mode == "one":
            rows = rows[gt.idx[rows] == g_idx]
        lefts_m.append(np.full(len(rows), i, dtype=np.int64))
        lefts_g.append(rows)
        # the test tensor's role and index each golden tensor pairs with
        keys_io.append(g_io[rows] if mode == "all" else np.full(len(rows), roles.index(str(t_role)), dtype=np.int64))
        keys_idx.append(np.full(len(rows), t_idx, dtype=np.int64) if mode == "one" else gt.idx[rows])
    left_m, left_g = np.concatenate(lefts_m), np.concatenate(lefts_g)
    t_node_of = np.asarray([m.test_node_id for m in matches], dtype=np.int64)
    left_key = np.stack([t_node_of[left_m], gt.token_id[left_g], np.concatenate(keys_io), np.concatenate(keys_idx)])
    right_key = np.stack([tt.node_id, tt.token_id, t_io, tt.idx])
    left_pos, right_rows = _equi_join(left_key, right_key)
    if not len(left_pos):
        return TensorPairs.empty()
    left_m, left_g = left_m[left_pos], left_g[left_pos]
    g_ids, t_ids = gt.tensor_id[left_g], tt.tensor_id[right_rows]
    # a pair made twice (two matches naming the same tensors) is kept once, where it came first
    _, first = np.unique(np.stack([g_ids, t_ids]), axis=1, return_index=True)
    keep = np.sort(first)
    left_m, left_g, g_ids, t_ids = left_m[keep], left_g[keep], g_ids[keep], t_ids[keep]
    tokens_out = gt.token_id[left_g]
    picked = [matches[i] for i in left_m.tolist()]
    pairs = TensorPairs(
        tokens_out,
        tokens_out.copy(),
        g_ids,
        t_ids,
        np.asarray([m.golden_node_id for m in matches], dtype=np.int64)[left_m],
        t_node_of[left_m],
        gt.io.take(left_g).text(),  # type: ignore[arg-type]  # io is never NULL
        [m.method for m in picked],
        np.asarray([float(m.confidence) for m in picked], dtype=np.float64),
        [m.transform for m in picked],
        np.full(len(keep), -1, dtype=np.int64),
    )
    pairs = pairs.with_transform(_layout_transforms(pairs, golden, test))
    if test.quant:
        pairs = pairs.with_transform(resolve_operands(pairs, test.nodes, test.tensors))
    return pairs


def _roles_named(m: NodeMatch) -> list[str]:
    return [r for r in (m.golden_sel.role, m.test_sel.role) if r is not None]


def _role_codes(tensors: TensorTable, roles: list[str]) -> np.ndarray:
    """Each tensor's role as its position in `roles` (one numbering for both runs)."""
    to_shared = np.asarray([roles.index(v) for v in tensors.io.values] + [-1], dtype=np.int64)
    return to_shared[tensors.io.codes]


def _equi_join(left: np.ndarray, right: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `left` and `right` (keys as columns of int arrays) with equal keys: (left positions, right
    positions), in left order, then right order."""
    n_left = left.shape[1]
    if n_left == 0 or right.shape[1] == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, ids = np.unique(np.concatenate([left, right], axis=1), axis=1, return_inverse=True)
    ids = ids.reshape(-1)
    left_ids, right_ids = ids[:n_left], ids[n_left:]
    by_key = np.argsort(right_ids, kind="stable")  # right rows grouped by key, in their order
    sorted_ids = right_ids[by_key]
    lo = np.searchsorted(sorted_ids, left_ids, side="left")
    hi = np.searchsorted(sorted_ids, left_ids, side="right")
    counts = hi - lo
    left_pos = np.repeat(np.arange(n_left, dtype=np.int64), counts)
    offsets = np.arange(len(left_pos), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return left_pos, by_key[np.repeat(lo, counts) + offsets]


def _shapes(frames: RunFrames, ids: np.ndarray) -> list[tuple[int, ...] | None]:
    """The shape of each tensor of `ids` (one shared tuple per distinct shape)."""
    t = frames.tensors
    parsed = [shape_tuple(v) for v in t.shape.values]
    rows = t.rows_of(ids)
    codes = t.shape.codes
    return [None if r < 0 or codes[r] < 0 else parsed[codes[r]] for r in rows.tolist()]


def _layout_transforms(pairs: TensorPairs, golden: RunFrames, test: RunFrames) -> list[str | None]:
    """Each pair's transform, plus the layout rule (`layout:squeeze`, ...) that relates two different shapes."""
    out: list[str | None] = []
    g_shapes, t_shapes = _shapes(golden, pairs.golden_tensor_id), _shapes(test, pairs.test_tensor_id)
    known: dict[tuple[object, tuple[int, ...] | None, tuple[int, ...] | None], str | None] = {}
    for tr, gs, ts in zip(pairs.transform, g_shapes, t_shapes):
        key = (tr, gs, ts)
        if key not in known:  # a dump has few distinct shapes: each combination is worked out once
            g_eff, t_eff = shape_after(gs, tr, "g"), shape_after(ts, tr, "t")
            rule = layout_rule(g_eff, t_eff) if g_eff is not None and t_eff is not None else None
            known[key] = with_layout(tr, rule) if rule else tr
        out.append(known[key])
    return out
