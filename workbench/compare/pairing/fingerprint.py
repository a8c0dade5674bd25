"""Mapping fingerprints: what the dumps looked like when a mapping was saved, and which pairs no longer fit.

The app's mapping editor stamps every explicit pair of a `wb-mapping` file with a print of both nodes (type,
and the dtype and shape of each input and output at the node's first dumped token), and the file with a
digest of each dump's node names and types. `check_mapping` holds the pairs against the dumps being
compared: a pair whose node is gone, whose type changed, or whose selected tensors changed in number, shape
or kind of dtype (integer vs floating; bf16 vs fp16 vs fp32 is what a comparison is for) is *stale*: reported,
stored in `mapping_stale`, and not used. Rules are matched again on every compare, so only explicit pairs can
be stale; a rule that matches nothing in these dumps is reported too. See docs/mapping.md.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import duckdb

from workbench.compare.pairing.mapping import MappingFile, PairSpec, RuleSpec, TensorSel

FINGERPRINT_VERSION = 1
_INT_DTYPE = re.compile(r"^(u?int[0-9]*|long|short|bool|char)$")


@dataclass(frozen=True, slots=True)
class NodePrint:
    """One node as the mapping saw it: type, the token its tensors were read at, `role:idx` -> `dtype[shape]`."""

    type: str | None
    token: int | None
    tensors: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "token": self.token, "tensors": dict(self.tensors)}

    @classmethod
    def from_json(cls, data: Any) -> NodePrint | None:
        if not isinstance(data, dict):
            return None
        tensors = data.get("tensors")
        token = data.get("token")
        return cls(
            None if data.get("type") is None else str(data["type"]),
            token if isinstance(token, int) and not isinstance(token, bool) else None,
            {str(k): str(v) for k, v in tensors.items()} if isinstance(tensors, dict) else {},
        )


@dataclass(slots=True)
class CurrentNode:
    """A node of the dump being compared: its type, every token it has tensors at, and its tensors there."""

    type: str | None
    tokens: list[int]
    by_token: dict[int, dict[str, str]]

    def at(self, token: int | None) -> tuple[dict[str, str], bool]:
        """Its tensors at `token` when it has that token (exact), else at its first token (not exact)."""
        if token is not None and token in self.by_token:
            return self.by_token[token], True
        return (self.by_token[self.tokens[0]] if self.tokens else {}), False

    def print(self) -> NodePrint:
        first = self.tokens[0] if self.tokens else None
        return NodePrint(self.type, first, dict(self.by_token.get(first, {})) if first is not None else {})


STALE_SLICE = 50_000  # mapping_stale rows inserted at a time


@dataclass(frozen=True, slots=True)
class StaleEntry:
    """A pair (or rule) of the mapping file that was not used, and why."""

    kind: str  # pair | rule
    golden: str
    test: str
    golden_tensor: str
    test_tensor: str
    reason: str


@dataclass(slots=True)
class MappingCheck:
    """The outcome of holding a mapping against two dumps."""

    pairs: int = 0  # explicit pairs in the file
    fingerprinted: bool = False  # the file carries a fingerprint
    unchecked: int = 0  # explicit pairs without a print (added by hand to a fingerprinted file)
    stale: list[StaleEntry] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # "golden" / "test": topology differs from the saved digest

    @property
    def stale_pairs(self) -> list[StaleEntry]:
        return [s for s in self.stale if s.kind == "pair"]

    @property
    def dead_rules(self) -> list[StaleEntry]:
        return [s for s in self.stale if s.kind == "rule"]

    def stale_keys(self) -> set[tuple[str, str, str, str]]:
        return {(s.golden, s.test, s.golden_tensor, s.test_tensor) for s in self.stale_pairs}

    def usable(self, mapping: MappingFile) -> MappingFile:
        """A copy of `mapping` without its stale pairs (what the compare uses)."""
        keys = self.stale_keys()
        if not keys:
            return mapping
        out = MappingFile(
            [p for p in mapping.pairs if _key(p) not in keys],
            list(mapping.rules),
            list(mapping.types),
            list(mapping.unpaired),
            mapping.source,
        )
        out.pair_prints = dict(mapping.pair_prints)
        out.fingerprint = mapping.fingerprint
        return out

    def lines(self, show_all: bool = False) -> list[str]:
        """What `wb compare` prints: one line about the pairs, one about rules matching nothing; with
        `show_all`, one line per stale pair or rule after them."""
        out: list[str] = []
        stale = self.stale_pairs
        if self.pairs and not self.fingerprinted:
            missing = f"; {len(stale)} name a node not in these dumps: not used" if stale else ""
            out.append(f"mapping: no fingerprint: pairs not checked (re-save it in the app's mapping editor){missing}")
        elif stale:
            reasons = "; ".join(s.reason.split("; ")[0] for s in stale[:2])
            more = f"; {len(stale) - 2} more" if len(stale) > 2 else ""
            changed = f"; {' and '.join(self.changed)} topology changed since it was saved" if self.changed else ""
            out.append(
                f"mapping: {len(stale)} of {self.pairs} pairs stale ({reasons}{more}); not used{changed} "
                "(wb compare --show-stale, table mapping_stale, the app's mapping editor)"
            )
        elif self.pairs:
            extra = f"; {self.unchecked} without a print, not checked" if self.unchecked else ""
            if self.changed:
                extra += f" ({' and '.join(self.changed)} topology changed since it was saved)"
            out.append(f"mapping: {self.pairs} pairs checked against its fingerprint, none stale{extra}")
        dead = self.dead_rules
        if dead:
            first = f"{dead[0].golden} <-> {dead[0].test}"
            more = f" and {len(dead) - 1} more" if len(dead) > 1 else ""
            verb = "rules match" if len(dead) > 1 else "rule matches"
            out.append(f"mapping: {len(dead)} {verb} nothing here ({first}{more})")
        if show_all:
            for s in self.stale:
                sel = "" if s.golden_tensor == s.test_tensor == "*" else f" [{s.golden_tensor} / {s.test_tensor}]"
                arrow = "<->" if s.kind == "rule" else "⇄"
                out.append(f"  stale {s.kind}: {s.golden} {arrow} {s.test}{sel}: {s.reason}")
        return out


def _key(p: PairSpec) -> tuple[str, str, str, str]:
    return (p.golden, p.test, str(p.golden_tensor), str(p.test_tensor))


# ---------------------------------------------------------------------- reading the dumps
def _tensor_text(dtype: Any, shape: Any) -> str:
    dims = "?" if shape is None else ",".join(str(int(d)) for d in shape)
    return f"{dtype or '?'}[{dims}]"


def current_nodes(con: duckdb.DuckDBPyConnection, run_id: int, names: set[str]) -> dict[str, CurrentNode]:
    """The named nodes of a run as they are now (weights left out: whether they were saved is a dump option)."""
    if not names:
        return {}
    rows = con.execute(
        "SELECT n.name, n.type, t.token_id, t.io, t.idx, t.dtype, t.shape FROM nodes n "
        "LEFT JOIN tensors t ON t.run_id = n.run_id AND t.node_id = n.node_id AND t.io IN ('in', 'out') "
        "WHERE n.run_id = ? AND list_contains(?, n.name)",
        [run_id, sorted(names)],
    ).fetchall()
    out: dict[str, CurrentNode] = {}
    for name, typ, token, io, idx, dtype, shape in rows:
        node = out.setdefault(str(name), CurrentNode(None if typ is None else str(typ), [], {}))
        if token is None:
            continue
        node.by_token.setdefault(int(token), {})[f"{io}:{int(idx)}"] = _tensor_text(dtype, shape)
    for node in out.values():
        node.tokens = sorted(node.by_token)
    return out


def dump_print(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, Any]:
    """A run's whole-dump print: where it was read, its kind, its node count and a digest of names and types."""
    row = con.execute("SELECT path, kind FROM runs WHERE run_id = ?", [run_id]).fetchone()
    # hashed in the database: a dump of 100,000 nodes is not brought into Python for this
    digest = con.execute(
        "SELECT count(*), md5(coalesce(string_agg(name || chr(9) || coalesce(type, ''), chr(10) ORDER BY name, type), "
        "'')) FROM nodes WHERE run_id = ?",
        [run_id],
    ).fetchone()
    return {
        "path": None if row is None else str(row[0]),
        "kind": None if row is None else str(row[1]),
        "nodes": 0 if digest is None else int(digest[0]),
        "digest": "" if digest is None else str(digest[1]),
    }


