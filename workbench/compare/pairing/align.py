"""Aligning two call streams of the same kind of dump, so an inserted or missing op never shifts the pairing.

msprobe names API calls by counters (`Tensor.__mul__.21.forward`) and msit numbers repeated API calls
and module-list entries: one extra call in the test run renames every later call of its kind. Pairing
by name then compares the wrong tensors. Here the children of two paired scopes (the top level, then
the children of every paired module, recursively) are aligned as sequences:

* each node gets a key: its type, its module name where one exists (`down_proj`; list indices and
  call counters are not part of it), and the shapes of its tensors at its first token (the roles
  both runs dumped);
* the longest common subsequence of the keys pairs the nodes (Myers' O((N+M)D) diff, linear when the
  streams differ by a few ops; past `MAX_EDITS` differences, difflib's matching blocks);
* where several nodes with one key sit next to an insertion (`x * 1.0` beside another multiply of the
  same shape), the recorded statistics (norm, mean) decide which one is the extra;
* between two aligned nodes, leftovers with identical names, or the same op types in the same order
  with other shapes, are paired too (their shapes are judged later: a layout rule or `not comparable`).

What stays unpaired is reported unmatched.
"""

from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from workbench.compare.pairing.frames import NodeTable, TensorTable

MAX_EDITS = 2000  # beyond this many differences in one scope, Myers' trace costs more than it is worth
_MAX_RUN_CELLS = 250_000  # size bound of the statistics re-alignment of one run of equal keys

Shapes = tuple[tuple[str, int, tuple[int, ...] | None], ...]
Key = tuple[str, str | None, Shapes]  # type, own module name, tensor shapes at the first token
_MSPROBE_MODULE = re.compile(r"^(?:Module|Cell)\.(.+)\.[^.]+\.forward(?:#[0-9]+)?$")
_INDEXED = re.compile(r"^[0-9]+_")


def leaf_name(name: str, kind: str) -> str | None:
    """A node's own module name (`down_proj`, `RmsNormOperation`), without counters or list indices."""
    if kind == "msprobe":
        m = _MSPROBE_MODULE.match(name)
        if not m:
            return None  # an API call: its type says everything
        leaf = m.group(1).rsplit(".", 1)[-1]
    elif kind == "atb":
        leaf = _INDEXED.sub("", name.rsplit("/", 1)[-1])
    else:
        leaf = name.rsplit(".", 1)[-1]
        leaf = re.sub(r"\.[0-9]+$", "", leaf)
    return None if leaf.isascii() and leaf.isdigit() else leaf


@dataclass(slots=True)
class StreamSide:
    """One run's nodes as scopes of ordered children, with alignment keys and statistics."""

    kind: str
    children: dict[int | None, list[int]]
    name: dict[int, str]
    type: dict[int, str]
    key: dict[int, Key]
    stats: dict[int, dict[tuple[str, int], float]]

    @classmethod
    def build(cls, kind: str, nodes: NodeTable, tensors: TensorTable, roles: set[str]) -> StreamSide:
        ids = nodes.node_id.tolist()
        name = dict(zip(ids, nodes.name))
        typ = dict(zip(ids, (_text(x) for x in nodes.type)))
        order = {n: (float(e) if e is not None else math.inf) for n, e in zip(ids, nodes.exec_order)}
        children: dict[int | None, list[int]] = defaultdict(list)
        known = set(ids)
        for nid, pid in zip(ids, nodes.parent_id):
            p = None if pid is None or int(pid) not in known else int(pid)
            children[p].append(nid)
        for kids in children.values():
            kids.sort(key=lambda n: (order[n], n))
        shapes, stats = first_token_tensors(tensors, roles)
        key = {n: (typ[n], leaf_name(name[n], kind), shapes.get(n, ())) for n in ids}
        return cls(kind, children, name, typ, key, stats)


def first_token_tensors(
    tensors: TensorTable, roles: set[str]
) -> tuple[dict[int, Shapes], dict[int, dict[tuple[str, int], float]]]:
    """Per node: the shapes of its tensors at its first token, and one statistic (norm, else mean) per tensor."""
    t = tensors.take(tensors.io.is_in(roles)) if roles else tensors
    if not len(t):
        return {}, {}
    nodes, at = np.unique(t.node_id, return_inverse=True)
    first = np.full(len(nodes), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, at, t.token_id)
    t = t.take(t.token_id == first[at])
    parsed = [shape_tuple(v) for v in t.shape.values] + [None]  # code -1: unknown
    stat = np.where(np.isnan(t.norm), t.mean, t.norm)
    shapes: dict[int, list[tuple[str, int, tuple[int, ...] | None]]] = defaultdict(list)
    stats: dict[int, dict[tuple[str, int], float]] = defaultdict(dict)
    io_text = t.io.text()
    for nid, io, idx, code, v in zip(
        t.node_id.tolist(), io_text, t.idx.tolist(), t.shape.codes.tolist(), stat.tolist()
    ):
        shapes[nid].append((str(io), idx, parsed[code]))
        if not math.isnan(v):
            stats[nid][(str(io), idx)] = v
    return {n: tuple(sorted(v)) for n, v in shapes.items()}, dict(stats)


