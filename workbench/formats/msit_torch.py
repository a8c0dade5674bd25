"""Reader for msit torch dumps (forward hooks): `model_tree.json` + `{token}/{module}/input_*.pth|output*.pth`.

Tensor indices: the files of one role are sorted by their integer path (`input_0` < `input_0_0` <
`input_0_1` < `input_1`) and numbered 0, 1, 2 ... in that order; this is the flattened order of
the positional arguments (or outputs), so a flat `input_{i}` / `output_{i}` keeps index i and
`output.pth` is output 0. Statistics-only rows (`statistics.csv`) are numbered the same way, by
their order within the role.

Execution order: our dumper's `wb_manifest.json` when present (`recorded`), else rebuilt from data
flow on the first token (`data-flow`): a module that consumes a tensor another module produced
runs after it; siblings are ordered topologically with the definition order as tie-breaker and a
parent precedes its children. Without any dumped input the definition order is all we have.

Without a usable `model_tree.json` (missing, unreadable, malformed, nested too deeply) the tree comes from
the folder names, with one problem line: every dotted prefix of a `root.` module is a module too (dumped or
not, like `root.model.layers`), so the hierarchy is the one the tree gives; a module's type is then its
last name segment.
"""

from __future__ import annotations

import csv
import heapq
import os
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.core.capped import STATISTICS, FileRefused, open_capped
from workbench.core.files import MANIFEST_NAME, MODEL_TREE_NAME
from workbench.formats.layers import inherit_layers, layer_from_name
from workbench.formats.model import (
    TENSOR_ROLES,
    Dump,
    DumpError,
    Node,
    OrderSource,
    TensorEntry,
    TensorRole,
    TensorStats,
    check_shape,
    checked_stats,
    param_index,
    token_folder_problem,
    token_number,
)
from workbench.formats.quant_links import QUANT_KEY, quant_links
from workbench.formats.scan import check_link, content_key, link_problem, list_dir, pth_header, read_json

MANIFEST = MANIFEST_NAME
MODEL_TREE = MODEL_TREE_NAME
STATS_CSV = "statistics.csv"
WEIGHTS_DIR = "weights"  # `dump_weight=True`: `weights/{module}.{param}.pth`, once per run
_TENSOR_RE = re.compile(r"^(input|output)((?:_\d+)*)$", re.ASCII)
_MAX_PRODUCERS = 32  # a content hash produced by more modules than this carries no ordering information


def is_torch_device_dir(path: Path) -> bool:
    """A `{device}_{pid}` folder of an msit torch dump: it holds `model_tree.json` or numeric token folders
    whose module folders are named `root...`."""
    if (path / MODEL_TREE).is_file():
        return True
    try:
        for tok in sorted(p for p in path.iterdir() if p.is_dir() and token_number(p.name) is not None)[:2]:
            for mod in tok.iterdir():
                if mod.is_dir() and (mod.name == "root" or mod.name.startswith("root.")):
                    return True
    except OSError:
        return False
    return False


@dataclass(slots=True)
class _Selection:
    token: int | None = None
    module: str | None = None


