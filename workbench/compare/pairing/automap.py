"""Automatic mapping between a PyTorch module tree (golden) and an accelerated library's op graph (test).

No hand-written file needed for Llama-family models on ATB-style graphs:

1. layers pair by layer index; each golden layer pairs with the test layer of every graph
   (prefill and decode graphs are separate test nodes; tensors pair by token, so token 0
   meets the prefill graph and later tokens the decoder graph);
2. inside a layer, ops pair by type rules (`LAYER_RULES`): norms in execution order,
   the attention and MLP groups, Linear modules to Linear ops, and fused ops to the group
   of modules they replace (fused QKV Linear + Split -> q/k/v_proj compared on the split
   outputs; fused gate-up Linear -> gate_proj/up_proj compared on its halves);
3. outside layers: embedding, rotary tables, final norm, LM head by type;
4. every proposed pair is checked on shapes (element counts, after the layout transform) and
   dropped when they disagree, so ambiguous ops stay unmatched for the mapping editor
   rather than being guessed. Each match records its evidence and a confidence.

Tensor-parallel test ranks (an ATB graph with an `AllReduceOperation` after o_proj and down, its param
naming `rank`/`rankSize`) pair with an unsplit golden: o_proj and down_proj outputs with the all-reduce
outputs (the sum of the ranks' partial products is the full product), and the column-parallel ops
(q/k/v, gate/up, the attention context, the SwiGLU output) with this rank's slice of the golden tensor
(`g.chunk:-1:RANK:SIZE`); a rank's partial o_proj/down outputs have no golden counterpart.

Layouts differ and are handled: `[batch, seq, hidden]` vs unpadded `[tokens, hidden]` and split
heads compare flattened (same element order); transposed weights are not compared.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass

from workbench.compare.pairing.mapping import TensorSel
from workbench.compare.pairing.matching import NodeMatch, RunFrames

OUT0, IN0 = TensorSel("out", 0), TensorSel("in", 0)

# golden module name suffixes, by role
Q_NAMES = ("q_proj", "query", "wq", "q")
K_NAMES = ("k_proj", "key", "wk", "k")
V_NAMES = ("v_proj", "value", "wv", "v")
O_NAMES = ("o_proj", "dense", "wo", "out_proj", "o")
GATE_NAMES = ("gate_proj", "w1", "gate")
UP_NAMES = ("up_proj", "w3", "up")
DOWN_NAMES = ("down_proj", "w2", "down", "dense_4h_to_h")


@dataclass(slots=True)
class _Tree:
    frames: RunFrames
    children: dict[int | None, list[int]]
    name: dict[int, str]
    type: dict[int, str]
    layer: dict[int, int | None]
    order: dict[int, float]
    numel: dict[tuple[int, str, int], dict[int, int]]  # (node, io, idx) -> token -> numel
    params: dict[int, str]  # node -> params JSON, for communication ops only

    @classmethod
    def build(cls, frames: RunFrames) -> _Tree:
        nodes = frames.nodes
        ids = nodes.node_id.tolist()
        children: dict[int | None, list[int]] = defaultdict(list)
        order = {n: (float(e) if e is not None else float(n) + 1e9) for n, e in zip(ids, nodes.exec_order)}
        for nid, pid in zip(ids, nodes.parent_id):
            children[None if pid is None else int(pid)].append(nid)
        for kids in children.values():
            kids.sort(key=lambda n: order[n])
        t = frames.tensors
        numel: dict[tuple[int, str, int], dict[int, int]] = defaultdict(dict)
        for n, io, i, tok, x in zip(
            t.node_id.tolist(), t.io.text(), t.idx.tolist(), t.token_id.tolist(), t.numel.tolist()
        ):
            if x >= 0:
                numel[(n, str(io), i)][tok] = x
        return cls(
            frames,
            children,
            dict(zip(ids, nodes.name)),
            {n: str(x) if x is not None else "" for n, x in zip(ids, nodes.type)},
            dict(zip(ids, nodes.layer)),
            order,
            numel,
            {
                n: str(p)
                for n, x, p in zip(ids, nodes.type, nodes.params)
                if x is not None and "AllReduce" in str(x) and p is not None
            },
        )

    def tp_rank(self, nid: int) -> tuple[int, int] | None:
        """(rank, rankSize) a communication op records in its param, when it names 2+ ranks."""
        try:
            p = json.loads(self.params.get(nid) or "{}")
            rank, size = int(p["rank"]), int(p["rankSize"])
        except (ValueError, KeyError, TypeError):
            return None
        return (rank, size) if size > 1 and 0 <= rank < size else None

    def subtree(self, root: int) -> list[int]:
        out, stack = [], [root]
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(reversed(self.children.get(cur, [])))
        return sorted(out[1:], key=lambda n: self.order[n])

    def leaf_name(self, nid: int) -> str:
        return re.split(r"[./]", self.name[nid])[-1]

    def is_type(self, nid: int, *needles: str) -> bool:
        t = self.type[nid].lower()
        return any(n.lower() in t for n in needles)


def _layer_roots(tree: _Tree) -> dict[int, list[int]]:
    """layer index -> the outermost nodes of that layer (one per graph/phase)."""
    out: dict[int, list[int]] = defaultdict(list)
    parent = {c: p for p, kids in tree.children.items() for c in kids}
    for nid, layer in tree.layer.items():
        if layer is None:
            continue
        p = parent.get(nid)
        if p is None or tree.layer.get(p) is None:
            out[layer].append(nid)
    return out


class _Builder:
    def __init__(self, g: _Tree, t: _Tree, taken: set[int]) -> None:
        self.g, self.t, self.taken = g, t, taken
        self.matches: list[NodeMatch] = []

    def numel_ok(self, gid: int, tid: int, gsel: TensorSel, tsel: TensorSel, transform: str | None) -> str | None:
        """Evidence string when every selected tensor pair agrees on element count, else None."""
        keys: list[tuple[tuple[int, str, int], tuple[int, str, int]]] = []
        if gsel.role is None and tsel.role is None:
            keys = [(k, (tid, k[1], k[2])) for k in self.g.numel if k[0] == gid and (tid, k[1], k[2]) in self.t.numel]
        else:
            keys = [((gid, gsel.role or "out", gsel.index or 0), (tid, tsel.role or "out", tsel.index or 0))]
        checks = []
        for gkey, tkey in keys:
            g_tok, t_tok = self.g.numel.get(gkey, {}), self.t.numel.get(tkey, {})
            common = sorted(set(g_tok) & set(t_tok))
            if common:  # compare at the same token: prefill and decode shapes differ
                checks.append((g_tok[common[0]], t_tok[common[0]]))
        if not checks:
            return "no tensors to check shapes on"
        for gn, tn in checks:
            for step in (transform or "").split(";"):
                side, _, op = step.partition(".")
                if op.startswith("chunk:"):
                    n = int(op.rsplit(":", 1)[1])
                    gn, tn = (gn // n, tn) if side == "g" else (gn, tn // n)
            if gn != tn:
                return None
        return "element counts agree (" + ", ".join(str(gn) for gn, _ in checks[:3]) + ")"

    def add(
        self,
        gid: int,
        tid: int,
        method: str,
        confidence: float,
        why: str,
        gsel: TensorSel = TensorSel(),
        tsel: TensorSel = TensorSel(),
        transform: str | None = None,
    ) -> bool:
        if gid in self.taken:
            return False
        shape = self.numel_ok(gid, tid, gsel, tsel, transform)
        if shape is None:
            return False
        self.matches.append(NodeMatch(gid, tid, method, confidence, f"{why}; {shape}", gsel, tsel, transform))
        return True


def _by_suffix(g: _Tree, nodes: list[int], names: tuple[str, ...]) -> int | None:
    hits = [n for n in nodes if g.leaf_name(n) in names]
    return hits[0] if len(hits) == 1 else None


def _match_attention(b: _Builder, g_att: int, t_att: int, layer: int) -> None:
    g, t = b.g, b.t
    g_lin = [n for n in g.subtree(g_att) if g.is_type(n, "Linear")]
    t_ops = t.subtree(t_att)
    t_lin = [n for n in t_ops if t.type[n] == "LinearOperation"]
    t_split = [n for n in t_ops if t.type[n] == "SplitOperation"]
    t_core = [n for n in t_ops if t.is_type(n, "SelfAttentionOperation", "PagedAttentionOperation", "FlashAttention")]
    q, k, v, o = (_by_suffix(g, g_lin, names) for names in (Q_NAMES, K_NAMES, V_NAMES, O_NAMES))
    where = f"layer {layer}"
    t_ar = [n for n in t_ops if t.is_type(n, "AllReduce")]
    tp = t.tp_rank(t_ar[0]) if len(t_ar) == 1 else None
    part = f"g.chunk:-1:{tp[0]}:{tp[1]}" if tp else None  # this rank's heads of the golden tensor
    of_rank = f" (rank {tp[0]} of {tp[1]}: its heads)" if tp else ""
    if len(t_lin) == 2 and len(t_split) == 1 and None not in (q, k, v, o):
        # fused QKV Linear + Split: q/k/v compared on the split outputs, inputs on the fused Linear's input
        for idx, gid in enumerate((q, k, v)):
            assert gid is not None
            b.add(
                gid,
                t_split[0],
                "auto-fused-qkv",
                0.95,
                f"{where}: {g.leaf_name(gid)} <-> output {idx} of the QKV split{of_rank}",
                OUT0,
                TensorSel("out", idx),
                part,
            )
            b.add(
                gid,
                t_lin[0],
                "auto-fused-qkv",
                0.95,
                f"{where}: {g.leaf_name(gid)} input <-> fused QKV Linear input",
                IN0,
                IN0,
            )
        assert o is not None
        if tp:
            b.add(
                o,
                t_ar[0],
                "auto-allreduce",
                0.95,
                f"{where}: attention output projection <-> the all-reduce of the ranks' partial products",
                OUT0,
                OUT0,
            )
        else:
            b.add(o, t_lin[1], "auto-linear", 0.95, f"{where}: attention output projection <-> second Linear")
    elif len(t_lin) == 4 and None not in (q, k, v, o):
        for gid, tid in zip((q, k, v, o), t_lin):
            assert gid is not None
            b.add(gid, tid, "auto-linear", 0.9, f"{where}: {g.leaf_name(gid)} <-> Linear in execution order")
    if len(t_core) == 1 and o is not None:
        # the attention core has no module in torch: its output is the output projection's input
        b.add(
            o,
            t_core[0],
            "auto-attention-core",
            0.9,
            f"{where}: attention context (o_proj input) <-> {t.leaf_name(t_core[0])} output{of_rank}",
            IN0,
            OUT0,
            part,
        )


def _match_mlp(b: _Builder, g_mlp: int, t_mlp: int, layer: int) -> None:
    g, t = b.g, b.t
    g_lin = [n for n in g.subtree(g_mlp) if g.is_type(n, "Linear")]
    t_ops = t.subtree(t_mlp)
    t_lin = [n for n in t_ops if t.type[n] == "LinearOperation"]
    t_act = [n for n in t_ops if t.is_type(n, "ActivationOperation")]
    gate, up, down = (_by_suffix(g, g_lin, names) for names in (GATE_NAMES, UP_NAMES, DOWN_NAMES))
    where = f"layer {layer}"
    t_ar = [n for n in t_ops if t.is_type(n, "AllReduce")]
    tp = t.tp_rank(t_ar[0]) if len(t_ar) == 1 else None
    part = f"g.chunk:-1:{tp[0]}:{tp[1]};" if tp else ""  # this rank's slice of the intermediate
    of_rank = f" (rank {tp[0]} of {tp[1]}: its slice)" if tp else ""
    if len(t_lin) == 2 and None not in (gate, up, down):
        assert gate is not None and up is not None and down is not None
        b.add(
            gate,
            t_lin[0],
            "auto-fused-gate-up",
            0.95,
            f"{where}: gate_proj <-> first half of the fused gate-up{of_rank}",
            OUT0,
            OUT0,
            part + "t.chunk:-1:0:2",
        )
        b.add(gate, t_lin[0], "auto-fused-gate-up", 0.95, f"{where}: gate_proj input <-> gate-up input", IN0, IN0)
        b.add(
            up,
            t_lin[0],
            "auto-fused-gate-up",
            0.95,
            f"{where}: up_proj <-> second half of the fused gate-up{of_rank}",
            OUT0,
            OUT0,
            part + "t.chunk:-1:1:2",
        )
        b.add(up, t_lin[0], "auto-fused-gate-up", 0.95, f"{where}: up_proj input <-> gate-up input", IN0, IN0)
        if tp:
            b.add(
                down,
                t_ar[0],
                "auto-allreduce",
                0.95,
                f"{where}: down_proj <-> the all-reduce of the ranks' partial products",
                OUT0,
                OUT0,
            )
        else:
            b.add(down, t_lin[1], "auto-linear", 0.95, f"{where}: down_proj <-> second Linear of the MLP")
        if len(t_act) == 1:
            # SwiGLU fuses act(gate) * up: its output is down_proj's input
            b.add(
                down,
                t_act[0],
                "auto-swiglu",
                0.9,
                f"{where}: down_proj input <-> fused SwiGLU output{of_rank}",
                IN0,
                OUT0,
                part.rstrip(";") or None,
            )
    elif len(t_lin) == 3 and None not in (gate, up, down):
        for gid, tid in zip((gate, up, down), t_lin):
            assert gid is not None
            b.add(gid, tid, "auto-linear", 0.9, f"{where}: {g.leaf_name(gid)} <-> Linear in execution order")


def _match_layer(b: _Builder, g_layer: int, t_layer: int, layer: int) -> None:
    g, t = b.g, b.t
    for gsel, tsel in ((IN0, IN0), (OUT0, OUT0)):
        b.add(g_layer, t_layer, "auto-layer", 0.95, f"layer {layer} by index and execution order", gsel, tsel)
    g_kids, t_kids = g.children.get(g_layer, []), t.children.get(t_layer, [])
    g_norms = [n for n in g_kids if g.is_type(n, "Norm")]
    t_norms = [n for n in t_kids if t.is_type(n, "NormOperation")]
    if len(g_norms) == len(t_norms):
        for i, (gid, tid) in enumerate(zip(g_norms, t_norms)):
            b.add(gid, tid, "auto-norm", 0.95, f"layer {layer}: norm #{i + 1} of {len(g_norms)} in execution order")
    g_att = [n for n in g_kids if g.is_type(n, "Attention")]
    t_att = [n for n in t_kids if t.is_type(n, "Attention") and not t.is_type(n, "Operation")]
    if len(g_att) == 1 and len(t_att) == 1:
        for gsel, tsel in ((IN0, IN0), (OUT0, OUT0)):
            b.add(
                g_att[0],
                t_att[0],
                "auto-attention",
                0.95,
                f"layer {layer}: attention block <-> attention graph",
                gsel,
                tsel,
            )
        _match_attention(b, g_att[0], t_att[0], layer)
    g_mlp = [n for n in g_kids if g.is_type(n, "MLP", "FeedForward")]
    t_mlp = [n for n in t_kids if t.is_type(n, "Mlp", "MLP") and not t.is_type(n, "Operation")]
    if len(g_mlp) == 1 and len(t_mlp) == 1:
        for gsel, tsel in ((IN0, IN0), (OUT0, OUT0)):
            b.add(g_mlp[0], t_mlp[0], "auto-mlp", 0.95, f"layer {layer}: MLP block <-> MLP graph", gsel, tsel)
        _match_mlp(b, g_mlp[0], t_mlp[0], layer)


def _match_outside_layers(b: _Builder) -> None:
    g, t = b.g, b.t
    g_out = [n for n in g.name if g.layer[n] is None]
    t_top = [n for n in t.children.get(None, []) if t.layer[n] is None]
    # an ATB dump's top level is per graph; the same op name may appear in both graphs (one node)
    g_embed = [n for n in g_out if g.is_type(n, "Embedding") and not g.is_type(n, "Rotary", "Positional")]
    t_embed = [n for n in t_top if t.is_type(n, "WordEmbedding") or t.leaf_name(n).endswith("WordEmbedding")]
    if len(g_embed) == 1 and len(t_embed) >= 1:
        for tid in t_embed:
            b.add(g_embed[0], tid, "auto-embedding", 0.95, "word embedding output", OUT0, OUT0)
            # ATB gathers from (weight, ids): the token ids are its second input
            b.add(g_embed[0], tid, "auto-embedding", 0.95, "token ids", IN0, TensorSel("in", 1))
    g_rot = [n for n in g_out if g.is_type(n, "Rotary")]
    t_rot = [n for n in t_top if t.is_type(n, "PositionalEmbedding") or "Positional" in t.leaf_name(n)]
    if len(g_rot) == 1 and len(t_rot) >= 1:
        for tid in t_rot:
            b.add(g_rot[0], tid, "auto-rotary", 0.8, "cos/sin tables", TensorSel("out"), TensorSel("out"))
    g_norm = [n for n in g_out if g.is_type(n, "Norm")]
    t_norm = [n for n in t_top if t.is_type(n, "NormOperation")]
    if len(g_norm) == 1 and len(t_norm) >= 1:
        for tid in t_norm:
            b.add(g_norm[0], tid, "auto-norm", 0.95, "final norm")
    g_head = [n for n in g_out if g.leaf_name(n) in ("lm_head", "output", "embed_out")]
    t_head = [n for n in t_top if t.is_type(n, "LmHead") or "LmHead" in t.leaf_name(n)]
    if len(g_head) == 1 and len(t_head) >= 1:
        for tid in t_head:
            b.add(g_head[0], tid, "auto-lm-head", 0.95, "LM head (logits)", TensorSel("out"), TensorSel("out"))
            b.add(g_head[0], tid, "auto-lm-head", 0.95, "LM head input", IN0, IN0)


def auto_match(golden: RunFrames, test: RunFrames, taken: set[int]) -> list[NodeMatch]:
    """Node pairs between a torch module tree and an ATB-style op graph; see the module docstring."""
    g, t = _Tree.build(golden), _Tree.build(test)
    b = _Builder(g, t, set(taken))
    g_layers, t_layers = _layer_roots(g), _layer_roots(t)
    for layer, g_roots in sorted(g_layers.items()):
        if len(g_roots) != 1:
            continue
        for t_root in t_layers.get(layer, []):
            _match_layer(b, g_roots[0], t_root, layer)
    _match_outside_layers(b)
    # the same selectors twice for one node pair (prefill/decode share names outside layers) are harmless;
    # drop exact duplicates
    seen, out = set(), []
    for m in b.matches:
        key = (m.golden_node_id, m.test_node_id, str(m.golden_sel), str(m.test_sel), m.transform)
        if key not in seen:
            seen.add(key)
            out.append(m)
    return out
