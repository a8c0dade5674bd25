"""Fallback layers: which quantized linears to keep in float, by the gain in the final output's error.

Per token, each quantized linear `i` adds `a_i = sqrt(out_i^2 - in_i^2)` (relative errors of its float output
and input against the golden run); the final output (the golden run's last op, the logits) carries `E`.
Independent errors add in quadrature and a layer's error reaches the output amplified by a common factor `g`
(`g^2 = E^2 / sum a_i^2`), so keeping a set `S` in float leaves `sqrt(E^2 - g^2 sum_S a_i^2)`. The linears are
taken greedily by `a_i` (averaged over tokens); each one's estimated gain is what it removes from `E`.
The quantized linears are the manifest's `quant.linears` (`formats/quant_links.py`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass

import duckdb

from workbench.catalog import first_row
from workbench.formats.quant_links import quant_links


@dataclass(frozen=True, slots=True)
class Fallback:
    """One recommended linear: its rank, what it adds, and the final error before and after keeping it float."""

    rank: int
    linear: str
    added: float  # mean over tokens of the relative error it adds
    gain: float  # estimated drop of the final output's relative error from keeping it (and those above) in float
    final_before: float
    final_after: float
    golden_node_id: int = -1  # the linear's golden node


_ERR = """
SELECT m.token_id, gn.name, m.io,
       max(coalesce(x.relative_euclidean_distance,
                    CASE WHEN x.cosine_similarity IS NOT NULL
                         THEN sqrt(greatest(0.0, 2.0 * (1.0 - x.cosine_similarity))) END)) AS err
FROM matches m
JOIN comparisons c ON c.cmp_id = m.cmp_id
JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id
JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
WHERE m.cmp_id = ? AND m.method <> 'quant'
GROUP BY 1, 2, 3
"""


def quantized_linears(con: duckdb.DuckDBPyConnection, cmp_id: int) -> list[str]:
    """The quantized linears the test run of `cmp_id` declares (empty for a run that is not quantized)."""
    row = first_row(
        con.execute(
            "SELECT r.meta FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?", [cmp_id]
        )
    )
    if row is None or row[0] is None:
        return []
    meta = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    try:
        return [lin.name for lin in quant_links(meta)[1]] if isinstance(meta, dict) else []
    except ValueError:
        return []


def demo_recipe(con: duckdb.DuckDBPyConnection, cmp_id: int) -> tuple[str, str | None] | None:
    """(scheme, defect) when the test run of `cmp_id` is `wb demo --stack quant`'s (recorded in its manifest's
    `quant.demo`), else None. Only names: the caller checks them against the demo's own registry."""
    row = first_row(
        con.execute(
            "SELECT r.meta FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?", [cmp_id]
        )
    )
    meta = json.loads(row[0]) if row is not None and isinstance(row[0], str) else None
    demo = meta.get("quant", {}).get("demo") if isinstance(meta, dict) and isinstance(meta.get("quant"), dict) else None
    if not isinstance(demo, dict) or not isinstance(demo.get("scheme"), str):
        return None
    defect = demo.get("defect")
    return str(demo["scheme"]), None if defect is None else str(defect)


def fallback(con: duckdb.DuckDBPyConnection, cmp_id: int, k: int) -> list[Fallback]:
    """The `k` quantized linears of comparison `cmp_id` whose keeping in float gains most (best first).

    ValueError when the test run declares no quantized linear or no final output was compared."""
    if k < 1:
        raise ValueError(f"--fallback {k}: expected 1 or more")
    linears = quantized_linears(con, cmp_id)
    if not linears:
        raise ValueError(f"comparison {cmp_id}: its test run declares no quantized linear (no 'quant' manifest entry)")
    last = first_row(
        con.execute(
            "SELECT gn.name FROM matches m JOIN comparisons c ON c.cmp_id = m.cmp_id "
            "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
            "WHERE m.cmp_id = ? AND m.io = 'out' AND m.method <> 'quant' "
            "ORDER BY gn.end_order DESC NULLS LAST, gn.depth LIMIT 1",
            [cmp_id],
        )
    )
    if last is None:
        raise ValueError(f"comparison {cmp_id}: no compared output to judge the final error by")
    node_ids = {
        str(n): int(i)
        for n, i in con.execute(
            "SELECT n.name, n.node_id FROM nodes n JOIN comparisons c ON c.golden_run = n.run_id WHERE c.cmp_id = ?",
            [cmp_id],
        ).fetchall()
    }
    err: dict[tuple[int, str, str], float] = {
        (int(t), str(n), str(io)): float(e) for t, n, io, e in con.execute(_ERR, [cmp_id]).fetchall() if e is not None
    }
    tokens = sorted({t for t, n, io in err if n == last[0] and io == "out"})
    names = set(linears)
    added: dict[str, list[float]] = defaultdict(list)
    finals: list[float] = []
    per_tok: list[dict[str, float]] = []
    for tok in tokens:
        here: dict[str, float] = {}
        for name in names:
            o, i = err.get((tok, name, "out")), err.get((tok, name, "in"), 0.0)
            if o is not None:
                here[name] = math.sqrt(max(o * o - i * i, 0.0))
                added[name].append(here[name])
        finals.append(err[(tok, str(last[0]), "out")])
        per_tok.append(here)
    order = sorted(added, key=lambda n: (-sum(added[n]) / len(added[n]), n))[:k]
    out: list[Fallback] = []
    before = sum(finals) / len(finals)
    kept: list[str] = []
    prev = before
    for rank, name in enumerate(order, start=1):
        kept.append(name)
        after = sum(_after(e, here, kept) for e, here in zip(finals, per_tok)) / len(finals)
        mean = sum(added[name]) / len(added[name])
        out.append(Fallback(rank, name, mean, prev - after, before, after, node_ids.get(name, -1)))
        prev = after
    return out


def _after(final: float, added: dict[str, float], kept: list[str]) -> float:
    total = sum(a * a for a in added.values())
    if total <= 0:
        return final
    g2 = final * final / total
    return math.sqrt(max(final * final - g2 * sum(added.get(n, 0.0) ** 2 for n in kept), 0.0))
