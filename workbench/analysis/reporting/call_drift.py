"""Calls a test run makes at some tokens and not at others: where names numbered by their kind stop pairing alike.

msprobe names a torch call by a counter of its kind within a step (`Tensor.__mul__.23.forward`), msit numbers repeated
calls likewise: one call the test run makes only at decode steps (a cast, a cache write on a decode-only path) renames
every later call of its kind at those tokens. The call-stream alignment pairs nodes by their first token's calls, so
a difference present from the first token is paired around; one that appears later is not, and names then pair
different calls there. `call_count_drift` finds such kinds and tokens from what both runs dumped.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import numpy as np

from workbench.compare.pairing.frames import RunFrames
from workbench.core.tokens import token_text

if TYPE_CHECKING:
    import duckdb

_SHOWN = 3  # kinds named in full; the rest counted
_FLAGS_MAX = 1 << 26  # (token, node) keys flagged in an array up to this many (64 MB), sorted beyond


def _calls_per_token(run: RunFrames) -> dict[tuple[int, str], int]:
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


def call_count_drift(golden: RunFrames, test: RunFrames) -> list[str]:
    """One line per kind of call both runs make whose count differs between them at some tokens by another amount
    than at the first token both runs dumped (the last line counts the kinds past the first few). Only between dumps
    of one kind: a torch module and an ATB op never pair by name."""
    if golden.kind != test.kind:
        return []
    g, t = _calls_per_token(golden), _calls_per_token(test)
    tokens = sorted({tok for tok, _ in g} & {tok for tok, _ in t})
    if len(tokens) < 2:
        return []
    kinds = sorted({k for _, k in g} & {k for _, k in t})
    lines: list[str] = []
    for kind in kinds:
        diff = {tok: t.get((tok, kind), 0) - g.get((tok, kind), 0) for tok in tokens}
        first = diff[tokens[0]]
        drifted = [tok for tok in tokens[1:] if diff[tok] != first]
        if not drifted:
            continue
        by_amount: dict[int, list[int]] = defaultdict(list)
        for tok in drifted:
            by_amount[diff[tok]].append(tok)
        said = "; ".join(
            f"at token{'s' if len(toks) > 1 else ''} {token_text(toks)}: {_count(d)}" for d, toks in by_amount.items()
        )
        lines.append(
            f"{kind} calls, test against golden run, {said} (at token {tokens[0]}: {_count(first)}): calls numbered "
            "by their kind are renamed past the difference, so at those tokens such pairs may compare different calls"
        )
    if len(lines) > _SHOWN:
        lines = [*lines[:_SHOWN], f"... and {len(lines) - _SHOWN} more kinds of call"]
    return lines


def _count(diff: int) -> str:
    return "as many" if diff == 0 else f"{abs(diff)} {'more' if diff > 0 else 'fewer'}"


def store_call_drift(con: duckdb.DuckDBPyConnection, cmp_id: int, lines: list[str]) -> None:
    """Replace the comparison's rows of `call_drift` with `lines` (`call_count_drift`'s), in their order."""
    con.execute("DELETE FROM call_drift WHERE cmp_id = ?", [cmp_id])
    if lines:
        con.executemany("INSERT INTO call_drift VALUES (?, ?, ?)", [[cmp_id, i, line] for i, line in enumerate(lines)])
