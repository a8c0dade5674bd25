"""Calls a test run makes at some tokens and not at others, paired again at those tokens.

msprobe names a torch call by a counter of its kind within a step (`Tensor.__mul__.23.forward`), msit numbers repeated
calls likewise: one call the test run makes only at decode steps (a cast, a product on a decode-only path) renames
every later call of its kind at those tokens. The nodes are paired once, by the first token's calls
(`align`, `matching`): a difference present from the first token is paired around, one that appears later is not,
and names then pair different calls there.

`call_drifts` finds such kinds and tokens from what both runs dumped: the number of nodes of a kind holding a tensor
at a token, test against golden, against that difference at the first token both runs dumped. `realign_drifted`
pairs the calls of each such kind again at each such token: both runs' calls of the kind in their order at that
token (the order their tensors were read in), aligned by the shapes of their tensors there and, among calls of equal
shapes, by their statistics (`align.align_keys`); their tensors are paired by that alignment instead of by the
first token's. Pairs a mapping file or the editor made are left as they are.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from workbench.compare.pairing.align import Shapes, align_keys, first_token_tensors
from workbench.compare.pairing.frames import RunFrames, TensorPairs

# the pairs the automatic matching made (re-paired at a drifting token); a mapping's or the editor's are the user's
AUTOMATIC_METHODS = frozenset({"name", "aligned"})
REALIGNED = "aligned at token"  # the method of a pair made here
_FLAGS_MAX = 1 << 26  # (token, node) keys flagged in an array up to this many (64 MB), sorted beyond


@dataclass(frozen=True, slots=True)
class CallDrift:
    """A kind of call whose count, test against golden run, differs at some tokens from its difference at the first
    token both runs dumped."""

    kind: str
    first_token: int
    first_difference: int  # test minus golden calls at the first token
    by_difference: dict[int, list[int]]  # another difference -> the tokens where the count differs by it

    @property
    def tokens(self) -> list[int]:
        return sorted(t for toks in self.by_difference.values() for t in toks)


def calls_per_token(run: RunFrames) -> dict[tuple[int, str], int]:
    """(token, node type) -> how many nodes of that type hold a tensor at that token."""
    t = run.tensors
    if len(t.node_id) == 0:
        return {}
    kinds = sorted({k for k in run.nodes.type if k})
    code_of = {k: i for i, k in enumerate(kinds)}
    nodes = run.nodes.node_id
    codes = np.full(int(max(int(nodes.max(initial=0)), int(t.node_id.max())) + 1), -1, dtype=np.int64)
    codes[nodes] = [code_of[k] if k else -1 for k in run.nodes.type]
    span = int(t.node_id.max()) + 1
    key = t.token_id.astype(np.int64) * span + t.node_id
    size = int(key.max()) + 1
    if size <= _FLAGS_MAX:  # each (token, node) once: a flag per key, no sort (~10 ms at 2M tensors)
        flags = np.zeros(size, dtype=np.bool_)
        flags[key] = True
        seen = np.flatnonzero(flags)
    else:
        seen = np.unique(key)
    token, node = np.divmod(seen, span)
    kind = codes[node]
    keep = kind >= 0
    per_kind = np.bincount(token[keep] * len(kinds) + kind[keep])  # (token, kind) keys: tokens x kinds at most
    keys = np.flatnonzero(per_kind)
    return {(int(k // len(kinds)), kinds[int(k % len(kinds))]): int(per_kind[k]) for k in keys}


def call_drifts(golden: RunFrames, test: RunFrames, compared: Collection[int] | None = None) -> list[CallDrift]:
    """The kinds of call both runs make whose count differs between them at some tokens by another amount than at the
    first token both runs dumped, by kind; with `compared`, only at those tokens. Only between dumps of one kind: a
    torch module and an ATB op never pair by name."""
    if golden.kind != test.kind:
        return []
    g, t = calls_per_token(golden), calls_per_token(test)
    tokens = sorted({tok for tok, _ in g} & {tok for tok, _ in t})
    if len(tokens) < 2:
        return []
    out: list[CallDrift] = []
    for kind in sorted({k for _, k in g} & {k for _, k in t}):
        diff = {tok: t.get((tok, kind), 0) - g.get((tok, kind), 0) for tok in tokens}
        first = diff[tokens[0]]
        by_difference: dict[int, list[int]] = defaultdict(list)
        for tok in tokens[1:]:
            if diff[tok] != first and (compared is None or tok in compared):
                by_difference[diff[tok]].append(tok)
        if by_difference:
            out.append(CallDrift(kind, tokens[0], first, dict(by_difference)))
    return out


def realign_drifted(
    pairs: TensorPairs,
    golden: RunFrames,
    test: RunFrames,
    drifts: list[CallDrift],
) -> tuple[TensorPairs, dict[str, list[int]]]:
    """`pairs` with the automatic pairs of each drifting kind's calls at its drifting tokens replaced by the pairs of
    their alignment at that token (see the module docstring), and the tokens re-paired, by kind. A quantized test run
    is left as it is (its int tensors pair through their scales, not by name)."""
    if not drifts or not len(pairs) or test.quant:
        return pairs, {}
    from workbench.compare.pairing.matching import NodeMatch, pair_tensors

    automatic = np.fromiter((m in AUTOMATIC_METHODS for m in pairs.method), dtype=np.bool_, count=len(pairs))
    drop = np.zeros(len(pairs), dtype=np.bool_)
    added: list[TensorPairs] = []
    realigned: dict[str, list[int]] = {}
    for drift in drifts:
        g_of_kind, t_of_kind = _nodes_of(golden, drift.kind), _nodes_of(test, drift.kind)
        # each row set filtered once by kind, then by token (a run with hundreds of decode tokens)
        of_kind = np.flatnonzero(np.isin(pairs.golden_node_id, g_of_kind) | np.isin(pairs.test_node_id, t_of_kind))
        g_rows = np.flatnonzero(np.isin(golden.tensors.node_id, g_of_kind))
        t_rows = np.flatnonzero(np.isin(test.tensors.node_id, t_of_kind))
        for tok in drift.tokens:
            here = of_kind[pairs.token_id[of_kind] == tok]
            auto = here[automatic[here]]
            # the calls a mapping or the editor paired at this token stay theirs
            users = here[~automatic[here]]
            g_taken, t_taken = set(pairs.golden_node_id[users].tolist()), set(pairs.test_node_id[users].tolist())
            g_at, t_at = _calls_at(golden, g_rows, tok), _calls_at(test, t_rows, tok)
            g_ids = [n for n in g_at.order if n not in g_taken]
            t_ids = [n for n in t_at.order if n not in t_taken]
            matched = align_keys(
                [g_at.key[n] for n in g_ids],
                [t_at.key[n] for n in t_ids],
                [g_at.stats.get(n) for n in g_ids],
                [t_at.stats.get(n) for n in t_ids],
            )
            aligned = {(g_ids[i], t_ids[j]) for i, j in matched}
            # a pair the first token's matching made that the alignment at this token keeps stays as it is
            old = list(zip(pairs.golden_node_id[auto].tolist(), pairs.test_node_id[auto].tolist()))
            keep = np.asarray([pair in aligned for pair in old], dtype=np.bool_)
            drop[auto[~keep]] = True
            why = f"{drift.kind} calls aligned again at token {tok}: their count there differs from the first token's"
            matches = [NodeMatch(g, t, REALIGNED, 0.9, why) for g, t in sorted(aligned - set(old))]
            g_frames = dataclasses.replace(golden, tensors=golden.tensors.take(g_at.rows))
            t_frames = dataclasses.replace(test, tensors=test.tensors.take(t_at.rows))
            added.append(pair_tensors(matches, g_frames, t_frames))
            realigned.setdefault(drift.kind, []).append(tok)
    if not realigned:
        return pairs, {}
    return _merged(pairs, drop, added), realigned


@dataclass(slots=True)
class _Calls:
    """One run's calls of one kind at one token: in their order there, each one's alignment key and statistics."""

    rows: np.ndarray  # the run's tensor rows of those calls at that token
    order: list[int]  # node ids, in the order their tensors were read at that token
    key: dict[int, Shapes]
    stats: dict[int, dict[tuple[str, int], float]]


def _nodes_of(run: RunFrames, kind: str) -> np.ndarray:
    """The ids of the run's nodes of type `kind`."""
    return np.asarray([n for n, k in zip(run.nodes.node_id.tolist(), run.nodes.type) if k == kind], dtype=np.int64)


