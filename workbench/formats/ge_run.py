"""A TorchAir GE dump folder (graph text files + GE dump files) read into a `Dump` (kind `torchair_ge`).

Token folders are the leaf folders of the dump tree; their parent (the model id folder) is one graph's
run. Each run is paired with the graph file whose op names its files name (the graph's own identity),
not by position as msit does; a run no graph names is read without one (order by timestamp). One node
per GE op name (a fused `AutomaticBufferFusionOp` is one node whose `params["fused"]` lists the graph ops
it folds, found by msit's longest-prefix split of its name); `params["fx"]` holds the FX nodes the
graph's `_fx_tensor_name` attributes name; a `Cast`/`TransData` op no FX node names gets `params["fx_input"]`,
the FX node whose output feeds it. A duplicate op name in one token keeps the larger file (msit).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from workbench.core.files import MANIFEST_NAME
from workbench.formats import ge_dump, torchair
from workbench.formats.ge_graph import GeGraph, GeOp, read_graph
from workbench.formats.model import GE_KIND, GRAPH_ROOT, Dump, DumpError, Node, TensorEntry, token_number

NET_OUTPUT = "NetOutput"  # the GE op whose inputs are the graph's outputs
_SKIP_SUFFIXES = (".txt", ".npy", ".bin", ".json")
_SELF_COMPARED = ("Cast", "TransData")  # msit compares these, when no FX node is named, input against output


@dataclass(slots=True)
class _Run:
    folder: Path  # the model id folder
    files: dict[int, dict[str, Path]]  # token -> op name -> file


def split_fused(name: str, known: set[str]) -> list[str]:
    """The graph ops a fused op's name concatenates (longest known prefix first, as msit splits it);
    [] when the name does not split into known ops."""
    out: list[str] = []
    rest = name
    while rest:
        hit = next((rest[:n] for n in range(len(rest), 0, -1) if rest[:n] in known), None)
        if hit is None:
            return []
        out.append(hit)
        rest = rest[len(hit) :]
    return out


def is_ge_dir(p: Path) -> bool:
    """Whether `p` is a GE dump root: graph text files in it (or in the folder above a rank folder)."""
    if torchair.graph_files(p):
        return True
    return torchair.rank_of(p.name) is not None and bool(torchair.graph_files(p.parent))


def read_ge(p: Path, root: Path | None = None) -> Dump:
    """Read a GE dump folder (`msit_ge_dump`, or one of its `worldsize{N}_global_rank{R}` folders)."""
    rank = torchair.rank_of(p.name)
    graph_dir = p.parent if rank is not None else p
    problems: list[str] = []
    graphs: list[GeGraph] = []
    for f in torchair.graph_files(graph_dir, rank):
        try:
            graphs.append(read_graph(f))
        except DumpError as exc:
            problems.append(str(exc))
    dump_root = p
    if rank is None and torchair.rank_dirs(p):
        dump_root = torchair.rank_dirs(p)[0]
    runs = _runs(dump_root, problems)
    if not runs:
        raise DumpError(p, "no GE dump files ({OpType}.{OpName}.{task}.{stream}.{timestamp}) below it")
    nodes: list[Node] = [Node(GRAPH_ROOT, "GeGraph", exec_order=-1)]
    tensors: list[TensorEntry] = []
    pairing: list[str] = []
    several = len(runs) > 1
    common = Path(os.path.commonpath([r.folder for r in runs])) if several else dump_root
    for run in runs:
        graph = _graph_for(run, graphs)
        prefix = f"{run.folder.relative_to(common)}/" if several else ""  # e.g. the model id folder: `2/`
        pairing.append(f"{run.folder}: {graph.path if graph else 'no graph names its ops'}")
        _read_run(run, graph, prefix, len(nodes), nodes, tensors, problems)
        if graph is not None and not several:  # the graph's NetOutput names the model's outputs
            producers = [i for o in graph.ops if o.type == NET_OUTPUT for i in o.inputs]
            tensors += torchair.root_outputs(tensors, producers)
    meta: dict[str, object] = torchair.side_json(p, MANIFEST_NAME)  # our writer's record of the ids fed
    meta.update({"graphs": [g.path for g in graphs], "pairing": pairing})
    if rank is not None:
        meta["rank"] = rank
    return Dump(GE_KIND, root or p, nodes, tensors, "topology" if graphs else "recorded", meta=meta, problems=problems)


def _runs(dump_root: Path, problems: list[str]) -> list[_Run]:
    by_parent: dict[Path, dict[int, dict[str, Path]]] = {}
    for cur, dirs, files in torchair.walk_dirs(dump_root):
        if dirs or (cur == dump_root and not files):
            continue
        ge_files = [f for f in files if not f.endswith(_SKIP_SUFFIXES)]
        if not ge_files:
            continue
        tok = token_number(cur.name)
        if tok is None:
            problems.append(f"{cur}: GE dump files in a folder whose name is not a token number: not read")
            continue
        per_op = by_parent.setdefault(cur.parent, {}).setdefault(tok, {})
        for name in ge_files:
            path = cur / name
            parsed = ge_dump.parse_file_name(name)
            if parsed is None:
                problems.append(f"{path}: not a GE dump file name ({{OpType}}.{{OpName}}.{{task}}.{{stream}}.{{ts}})")
                continue
            old = per_op.get(parsed.op_name)
            if old is not None:
                keep = path if _size(path) > _size(old) else old
                problems.append(f"{path}: op {parsed.op_name} dumped twice at token {tok}: kept {keep.name}")
                path = keep
            per_op[parsed.op_name] = path
    return [_Run(folder, files) for folder, files in sorted(by_parent.items())]


def _size(p: Path) -> int:
    try:
        return os.path.getsize(p)
    except OSError:
        return -1


def _graph_for(run: _Run, graphs: list[GeGraph]) -> GeGraph | None:
    """The graph that names most of the run's ops (ties: the first by msit's order)."""
    names = {op for per_op in run.files.values() for op in per_op}
    best, score = None, 0
    for g in graphs:
        known = set(g.by_name())
        hits = sum(1 for n in names if n in known or split_fused(n, known))
        if hits > score:
            best, score = g, hits
    return best


def _read_run(
    run: _Run,
    graph: GeGraph | None,
    prefix: str,
    start: int,
    nodes: list[Node],
    tensors: list[TensorEntry],
    problems: list[str],
) -> None:
    ops = graph.by_name() if graph else {}
    known = set(ops)
    info: dict[str, tuple[str, tuple[int, int], dict[str, object]]] = {}  # name -> type, order key, params
    for token, per_op in sorted(run.files.items()):
        for op_name, path in sorted(per_op.items()):
            parsed = ge_dump.parse_file_name(path.name)
            assert parsed is not None
            if op_name not in info:
                info[op_name] = _describe(op_name, parsed, ops, known)
            node = prefix + op_name
            try:
                header = ge_dump.read_header(path)
            except DumpError as exc:
                problems.append(str(exc))
                tensors.append(
                    TensorEntry(token, node, "out", 0, ge_dump.tensor_path(path, "out", 0), error=exc.reason)
                )
                continue
            bad = [t.error for t in header.tensors if t.error]
            if bad:
                problems.append(f"{path}: {'; '.join(bad)}")
            for t in header.tensors:
                tensors.append(
                    TensorEntry(
                        token,
                        node,
                        t.role,
                        t.index,
                        ge_dump.tensor_path(path, t.role, t.index),
                        t.dtype,
                        t.shape,
                        t.layout,
                        error=t.error,
                    )
                )
    for i, name in enumerate(sorted(info, key=lambda n: (info[n][1], n))):
        op_type, _key, params = info[name]
        nodes.append(Node(prefix + name, op_type, GRAPH_ROOT, 1, exec_order=start + i, params=params or None))


def _describe(
    op_name: str, parsed: ge_dump.GeFileName, ops: dict[str, GeOp], known: set[str]
) -> tuple[str, tuple[int, int], dict[str, object]]:
    """(type, order key, params) of one dumped op: graph position first, then timestamp for ops no graph has."""
    op = ops.get(op_name)
    if op is not None and op.fx_nodes:
        return parsed.op_type, (op.position, 0), {"fx": list(op.fx_nodes)}
    if op is not None:  # a Cast/TransData GE inserted: compared against the FX output feeding it
        feeding = [n for i in op.inputs[:1] if i in ops for n in ops[i].fx_nodes[:1]]
        unlinked = any(k in parsed.op_type for k in _SELF_COMPARED)
        return parsed.op_type, (op.position, 0), {"fx_input": feeding} if unlinked and feeding else {}
    parts = split_fused(op_name, known) if parsed.op_type == ge_dump.FUSION_OP_TYPE else []
    if parts:
        first, last = ops[parts[0]], ops[parts[-1]]
        params: dict[str, object] = {"fused": parts, "fx_first": list(first.fx_nodes), "fx_last": list(last.fx_nodes)}
        return parsed.op_type, (first.position, 0), params
    return parsed.op_type, (1 << 40, parsed.timestamp), {}
