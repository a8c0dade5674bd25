"""Reader for ATB dumps: `tensors/{dev}_{pid}/{count}/{n}_{Name}/.../{before|after}/{in|out}tensor{k}.bin`.

Nodes are the op folders (name = folder path below the count folder, e.g. `2_Prefill_layer/3_RmsNormOperation`),
typed, parametrised and wired (`in_names`/`out_names`) from the topology JSONs `model/{pid}/*.json`
(or `layer/{pid}/{OpName}.json` for a graph op the model files do not describe).
Inputs are `before/intensor{k}` (else `after/intensor{k}`), outputs `after/outtensor{k}`.

Graphs: with two model files the prefill one is named `*prefill*`/`*encoder*` and the decode one
`*decode*`/`*decoder*`; otherwise the one whose top-level ops start at the lower folder index is
prefill. A top-level op folder belongs to the graph whose index range holds its index (msit's
rule: a graph's first index is the integer suffix of its first opName, +1 when
`layer/{pid}/TransdataOperation_0.json` exists); without two graphs a folder named `*prefill*` or
`*decode*` says so itself.

Tokens: count folders are the model's execute counts. msit
assumes a warmup whenever there are two graphs; we only call the first folder a warmup when it
holds prefill ops and so does the next folder (two prefills in a row), and leave it out
(`meta["atb_warmup_folder"]`). Token = folder number minus one when a warmup was dropped; a folder
holding both prefill and decode ops is two executions: its prefill ops get token t, its decode
ops t+1, and later folders shift by one (the same numbering as msit for its usual layout).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.core.text import has_foreign_digit
from workbench.formats import atb_bin
from workbench.formats.layers import is_layer_folder
from workbench.formats.model import (
    Dump,
    DumpError,
    Node,
    TensorEntry,
    TensorRole,
    checked_stats,
    token_folder_problem,
    token_number,
)
from workbench.formats.scan import check_link, link_problem, list_dir, read_json

_OP_RE = re.compile(r"^([0-9]{1,9})_(.+)$", re.DOTALL)
_TOKEN_RE = re.compile(r"[0-9]{1,9}")
_TENSOR_RE = re.compile(r"(intensor|outtensor)([0-9]{1,6})\.bin")
MAX_OP_DEPTH = 64  # op folders nest a few levels; deeper is a crafted dump
TOO_DEEP = f"op folders nested deeper than {MAX_OP_DEPTH}: the deeper ones are not read"
_PREFILL_WORDS = ("prefill", "encoder", "encode", "context", "full")
_DECODE_WORDS = ("decoder", "decode", "incre")


def is_atb_device_dir(path: Path) -> bool:
    """A `tensors/{dev}_{pid}` folder."""
    return path.parent.name == "tensors" and re.fullmatch(r"[0-9]+_[0-9]+", path.name) is not None


def token_folders(path: Path, depth: int = 4) -> list[Path]:
    """The token folders (`tensors/{dev}_{pid}/{token}`) at or below `path` (a dump root or any level down to
    a token folder), in device then token order; [] when there are none within `depth` levels."""
    if is_atb_device_dir(path):
        try:
            kids = [c for c in path.iterdir() if c.is_dir() and token_number(c.name) is not None]
        except OSError:
            return []
        return sorted(kids, key=lambda c: int(c.name))
    if token_number(path.name) is not None and is_atb_device_dir(path.parent):
        return [path]
    if depth <= 0 or not path.is_dir():
        return []
    try:
        kids = sorted(c for c in path.iterdir() if c.is_dir())
    except OSError:
        return []
    out: list[Path] = []
    for c in kids:
        out += token_folders(c, depth - 1)
    return out


# ------------------------------------------------------------------ the folder layout, for readers of single ops
OP_PARAM_FILE = "op_param.json"  # an op folder's params


def parse_op_folder(name: str) -> tuple[int, str] | None:
    """(index, op name) of an op folder name `{index}_{OpName}` (e.g. `3_RmsNormOperation`), else None."""
    m = _OP_RE.match(name)
    return (int(m.group(1)), m.group(2)) if m else None


def is_token_folder(name: str) -> bool:
    """Whether a folder name is an execute-count folder (`{count}`, below `tensors/{dev}_{pid}`)."""
    return _TOKEN_RE.fullmatch(name) is not None


def op_folder_of(tensor_path: str | Path) -> Path:
    """The op folder of a tensor file `.../{n}_{OpName}/{before|after}/{in|out}tensor{k}.bin`."""
    return Path(tensor_path).parent.parent


def token_folder_of(op_dir: Path) -> Path | None:
    """The execute-count folder an op folder lies in (through any group folders), or None."""
    for parent in op_dir.parents:
        if is_token_folder(parent.name):
            return parent
        if parse_op_folder(parent.name) is None:
            return None
    return None


def leaf_op_folders(folder: Path, too_deep: list[Path] | None = None, _depth: int = 0) -> list[Path]:
    """Leaf op folders below `folder` (itself when it is a leaf op), depth first in execution order. A folder
    whose op folders nest deeper than `MAX_OP_DEPTH` (a crafted dump) is not read further: it goes to
    `too_deep` (its problem: `TOO_DEEP`) and the others are still listed."""
    try:
        entries = [e for e in os.scandir(folder) if e.is_dir(follow_symlinks=False) and _OP_RE.match(e.name)]
    except OSError:
        return []
    if not entries:
        return [folder] if _OP_RE.match(folder.name) else []
    if _depth >= MAX_OP_DEPTH:
        if too_deep is not None:
            too_deep.append(folder)
        return []
    out: list[Path] = []
    for e in sorted(entries, key=lambda e: int(e.name.split("_", 1)[0])):
        out += leaf_op_folders(Path(e.path), too_deep, _depth + 1)
    return out


def numbered_tensor_files(folder: Path, prefix: str) -> list[Path]:
    """`{prefix}{k}.bin` files of a `before`/`after` folder, by index; a gap in the indices is a `DumpError`."""
    if not folder.is_dir():
        return []
    found: dict[int, Path] = {}
    for entry in os.scandir(folder):
        m = _TENSOR_RE.fullmatch(entry.name)
        if m and m.group(1) == prefix:
            found[int(m.group(2))] = Path(entry.path)
    if found and sorted(found) != list(range(len(found))):
        missing = next(i for i in range(len(found) + 1) if i not in found)
        raise DumpError(folder / f"{prefix}{missing}.bin", "missing file (the indices have a gap)")
    return [found[i] for i in sorted(found)]


@dataclass(frozen=True, slots=True)
class OpTensorFiles:
    """The dumped tensors of one op folder: inputs (from `before/`, else `after/`) and outputs (`after/`)."""

    inputs: list[Path]
    outputs: list[Path]
    inputs_before: bool  # the inputs were dumped before the op ran (an in-place op has not changed them)


def op_tensor_files(op_dir: Path) -> OpTensorFiles:
    """The input and output files of one op folder (see `OpTensorFiles`); a gap in an index is a `DumpError`."""
    inputs = numbered_tensor_files(op_dir / "before", "intensor")
    before = bool(inputs)
    inputs = inputs or numbered_tensor_files(op_dir / "after", "intensor")
    return OpTensorFiles(inputs, numbered_tensor_files(op_dir / "after", "outtensor"), before)


@dataclass(slots=True)
class _TopoOp:
    op: dict[str, Any]
    graph: str | None  # "prefill" / "decode" / None


@dataclass(slots=True)
class _Graphs:
    top: dict[int, _TopoOp] = field(default_factory=dict)  # top-level folder index -> op
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)
    model_name: str | None = None
    layer_ops: dict[str, dict[str, Any]] = field(default_factory=dict)  # opName -> layer JSON


def _suffix_int(name: Any) -> int | None:
    m = re.search(r"_([0-9]{1,9})$", str(name))
    return int(m.group(1)) if m else None


def _classify(name: str) -> str | None:
    low = name.lower()
    if any(w in low for w in _DECODE_WORDS):
        return "decode"
    if any(w in low for w in _PREFILL_WORDS):
        return "prefill"
    return None


def _load_topology(dump_root: Path, pid: str, problems: list[str]) -> _Graphs:
    g = _Graphs()
    layer_dir = dump_root / "layer" / pid
    model_dir = dump_root / "model" / pid
    if not layer_dir.is_dir() and not model_dir.is_dir():
        problems.append(
            f"{dump_root}: no model/{pid} or layer/{pid} topology folder: op types, graphs (prefill/decode) "
            "and tokens are guessed from folder names"
        )
        return g
    if layer_dir.is_dir():
        try:
            for e in list_dir(layer_dir):
                if e.name.endswith(".json") and not e.is_dir:
                    try:
                        data = read_json(e.path)
                    except DumpError as exc:
                        problems.append(str(exc))
                        continue
                    if isinstance(data, dict):
                        g.layer_ops[str(data.get("opName", e.name[:-5]))] = data
        except DumpError as exc:
            problems.append(str(exc))
    if not model_dir.is_dir():
        return g
    models: list[tuple[str, dict[str, Any], int]] = []
    try:
        entries = list_dir(model_dir)
    except DumpError as exc:
        problems.append(str(exc))
        return g
    transdata = (layer_dir / "TransdataOperation_0.json").is_file()
    for e in entries:
        if e.is_dir or not e.name.endswith(".json"):
            continue
        try:
            data = read_json(e.path)
        except DumpError as exc:
            problems.append(str(exc))
            continue
        nodes = data.get("nodes") if isinstance(data, dict) else None
        if not isinstance(nodes, list) or not nodes or not isinstance(nodes[0], dict):
            problems.append(f"{e.path}: model topology without a 'nodes' list: ignored")
            continue
        start = (_suffix_int(nodes[0].get("opName")) or 0) + (1 if transdata else 0)
        models.append((e.path, data, start))
        if g.model_name is None and data.get("modelName"):
            g.model_name = str(data["modelName"])
    if not models:
        return g
    # name which graph is which
    roles: dict[int, str] = {}
    if len(models) >= 2:
        named = [_classify(Path(p).stem) for p, _d, _s in models]
        if named.count("prefill") == 1 and named.count("decode") == 1:
            roles = {i: r for i, r in enumerate(named) if r is not None}
        else:
            by_start = sorted(range(len(models)), key=lambda i: (models[i][2], models[i][0]))
            roles = {by_start[0]: "prefill", by_start[1]: "decode"}
            if len(models) > 2:
                problems.append(
                    f"{model_dir}: {len(models)} model topologies; using "
                    f"{Path(models[by_start[0]][0]).name} (prefill) and "
                    f"{Path(models[by_start[1]][0]).name} (decode)"
                )
    for i, (path, data, start) in enumerate(models):
        role = roles.get(i) if len(models) >= 2 else None
        if len(models) >= 2 and role is None:
            continue
        nodes = [n for n in data["nodes"] if isinstance(n, dict)]
        if role is not None:
            g.files[role] = Path(path).name
            g.ranges[role] = (start, start + len(nodes))
        for j, op in enumerate(nodes):
            g.top.setdefault(start + j, _TopoOp(op, role))
    if len(g.ranges) == 2:
        (a0, a1), (b0, b1) = g.ranges["prefill"], g.ranges["decode"]
        if a0 < b1 and b0 < a1:  # overlapping ranges: indices cannot tell the graphs apart
            problems.append(
                f"{model_dir}: prefill and decode graphs use overlapping op indices; phases taken from folder names"
            )
            g.ranges = {}
            for t in g.top.values():
                t.graph = None
    return g


@dataclass(slots=True)
class _OpInfo:
    node: Node
    index_path: tuple[int, ...]
    topo: dict[str, Any] | None
    param_read: bool = False


def read_atb(
    dump_root: Path,
    dev_dir: Path,
    *,
    count_folder: str | None = None,
    op_rel: str | None = None,
    root: Path | None = None,
) -> Dump:
    """Read `tensors/{dev}_{pid}` of an ATB dump whose `msit_dump_*` folder is `dump_root`.

    `count_folder` restricts to one execute-count folder, `op_rel` (a path below it) to one op subtree.
    """
    problems: list[str] = []
    pid = dev_dir.name.rsplit("_", 1)[-1]
    graphs = _load_topology(dump_root, pid, problems)
    meta: dict[str, Any] = {"device_folder": dev_dir.name}
    if graphs.files:
        meta["atb_graphs"] = dict(graphs.files)
    _read_wb_manifest(dump_root, meta, problems)

    try:
        entries = list_dir(dev_dir)
    except DumpError as exc:
        problems.append(str(exc))
        entries = []
    counts: list[tuple[int, str]] = []
    for e in entries:
        num = token_number(e.name) if e.is_dir else None
        if num is not None:
            counts.append((num, e.path))
            continue
        bad = token_folder_problem(e.path, e.name) if e.is_dir else link_problem(e)
        if bad is not None:
            problems.append(bad)
    counts.sort()

    ops: dict[str, _OpInfo] = {}
    # per count folder: (op folder rel name, folder path) pairs, pre-order
    per_count: list[tuple[int, list[tuple[str, str]]]] = []
    for num, path in counts:
        folders: list[tuple[str, str]] = []
        _walk_ops(path, "", (), None, graphs, ops, folders, problems)
        per_count.append((num, folders))

    tokens_of = _assign_tokens(per_count, ops, graphs, meta)
    if count_folder is not None:
        per_count = [pc for pc in per_count if str(pc[0]) == count_folder]
    tensors: list[TensorEntry] = []
    for num, folders in per_count:
        for rel, fpath in folders:
            if op_rel is not None and not (rel == op_rel or rel.startswith(op_rel + "/")):
                continue
            info = ops[rel]
            token = tokens_of.get((num, info.node.phase))
            if token is None:
                continue  # warmup
            if not info.param_read:
                info.param_read = True
                info.node.params = _read_params(Path(fpath), info.topo, problems)
            _scan_op_tensors(token, rel, Path(fpath), tensors, problems)

    nodes = [o.node for o in sorted(ops.values(), key=lambda o: o.index_path)]
    for i, n in enumerate(nodes):
        n.exec_order = i
    _assign_layers(nodes, ops)
    return Dump(
        kind="atb",
        root=(root or dev_dir).resolve(),
        nodes=nodes,
        tensors=tensors,
        order_source="topology",
        model_name=graphs.model_name,
        meta=meta,
        problems=problems,
    )


_WB_MANIFEST_KEYS = ("input_ids", "generated", "follow_tokens", "dtype", "defect_description", "command")


def _read_wb_manifest(dump_root: Path, meta: dict[str, Any], problems: list[str]) -> None:
    """The token facts our ATB stack records in `wb_manifest.json` (prompt and generated ids), into `meta`."""
    path = dump_root / "wb_manifest.json"
    if not path.is_file():
        return
    try:
        data = read_json(path)
    except DumpError as exc:
        problems.append(str(exc))
        return
    if isinstance(data, dict):
        meta["wb_manifest"] = {k: data[k] for k in _WB_MANIFEST_KEYS if k in data}


def _walk_ops(
    folder: str,
    prefix: str,
    index_path: tuple[int, ...],
    topo_children: list[Any] | None,
    graphs: _Graphs,
    ops: dict[str, _OpInfo],
    out: list[tuple[str, str]],
    problems: list[str],
    phase: str | None = None,
) -> None:
    try:
        entries = list_dir(folder)
    except DumpError as exc:
        problems.append(str(exc))
        return
    if len(index_path) >= MAX_OP_DEPTH:
        if any(e.is_dir and _OP_RE.match(e.name) for e in entries):
            problems.append(f"{folder}: {TOO_DEEP}")
        return
    op_dirs = []
    for e in entries:
        m = _OP_RE.match(e.name)
        if e.is_dir and m:
            op_dirs.append((int(m.group(1)), m.group(2), e))
        elif m:
            bad = link_problem(e)
            if bad is not None:
                problems.append(bad)
        elif e.is_dir and has_foreign_digit(e.name.split("_", 1)[0]):
            problems.append(f"{e.path}: folder name holds a digit that is not ASCII: not read as an op")
    op_dirs.sort(key=lambda x: x[0])
    for idx, suffix, e in op_dirs:
        rel = f"{prefix}/{e.name}" if prefix else e.name
        ipath = (*index_path, idx)
        if rel not in ops:
            topo: dict[str, Any] | None = None
            node_phase = phase
            if not index_path:
                t = graphs.top.get(idx)
                if t is not None:
                    topo = t.op
                    node_phase = t.graph
                if node_phase is None:
                    node_phase = _classify(suffix)
                if topo is None or not topo.get("nodes"):
                    # a graph op the model file does not expand: its own layer JSON may
                    layer_json = graphs.layer_ops.get(f"{suffix}_{idx}")
                    if layer_json is not None:
                        topo = {**layer_json, **(topo or {})} if topo else layer_json
                        if not topo.get("nodes"):
                            topo["nodes"] = layer_json.get("nodes", [])
            elif topo_children is not None and 0 <= idx < len(topo_children) and isinstance(topo_children[idx], dict):
                topo = topo_children[idx]
            op_type = str(topo.get("opType")) if topo and topo.get("opType") else suffix
            node = Node(
                name=rel,
                type=op_type,
                parent=prefix or None,
                depth=len(index_path),
                phase=node_phase,
                in_names=_names(topo, "inTensors"),
                out_names=_names(topo, "outTensors"),
            )
            ops[rel] = _OpInfo(node, ipath, topo)
        info = ops[rel]
        out.append((rel, e.path))
        children = info.topo.get("nodes") if info.topo else None
        _walk_ops(
            e.path,
            rel,
            ipath,
            children if isinstance(children, list) else None,
            graphs,
            ops,
            out,
            problems,
            info.node.phase,
        )


def _names(topo: dict[str, Any] | None, key: str) -> list[str] | None:
    if not topo or not isinstance(topo.get(key), list):
        return None
    return [str(x) for x in topo[key]]


def _read_params(folder: Path, topo: dict[str, Any] | None, problems: list[str]) -> dict[str, Any] | None:
    p = folder / OP_PARAM_FILE
    value: Any = None
    if p.is_file():
        try:
            value = read_json(p)
        except DumpError as exc:
            problems.append(str(exc))
    if value is None and topo is not None:
        value = topo.get("param")
    if isinstance(value, dict):
        return value
    if value in (None, ""):
        return None
    return {"value": value}


def _assign_tokens(
    per_count: list[tuple[int, list[tuple[str, str]]]], ops: dict[str, _OpInfo], graphs: _Graphs, meta: dict[str, Any]
) -> dict[tuple[int, str | None], int]:
    """(count folder, phase) -> token; warmup folders get no entry. Rules in the module docstring."""
    phases: list[set[str | None]] = []
    for _num, folders in per_count:
        phases.append({ops[rel].node.phase for rel, _p in folders if "/" not in rel})
    warmup = len(per_count) >= 2 and per_count[0][0] == 0 and phases[0] == {"prefill"} and "prefill" in phases[1]
    result: dict[tuple[int, str | None], int] = {}
    offset = 0
    for i, (num, _folders) in enumerate(per_count):
        if i == 0 and warmup:
            meta["atb_warmup_folder"] = str(num)
            offset = -1
            continue
        base = num + offset
        ph = phases[i]
        if "prefill" in ph and "decode" in ph:
            result[(num, "prefill")] = base
            result[(num, None)] = base
            result[(num, "decode")] = base + 1
            offset += 1
        else:
            for p in ("prefill", "decode", None):
                result[(num, p)] = base
    return result


def _scan_op_tensors(token: int, node: str, folder: Path, out: list[TensorEntry], problems: list[str]) -> None:
    found: dict[tuple[str, str], dict[int, str]] = {}
    for when in ("before", "after"):
        sub = folder / when
        if not sub.is_dir():
            continue
        try:
            files = list_dir(sub)
        except DumpError as exc:
            problems.append(str(exc))
            continue
        for f in files:
            m = _TENSOR_RE.fullmatch(f.name)
            if m and f.is_link:
                try:
                    check_link(f.path)
                except DumpError as exc:
                    problems.append(str(exc))
                    continue
            if m:  # a folder named like a tensor file fails to read below: a problem line, not a silent drop
                found.setdefault((when, m.group(1)), {})[int(m.group(2))] = f.path
            elif f.name.startswith(("intensor", "outtensor")) and has_foreign_digit(f.name):
                problems.append(f"{f.path}: file name holds a digit that is not ASCII: not read as a tensor")
    inputs = dict(found.get(("after", "intensor"), {}))
    inputs.update(found.get(("before", "intensor"), {}))
    outputs = found.get(("after", "outtensor"), {})
    by_role: tuple[tuple[TensorRole, dict[int, str]], ...] = (("in", inputs), ("out", outputs))
    for role, files_by_idx in by_role:
        for k in sorted(files_by_idx):
            path = files_by_idx[k]
            try:
                h = atb_bin.read_header(path)
            except DumpError as exc:
                problems.append(str(exc))
                out.append(TensorEntry(token, node, role, k, path, error=exc.reason))
                continue
            if h.stats is not None and h.payload_length == 0:
                entry = TensorEntry(
                    token, node, role, k, None, dtype=h.dtype, shape=h.shape, layout=h.layout, stats=h.stats
                )
                out.append(checked_stats(entry, path, problems, label=""))
            else:
                out.append(
                    TensorEntry(
                        token,
                        node,
                        role,
                        k,
                        path,
                        dtype=h.dtype,
                        shape=h.shape,
                        layout=h.layout,
                        error=None if h.has_data else "descriptor only (dumped with -sd): no tensor data",
                    )
                )


def _assign_layers(nodes: list[Node], ops: dict[str, _OpInfo]) -> None:
    """Layer = ordinal of a layer op among its graph's top-level layer ops; descendants inherit it."""
    top = [n for n in nodes if n.parent is None]
    has_child = {n.parent for n in nodes if n.parent is not None}
    graph_ops = {n.name for n in top if n.name in has_child or (ops[n.name].topo or {}).get("nodes")}
    counts = Counter((n.phase, n.type) for n in top if n.name in graph_ops)
    common = {pt for pt, c in counts.items() if c >= 2}
    per_phase: Counter[str | None] = Counter()
    layer_of: dict[str, int] = {}
    for n in top:
        suffix = n.name.split("_", 1)[-1]
        if (n.name in graph_ops and (n.phase, n.type) in common) or is_layer_folder(suffix) or is_layer_folder(n.type):
            layer_of[n.name] = per_phase[n.phase]
            per_phase[n.phase] += 1
    for n in nodes:
        head = n.name.split("/", 1)[0]
        n.layer = layer_of.get(head)
