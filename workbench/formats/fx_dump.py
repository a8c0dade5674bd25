"""FX dumps (TorchAir's golden side): one `.npy` per input and output of each aten node of a compiled graph.

File names: `{node}-{aten target}.{INPUT|OUTPUT}.{index}.{timestamp}.npy`, e.g.
`mm-aten.mm.default.INPUT.0.20240125031118787351.npy`; the node of the dump is `{node}-{aten target}`
(what a GE graph's `_fx_tensor_name` names). The three folder layouts and their token rules are in
`workbench.formats.torchair`. A node's order is the timestamp of its first file (written as it ran).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from workbench.core.files import MANIFEST_NAME
from workbench.formats import torchair
from workbench.formats.layers import layer_from_name
from workbench.formats.model import (
    FX_KIND,
    GRAPH_ROOT,
    Dump,
    DumpError,
    Node,
    TensorEntry,
    TensorRole,
    token_number,
)
from workbench.formats.scan import npy_header

# our FX dumper's side file: node -> the module it ran in (msit's layout has no such file; read when present)
FX_MODULES_FILE = "fx_node_modules.json"
_FILE_RE = re.compile(r"^(?P<node>.+)\.(?P<role>INPUT|OUTPUT)\.(?P<idx>[0-9]{1,6})\.(?P<ts>[0-9]{1,30})\.npy$")


@dataclass(frozen=True, slots=True)
class FxFileName:
    node: str
    role: TensorRole  # "in" / "out"
    index: int
    timestamp: int


def parse_file_name(name: str) -> FxFileName | None:
    """The parts of an FX dump file name; None when it is not one."""
    m = _FILE_RE.match(name)
    if m is None:
        return None
    return FxFileName(m["node"], "in" if m["role"] == "INPUT" else "out", int(m["idx"]), int(m["ts"]))


def file_name(node: str, role: str, index: int, timestamp: int) -> str:
    """The FX dump file name of one tensor (`role` "in" / "out")."""
    return f"{node}.{'INPUT' if role == 'in' else 'OUTPUT'}.{index}.{timestamp}.npy"


def node_type(node: str) -> str:
    """`mm-aten.mm.default` -> `aten.mm.default` (the aten target)."""
    return node.split("-", 1)[1] if "-" in node else node


def is_fx_dir(p: Path) -> bool:
    """Whether `p` holds an FX dump at any level users pass (`msit_fx_dump`, a rank folder, `data_dump`, ...)."""
    return bool(token_dirs(p)[0])


def token_dirs(p: Path) -> tuple[list[tuple[int, list[Path]]], bool]:
    """Per token: the folders holding its `.npy` files (one per graph), and whether the token rule is the
    rank-folder one (folder name = token) rather than the old one (folder name = token + 1)."""
    ranked = any(torchair.rank_of(a.name) is not None for a in [p, *list(p.parents)[:3]])
    for cur, dirs, _files in torchair.walk_dirs(p, depth=4):
        digits = [d for d in dirs if token_number(d) is not None]
        if not digits or len(digits) != len(dirs):
            continue
        found: list[tuple[int, list[Path]]] = []
        for d in sorted(digits, key=int):
            folder = cur / d
            graphs = _npy_folders(folder)
            if not graphs:
                continue
            n = int(d)
            found.append((n if ranked else n - 1, graphs))
        if found:
            return found, ranked
    return [], ranked


def _npy_folders(token_dir: Path) -> list[Path]:
    """The token folder itself when it holds `.npy` files, else its `gm_*_dump` (or other) sub-folders that do."""
    _cur, dirs, files = next(iter(torchair.walk_dirs(token_dir, depth=0)))
    if any(f.endswith(".npy") for f in files):
        return [token_dir]
    return [token_dir / d for d in dirs if any(f.endswith(".npy") for f in torchair.walk_dirs(token_dir / d, 0)[0][2])]


def read_fx(p: Path, root: Path | None = None) -> Dump:
    """Read an FX dump folder into a `Dump` (kind `torchair_fx`); bad files are problems, one line each."""
    tokens, ranked = token_dirs(p)
    if not tokens:
        raise DumpError(p, "not an FX dump: no token folders holding {node}.{INPUT|OUTPUT}.{i}.{ts}.npy files")
    problems: list[str] = []
    tensors: list[TensorEntry] = []
    first_seen: dict[str, tuple[int, int]] = {}
    several = max(len(g) for _t, g in tokens) > 1
    for token, graphs in tokens:
        if token < 0:
            problems.append(f"{graphs[0].parent}: token folder 0 in a layout whose tokens start at 1: not read")
            continue
        for gi, folder in enumerate(graphs):
            prefix = f"graph{gi}/" if several else ""
            _cur, _dirs, files = torchair.walk_dirs(folder, depth=0)[0]
            for name in files:
                if not name.endswith(".npy"):
                    continue
                path = str(folder / name)
                parsed = parse_file_name(name)
                if parsed is None:
                    problems.append(f"{path}: not an FX dump file name ({{node}}.{{INPUT|OUTPUT}}.{{i}}.{{ts}}.npy)")
                    continue
                node = prefix + parsed.node
                key = (token, parsed.timestamp)
                if node not in first_seen or key < first_seen[node]:
                    first_seen[node] = key
                try:
                    dtype, shape = npy_header(path)
                except DumpError as exc:
                    problems.append(str(exc))
                    tensors.append(TensorEntry(token, node, parsed.role, parsed.index, path, error=exc.reason))
                    continue
                tensors.append(TensorEntry(token, node, parsed.role, parsed.index, path, dtype, shape))
    modules = {str(k): str(v) for k, v in torchair.side_json(p, FX_MODULES_FILE).items()}
    ordered = sorted(first_seen, key=lambda n: (first_seen[n], n))
    nodes = [Node(GRAPH_ROOT, "GraphModule", exec_order=-1)]
    scopes: dict[str, Node] = {}
    for i, name in enumerate(ordered):
        bare = name.split("/", 1)[1] if several else name
        module = modules.get(bare)
        parent = _scope(module, scopes, nodes) if module else nodes[0]
        nodes.append(
            Node(
                name,
                node_type(bare),
                parent=parent.name,
                depth=parent.depth + 1,
                exec_order=i,
                layer=layer_from_name(module) if module else None,
                params={"module": module} if module else None,
            )
        )
    meta = torchair.side_json(p, MANIFEST_NAME)  # our dumper's record: the ids fed at each token, graph outputs
    outputs = meta.get("graph_outputs")
    if not several and isinstance(outputs, list):
        tensors += torchair.root_outputs(tensors, [str(o) for o in outputs])
    meta["layout"] = "rank folders" if ranked else "data_dump (token folder = token + 1)"
    return Dump(FX_KIND, root or p, nodes, tensors, "recorded", meta=meta, problems=problems)


def _scope(module: str, scopes: dict[str, Node], nodes: list[Node]) -> Node:
    """The node of a module (created with its parents on first use, below the graph root): ops are shown, and
    grouped in the heatmap, under the module they ran in."""
    if module in scopes:
        return scopes[module]
    head, _, _tail = module.rpartition(".")
    parent = _scope(head, scopes, nodes) if head else nodes[0]
    node = Node(module, "module", parent=parent.name, depth=parent.depth + 1, layer=layer_from_name(module))
    scopes[module] = node
    nodes.append(node)
    return node