def read_msit_torch(
    dev_dir: Path, *, token: int | None = None, module: str | None = None, root: Path | None = None
) -> Dump:
    """Read one `{device}_{pid}` folder; `token`/`module` restrict the tensors to one token / module subtree."""
    problems: list[str] = []
    nodes, model_name = _read_tree(dev_dir, problems)
    tree_used = bool(nodes)
    meta: dict[str, Any] = {}
    manifest_path = dev_dir / MANIFEST
    manifest: dict[str, Any] | None = None
    if manifest_path.is_file():
        try:
            m = read_json(manifest_path)
            if not isinstance(m, dict) or not isinstance(m.get("exec_order"), dict):
                raise DumpError(manifest_path, "no 'exec_order' object: manifest ignored")
            manifest = m
            meta.update(m)
        except DumpError as exc:
            problems.append(str(exc))
    try:
        quant_links(meta)
    except ValueError as exc:  # a malformed `quant` entry: the int tensors are compared as they are
        problems.append(f"{manifest_path}: {exc}; its int tensors are not dequantized")
        meta.pop(QUANT_KEY, None)

    sel = _Selection(token, module)
    tensors, hashes = _scan_tokens(dev_dir, sel, problems, want_hashes=manifest is None)
    _scan_weights(dev_dir, sel, tensors, problems)

    # modules seen on disk but absent from the tree (API-mode folders, missing tree)
    by_name = {n.name: n for n in nodes}
    for name in sorted({t.node for t in tensors} - by_name.keys(), key=_name_key):
        _add_folder_node(name, nodes, by_name, from_folders=not tree_used)

    order_source: OrderSource
    if manifest is not None:
        order_source = "recorded"
        exec_lists: dict[str, Any] = manifest["exec_order"]
        key = (
            "0"
            if "0" in exec_lists
            else min(exec_lists, key=lambda k: (token_number(k) is None, token_number(k) or 0, k), default=None)
        )
        order = exec_lists.get(key, []) if key is not None else []
        pos = {name: i for i, name in enumerate(order) if isinstance(name, str)}
        _assign_order_by_position(nodes, pos)
    elif hashes.has_inputs:
        order_source = "data-flow"
        _assign_order_by_dataflow(nodes, hashes)
    else:
        order_source = "definition"
        _assign_order_by_position(nodes, {})

    for n in nodes:
        n.layer = layer_from_name(n.name)
    inherit_layers(nodes)
    if manifest is not None and manifest.get("model_class"):
        model_name = str(manifest["model_class"])
    return Dump(
        kind="msit_torch",
        root=(root or dev_dir).resolve(),
        nodes=nodes,
        tensors=tensors,
        order_source=order_source,
        model_name=model_name,
        meta=meta,
        problems=problems,
    )


# ---------------------------------------------------------------------------------------------- tree


def _read_tree(dev_dir: Path, problems: list[str]) -> tuple[list[Node], str | None]:
    path = dev_dir / MODEL_TREE
    if not path.exists():
        problems.append(f"{path}: missing; the module tree is rebuilt from the folder names")
        return [], None
    try:
        data = read_json(path)
        nodes: list[Node] = []
        _walk_tree(data, None, 0, nodes, path)
    except DumpError as exc:
        problems.append(f"{exc}; not used: the module tree is rebuilt from the folder names")
        return [], None
    return nodes, (nodes[0].type if nodes else None)


def _walk_tree(obj: Any, parent: str | None, depth: int, out: list[Node], path: Path) -> None:
    # iterative pre-order: deep trees must not hit the recursion limit
    stack: list[tuple[Any, str | None, int]] = [(obj, parent, depth)]
    seen: set[str] = set()
    while stack:
        cur, par, dep = stack.pop()
        if not isinstance(cur, dict) or not isinstance(cur.get("name"), str):
            raise DumpError(path, "malformed tree: every node needs 'name', 'type' and 'children'")
        name = cur["name"]
        if name in seen:
            continue
        seen.add(name)
        out.append(Node(name=name, type=str(cur.get("type", "")), parent=par, depth=dep))
        children = cur.get("children") or []
        if not isinstance(children, list):
            raise DumpError(path, f"malformed tree: children of {name!r} is not a list")
        for child in reversed(children):
            stack.append((child, name, dep + 1))


def _name_key(name: str) -> tuple[Any, ...]:
    return tuple((0, int(p)) if p.isascii() and p.isdigit() else (1, p) for p in name.split("."))


