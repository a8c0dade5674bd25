"""Reader for msprobe dumps: `step{N}/rank{R}/dump.json` + `construct.json` + `dump_tensor_data/*.pt|*.npy`.

Forward calls only (backward and parameter-gradient entries are counted in `meta["skipped_entries"]`).

Tokens. A module call's token is the call counter of its outermost module ancestor in `construct.json`
(the k-th forward of the model is token k); an API call takes the token of its enclosing module call,
or, with no module around it, of the nearest module call before it in `dump.json` (after it when
there is none before). When every step read holds a single forward (all counters 0, or no module
at all) the token is the step number instead, except that a step recording no module (`level: L1`) with
several word-embedding calls (`Functional.embedding`) splits at each: each forward of a language model starts
with one; several steps with several forwards each are numbered
in (step, counter) order. `meta["token_rule"]` says which rule applied.

Node names. A module call keeps its name without the call counter
(`Module.model.layers.0.mlp.LlamaMLP.forward`), so the same module in successive forwards is one node;
a module called j > 0 times before within the same token gets `#j` appended. An API call is named
`{Prefix}.{api}.{j}.{direction}` where j counts the calls of that API within the token (msprobe's own
name when a step holds one forward).

Tensor indices: input tensors are numbered in order over `input_args` then `input_kwargs` (nested
lists flattened, non-tensor values skipped), outputs likewise. A module call's `parameters` (its direct
weights) become `param` tensors numbered by parameter name, so they are compared like msprobe does.
"""

from __future__ import annotations

import bisect
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.formats.layers import inherit_layers, layer_from_name, layers_by_repetition
from workbench.formats.model import (
    Dump,
    DumpError,
    Node,
    Payload,
    TensorEntry,
    TensorRole,
    TensorStats,
    check_shape,
    checked_stats,
    param_index,
)
from workbench.formats.scan import check_link, list_dir, npy_header, pth_header, read_json
from workbench.formats.token_ids import is_embedding_node

_MODULE_RE = re.compile(r"^(Module|Cell)\.(.+)\.([^.]+)\.(forward|backward)\.([0-9]{1,9})$", re.DOTALL)
_API_RE = re.compile(r"^([A-Za-z]\w*)\.(.+)\.([0-9]{1,9})\.(forward|backward)$", re.DOTALL)
_STEP_RE = re.compile(r"step([0-9]{1,9})")
_RANK_RE = re.compile(r"rank[0-9]*|proc[0-9]+")


def is_msprobe_rank_dir(path: Path) -> bool:
    """A `step{N}/rank{R}` folder: it holds `dump.json`."""
    return (path / "dump.json").is_file()


@dataclass(slots=True)
class _Call:
    full: str
    is_module: bool
    base: str  # name without the counter
    counter: int
    cls: str
    step: int
    pos: int
    entry: dict[str, Any]
    parent_full: str | None = None
    raw_token: int = 0
    token: int = 0
    node: str = ""
    children: list[_Call] = field(default_factory=list)


def find_rank_dirs(path: Path) -> list[tuple[int, Path]]:
    """(step, rank folder) pairs under a dump path, a step folder or a rank folder; one rank (the first)."""
    if is_msprobe_rank_dir(path):
        m = _STEP_RE.fullmatch(path.parent.name)
        return [(int(m.group(1)) if m else 0, path)]
    steps: list[tuple[int, Path]] = []
    own_step = _STEP_RE.fullmatch(path.name)
    if own_step:
        steps = [(int(own_step.group(1)), path)]
    else:
        try:
            for e in list_dir(path):
                m = _STEP_RE.fullmatch(e.name)
                if e.is_dir and m:
                    steps.append((int(m.group(1)), Path(e.path)))
        except DumpError:
            return []
    steps.sort()
    ranks: dict[str, list[tuple[int, Path]]] = defaultdict(list)
    for step, sp in steps:
        try:
            for e in list_dir(sp):
                if e.is_dir and _RANK_RE.fullmatch(e.name) and (Path(e.path) / "dump.json").is_file():
                    ranks[e.name].append((step, Path(e.path)))
        except DumpError:
            continue
    if not ranks:
        return []
    first = sorted(ranks, key=lambda r: (len(r), r))[0]
    return ranks[first]