def shape_tuple(shape: object) -> tuple[int, ...] | None:
    """A catalog shape cell (list, array, or its text `[4, 8]` as `load_frames` gives it; None/NaN/NA when the
    file was unreadable) as a tuple."""
    if isinstance(shape, str):
        inner = shape.strip().removeprefix("[").removesuffix("]")
        return tuple(int(d) for d in inner.split(",")) if inner.strip() else ()
    if isinstance(shape, list | tuple | np.ndarray):
        return tuple(int(d) for d in shape)
    return None


def _text(x: object) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


# ---------------------------------------------------------------------------------------------- LCS


def lcs_pairs(a: Sequence[Hashable], b: Sequence[Hashable], max_edits: int = MAX_EDITS) -> list[tuple[int, int]]:
    """Index pairs of a longest common subsequence of `a` and `b` (Myers), in order."""
    lo = 0
    while lo < len(a) and lo < len(b) and a[lo] == b[lo]:
        lo += 1
    hi_a, hi_b = len(a), len(b)
    while hi_a > lo and hi_b > lo and a[hi_a - 1] == b[hi_b - 1]:
        hi_a -= 1
        hi_b -= 1
    head = [(i, i) for i in range(lo)]
    tail = [(hi_a + i, hi_b + i) for i in range(len(a) - hi_a)]
    mid = _myers(a[lo:hi_a], b[lo:hi_b], max_edits)
    if mid is None:
        sm = difflib.SequenceMatcher(None, list(a[lo:hi_a]), list(b[lo:hi_b]), autojunk=False)
        mid = [(blk.a + k, blk.b + k) for blk in sm.get_matching_blocks() for k in range(blk.size)]
    return head + [(i + lo, j + lo) for i, j in mid] + tail


