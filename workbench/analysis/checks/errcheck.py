"""The anomaly check of one dump: where NaN, Inf, fp16 overflow or saturation first appear.

For every kind of anomaly, the first op that *produces* it: ops are visited token by token and, within
a token, in the order they finish (an op ends before the module that encloses it), so the named op is
the one whose output turned abnormal, never the layer around it. Like msprobe's overflow check, each
finding says whether the op's inputs were normal (the op made the anomaly: msprobe's "critical") or
already abnormal (it came from outside the dump, e.g. the model input).

Kinds:
- `nan`, `+inf`, `-inf`: in an op's outputs;
- `nan?`: statistics only, a NaN mean that +inf and -inf in the same tensor explain: NaN may or may not be
  there (max, min and norm are NaN only with a NaN element, and then the kind is `nan`);
- `fp16_overflow`: a float32/bfloat16/float64 input with finite |x| > 65504 (float16's largest value)
  to an op that outputs float16 (a cast) or takes other float16 inputs (an fp16 op): the values cannot
  survive the cast;
- `saturation`: output elements at exactly +/- the largest finite value of a float16/bfloat16 tensor
  (how saturation-mode hardware clamps an overflow instead of writing Inf).

Tensors are read one at a time, memory-mapped and scanned in chunks (memory bounded by one chunk);
tensors without data (statistics-only dumps) are judged from their recorded max/min/mean/norm, which gives
the kind (only what the statistics prove) and the place but not the element count.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from workbench.formats.arrays import RawTensor, read_array
from workbench.formats.model import Dump, DumpError, Node, TensorEntry

FP16_MAX = 65504.0
BF16_MAX = 3.3895313892515355e38
KINDS = ("nan", "+inf", "-inf", "nan?", "fp16_overflow", "saturation")
_SATURATION_AT = {"float16": FP16_MAX, "bfloat16": BF16_MAX}
_WIDE_FLOATS = {"float32", "bfloat16", "float64"}
CHUNK = 1 << 20


@dataclass(slots=True)
class TensorCounts:
    """Anomalous elements of one tensor per kind; None for a kind means "present, count unknown" (statistics)."""

    counts: dict[str, int | None] = field(default_factory=dict)
    over_fp16: int | None = 0  # finite |x| > 65504 (becomes `fp16_overflow` when the op outputs float16)
    from_stats: bool = False

    def has(self, kind: str) -> bool:
        return kind in self.counts


@dataclass(slots=True)
class Finding:
    """The first op that shows one kind of anomaly."""

    kind: str
    token: int
    op: str
    op_type: str
    tensor: str  # e.g. out0, in1
    count: int | None  # anomalous elements in that op's tensors of this kind (None: statistics only)
    inputs: str  # normal | abnormal | not dumped
    ops: int  # (token, op) places showing this kind over the whole dump
    module_chain: str

    def to_row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class ErrcheckResult:
    """What `check_dump` found; `findings` is empty when the dump has no anomaly."""

    root: str
    kind: str
    tokens: list[int]
    ops: int
    tensors_read: int
    tensors_from_stats: int
    findings: list[Finding]
    problems: list[str]

    @property
    def anomalous(self) -> bool:
        return bool(self.findings)


# ---------------------------------------------------------------------------------------------- one tensor


def _float_chunks(raw: RawTensor) -> Iterator[np.ndarray]:
    flat = np.asarray(raw.array).reshape(-1)
    for start in range(0, flat.size, CHUNK):
        part = flat[start : start + CHUNK]
        if raw.dtype == "bfloat16":
            yield (part.astype(np.uint32) << 16).view(np.float32)
        else:
            yield part


def scan_array(raw: RawTensor) -> TensorCounts:
    """Count NaN, +Inf, -Inf, finite |x| > 65504 and saturated elements of one tensor, chunk by chunk."""
    out = TensorCounts()
    kind = np.asarray(raw.array).dtype.kind
    if kind != "f" and raw.dtype != "bfloat16":
        return out  # integers and booleans hold no NaN/Inf
    totals = dict.fromkeys(("nan", "+inf", "-inf", "saturation"), 0)
    over = 0
    sat = _SATURATION_AT.get(raw.dtype)
    with np.errstate(all="ignore"):
        for x in _float_chunks(raw):
            fin = np.isfinite(x)
            n_fin = int(np.count_nonzero(fin))
            if n_fin < x.size:
                totals["nan"] += int(np.count_nonzero(np.isnan(x)))
                totals["+inf"] += int(np.count_nonzero(x == np.inf))
                totals["-inf"] += int(np.count_nonzero(x == -np.inf))
            mag = np.abs(x[fin] if n_fin < x.size else x)
            if raw.dtype in _WIDE_FLOATS:
                over += int(np.count_nonzero(mag > FP16_MAX))
            if sat is not None:
                totals["saturation"] += int(np.count_nonzero(mag == sat))
    out.counts = {k: v for k, v in totals.items() if v}
    out.over_fp16 = over
    return out


def scan_stats(entry: TensorEntry) -> TensorCounts | None:
    """The same judgement from a statistics-only record (max/min/mean); None when nothing was recorded."""
    st = entry.stats
    vals = [v for v in (st.max, st.min, st.mean) if v is not None] if st is not None else []
    if st is None or not vals:
        return None
    out = TensorCounts(from_stats=True, over_fp16=None)
    pos = st.max == math.inf or st.mean == math.inf
    neg = st.min == -math.inf or st.mean == -math.inf
    if pos:
        out.counts["+inf"] = None
    if neg:
        out.counts["-inf"] = None
    # max, min and norm are NaN only with a NaN element; a NaN mean also comes from +inf and -inf together
    nan_extreme = any(v is not None and math.isnan(v) for v in (st.max, st.min, st.norm))
    nan_mean = st.mean is not None and math.isnan(st.mean)
    if nan_extreme or (nan_mean and not (pos and neg)):
        out.counts["nan"] = None
    elif nan_mean:
        out.counts["nan?"] = None
    finite = [abs(v) for v in (st.max, st.min) if v is not None and math.isfinite(v)]
    peak = max(finite, default=0.0)
    dtype = entry.dtype or ""
    if dtype in _WIDE_FLOATS and peak > FP16_MAX:
        out.over_fp16 = None
    else:
        out.over_fp16 = 0
    sat = _SATURATION_AT.get(dtype)
    if sat is not None and peak == sat:
        out.counts["saturation"] = None
    return out


# ---------------------------------------------------------------------------------------------- the dump


def end_order(nodes: list[Node]) -> dict[str, tuple[float, int]]:
    """Sort key of each node by completion: (last exec_order in its subtree, -depth); unordered nodes last."""
    by_name = {n.name: n for n in nodes}
    last: dict[str, float] = {n.name: (math.inf if n.exec_order is None else float(n.exec_order)) for n in nodes}
    for n in nodes:
        if n.exec_order is None:
            continue
        p, hops = n.parent, 0
        while p is not None and p in last and hops <= len(nodes):
            if last[p] == math.inf or last[p] < n.exec_order:
                last[p] = float(n.exec_order)
            p, hops = by_name[p].parent, hops + 1
    return {n.name: (last[n.name], -n.depth) for n in nodes}


def module_chain(name: str, by_name: dict[str, Node]) -> str:
    """The op's enclosing modules, outermost first, then the op: `a > b > op`."""
    chain = [name]
    cur = by_name.get(name)
    while cur is not None and cur.parent is not None and len(chain) <= len(by_name):
        chain.append(cur.parent)
        cur = by_name.get(cur.parent)
    return " > ".join(reversed(chain))