# ---------------------------------------------------------------------- checking
def _dtype_kind(dtype: str) -> str:
    d = dtype.removeprefix("torch.").lower()
    return "?" if d == "?" else "integer" if _INT_DTYPE.match(d) else "float"


def _split(text: str) -> tuple[str, list[str] | None]:
    dtype, _, rest = text.partition("[")
    dims = rest.rstrip("]")
    return dtype, None if dims == "?" else ([d for d in dims.split(",") if d] if dims else [])


def _shape_change(old: list[str], new: list[str], exact: bool) -> str | None:
    """How a shape changed, or None. Across tokens (`exact` False) only the rank counts: any dimension may be a
    sequence length (ids, masks, caches) that legitimately differs from one token to the next."""
    if not exact:
        return None if len(old) == len(new) else f"[{', '.join(old)}] -> [{', '.join(new)}]"
    if old == new:
        return None
    diff = [i for i, (a, b) in enumerate(zip(old, new)) if a != b]
    if len(old) == len(new) and len(diff) == 1:
        return f"{old[diff[0]]} -> {new[diff[0]]}"
    return f"[{', '.join(old)}] -> [{', '.join(new)}]"


def node_changes(name: str, saved: NodePrint, now: CurrentNode, sel: TensorSel) -> list[str]:
    """Why one node no longer fits its saved print (empty: it does), for the tensors `sel` picks."""
    reasons: list[str] = []
    if (saved.type or "") != (now.type or ""):
        reasons.append(f"type of {name} changed {saved.type} -> {now.type}")
    tensors, exact = now.at(saved.token)

    def picked(d: dict[str, str]) -> dict[str, str]:
        out = {}
        for key, val in d.items():
            role, _, idx = key.partition(":")
            if idx.isascii() and idx.isdigit() and sel.accepts(role, int(idx)):
                out[key] = val
        return out

    old, new = picked(saved.tensors), picked(tensors)
    if old and not now.tokens:
        return [*reasons, f"{name} has no tensors in this dump"]
    for key in sorted(old.keys() - new.keys()):
        reasons.append(f"{name} {key} is gone")
    for key in sorted(new.keys() - old.keys()):
        reasons.append(f"{name} gained {key}")
    for key in sorted(old.keys() & new.keys()):
        (od, oshape), (nd, nshape) = _split(old[key]), _split(new[key])
        if oshape is not None and nshape is not None:
            change = _shape_change(oshape, nshape, exact)
            if change:
                reasons.append(f"shape of {name} {key} changed {change}")
                continue
        if _dtype_kind(od) != _dtype_kind(nd) and "?" not in (_dtype_kind(od), _dtype_kind(nd)):
            reasons.append(f"dtype of {name} {key} changed {od} -> {nd}")
    return reasons