def find_all_rank_dirs(path: Path) -> dict[str, list[tuple[int, Path]]]:
    """Every rank folder name below a dump path or a step folder -> its (step, folder) pairs."""
    steps: list[tuple[int, Path]] = []
    m = _STEP_RE.fullmatch(path.name)
    if m:
        steps = [(int(m.group(1)), path)]
    else:
        try:
            entries = list_dir(path)
            steps = [(int(x.group(1)), Path(e.path)) for e in entries if e.is_dir and (x := _STEP_RE.fullmatch(e.name))]
        except DumpError:
            return {}
    ranks: dict[str, list[tuple[int, Path]]] = defaultdict(list)
    for step, sp in sorted(steps):
        try:
            for e in list_dir(sp):
                if e.is_dir and _RANK_RE.fullmatch(e.name) and (Path(e.path) / "dump.json").is_file():
                    ranks[e.name].append((step, Path(e.path)))
        except DumpError:
            continue
    return dict(ranks)


def read_msprobe(rank_dirs: list[tuple[int, Path]], *, root: Path) -> Dump:
    """Read the dump.json/construct.json of one rank over the given steps."""
    problems: list[str] = []
    meta: dict[str, Any] = {"steps": [s for s, _ in rank_dirs], "rank_folder": rank_dirs[0][1].name}
    calls: list[_Call] = []
    skipped = 0
    pos = 0
    for step, rdir in rank_dirs:
        try:
            dump = read_json(rdir / "dump.json")
            if not isinstance(dump, dict) or not isinstance(dump.get("data"), dict):
                raise DumpError(rdir / "dump.json", "no 'data' object: not an msprobe dump.json")
        except DumpError as exc:
            problems.append(str(exc))
            continue
        for key in ("task", "level", "framework"):
            if key in dump and key not in meta:
                meta[key] = dump[key]
        construct: dict[str, Any] = {}
        cpath = rdir / "construct.json"
        if cpath.is_file():
            try:
                c = read_json(cpath)
                construct = c if isinstance(c, dict) else {}
            except DumpError as exc:
                problems.append(str(exc))
        step_calls: dict[str, _Call] = {}
        for full, entry in dump["data"].items():
            pos += 1
            call = _parse_call(full, entry, step, pos)
            if call is None:
                skipped += 1
                continue
            par = construct.get(full)
            if isinstance(par, list):  # Megatron: [parent, micro_step]
                par = par[0] if par else None
            call.parent_full = par if isinstance(par, str) else None
            step_calls[full] = call
            calls.append(call)
        for call in step_calls.values():
            parent = step_calls.get(call.parent_full) if call.parent_full else None
            if parent is not None:
                parent.children.append(call)
            else:
                call.parent_full = None
        _raw_tokens(list(step_calls.values()))
    if skipped:
        meta["skipped_entries"] = skipped
    _final_tokens(calls, meta)
    nodes = _name_nodes(calls)
    tensors: list[TensorEntry] = []
    for call in calls:
        ddir = rank_dirs[[s for s, _ in rank_dirs].index(call.step)][1] / "dump_tensor_data"
        _call_tensors(call, ddir, tensors, problems)
    model_name = next((c.cls for c in calls if c.is_module and c.parent_full is None), None)
    return Dump(
        kind="msprobe",
        root=root.resolve(),
        nodes=nodes,
        tensors=tensors,
        order_source="recorded",
        model_name=model_name,
        meta=meta,
        problems=problems,
    )