@dataclass(slots=True)
class _Place:
    token: int
    node: str
    ins: dict[int, TensorCounts | None]
    outs: dict[int, TensorCounts | None]
    in_dtypes: list[str]
    out_dtypes: list[str]


def _kinds_of(place: _Place, role: str) -> dict[str, tuple[int | None, str]]:
    """kind -> (element count or None, first tensor label) over one role's tensors of a place."""
    found: dict[str, tuple[int | None, str]] = {}
    tensors = place.outs if role == "out" else place.ins
    for idx in sorted(tensors):
        c = tensors[idx]
        if c is None:
            continue
        for kind, n in c.counts.items():
            if kind not in found:
                found[kind] = (n, f"{role}{idx}")
            else:
                prev, label = found[kind]
                found[kind] = (None if prev is None or n is None else prev + n, label)
    if role == "in" and "float16" in (*place.out_dtypes, *place.in_dtypes):  # a cast to fp16, or an fp16 op
        for idx in sorted(tensors):
            c = tensors[idx]
            if c is None or c.over_fp16 == 0:
                continue
            prev_n, label = found.get("fp16_overflow", (0, f"in{idx}"))
            total = None if prev_n is None or c.over_fp16 is None else prev_n + c.over_fp16
            found["fp16_overflow"] = (total, label)
    return found


