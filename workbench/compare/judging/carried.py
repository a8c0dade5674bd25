"""The error a node's inputs carried in at a token, for the outputs more precise than the run (`judge.judge_carried`)
and what the app's detail pane says of them.

A float32 op of a bfloat16 run (RMSNorm's `pow`, `mean`, `rsqrt` and products) carries its inputs' bf16 error in a
tensor judged by float32's bounds: its output passes when it adds no error of its own (`judge.judge_pair`'s
`carried_in`). What it was fed is its compared inputs' largest relative euclidean distance at that token; a dump of
outputs only (msprobe's `data_mode: ["output"]`) has no inputs, and stands in for them as the born rule reads data
flow: the output of the op that completed last before it started, and where that op is itself more precise than the
run (a link of a chain of upcast ops: `pow`, `mean`, `rsqrt`), every output back along the chain to the last op in the
run's dtype, whose output was upcast: whichever of them it was fed, it was fed no more error than their largest.
An op that runs first at its token has no stand-in (its own dtype's bounds judge it).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workbench.compare.judging.dtypes import PRECISION, more_precise_than
from workbench.core.metrics import REL_EUCLID

if TYPE_CHECKING:
    import duckdb

_LAST = 1 << 30  # the place of a node the dump gives no execution order


@dataclass(frozen=True, slots=True)
class Carried:
    """What a node's inputs carried in at one token: a relative euclidean distance, and where it was read (said in
    the app's detail pane)."""

    rel_euclid: float
    source: str


def carried_errors(
    con: duckdb.DuckDBPyConnection, cmp_id: int, keys: Collection[tuple[int, int]], run_dtype: str | None
) -> dict[tuple[int, int], Carried]:
    """(token, golden node) -> what its inputs carried in, for those of `keys` where it is known: its compared
    inputs' largest relative euclidean distance, else the stand-in (see the module docstring)."""
    from workbench.catalog.store import int_column, registered

    if not keys:
        return {}
    wanted = {"token_id": int_column([t for t, _ in keys]), "node_id": int_column([n for _, n in keys])}
    with registered(con, "_carried_keys", wanted):
        found = {
            (int(t), int(n)): Carried(float(e), "its inputs' largest")
            for t, n, e in con.execute(
                f"SELECT m.token_id, m.golden_node_id, max(x.{REL_EUCLID}) FROM matches m "
                "JOIN metrics x USING (cmp_id, pair_id) "
                "JOIN _carried_keys k ON k.token_id = m.token_id AND k.node_id = m.golden_node_id "
                f"WHERE m.cmp_id = ? AND m.io = 'in' AND x.{REL_EUCLID} IS NOT NULL GROUP BY 1, 2",
                [cmp_id],
            ).fetchall()
        }
    missing = [k for k in keys if k not in found]
    if missing:
        found.update(_stand_ins(con, cmp_id, missing, run_dtype))
    return found


@dataclass(frozen=True, slots=True)
class _Done:
    end: int
    start: int
    node: int
    name: str
    rel_euclid: float
    in_chain: bool  # every output of it more precise than the run, or not floating: a link of a chain of upcast ops


_TOKENS_AT_ONCE = 64  # the outputs of this many tokens are held at once (a 1,000-token dump of 1,900 ops a token)


def _stand_ins(
    con: duckdb.DuckDBPyConnection, cmp_id: int, keys: list[tuple[int, int]], run_dtype: str | None
) -> dict[tuple[int, int], Carried]:
    starts = {
        int(n): _LAST if s is None else int(s)
        for n, s in con.execute(
            "SELECT n.node_id, n.exec_order FROM nodes n JOIN comparisons c ON n.run_id = c.golden_run "
            "WHERE c.cmp_id = ?",
            [cmp_id],
        ).fetchall()
    }
    by_token: dict[int, list[int]] = defaultdict(list)
    for tok, node in keys:
        by_token[tok].append(node)
    tokens = sorted(by_token)
    out: dict[tuple[int, int], Carried] = {}
    for at in range(0, len(tokens), _TOKENS_AT_ONCE):
        chunk = tokens[at : at + _TOKENS_AT_ONCE]
        for tok, items in _outputs_in_order(con, cmp_id, chunk, run_dtype).items():
            ends = [(d.end, d.start, d.node) for d in items]
            for node in by_token[tok]:
                k = bisect.bisect_left(ends, (starts.get(node, _LAST), -1, -1)) - 1
                if k >= 0:
                    out[(tok, node)] = _along_the_chain(items, k)
    return out


def _outputs_in_order(
    con: duckdb.DuckDBPyConnection, cmp_id: int, tokens: list[int], run_dtype: str | None
) -> dict[int, list[_Done]]:
    """Per token, the compared outputs in the order their ops completed."""
    from workbench.catalog.store import int_column, registered

    with registered(con, "_carried_tokens", {"token_id": int_column(tokens)}):
        rows = con.execute(
            f"SELECT m.token_id, n.node_id, n.exec_order, n.end_order, n.name, max(x.{REL_EUCLID}), "
            "bool_and(list_contains(?, tt.dtype) OR NOT list_contains(?, tt.dtype)) "
            "FROM matches m JOIN metrics x USING (cmp_id, pair_id) JOIN comparisons c USING (cmp_id) "
            "JOIN _carried_tokens k ON k.token_id = m.token_id "
            "JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = m.golden_node_id "
            "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
            f"WHERE m.cmp_id = ? AND m.io = 'out' AND x.{REL_EUCLID} IS NOT NULL GROUP BY 1, 2, 3, 4, 5",
            [more_precise_than(run_dtype), list(PRECISION), cmp_id],
        ).fetchall()
    done: dict[int, list[_Done]] = defaultdict(list)
    for tok, node, start, end, name, rel, in_chain in rows:
        at = _LAST if start is None else int(start)
        finish = at if end is None else int(end)
        done[int(tok)].append(_Done(finish, at, int(node), str(name), float(rel), bool(in_chain)))
    for items in done.values():
        items.sort(key=lambda d: (d.end, d.start, d.node))
    return done


def _along_the_chain(items: list[_Done], k: int) -> Carried:
    """What the op after `items[k]` was fed: that output, and back along a chain of upcast ops to its source."""
    chain = [items[k]]
    while chain[-1].in_chain and k > 0:
        k -= 1
        chain.append(items[k])
    worst = max(chain, key=lambda d: d.rel_euclid)
    if len(chain) == 1:
        return Carried(worst.rel_euclid, f"no input dumped: the output of {worst.name} before it")
    return Carried(
        worst.rel_euclid, f"no input dumped: the largest output from {chain[-1].name} to {chain[0].name} before it"
    )
