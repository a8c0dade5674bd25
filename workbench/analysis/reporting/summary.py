"""What one comparison found, read back from the catalog: the numbers `wb compare` prints and the app opens on."""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from workbench.analysis.verdicts.born import inputs_unchecked
from workbench.analysis.verdicts.causes import CAUSE_LEAD, cause_in
from workbench.catalog import first_row
from workbench.catalog.lookup import InsideOrigin, has_statistics_only_pairs, highest_inside
from workbench.catalog.store import registered
from workbench.compare.pairing.fingerprint import MappingCheck
from workbench.compare.pairing.frames import RunFrames, TensorPairs
from workbench.compare.pairing.matching import NodeMatch
from workbench.core.advice import STANDS_OUT
from workbench.formats.overwrites import overwritten_target_sql
from workbench.formats.quant_links import quant_links


@dataclass(frozen=True, slots=True)
class Origin:
    """The root-cause advisor's most likely origin of a token's error (rank 1 of the `advice` table)."""

    golden_node: str
    test_node: str | None
    score: float
    reason: str
    evidence: str | None = None
    stands_out: bool = False  # the score says it stands out of its peers' noise


@dataclass(slots=True)
class CompareResult:
    """The outcome of one compare call (see `summarize_comparison`)."""

    cmp_id: int
    catalog: Path
    golden_run: int
    test_run: int
    pairs: int = 0  # tensor pairs in this comparison (selected tokens)
    computed: int = 0  # pairs computed by this call
    skipped: int = 0  # pairs already in the catalog
    failed: int = 0
    uncomparable: int = 0  # pairs with no metrics (unreadable file, shape mismatch, ...)
    not_judged: int = 0  # what an in-place call overwrites, before the write (`overwrites.NOT_JUDGED`)
    shape_mismatch: int = 0  # pairs whose element counts differ
    on_statistics: int = 0  # pairs judged on statistics only (a side kept max/min/mean/norm, no tensor)
    unmatched_golden: int = 0
    unmatched_test: int = 0
    golden_nodes: int = 0
    test_nodes: int = 0
    born: dict[int, str | None] = field(default_factory=dict)
    born_test: dict[int, str | None] = field(default_factory=dict)
    born_evidence: dict[int, str] = field(default_factory=dict)
    born_score: dict[int, float] = field(default_factory=dict)  # token -> the advisor's score of its born op
    # token -> the op the advisor scores highest inside the born op (a module whose child op adds its error)
    born_inside: dict[int, InsideOrigin] = field(default_factory=dict)
    born_inputs_unchecked: set[int] = field(default_factory=set)  # tokens whose born op had no input judged
    origins: dict[int, Origin] = field(default_factory=dict)  # the advisor's first op per token
    # ops standing out whose error a known cause explains: golden name -> (the cause, the tokens)
    explained: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    first_failing_token: int | None = None
    problems: list[str] = field(default_factory=list)
    coverage: dict[str, Any] = field(default_factory=dict)
    mapping_check: MappingCheck | None = None  # the mapping file's pairs held against these dumps
    quantized: bool = False  # the test run declares quantized linears (`formats/quant_links.py`)
    call_drift: list[str] = field(default_factory=list)  # calls made at some tokens only (`drift_lines`)


def _judged_on_statistics(con: duckdb.DuckDBPyConnection, cmp_id: int) -> int:
    """Pairs of comparison `cmp_id` among `_ids` judged on statistics: a side has no tensor file
    (`comparison.on_statistics`)."""
    row = first_row(
        con.execute(
            "SELECT count(*) FROM metrics x JOIN matches m USING (cmp_id, pair_id) JOIN comparisons c USING (cmp_id) "
            "JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id "
            "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
            "WHERE x.cmp_id = ? AND x.pair_id IN (SELECT pair_id FROM _ids) AND x.passed IS NOT NULL "
            "AND (gt.path IS NULL OR tt.path IS NULL)",
            [cmp_id],
        )
    )
    return int(row[0]) if row else 0


