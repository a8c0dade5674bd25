"""All-reduce check of a multi-rank dump: each rank's output of a communication op against the sum of every
rank's input, per op and token, and which rank's contribution explains a mismatch.

Communication ops are found by name or type (`AllReduceOperation`, `AllReduceHcclRunner`, msprobe
`Distributed.all_reduce`, a torch module whose class name says all-reduce). One op's tensors of every rank are
in memory at a time (float64), so memory is bounded by the ranks times the largest such tensor.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from workbench.formats.arrays import RawTensor, read_array
from workbench.formats.model import Dump, DumpError, TensorEntry

COMM_RE = re.compile(r"all_?reduce", re.IGNORECASE)
# relative error (norm-wise) of an output against the float64 sum of the inputs, for 2 ranks: one rounding of
# the sum to the output dtype is at most its unit roundoff (bf16 2^-8, fp16 2^-11), and typically a third of
# it; each further rank adds one more rounding of a partial sum, so the bound grows with ranks - 1
DEFAULT_BOUNDS = {"float32": 1e-5, "float64": 1e-12, "float16": 1.25 * 2.0**-11, "bfloat16": 1.25 * 2.0**-8}
EXPLAINED = 0.3  # a rank "explains" a mismatch when its scaled input leaves less than this share of it


@dataclass(frozen=True, slots=True)
class AllReduceResult:
    """One communication op at one token on one rank."""

    rank_index: int  # position in the list of dumps checked
    token: int
    node: str
    rel_error: float | None  # ||out - sum(inputs)|| / ||sum(inputs)||
    passed: bool | None
    culprit: int | None = None  # rank index whose contribution explains the mismatch
    factor: float | None = None  # that contribution arrived multiplied by this (0: dropped)
    reason: str | None = None


def is_comm_node(name: str, node_type: str) -> bool:
    """A communication (all-reduce) op, by its type or name."""
    return bool(COMM_RE.search(node_type) or COMM_RE.search(name))


def _f64(raw: RawTensor) -> np.ndarray:
    arr = np.asarray(raw.array).reshape(-1)
    if raw.dtype == "bfloat16":
        return (arr.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return arr.astype(np.float64)


def check_allreduce(dumps: list[Dump], bounds: dict[str, float] | None = None) -> list[AllReduceResult]:
    """Every all-reduce op found in all ranks at the same token: output of each rank vs the sum of inputs."""
    limits = {**DEFAULT_BOUNDS, **(bounds or {})}
    per_rank: list[dict[tuple[int, str], dict[str, TensorEntry]]] = []
    for d in dumps:
        types = {n.name: n.type for n in d.nodes}
        found: dict[tuple[int, str], dict[str, TensorEntry]] = defaultdict(dict)
        for t in d.tensors:
            if t.index == 0 and t.path and not t.error and is_comm_node(t.node, types.get(t.node, "")):
                found[(t.token, t.node)][t.role] = t
        per_rank.append(found)
    if not per_rank:
        return []
    common = sorted(set.intersection(*(set(k for k, v in r.items() if len(v) == 2) for r in per_rank)))
    out: list[AllReduceResult] = []
    for token, node in common:
        entries = [r[(token, node)] for r in per_rank]
        out.extend(_check_one(token, node, entries, limits))
    return out


def _check_one(
    token: int, node: str, entries: list[dict[str, TensorEntry]], limits: dict[str, float]
) -> list[AllReduceResult]:
    try:
        ins = [_f64(read_array(e["in"].path or "")) for e in entries]
        outs = [_f64(read_array(e["out"].path or "")) for e in entries]
    except DumpError as exc:
        return [AllReduceResult(i, token, node, None, None, reason=str(exc)) for i in range(len(entries))]
    if len({a.size for a in ins + outs}) != 1:
        return [
            AllReduceResult(i, token, node, None, None, reason="inputs and outputs differ in size across ranks")
            for i in range(len(entries))
        ]
    expected = np.sum(ins, axis=0)
    scale = float(np.linalg.norm(expected))
    results = []
    for i, (e, o) in enumerate(zip(entries, outs)):
        resid = o - expected
        err = float(np.linalg.norm(resid))
        rel = err / scale if scale > 0 else (0.0 if err == 0 else math.inf)
        bound = limits.get(str(e["out"].dtype), limits["float32"]) * max(1, len(entries) - 1)
        passed = bool(rel <= bound)
        culprit = factor = None
        if not passed and err > 0:
            culprit, factor = _explain(resid, ins)
        results.append(AllReduceResult(i, token, node, rel, passed, culprit, factor))
    return results


def _explain(resid: np.ndarray, ins: list[np.ndarray]) -> tuple[int | None, float | None]:
    """The rank k whose input, scaled by c, best accounts for the residual: out = sum + c * in_k, so rank k's
    contribution arrived multiplied by 1 + c."""
    best: tuple[float, int, float] | None = None
    r_norm = float(np.linalg.norm(resid))
    for k, x in enumerate(ins):
        xx = float(np.dot(x, x))
        if xx == 0:
            continue
        c = float(np.dot(resid, x)) / xx
        left = float(np.linalg.norm(resid - c * x)) / r_norm
        if best is None or left < best[0]:
            best = (left, k, c)
    if best is None or best[0] > EXPLAINED:
        return None, None
    return best[1], 1.0 + best[2]


def describe(res: AllReduceResult, labels: list[str]) -> str:
    """One line for a failing op."""
    what = f"{res.node} (token {res.token}) on {labels[res.rank_index]}: rel error {res.rel_error:.3g}"
    if res.culprit is not None and res.factor is not None:
        how = "dropped" if abs(res.factor) < 0.05 else f"scaled by {res.factor:.3g}"
        what += f"; {labels[res.culprit]}'s contribution {how}"
    return what