def _layer_of(layer: Any) -> int | None:
    return None if layer is None else int(layer)


def _dead_rule(rule: RuleSpec, golden: list[tuple[str, Any]], test: list[tuple[str, Any]]) -> str | None:
    """Why a rule pairs nothing in these dumps, or None when it pairs something."""
    gre, tre = rule.golden_regex(), rule.test_regex()
    g_layers = [_layer_of(lay) for n, lay in golden if gre.match(n)]
    t_layers = [_layer_of(lay) for n, lay in test if tre.match(n)]
    if not g_layers and not t_layers:
        return "matches no golden and no test node"
    if not g_layers:
        return "matches no golden node"
    if not t_layers:
        return "matches no test node"
    per_layer: dict[int | None, int] = defaultdict(int)
    for lay in t_layers:
        per_layer[lay] += 1
    if not any(per_layer.get(lay) == 1 for lay in g_layers):
        return f"its {len(g_layers)} golden and {len(t_layers)} test nodes share no layer with one test node"
    return None


def check_mapping(
    mapping: MappingFile,
    con: duckdb.DuckDBPyConnection,
    golden_run: int,
    test_run: int,
    *,
    rules: bool = True,
) -> MappingCheck:
    """Hold a mapping's explicit pairs (and, with `rules`, its rules) against two runs of a catalog."""
    check = MappingCheck(pairs=len(mapping.pairs), fingerprinted=mapping.fingerprint is not None)
    if check.fingerprinted and mapping.fingerprint is not None:
        for side, run in (("golden", golden_run), ("test", test_run)):
            saved = mapping.fingerprint.get(side)
            if isinstance(saved, dict) and saved.get("digest") != dump_print(con, run)["digest"]:
                check.changed.append(side)
    if mapping.pairs:
        g_now = current_nodes(con, golden_run, {p.golden for p in mapping.pairs})
        t_now = current_nodes(con, test_run, {p.test for p in mapping.pairs})
        for p in mapping.pairs:
            reasons = pair_changes(p, mapping, g_now, t_now)
            if reasons is None:
                check.unchecked += 1
            elif reasons:
                check.stale.append(
                    StaleEntry("pair", p.golden, p.test, str(p.golden_tensor), str(p.test_tensor), "; ".join(reasons))
                )
    if rules and mapping.rules:
        golden = con.execute("SELECT name, layer FROM nodes WHERE run_id = ?", [golden_run]).fetchall()
        test = con.execute("SELECT name, layer FROM nodes WHERE run_id = ?", [test_run]).fetchall()
        for r in mapping.rules:
            why = _dead_rule(r, golden, test)
            if why:
                check.stale.append(
                    StaleEntry("rule", r.golden, r.test, str(r.golden_tensor), str(r.test_tensor), f"the rule {why}")
                )
    return check