def _category(op_type: str) -> str | None:
    t = op_type.lower()
    for cat, needles in (
        ("norm", ("norm",)),
        ("attention", ("attention",)),
        ("mlp", ("mlp", "feedforward")),
        ("linear", ("linear",)),
    ):
        if any(n in t for n in needles):
            return cat
    return None


def node_coverage(golden: RunFrames, test: RunFrames, matches: list[NodeMatch], pairs: TensorPairs) -> dict[str, Any]:
    """How many nodes of each side have a pair, by matching method and by module category."""
    g_with = set(np.unique(golden.tensors.node_id).tolist())
    t_with = set(np.unique(test.tensors.node_id).tolist())
    g_matched = {m.golden_node_id for m in matches} & g_with
    t_matched = {m.test_node_id for m in matches} & t_with
    by_method: dict[str, int] = {}
    seen: set[tuple[int, int]] = set()
    for m in matches:  # node pairs, each once (a fused q/k/v pair is matched once per tensor selection)
        if (m.golden_node_id, m.test_node_id) in seen:
            continue
        seen.add((m.golden_node_id, m.test_node_id))
        by_method[m.method.split(":")[0]] = by_method.get(m.method.split(":")[0], 0) + 1
    # the modules a port is judged on: Linear, norm, attention and MLP blocks of the golden model
    categories: dict[str, list[int]] = {}
    for nid, typ in zip(golden.nodes.node_id.tolist(), golden.nodes.type):
        cat = _category(typ or "")
        if cat and nid in g_with:
            categories.setdefault(cat, [0, 0])
            categories[cat][1] += 1
            categories[cat][0] += nid in g_matched
    return {
        "golden_nodes": len(g_with),
        "golden_matched": len(g_matched),
        "categories": categories,
        "test_nodes": len(t_with),
        "test_matched": len(t_matched),
        "by_method": by_method,
        "tensor_pairs": len(pairs),
    }


def _overwritten_unjudged(con: duckdb.DuckDBPyConnection, cmp_id: int) -> int:
    """How many of the pairs in `_ids` are unjudged targets of an in-place write (`overwrites.overwritten_target`)."""
    row = first_row(
        con.execute(
            "SELECT count(*) FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
            "JOIN comparisons c USING (cmp_id) "
            "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
            "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
            "WHERE x.cmp_id = ? AND x.passed IS NULL AND x.pair_id IN (SELECT pair_id FROM _ids) "
            f"AND {overwritten_target_sql('gn.type', 'm.io', 'tt.idx')}",
            [cmp_id],
        )
    )
    return int(row[0]) if row else 0