def _add_folder_node(name: str, nodes: list[Node], by_name: dict[str, Node], *, from_folders: bool = False) -> None:
    """Add a module folder that the tree does not list, under its longest listed prefix. `from_folders` (no
    usable tree): every dotted prefix of a `root.` name is a module, dumped or not (`root.model.layers`), so the
    hierarchy is the one a tree gives."""
    parent = None
    parts = name.split(".")
    if from_folders and name.startswith("root."):
        parent = ".".join(parts[:-1])
        if parent not in by_name:
            _add_folder_node(parent, nodes, by_name, from_folders=True)
    else:
        for i in range(len(parts) - 1, 0, -1):
            cand = ".".join(parts[:i])
            if cand in by_name:
                parent = cand
                break
    if parent is None and name != "root" and "root" not in by_name and name.startswith("root."):
        _add_folder_node("root", nodes, by_name)
        parent = "root"
    depth = by_name[parent].depth + 1 if parent is not None else 0
    node = Node(name=name, type=parts[-1] if parent is not None else "", parent=parent, depth=depth)
    nodes.append(node)
    by_name[name] = node


# ---------------------------------------------------------------------------------------------- tensors


@dataclass(slots=True)
class _Hashes:
    token: int | None = None
    inputs: dict[str, list[bytes]] | None = None
    outputs: dict[str, list[bytes]] | None = None
    has_inputs: bool = False

    def add(self, module: str, role: TensorRole, key: bytes) -> None:
        """One tensor's content key (a payload's digest, or a statistics-only tensor's `_stats_key`)."""
        target = self.inputs if role == "in" else self.outputs
        assert target is not None
        target[module].append(key)
        self.has_inputs = self.has_inputs or role == "in"


def _scan_tokens(
    dev_dir: Path, sel: _Selection, problems: list[str], *, want_hashes: bool
) -> tuple[list[TensorEntry], _Hashes]:
    tensors: list[TensorEntry] = []
    hashes = _Hashes(inputs=defaultdict(list), outputs=defaultdict(list))
    try:
        entries = list_dir(dev_dir)
    except DumpError as exc:
        problems.append(str(exc))
        return tensors, hashes
    token_dirs: list[tuple[int, str]] = []
    for e in entries:
        if e.is_dir:
            num = token_number(e.name)
            if num is not None:
                token_dirs.append((num, e.path))
                continue
            bad = token_folder_problem(e.path, e.name)
        else:
            bad = link_problem(e)
        if bad is not None:
            problems.append(bad)
    token_dirs.sort()
    if sel.token is not None:
        token_dirs = [td for td in token_dirs if td[0] == sel.token]
    for i, (tok, tok_path) in enumerate(token_dirs):
        hash_this = want_hashes and i == 0
        if hash_this:
            hashes.token = tok
        try:
            mods = list_dir(tok_path)
        except DumpError as exc:
            problems.append(str(exc))
            continue
        for m in mods:
            if not m.is_dir:
                bad = link_problem(m)
                if bad is not None:
                    problems.append(bad)
                continue
            if sel.module is not None and not (m.name == sel.module or m.name.startswith(sel.module + ".")):
                continue
            _scan_module(tok, m.name, m.path, tensors, problems, hashes if hash_this else None)
    return tensors, hashes


def _scan_weights(dev_dir: Path, sel: _Selection, out: list[TensorEntry], problems: list[str]) -> None:
    """Parameters saved once per run (`weights/root.x.weight.pth`) as `param` tensors of their module, filed
    under the first token read (they do not change between tokens); indexed by parameter name (`param_index`)."""
    folder = dev_dir / WEIGHTS_DIR
    if not folder.is_dir():
        return
    token = sel.token if sel.token is not None else min((t.token for t in out), default=0)
    try:
        files = [f for f in list_dir(folder) if not f.is_dir and f.name.endswith(".pth")]
    except DumpError as exc:
        problems.append(str(exc))
        return
    by_module: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for f in sorted(files, key=lambda f: f.name):
        module, _, pname = f.name[:-4].rpartition(".")
        if not module or not pname:
            problems.append(f"{f.path}: unexpected weight file name (want <module>.<param>.pth)")
            continue
        if sel.module is not None and not (module == sel.module or module.startswith(sel.module + ".")):
            continue
        by_module[module].append((pname, f.path))
    for module, params in by_module.items():
        for pname, path in sorted(params):
            idx = param_index(pname)
            try:
                dt, shape, at = pth_header(path)
            except DumpError as exc:
                problems.append(str(exc))
                out.append(TensorEntry(token, module, "param", idx, path, error=exc.reason))
                continue
            out.append(TensorEntry(token, module, "param", idx, path, dtype=dt, shape=shape, payload=at))