def _places(dump: Dump) -> dict[tuple[int, str], list[TensorEntry]]:
    out: dict[tuple[int, str], list[TensorEntry]] = defaultdict(list)
    for t in dump.tensors:
        out[(t.token, t.node)].append(t)
    return out


def check_dump(dump: Dump, progress: Callable[[int, int], None] | None = None) -> ErrcheckResult:
    """The first op producing each kind of anomaly in one dump (see the module docstring)."""
    by_name = dump.node_map()
    order = end_order(dump.nodes)
    places = _places(dump)
    keys = sorted(places, key=lambda k: (k[0], order.get(k[1], (math.inf, 0)), k[1]))
    problems = list(dump.problems)
    first: dict[str, Finding] = {}
    seen_ops: dict[str, int] = defaultdict(int)
    read = from_stats = 0
    for i, key in enumerate(keys):
        if progress is not None:
            progress(i, len(keys))
        place = _Place(key[0], key[1], {}, {}, [], [])
        for entry in places[key]:
            counts: TensorCounts | None = None
            if entry.path is not None and entry.error is None:
                try:
                    counts = scan_array(read_array(entry.path))
                    read += 1
                except DumpError as exc:
                    problems.append(str(exc))
            if counts is None:
                counts = scan_stats(entry)
                if counts is not None:
                    from_stats += 1
            (place.outs if entry.role == "out" else place.ins)[entry.index] = counts
            (place.out_dtypes if entry.role == "out" else place.in_dtypes).append(entry.dtype or "")
        out_kinds = _kinds_of(place, "out")
        in_kinds = _kinds_of(place, "in")
        node = by_name.get(key[1])
        op_type = node.type if node is not None else ""
        if not place.ins:
            inputs_state = "not dumped"
        else:
            inputs_state = "abnormal" if any(k in in_kinds for k in KINDS if k != "fp16_overflow") else "normal"
        for kind in KINDS:
            if kind == "fp16_overflow":
                hit = in_kinds.get(kind)
            else:
                hit = out_kinds.get(kind)
                if hit is None and not place.outs and kind in in_kinds:
                    hit = in_kinds[kind]  # an inputs-only dump: the first op that receives it
            if hit is None:
                continue
            seen_ops[kind] += 1
            if kind not in first:
                count, label = hit
                chain = module_chain(key[1], by_name)
                first[kind] = Finding(kind, key[0], key[1], op_type, label, count, inputs_state, 0, chain)
    if progress is not None:
        progress(len(keys), len(keys))
    findings = []
    for kind in KINDS:
        if kind in first:
            first[kind].ops = seen_ops[kind]
            findings.append(first[kind])
    findings.sort(key=lambda f: (f.token, order.get(f.op, (math.inf, 0)), KINDS.index(f.kind)))
    return ErrcheckResult(
        root=str(dump.root),
        kind=dump.kind,
        tokens=dump.tokens,
        ops=len({k[1] for k in keys}),
        tensors_read=read,
        tensors_from_stats=from_stats,
        findings=findings,
        problems=problems,
    )