def summarize_comparison(
    con: duckdb.DuckDBPyConnection,
    catalog: Path,
    cmp_id: int,
    golden: RunFrames,
    test: RunFrames,
    matches: list[NodeMatch],
    pairs: TensorPairs,
    tokens: Collection[int] | None,
    *,
    computed: int = 0,
    problems: list[str] | None = None,
    call_drift: Collection[str] = (),
) -> CompareResult:
    """The numbers `wb compare` prints, read back from the catalog (`call_drift`: the lines of
    `call_drift.drift_lines`, as stored)."""
    with registered(con, "_ids", {"pair_id": pairs.pair_id}):
        row = first_row(
            con.execute(
                "SELECT count(*), count(*) FILTER (WHERE passed = false), "
                "count(*) FILTER (WHERE passed IS NULL), "
                "count(*) FILTER (WHERE cmp_fail_reason LIKE 'data shape doesn''t match%' "
                "OR (cmp_fail_reason LIKE 'not comparable%' "
                "AND cmp_fail_reason NOT LIKE 'not comparable on statistics%')) "
                "FROM metrics "
                "WHERE cmp_id = ? AND pair_id IN (SELECT pair_id FROM _ids)",
                [cmp_id],
            )
        )
        on_statistics = _judged_on_statistics(con, cmp_id) if has_statistics_only_pairs(con, cmp_id) else 0
        not_judged = _overwritten_unjudged(con, cmp_id) if row is not None and row[2] else 0
    assert row is not None
    cov = node_coverage(golden, test, matches, pairs)
    res = CompareResult(
        cmp_id=cmp_id,
        catalog=catalog,
        golden_run=golden.run_id,
        test_run=test.run_id,
        pairs=len(pairs),
        computed=computed,
        skipped=len(pairs) - computed,
        failed=int(row[1]),
        uncomparable=int(row[2]) - not_judged,
        not_judged=not_judged,
        shape_mismatch=int(row[3]),
        on_statistics=on_statistics,
        unmatched_golden=cov["golden_nodes"] - cov["golden_matched"],
        unmatched_test=cov["test_nodes"] - cov["test_matched"],
        golden_nodes=cov["golden_nodes"],
        test_nodes=cov["test_nodes"],
        problems=list(problems or []),
        coverage=cov,
        call_drift=list(call_drift),
    )
    tok_filter = "" if tokens is None else f" AND b.token_id IN ({','.join(str(int(t)) for t in sorted(tokens))})"
    born_nodes: dict[int, int] = {}
    for tok, gid, gname, tname, why in con.execute(
        "SELECT b.token_id, b.golden_node_id, gn.name, tn.name, b.evidence FROM error_born b "
        "JOIN comparisons c USING (cmp_id) "
        "LEFT JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = b.golden_node_id "
        "LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = b.test_node_id "
        f"WHERE b.cmp_id = ?{tok_filter} ORDER BY b.token_id",
        [cmp_id],
    ).fetchall():
        res.born[int(tok)] = gname
        res.born_test[int(tok)] = tname
        if gid is not None:
            born_nodes[int(tok)] = int(gid)
        if why:
            res.born_evidence[int(tok)] = why
    for tok, score in con.execute(
        "SELECT b.token_id, a.score FROM error_born b JOIN advice a ON a.cmp_id = b.cmp_id "
        f"AND a.token_id = b.token_id AND a.golden_node_id = b.golden_node_id WHERE b.cmp_id = ?{tok_filter}",
        [cmp_id],
    ).fetchall():
        res.born_score[int(tok)] = float(score)
    res.born_inside = highest_inside(con, cmp_id, born_nodes)
    res.born_inputs_unchecked = inputs_unchecked(con, cmp_id, born_nodes)
    for tok, gname, tname, score, reason, why in con.execute(
        "SELECT a.token_id, gn.name, tn.name, a.score, a.reason, a.evidence FROM advice a "
        "JOIN comparisons c USING (cmp_id) JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = a.golden_node_id "
        "LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = a.test_node_id "
        f"WHERE a.cmp_id = ? AND a.rank = 1{tok_filter.replace('b.', 'a.')} ORDER BY a.token_id",
        [cmp_id],
    ).fetchall():
        res.origins[int(tok)] = Origin(
            str(gname), None if tname is None else str(tname), float(score), str(reason), why, score >= STANDS_OUT
        )
    for tok, gname, reason in con.execute(
        "SELECT a.token_id, gn.name, a.reason FROM advice a JOIN comparisons c USING (cmp_id) "
        "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = a.golden_node_id "
        f"WHERE a.cmp_id = ? AND a.score >= ? AND contains(a.reason, ?){tok_filter.replace('b.', 'a.')} "
        "ORDER BY a.token_id, a.rank",
        [cmp_id, STANDS_OUT, "; " + CAUSE_LEAD],
    ).fetchall():
        cause = cause_in(str(reason))
        if cause:
            res.explained.setdefault(str(gname), (cause, []))[1].append(int(tok))
    first = next((t for t, n in sorted(res.born.items()) if n is not None), None)
    res.first_failing_token = first
    meta = first_row(
        con.execute(
            "SELECT r.meta FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?", [cmp_id]
        )
    )
    res.quantized = _is_quantized(None if meta is None else meta[0])
    if res.quantized:  # judged by its int8 noise, not the float thresholds: the first token whose origin stands out
        res.first_failing_token = next((t for t, o in sorted(res.origins.items()) if o.stands_out), None)
    return res


def _is_quantized(meta: object) -> bool:
    try:
        parsed = json.loads(meta) if isinstance(meta, str) else meta
        return isinstance(parsed, dict) and bool(quant_links(parsed)[1])
    except ValueError:
        return False