def pair_changes(
    pair: PairSpec, mapping: MappingFile, golden: dict[str, CurrentNode], test: dict[str, CurrentNode]
) -> list[str] | None:
    """Why an explicit pair no longer fits (empty: it fits); None when it has no print to check against.
    A node that is not in the dump at all makes a pair stale, print or not."""
    missing = []
    if pair.golden not in golden:
        missing.append(f"node {pair.golden} not in the golden dump")
    if pair.test not in test:
        missing.append(f"node {pair.test} not in the test dump")
    if missing:
        return missing
    saved = mapping.pair_prints.get((pair.golden, pair.test))
    if mapping.fingerprint is None or saved is None:
        return None
    g_print, t_print = NodePrint.from_json(saved.get("golden")), NodePrint.from_json(saved.get("test"))
    if g_print is None or t_print is None:
        return None
    return node_changes(pair.golden, g_print, golden[pair.golden], pair.golden_tensor) + node_changes(
        pair.test, t_print, test[pair.test], pair.test_tensor
    )


def stamp_mapping(
    mapping: MappingFile,
    con: duckdb.DuckDBPyConnection,
    golden_run: int,
    test_run: int,
    keep_stale: set[tuple[str, str]] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Write the fingerprint of the current dumps into `mapping` (before saving it). Pairs in `keep_stale`
    keep their old print, so a stale pair the user did not resolve stays stale."""
    g_now = current_nodes(con, golden_run, {p.golden for p in mapping.pairs})
    t_now = current_nodes(con, test_run, {p.test for p in mapping.pairs})
    prints: dict[tuple[str, str], dict[str, Any]] = {}
    for p in mapping.pairs:
        key = (p.golden, p.test)
        if key in keep_stale and key in mapping.pair_prints:
            prints[key] = mapping.pair_prints[key]
        elif p.golden in g_now and p.test in t_now:
            prints[key] = {"golden": g_now[p.golden].print().to_json(), "test": t_now[p.test].print().to_json()}
    mapping.pair_prints = prints
    mapping.fingerprint = {
        "version": FINGERPRINT_VERSION,
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "golden": dump_print(con, golden_run),
        "test": dump_print(con, test_run),
    }


def store_check(con: duckdb.DuckDBPyConnection, cmp_id: int, check: MappingCheck | None, source: str | None) -> None:
    """Replace the comparison's rows of `mapping_stale` with this check's."""
    from workbench.catalog.store import insert_rows

    con.execute("DELETE FROM mapping_stale WHERE cmp_id = ?", [cmp_id])
    if check is None or not check.stale:
        return
    for lo in range(0, len(check.stale), STALE_SLICE):  # a million stale pairs: one frame of them would be ~1 GB
        insert_rows(
            con,
            "mapping_stale",
            [
                (cmp_id, s.kind, s.golden, s.test, s.golden_tensor, s.test_tensor, s.reason, source)
                for s in check.stale[lo : lo + STALE_SLICE]
            ],
        )