def param_name(path: str) -> str:
    """The parameter name in a weight file's path: ours (`root.x.weight.pth`), msprobe's (`...parameters.weight.pt`)."""
    stem = os.path.basename(path)
    for ext in (".pth", ".pt", ".npy"):
        if stem.endswith(ext):
            stem = stem[: -len(ext)]
            break
    return stem.rpartition(".")[2]


def _role_index(stem: str) -> tuple[TensorRole, tuple[int, ...]] | None:
    m = _TENSOR_RE.match(stem)
    if not m:
        return None
    nums = tuple(int(x) for x in m.group(2).split("_") if x)
    return ("in" if m.group(1) == "input" else "out"), nums


def _scan_module(
    tok: int, module: str, folder: str, out: list[TensorEntry], problems: list[str], hashes: _Hashes | None
) -> None:
    try:
        files = list_dir(folder)
    except DumpError as exc:
        problems.append(str(exc))
        return
    by_role: dict[TensorRole, list[tuple[tuple[int, ...], str]]] = {"in": [], "out": []}
    stats_file = None
    for f in files:
        if f.is_dir and not f.name.endswith(".pth"):  # a folder named like a tensor file is reported below
            continue
        if f.is_link:
            try:
                check_link(f.path)
            except DumpError as exc:
                problems.append(str(exc))
                continue
        if f.name == STATS_CSV:
            stats_file = f.path
            continue
        if not f.name.endswith(".pth"):
            continue
        ri = _role_index(f.name[:-4])
        if ri is None:
            problems.append(f"{f.path}: unexpected tensor file name (want input_<i>.pth or output[_<i>].pth)")
            continue
        by_role[ri[0]].append((ri[1], f.path))
    stats: dict[tuple[TensorRole, int], tuple[str | None, tuple[int, ...] | None, TensorStats]] = {}
    if stats_file is not None:
        try:
            stats = _read_stats_csv(stats_file)
        except DumpError as exc:
            problems.append(str(exc))
    first = len(out)
    for role in TENSOR_ROLES:
        for idx, (_nums, path) in enumerate(sorted(by_role[role])):
            st = stats.pop((role, idx), None)
            key = None
            try:
                # the data-flow order (no manifest) hashes a few spread runs of each payload; no torch either way
                if hashes is not None:
                    dt, raw_shape, key, at = content_key(path)
                    shape = check_shape(path, raw_shape)
                else:
                    dt, shape, at = pth_header(path)
            except DumpError as exc:
                problems.append(str(exc))
                out.append(
                    TensorEntry(
                        tok,
                        module,
                        role,
                        idx,
                        path,
                        error=exc.reason,
                        stats=st[2] if st else None,
                    )
                )
                continue
            out.append(
                TensorEntry(
                    tok,
                    module,
                    role,
                    idx,
                    path,
                    dtype=dt,
                    shape=shape,
                    stats=st[2] if st else None,
                    digest=key,
                    payload=at,
                )
            )
            if hashes is not None and key is not None:
                hashes.add(module, role, key)
    for (role, idx), (st_dtype, st_shape, st_) in sorted(stats.items()):
        out.append(TensorEntry(tok, module, role, idx, None, dtype=st_dtype, shape=st_shape, stats=st_))
        if hashes is not None and (key := _stats_key(st_dtype, st_shape, st_)) is not None:
            hashes.add(module, role, key)
    if stats_file is not None:  # impossible statistics refused, with their line naming the CSV
        out[first:] = [checked_stats(e, stats_file, problems) for e in out[first:]]