def _myers(a: Sequence[Hashable], b: Sequence[Hashable], max_edits: int) -> list[tuple[int, int]] | None:
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return []
    v: dict[int, int] = {1: 0}
    rounds: list[dict[int, int]] = []
    for d in range(min(n + m, max_edits) + 1):
        cur: dict[int, int] = {}
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v.get(k - 1, -1) < v.get(k + 1, -1)):
                x = v[k + 1]
            else:
                x = v[k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[k] = cur[k] = x
            if x >= n and y >= m:
                rounds.append(cur)
                return _backtrack(rounds, n, m)
        rounds.append(cur)
    return None


def _backtrack(rounds: list[dict[int, int]], n: int, m: int) -> list[tuple[int, int]]:
    x, y = n, m
    out: list[tuple[int, int]] = []
    for d in range(len(rounds) - 1, -1, -1):
        k = x - y
        if d == 0:
            prev_x, prev_y = 0, 0
        else:
            prev = rounds[d - 1]
            prev_k = k + 1 if k == -d or (k != d and prev.get(k - 1, -1) < prev.get(k + 1, -1)) else k - 1
            prev_x = prev[prev_k]
            prev_y = prev_x - prev_k
        while x > prev_x and y > prev_y:  # the snake after the edit: matches
            x -= 1
            y -= 1
            out.append((x, y))
        x, y = prev_x, prev_y
    out.reverse()
    return out


# ---------------------------------------------------------------------------------------------- one scope


def _distance(g: dict[tuple[str, int], float] | None, t: dict[tuple[str, int], float] | None) -> float:
    if not g or not t:
        return 0.0
    common = g.keys() & t.keys()
    total = 0.0
    for k in common:
        a, b = g[k], t[k]
        if math.isfinite(a) and math.isfinite(b):
            total += abs(a - b) / (abs(a) + abs(b) + 1e-30)
        elif not (math.isnan(a) and math.isnan(b)) and a != b:
            total += 1.0
    return total


def _refine_runs(
    pairs: list[tuple[int, int]],
    gkeys: Sequence[Hashable],
    tkeys: Sequence[Hashable],
    gstats: Sequence[dict[tuple[str, int], float] | None],
    tstats: Sequence[dict[tuple[str, int], float] | None],
) -> list[tuple[int, int]]:
    """Within each run of equal keys that holds an insertion or deletion, pick the extra one by statistics."""
    if not pairs or len(pairs) == min(len(gkeys), len(tkeys)) == max(len(gkeys), len(tkeys)):
        return pairs
    # walk the alignment as a sequence of steps and cut it into runs of one key
    steps: list[tuple[int | None, int | None]] = []
    i = j = 0
    for pi, pj in [*pairs, (len(gkeys), len(tkeys))]:
        while i < pi:
            steps.append((i, None))
            i += 1
        while j < pj:
            steps.append((None, j))
            j += 1
        if pi < len(gkeys) and pj < len(tkeys):
            steps.append((pi, pj))
        i, j = pi + 1, pj + 1
    out: list[tuple[int, int]] = []
    run: list[tuple[int | None, int | None]] = []

    def key_of(s: tuple[int | None, int | None]) -> Hashable:
        g, t = s
        if g is not None:
            return gkeys[g]
        assert t is not None
        return tkeys[t]

    def flush() -> None:
        gi = [s[0] for s in run if s[0] is not None]
        tj = [s[1] for s in run if s[1] is not None]
        matched = [(g, t) for g, t in run if g is not None and t is not None]
        if len(gi) != len(tj) and matched and len(gi) * len(tj) <= _MAX_RUN_CELLS:
            out.extend(_best_in_order(gi, tj, gstats, tstats))
        else:
            out.extend(matched)
        run.clear()

    for s in steps:
        if run and key_of(run[-1]) != key_of(s):
            flush()
        run.append(s)
    if run:
        flush()
    return out


def _best_in_order(
    gi: list[int],
    tj: list[int],
    gstats: Sequence[dict[tuple[str, int], float] | None],
    tstats: Sequence[dict[tuple[str, int], float] | None],
) -> list[tuple[int, int]]:
    """min(len) in-order pairs of `gi` and `tj` with the smallest total statistics distance (ties: earliest)."""
    n, m = len(gi), len(tj)
    inf = math.inf
    # cost[i][j]: best cost pairing gi[:i] with tj[:j] using min(i, j)... restricted to full pairing of the shorter
    short_g = n <= m
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    cost[0] = [0.0] * (m + 1) if short_g else [0.0] + [inf] * m
    for i in range(n + 1):
        if not short_g:
            cost[i][0] = 0.0
    cost[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            pair = cost[i - 1][j - 1] + _distance(gstats[gi[i - 1]], tstats[tj[j - 1]])
            skip = cost[i][j - 1] if short_g else cost[i - 1][j]
            cost[i][j] = min(pair, skip)
    out: list[tuple[int, int]] = []
    i, j = n, m
    while i > 0 and j > 0:
        pair = cost[i - 1][j - 1] + _distance(gstats[gi[i - 1]], tstats[tj[j - 1]])
        if cost[i][j] == pair:
            out.append((gi[i - 1], tj[j - 1]))
            i, j = i - 1, j - 1
        elif short_g:
            j -= 1
        else:
            i -= 1
    out.reverse()
    return out


def align_keys(
    gkeys: Sequence[Hashable],
    tkeys: Sequence[Hashable],
    gstats: Sequence[dict[tuple[str, int], float] | None],
    tstats: Sequence[dict[tuple[str, int], float] | None],
) -> list[tuple[int, int]]:
    """(golden position, test position) pairs of two ordered key sequences: their longest common subsequence, the
    extra one among equal keys next to an insertion picked by the statistics (`_refine_runs`)."""
    intern: dict[Hashable, int] = {}
    gk = [intern.setdefault(k, len(intern)) for k in gkeys]
    tk = [intern.setdefault(k, len(intern)) for k in tkeys]
    return _refine_runs(lcs_pairs(gk, tk), gk, tk, gstats, tstats)


def align_scope(g: StreamSide, t: StreamSide, gs: list[int], ts: list[int]) -> list[tuple[int, int, str]]:
    """(golden node, test node, how) pairs of two ordered sibling lists; how: `key`, `name` or `type`."""
    if not gs or not ts:
        return []
    pairs = align_keys(
        [g.key[n] for n in gs], [t.key[n] for n in ts], [g.stats.get(n) for n in gs], [t.stats.get(n) for n in ts]
    )
    out = [(gs[i], ts[j], "key") for i, j in pairs]
    # leftovers between two aligned nodes: identical names, then the same op types in the same order
    prev_i = prev_j = -1
    for i, j in [*pairs, (len(gs), len(ts))]:
        g_gap, t_gap = gs[prev_i + 1 : i], ts[prev_j + 1 : j]
        prev_i, prev_j = i, j
        if not g_gap or not t_gap:
            continue
        t_by_name = {t.name[x]: x for x in t_gap}
        used_g, used_t = set(), set()
        for x in g_gap:
            y = t_by_name.get(g.name[x])
            if y is not None and g.type[x] == t.type[y]:
                out.append((x, y, "name"))
                used_g.add(x)
                used_t.add(y)
        rest_g = [x for x in g_gap if x not in used_g]
        rest_t = [y for y in t_gap if y not in used_t]
        if rest_g and len(rest_g) == len(rest_t):
            if all((g.type[x], g.key[x][1]) == (t.type[y], t.key[y][1]) for x, y in zip(rest_g, rest_t)):
                out.extend((x, y, "type") for x, y in zip(rest_g, rest_t))
    return out
