"""Folder rules shared by the TorchAir readers (GE dumps, FX dumps): rank folders, token folders, graph files.

msit's layouts (`../shared/reference/msit_llm_spec.md` §1(d)):

- GE: `msit_ge_dump/dynamo_original_graph_*.txt` (the graphs) and
  `[worldsize{N}_global_rank{R}/]{time}/{device}/{model name}/{model id}/{token}/` holding
  `{OpType}.{OpName}.{task}.{stream}.{ts}` files;
- FX (PTA > 7.1): `msit_fx_dump/worldsize{N}_global_rank{R}/{model}/{token}/*.npy` (the folder name is the token);
- FX (PTA 7.1): `msit_fx_dump/data_dump/{token+1}/gm_{time}_dump/*.npy`; older: `data_dump/{token+1}/gm_*_dump/`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from workbench.formats.ge_graph import graph_rank, is_graph_file
from workbench.formats.model import GRAPH_ROOT, DumpError, TensorEntry
from workbench.formats.scan import DirEntry, list_dir, read_json

GE_DUMP_DIR = "msit_ge_dump"
FX_DUMP_DIR = "msit_fx_dump"
RANK_DIR_RE = re.compile(r"^worldsize([0-9]+)_global_rank([0-9]+)$")
MAX_DEPTH = 8


def rank_of(name: str) -> int | None:
    """The rank of a `worldsize{N}_global_rank{R}` folder; None for any other name."""
    m = RANK_DIR_RE.match(name)
    return int(m.group(2)) if m else None


def rank_dirs(p: Path) -> list[Path]:
    """The `worldsize{N}_global_rank{R}` folders directly below `p`, by rank."""
    found = [Path(e.path) for e in _entries(p) if e.is_dir and rank_of(e.name) is not None]
    return sorted(found, key=lambda d: rank_of(d.name) or 0)


def graph_files(p: Path, rank: int | None = None) -> list[Path]:
    """GE graph text files directly in `p`, for one rank when given, ordered by the first integer of the name
    (msit's order); files of other ranks are left out."""
    out = []
    for e in _entries(p):
        if e.is_dir or not is_graph_file(e.name):
            continue
        r = graph_rank(e.name)
        if rank is not None and r is not None and r != rank:
            continue
        out.append(Path(e.path))
    return sorted(out, key=lambda f: (_first_int(f.name), f.name))


def _first_int(name: str) -> int:
    m = re.search(r"[0-9]+", name)
    return int(m.group(0)) if m else 0


def _entries(p: Path) -> list[DirEntry]:
    try:
        return list_dir(p)
    except DumpError:
        return []


def side_json(p: Path, name: str) -> dict[str, Any]:
    """A JSON object file our dumpers write beside a dump (`name` in `p` or one of the two folders above it);
    {} when there is none or it is not an object."""
    for folder in [p, *list(p.parents)[:2]]:
        f = folder / name
        if f.is_file():
            try:
                data = read_json(f)
            except DumpError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def root_outputs(tensors: list[TensorEntry], producers: list[str]) -> list[TensorEntry]:
    """The graph's outputs as outputs of its root node (the model's output: where the logits analysis looks), one
    per producer op and token: the producer's first output file, shared."""
    first = {(t.node, t.token): t for t in tensors if t.role == "out" and t.index == 0}
    tokens = sorted({t.token for t in tensors})
    out = []
    for tok in tokens:
        for k, name in enumerate(producers):
            t = first.get((name, tok))
            if t is not None:
                out.append(dataclasses.replace(t, node=GRAPH_ROOT, index=k))
    return out


def walk_dirs(p: Path, depth: int = MAX_DEPTH) -> list[tuple[Path, list[str], list[str]]]:
    """(folder, sub-folder names, file names) below `p`, sorted, never following links, at most `depth` deep."""
    out: list[tuple[Path, list[str], list[str]]] = []
    stack: list[tuple[Path, int]] = [(p, 0)]
    while stack:
        cur, d = stack.pop()
        entries = _entries(cur)
        dirs = sorted(e.name for e in entries if e.is_dir)
        files = sorted(e.name for e in entries if not e.is_dir and not e.is_link)
        out.append((cur, dirs, files))
        if d < depth:
            stack.extend((cur / name, d + 1) for name in reversed(dirs))
    return sorted(out, key=lambda t: str(t[0]))
