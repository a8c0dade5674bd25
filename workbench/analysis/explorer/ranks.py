"""The ranks of a multi-rank comparison: which comparisons of a catalog are the ranks of one compare.

`wb compare` of multi-rank dumps stores one comparison per rank (`runs.rank` on the rank's run). Two
comparisons are ranks of the same compare when their rank sides come from the same dump (the rank folders
share a parent: `tensors/`, `torch_tensors/`, msprobe's `step*/`) and their single-rank sides are the same
dump. The app's rank selector steps through them; each entry carries the figures `wb compare` prints per rank.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

Rows = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


@dataclass(frozen=True, slots=True)
class RankEntry:
    """One rank's comparison and its figures."""

    cmp_id: int
    rank: int
    failed: int  # tensor pairs failing
    allreduce_failed: int  # failing all-reduce checks of the rank's test run
    culprit_rank: int | None  # the rank whose contribution explains them


def _side_key(path: str, is_rank: bool) -> str:
    return os.path.dirname(path.rstrip("/")) if is_rank else path


def rank_group(rows: Rows, cmp_id: int) -> list[RankEntry]:
    """The comparisons that are ranks of the same compare as `cmp_id`, by rank; [] when it is no rank."""
    try:
        found = rows(
            "SELECT c.cmp_id, coalesce(t.rank, g.rank), g.path, t.path, g.rank IS NOT NULL, t.rank IS NOT NULL "
            "FROM comparisons c JOIN runs g ON g.run_id = c.golden_run JOIN runs t ON t.run_id = c.test_run",
            [],
        )
    except duckdb.Error:  # a catalog made before ranks (no runs.rank): nothing to select
        return []
    keys = {
        int(r[0]): (_side_key(str(r[2]), bool(r[4])), _side_key(str(r[3]), bool(r[5])))
        for r in found
        if r[1] is not None
    }
    if cmp_id not in keys:
        return []
    rank_of = {int(r[0]): int(r[1]) for r in found if r[1] is not None}
    group = sorted((c for c, k in keys.items() if k == keys[cmp_id]), key=lambda c: (rank_of[c], -c))
    latest: dict[int, int] = {}  # a compare run twice: the newest comparison of each rank
    for c in group:
        latest[rank_of[c]] = max(latest.get(rank_of[c], c), c)
    if cmp_id != latest.get(rank_of[cmp_id]):
        latest[rank_of[cmp_id]] = cmp_id  # the comparison shown stays in its group
    ids = sorted(latest.values(), key=lambda c: rank_of[c])
    marks = ", ".join("?" for _ in ids)
    failed = {
        int(r[0]): int(r[1])
        for r in rows(
            f"SELECT cmp_id, count(*) FILTER (WHERE passed = false) FROM metrics WHERE cmp_id IN ({marks}) "
            "GROUP BY cmp_id",
            ids,
        )
    }
    checks = {
        int(r[0]): (int(r[1]), None if r[2] is None else int(r[2]))
        for r in rows(
            "SELECT c.cmp_id, count(*) FILTER (WHERE a.passed = false), "
            "min(a.culprit_rank) FILTER (WHERE a.passed = false) "
            f"FROM comparisons c JOIN allreduce_checks a ON a.run_id = c.test_run WHERE c.cmp_id IN ({marks}) "
            "GROUP BY c.cmp_id",
            ids,
        )
    }
    return [
        RankEntry(c, rank_of[c], failed.get(c, 0), checks.get(c, (0, None))[0], checks.get(c, (0, None))[1])
        for c in ids
    ]


def step(group: list[RankEntry], cmp_id: int, delta: int) -> RankEntry | None:
    """The rank `delta` steps from the one shown (wrapping); None when there is no other rank."""
    ids = [e.cmp_id for e in group]
    if len(ids) < 2 or cmp_id not in ids:
        return None
    return group[(ids.index(cmp_id) + delta) % len(ids)]