def _calls_at(run: RunFrames, kind_rows: np.ndarray, token: int) -> _Calls:
    """One run's calls of a kind at `token` (`kind_rows`: the rows of its tensors of that kind, every token)."""
    t = run.tensors
    rows = kind_rows[t.token_id[kind_rows] == token]
    first_read: dict[int, int] = {}
    for nid, tid in zip(t.node_id[rows].tolist(), t.tensor_id[rows].tolist()):
        first_read[nid] = min(first_read.get(nid, tid), tid)
    order = sorted(first_read, key=lambda n: (first_read[n], n))
    shapes, stats = first_token_tensors(t.take(rows), set())  # one token here: its shapes and statistics
    return _Calls(rows, order, shapes, stats)


def _merged(pairs: TensorPairs, drop: np.ndarray, added: list[TensorPairs]) -> TensorPairs:
    """`pairs` without the rows `drop` marks, each new pair where the dropped pair of its golden tensor stood (the
    others after them)."""
    new = [p for p in added if len(p)]
    if not new:
        return pairs.take(~drop)
    fresh = TensorPairs.concat(new)
    at_golden = {g: i for i, g in enumerate(fresh.golden_tensor_id.tolist())}
    order: list[tuple[str, int]] = []
    placed: set[int] = set()
    for i, (dropped, g) in enumerate(zip(drop.tolist(), pairs.golden_tensor_id.tolist())):
        if not dropped:
            order.append(("old", i))
        elif (j := at_golden.get(g)) is not None and j not in placed:
            order.append(("new", j))
            placed.add(j)
    order += [("new", j) for j in range(len(fresh)) if j not in placed]
    both = TensorPairs.concat([pairs, fresh])
    rows = np.asarray([i if src == "old" else len(pairs) + i for src, i in order], dtype=np.int64)
    return both.take(rows)