def _parse_call(full: str, entry: Any, step: int, pos: int) -> _Call | None:
    if not isinstance(entry, dict):
        return None
    m = _MODULE_RE.match(full)
    if m:
        if m.group(4) != "forward":
            return None
        return _Call(
            full, True, f"{m.group(1)}.{m.group(2)}.{m.group(3)}.forward", int(m.group(5)), m.group(3), step, pos, entry
        )
    if ".parameters_grad" in full:
        return None
    m = _API_RE.match(full)
    if m:
        if m.group(4) != "forward":
            return None
        return _Call(
            full, False, f"{m.group(1)}.{m.group(2)}", int(m.group(3)), f"{m.group(1)}.{m.group(2)}", step, pos, entry
        )
    return None


def _raw_tokens(calls: list[_Call]) -> None:
    """Counter of the outermost module ancestor (APIs outside every module: nearest module call)."""
    by_full = {c.full: c for c in calls}
    unresolved: list[_Call] = []
    for c in calls:
        top: _Call | None = c if c.is_module else None
        cur = c
        seen = 0
        while cur.parent_full is not None and cur.parent_full in by_full and seen <= len(by_full):
            cur = by_full[cur.parent_full]
            seen += 1
            if cur.is_module:
                top = cur
        if top is None:
            unresolved.append(c)
        else:
            c.raw_token = top.counter
    if unresolved and not any(c.is_module for c in calls):
        # no module recorded (msprobe's `level: L1`): each forward of a language model starts with its word
        # embedding's lookup, so the k-th such call opens token k (nothing to split with fewer than two)
        starts = sorted(c.pos for c in calls if is_embedding_node(c.base, c.cls))
        if len(starts) > 1:
            for c in unresolved:
                c.raw_token = max(bisect.bisect_right(starts, c.pos) - 1, 0)
        return
    if unresolved:
        tops = sorted((c.pos, c.raw_token) for c in calls if c.is_module)
        for c in unresolved:
            before = [t for p, t in tops if p < c.pos]
            after = [t for p, t in tops if p > c.pos]
            c.raw_token = before[-1] if before else (after[0] if after else 0)


def _final_tokens(calls: list[_Call], meta: dict[str, Any]) -> None:
    steps = sorted({c.step for c in calls})
    per_step = {s: {c.raw_token for c in calls if c.step == s} for s in steps}
    if all(v <= {0} for v in per_step.values()):
        meta["token_rule"] = "step number (one forward per step)"
        for c in calls:
            c.token = c.step
    elif len(steps) == 1:
        modules = any(c.is_module for c in calls)
        meta["token_rule"] = "call counter of the outermost module" if modules else "word-embedding calls"
        for c in calls:
            c.token = c.raw_token
    else:
        meta["token_rule"] = "ordinal of (step, outermost module call counter)"
        order = {k: i for i, k in enumerate(sorted({(c.step, c.raw_token) for c in calls}))}
        for c in calls:
            c.token = order[(c.step, c.raw_token)]


def _name_nodes(calls: list[_Call]) -> list[Node]:
    seen: Counter[tuple[int, str]] = Counter()
    for c in sorted(calls, key=lambda c: c.pos):
        j = seen[(c.token, c.base)]
        seen[(c.token, c.base)] += 1
        if c.is_module:
            c.node = c.base if j == 0 else f"{c.base}#{j}"
        else:
            prefix, _, api = c.base.partition(".")
            c.node = f"{prefix}.{api}.{j}.forward"
    by_full = {c.full: c for c in calls}
    # call start = earliest position in the call's subtree (dump.json may list a module after its children)
    start: dict[str, int] = {}

    def subtree_start(c: _Call) -> int:
        stack = [(c, False)]
        while stack:
            cur, done = stack.pop()
            if cur.full in start:
                continue
            if done:
                start[cur.full] = min([cur.pos, *(start[ch.full] for ch in cur.children)])
            else:
                stack.append((cur, True))
                stack.extend((ch, False) for ch in cur.children if ch.full not in start)
        return start[c.full]

    nodes: dict[str, Node] = {}
    first_key: dict[str, tuple[int, int, int]] = {}
    depth_of: dict[str, int] = {}
    for c in calls:
        d = 0
        cur = c
        while cur.parent_full is not None and cur.parent_full in by_full and d <= len(by_full):
            cur = by_full[cur.parent_full]
            d += 1
        depth_of[c.full] = d
        key = (c.token, subtree_start(c), d)
        if c.node not in nodes:
            parent = by_full[c.parent_full].node if c.parent_full in by_full else None
            nodes[c.node] = Node(name=c.node, type=c.cls, parent=parent, depth=d)
            first_key[c.node] = key
        elif key < first_key[c.node]:
            first_key[c.node] = key
    ordered = sorted(nodes.values(), key=lambda n: first_key[n.name])
    for i, n in enumerate(ordered):
        n.exec_order = i
        n.layer = layer_from_name(n.name)
    inherit_layers(ordered)
    if not any(c.is_module for c in calls):  # `level: L1`: the layers of the first token's calls, by repetition
        first = min((c.token for c in calls), default=0)
        stream = sorted((c for c in calls if c.token == first), key=lambda c: c.pos)
        for c, layer in zip(stream, layers_by_repetition([c.cls for c in stream]), strict=True):
            nodes[c.node].layer = layer
    return ordered