def _stats_key(dtype: str | None, shape: tuple[int, ...] | None, stats: TensorStats) -> bytes | None:
    """A statistics-only tensor's content key for the data-flow order: msit prints each statistic in full (`repr`),
    so one tensor dumped as a module's output and the next one's input has the same dtype, shape, max, min, mean and
    L2 norm. None where a statistic is missing or NaN (every overflowed tensor would look alike)."""
    values = (stats.max, stats.min, stats.mean, stats.norm)
    if dtype is None or shape is None or any(v is None or v != v for v in values):
        return None
    return f"{dtype}|{shape}|{'|'.join(repr(v) for v in values)}".encode()


def _csv_role(row: dict[str, str]) -> TensorRole:
    return "out" if (row.get("InputOutput") or "").strip().lower().startswith("out") else "in"


def _float(text: str | None) -> float | None:
    if text is None or not text.isascii():  # float() also reads '٣'
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _read_stats_csv(
    path: str,
) -> dict[tuple[TensorRole, int], tuple[str | None, tuple[int, ...] | None, TensorStats]]:
    """Rows of one `statistics.csv`; a module called twice in a token appends twice, the last call wins."""
    try:
        with open_capped(path, STATISTICS, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except FileRefused as exc:
        raise DumpError(path, exc.reason) from None
    except OSError as exc:
        raise DumpError(path, f"cannot read: {exc.strerror or exc}") from None
    except (csv.Error, UnicodeDecodeError) as exc:
        raise DumpError(path, f"not a readable statistics CSV ({str(exc)[:120]})") from None
    if rows and not {"InputOutput", "Max", "Min", "Mean"} <= set(rows[0]):
        raise DumpError(path, "statistics CSV without InputOutput/Max/Min/Mean columns")
    calls: list[list[dict[str, str]]] = [[]]
    prev_role: TensorRole | None = None
    for r in rows:
        role = _csv_role(r)
        if role == "in" and prev_role == "out":
            calls.append([])
        calls[-1].append(r)
        prev_role = role
    result: dict[tuple[TensorRole, int], tuple[str | None, tuple[int, ...] | None, TensorStats]] = {}
    counters: dict[TensorRole, int] = {"in": 0, "out": 0}
    for r in calls[-1]:
        role = _csv_role(r)
        dt = (r.get("DataType") or "").strip()
        shape_text = r.get("Shape") or ""
        shape: tuple[int, ...] | None = None
        if shape_text.strip():
            try:
                shape = check_shape(path, tuple(int(x) for x in re.findall(r"-?[0-9]+", shape_text)), "Shape column")
            except DumpError:
                shape = None  # statistics still count; the shape is only shown
        stats = TensorStats(
            max=_float(r.get("Max")), min=_float(r.get("Min")), mean=_float(r.get("Mean")), norm=_float(r.get("L2Norm"))
        )
        result[(role, counters[role])] = (dt.removeprefix("torch.") or None, shape, stats)
        counters[role] += 1
    return result


# ---------------------------------------------------------------------------------------------- order


def _children_map(nodes: list[Node]) -> tuple[dict[str | None, list[Node]], dict[str, int]]:
    children: dict[str | None, list[Node]] = defaultdict(list)
    names = {n.name for n in nodes}
    for n in nodes:
        children[n.parent if n.parent in names else None].append(n)
    definition = {n.name: i for i, n in enumerate(nodes)}
    return children, definition


def _dfs_assign(
    nodes: list[Node], order_children: Callable[[list[Node]], list[Node]], children: dict[str | None, list[Node]]
) -> None:
    counter = 0
    stack = list(reversed(order_children(children.get(None, []))))
    visited: set[str] = set()
    while stack:
        n = stack.pop()
        if n.name in visited:
            continue
        visited.add(n.name)
        n.exec_order = counter
        counter += 1
        stack.extend(reversed(order_children(children.get(n.name, []))))


def _assign_order_by_position(nodes: list[Node], pos: dict[str, int]) -> None:
    """Siblings ordered by the first recorded call in their subtree; unrecorded ones keep definition order."""
    children, definition = _children_map(nodes)
    first: dict[str, float] = {}
    for n in reversed(nodes):  # pre-order reversed: children before parents
        best = float(pos[n.name]) if n.name in pos else float("inf")
        for c in children.get(n.name, []):
            best = min(best, first.get(c.name, float("inf")))
        first[n.name] = best
    _dfs_assign(nodes, lambda sibs: sorted(sibs, key=lambda s: (first[s.name], definition[s.name])), children)


def _assign_order_by_dataflow(nodes: list[Node], hashes: _Hashes) -> None:
    children, definition = _children_map(nodes)
    by_name = {n.name: n for n in nodes}
    assert hashes.inputs is not None and hashes.outputs is not None

    def chain(name: str) -> list[str]:
        out: list[str] = []
        cur: str | None = name
        while cur is not None and cur in by_name and len(out) <= len(by_name):
            out.append(cur)
            cur = by_name[cur].parent
        return out[::-1]  # root first

    producers: dict[bytes, list[str]] = defaultdict(list)
    for mod, keys in hashes.outputs.items():
        passthrough = set(hashes.inputs.get(mod, []))
        for k in set(keys) - passthrough:
            producers[k].append(mod)
    edges: dict[str, set[str]] = defaultdict(set)  # sibling -> siblings that must start after it
    chains: dict[str, list[str]] = {}
    for consumer, keys in hashes.inputs.items():
        if consumer not in by_name:
            continue
        c_chain = chains.setdefault(consumer, chain(consumer))
        for k in set(keys):
            prods = producers.get(k, [])
            if len(prods) > _MAX_PRODUCERS:
                continue
            for p in prods:
                if p == consumer or p not in by_name:
                    continue
                p_chain = chains.setdefault(p, chain(p))
                i = 0
                while i < len(p_chain) and i < len(c_chain) and p_chain[i] == c_chain[i]:
                    i += 1
                if i >= len(p_chain) or i >= len(c_chain):
                    continue  # one contains the other: no constraint between siblings
                edges[p_chain[i]].add(c_chain[i])  # siblings (or two roots)

    # a module whose inputs were neither produced by a dumped module nor handed down by an ancestor
    # consumes something its parent computed itself (`down_proj(act(gate(x)) * up(x))`): among the
    # siblings that are ready, it goes after those whose inputs are accounted for
    all_outputs = {k for keys in hashes.outputs.values() for k in keys}
    fresh: dict[str, int] = {}
    for mod, keys in hashes.inputs.items():
        if mod not in by_name or not keys:
            continue
        known = set(all_outputs)
        for anc in chains.setdefault(mod, chain(mod))[:-1]:
            known.update(hashes.inputs.get(anc, ()))
        fresh[mod] = 0 if any(k in known for k in keys) else 1

    def prio(name: str) -> tuple[int, int]:
        return fresh.get(name, 0), definition[name]

    def order_children(sibs: list[Node]) -> list[Node]:
        names = {s.name for s in sibs}
        indeg = {s.name: 0 for s in sibs}
        for s in sibs:
            for t in edges.get(s.name, ()):
                if t in names:
                    indeg[t] += 1
        ready = [(prio(s), s) for s, d in indeg.items() if d == 0]
        heapq.heapify(ready)
        remaining = {s.name: s for s in sibs}
        out: list[Node] = []
        while remaining:
            if not ready:  # a cycle (identity ops, coincidences): take the earliest-defined node
                name = min(remaining, key=prio)
            else:
                _, name = heapq.heappop(ready)
                if name not in remaining:
                    continue
            out.append(remaining.pop(name))
            for t in edges.get(name, ()):
                if t in remaining:
                    indeg[t] -= 1
                    if indeg[t] == 0:
                        heapq.heappush(ready, (prio(t), t))
        return out

    _dfs_assign(nodes, order_children, children)
