"""A torch dump's tensors for the precheck: `TorchDump` (an msit torch dump, ours or msit's, or an msprobe dump,
read from its files or from a catalog run) and `TorchOp` (one module or API call at one token).

A module folder, or a call of an msprobe dump, holds the op's inputs and outputs; its weights come from
`weights/` (our `DumpConfig(dump_weight=True)`, once per run) or from msprobe's `parameters` entries. This module
reads dump files only; it never imports the model that wrote them.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import torch

from workbench.core.files import MODEL_TREE_NAME
from workbench.formats.model import Dump, DumpError, token_number
from workbench.formats.msit_torch import param_name
from workbench.formats.tensor_io import load_tensor

Tensor = torch.Tensor


class CannotRun(Exception):
    """The op cannot be re-run from what was dumped; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One tensor file of one node at one token (`io`: in | out | param)."""

    token: int
    node: str
    io: str
    idx: int
    path: str | None
    error: str | None = None


class TorchDump:
    """The tensor files of one torch dump (msit torch or msprobe), by node and token, loaded on demand."""

    def __init__(
        self,
        kind: str,
        root: str,
        entries: list[Entry],
        types: dict[str, str],
        parents: dict[str, str | None],
        kwargs_inputs: dict[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.root = root
        self.types = types
        self.kwargs_inputs = kwargs_inputs or {}
        self._by: dict[tuple[str, int, str], list[Entry]] = defaultdict(list)
        self._tokens: dict[str, set[int]] = defaultdict(set)
        for e in entries:
            self._by[(e.node, e.token, e.io)].append(e)
            if e.io != "param":
                self._tokens[e.node].add(e.token)
        for v in self._by.values():
            v.sort(key=lambda e: e.idx)
        self._params: dict[str, list[Entry]] = {}
        for e in entries:
            if e.io == "param" and e.node not in self._params:
                self._params[e.node] = self._by[(e.node, e.token, "param")]
        self.children: dict[str, dict[str, str]] = defaultdict(dict)
        for node, parent in parents.items():
            if parent is not None:
                self.children[parent][attr_name(node)] = node

    @classmethod
    def from_dump(cls, dump: Dump) -> TorchDump:
        entries = [Entry(t.token, t.node, t.role, t.index, t.path, t.error) for t in dump.tensors]
        return cls(
            dump.kind,
            str(dump.root),
            entries,
            {n.name: _checked_type(n.type, n.params) for n in dump.nodes},
            {n.name: n.parent for n in dump.nodes},
            dump.meta.get("kwargs_inputs") if isinstance(dump.meta.get("kwargs_inputs"), dict) else None,
        )

    @classmethod
    def from_catalog(cls, con: duckdb.DuckDBPyConnection, run_id: int) -> TorchDump:
        """A catalog run (its tensor rows point at the dump's files)."""
        row = con.execute("SELECT kind, path, meta FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            raise CannotRun(f"no run {run_id} in the catalog")
        kind, root, meta_text = row
        if kind == "atb":
            raise CannotRun("an ATB run: check its op folders with the ATB precheck")
        nodes = con.execute(
            "SELECT n.name, n.type, p.name, n.params FROM nodes n LEFT JOIN nodes p ON p.run_id = n.run_id "
            "AND p.node_id = n.parent_id WHERE n.run_id = ?",
            [run_id],
        ).fetchall()
        rows = con.execute(
            "SELECT t.token_id, n.name, t.io, t.idx, t.path, t.error FROM tensors t JOIN nodes n "
            "ON n.run_id = t.run_id AND n.node_id = t.node_id WHERE t.run_id = ?",
            [run_id],
        ).fetchall()
        meta = json.loads(meta_text) if meta_text else {}
        kw = meta.get("kwargs_inputs") if isinstance(meta, dict) else None
        entries = [Entry(int(r[0]), r[1], r[2], int(r[3]), r[4], r[5]) for r in rows]
        return cls(
            str(kind),
            str(root),
            entries + _weights_of_redumps(con, run_id, entries),
            {n[0]: _checked_type(n[1] or "", n[3]) for n in nodes},
            {n[0]: n[2] for n in nodes},
            kw if isinstance(kw, dict) else None,
        )

    def tokens(self, node: str) -> list[int]:
        return sorted(self._tokens.get(node, ()))

    def has(self, node: str, token: int) -> bool:
        return bool(self._by.get((node, token, "out")))

    def _load(self, entries: list[Entry]) -> list[Tensor]:
        out = []
        for e in entries:
            if e.path is None:
                raise CannotRun(f"{e.node} token {e.token}: {e.io}{e.idx} has statistics only (re-dump with tensors)")
            if e.error:
                raise CannotRun(f"{e.path}: {e.error}")
            try:
                out.append(load_tensor(e.path))
            except DumpError as exc:
                raise CannotRun(str(exc)) from None
        return out

    def op(self, node: str, token: int) -> TorchOp:
        """The tensors of `node` at `token`; raises `CannotRun` when they are missing or unreadable."""
        if node not in self.types and not self._tokens.get(node):
            raise CannotRun(f"no node {node!r} in this dump")
        ins_e, outs_e = self._by.get((node, token, "in"), []), self._by.get((node, token, "out"), [])
        if not outs_e:
            raise CannotRun(f"{node}: no output dumped at token {token}")
        params_e = self._by.get((node, token, "param")) or self._params.get(node, [])
        kw = self.kwargs_inputs.get(str(token), {}).get(node, {}) if isinstance(self.kwargs_inputs, dict) else {}
        names = [_input_name(e.path, kw) for e in ins_e]
        params = dict(zip((param_name(e.path or "") for e in params_e), self._load(params_e), strict=True))
        return TorchOp(
            node, self.types.get(node, ""), token, self._load(ins_e), names, self._load(outs_e), params, self
        )

    def op_params(self, node: str) -> dict[str, Tensor]:
        """A node's saved weights by parameter name (any token)."""
        entries = self._params.get(node, [])
        return dict(zip((param_name(e.path or "") for e in entries), self._load(entries), strict=True))

    def descendants(self, node: str) -> list[str]:
        """Every node below `node`, depth first in definition order."""
        out: list[str] = []
        stack = list(reversed(self.children.get(node, {}).values()))
        while stack:
            cur = stack.pop()
            out.append(cur)
            stack.extend(reversed(self.children.get(cur, {}).values()))
        return out

    def child(self, node: str, *attrs: str) -> str | None:
        """The child of `node` named by the first of `attrs` that exists (`q_proj`, `query`, ...)."""
        kids = self.children.get(node, {})
        return next((kids[a] for a in attrs if a in kids), None)


def _weights_of_redumps(con: duckdb.DuckDBPyConnection, run_id: int, entries: list[Entry]) -> list[Entry]:
    """Weights saved with the files a run's tensors were re-pointed to (`wb redump`, the app's `d`): the param
    entries, by node name, of the other runs whose folders hold this run's tensor files, for the nodes that have
    none of their own."""
    have = {e.node for e in entries if e.io == "param"}
    runs = con.execute(
        "SELECT DISTINCT r.run_id FROM runs r JOIN tensors t ON t.run_id = ? AND t.path IS NOT NULL "
        "AND starts_with(t.path, r.path || '/') WHERE r.run_id <> ?",
        [run_id, run_id],
    ).fetchall()
    if not runs:
        return []
    names = {e.node for e in entries} - have
    out: list[Entry] = []
    for (other,) in runs:
        for tok, node, io, idx, path, error in con.execute(
            "SELECT t.token_id, n.name, t.io, t.idx, t.path, t.error FROM tensors t JOIN nodes n "
            "ON n.run_id = t.run_id AND n.node_id = t.node_id WHERE t.run_id = ? AND t.io = 'param'",
            [int(other)],
        ).fetchall():
            if node in names:
                out.append(Entry(int(tok), node, io, int(idx), path, error))
        names -= {e.node for e in out}
    return out


def attr_name(node: str) -> str:
    """A node's attribute name under its parent: `root.a.q_proj` -> q_proj; msprobe
    `Module.a.q_proj.Linear.forward` -> q_proj."""
    parts = node.split("#")[0].split(".")
    if parts[0] in ("Module", "Cell") and len(parts) >= 4:
        return parts[-3]
    return parts[-1]


def _input_name(path: str | None, kwargs: dict[str, Any]) -> str:
    """`input_2_0.pth` with kwargs {"2": "position_embeddings"} -> `position_embeddings.0`; else `input_2_0`."""
    stem = os.path.basename(path or "").split(".")[0]
    parts = stem.split("_")[1:]
    if parts and isinstance(kwargs.get(parts[0]), str):
        return ".".join([kwargs[parts[0]], *parts[1:]])
    return stem


@dataclass(slots=True)
class TorchOp:
    """One module or API call at one token: its dumped inputs, outputs and weights."""

    name: str
    type: str
    token: int
    ins: list[Tensor]
    in_names: list[str]
    outs: list[Tensor]
    params: dict[str, Tensor]
    source: TorchDump
    skipped: dict[str, str] = field(default_factory=dict)  # stage -> why it did not run

    def named(self, name: str) -> Tensor | None:
        return next((t for n, t in zip(self.in_names, self.ins, strict=True) if n == name), None)

    def weight(self, name: str = "weight") -> Tensor:
        w = self.params.get(name)
        if w is None:
            raise CannotRun(
                f"{self.name}: its {name} was not dumped (re-dump with --weights or press d; "
                "DumpConfig(dump_weight=True), msprobe's L0/mix level)"
            )
        return w


def _checked_type(node_type: str, params: Any) -> str:
    """The type a node is checked as: a TorchAir GE op as the aten op of the FX node its graph names
    (`MatMulV2` linked to `mm_3-aten.mm.default` -> `aten.mm.default`), any other node as its own type."""
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            params = None
    fx = params.get("fx") if isinstance(params, dict) else None
    if isinstance(fx, list) and fx and isinstance(fx[0], str) and "-aten." in fx[0]:
        return fx[0].split("-", 1)[1]
    return node_type


@dataclass(slots=True)
class Target:
    """What a path names: the dump to read, a node (None: all) and a token (None: the first)."""

    dump_path: Path
    node: str | None = None
    token: int | None = None
    notes: list[str] = field(default_factory=list)


def target_of(path: Path) -> Target:
    """`{dev}/{token}/{module}` -> that module and token; `{dev}/{token}` -> that token; else the dump."""
    p = path.resolve()
    tok, parent_tok = token_number(p.name), token_number(p.parent.name)
    if parent_tok is not None and (p.parent.parent / MODEL_TREE_NAME).exists():
        return Target(p.parent.parent, p.name, parent_tok)
    if tok is not None and (p.parent / MODEL_TREE_NAME).exists():
        return Target(p.parent, None, tok)
    return Target(p)