def _leaves(obj: Any) -> list[dict[str, Any]]:
    """Tensor descriptors in order (lists flattened, dict values in key order, non-tensors skipped)."""
    out: list[dict[str, Any]] = []
    stack = [obj]
    while stack:
        cur = stack.pop()
        if isinstance(cur, list | tuple):
            stack.extend(reversed(cur))
        elif isinstance(cur, dict):
            if "dtype" in cur and "shape" in cur and "tensor" in str(cur.get("type", "")).lower():
                out.append(cur)
            elif "type" not in cur:
                stack.extend(reversed(list(cur.values())))
    return out


def _num(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    return None


def _call_tensors(call: _Call, data_dir: Path, out: list[TensorEntry], problems: list[str]) -> None:
    e = call.entry
    params = e.get("parameters")
    named = sorted(params.items()) if isinstance(params, dict) else []
    roles: tuple[tuple[TensorRole, list[tuple[int, Any]]], ...] = (
        ("in", list(enumerate(_leaves([e.get("input_args", []), e.get("input_kwargs", {})])))),
        ("out", list(enumerate(_leaves([e.get("output", [])])))),
        # indexed by parameter name, as our weights are: a dropped bias leaves the weights paired
        ("param", [(param_index(str(k)), leaf) for k, v in named for leaf in _leaves([v])[:1]]),
    )
    for role, leaves in roles:
        for idx, leaf in leaves:
            dtype = str(leaf.get("dtype", "")).removeprefix("torch.") or None
            shape_v = leaf.get("shape")
            shape = None
            if isinstance(shape_v, list) and all(isinstance(d, int) for d in shape_v):
                try:
                    shape = check_shape(data_dir.parent / "dump.json", shape_v, f"{call.full} shape")
                except DumpError as exc:
                    problems.append(str(exc))
            stats = TensorStats(
                max=_num(leaf.get("Max")),
                min=_num(leaf.get("Min")),
                mean=_num(leaf.get("Mean")),
                norm=_num(leaf.get("Norm")),
            )
            name = leaf.get("data_name")
            escapes = isinstance(name, str) and bool(name) and (os.sep in name or name.startswith(".."))
            if escapes:
                problems.append(f"{data_dir / str(name)}: data_name leaves dump_tensor_data: ignored")
            path: str | None = None
            error: str | None = None
            at: Payload | None = None
            if isinstance(name, str) and name and not escapes:  # else statistics only
                path = str(data_dir / name)
                try:
                    if os.path.islink(path):
                        check_link(path)
                    if name.endswith(".npy"):
                        dtype, shape = npy_header(path)
                    else:
                        dtype, shape, at = pth_header(path)
                except DumpError as err:
                    bad = err if os.path.exists(path) else DumpError(path, "missing file")
                    problems.append(str(bad))
                    error = bad.reason
            entry = TensorEntry(
                call.token, call.node, role, idx, path, dtype=dtype, shape=shape, stats=stats, error=error, payload=at
            )
            out.append(checked_stats(entry, data_dir.parent / "dump.json", problems))
