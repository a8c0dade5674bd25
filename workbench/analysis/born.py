"""Where the error is born: per-node roll-ups and the per-token verdict.

A node *gives birth* to the error at a token when one of its outputs fails while all its
inputs pass. The verdict for a token is the earliest such node in execution order, taking
the deepest one: a parent module is never named when one of its children qualifies
(the child is where the error actually appears).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import duckdb

from workbench.catalog import first_row
from workbench.formats.atb import op_folder_of

NODE_RESULTS_SQL = """
INSERT INTO node_results
SELECT
    m.cmp_id,
    m.token_id,
    m.golden_node_id,
    arg_min(m.test_node_id, m.pair_id)                                       AS test_node_id,
    count(*) FILTER (WHERE m.io = 'out')                                     AS out_pairs,
    count(*) FILTER (WHERE m.io = 'out' AND x.passed = false)                AS out_failed,
    count(*) FILTER (WHERE m.io = 'in')                                      AS in_pairs,
    count(*) FILTER (WHERE m.io = 'in' AND x.passed = false)                 AS in_failed,
    min(x.cosine_similarity) FILTER (WHERE m.io = 'out')                     AS min_cosine,
    max(x.kl_divergence) FILTER (WHERE m.io = 'out')                         AS max_kl,
    max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'out')           AS max_rel_euclid,
    max(x.max_absolute_error) FILTER (WHERE m.io = 'out')                    AS max_abs_err,
    max(x.max_relative_error) FILTER (WHERE m.io = 'out')                    AS max_rel_err,
    max(x.mean_relative_error) FILTER (WHERE m.io = 'out')                   AS mean_rel_err,
    max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'in')            AS in_rel_euclid,
    max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'out')
        - coalesce(max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'in'), 0) AS added_error,
    bool_or(coalesce(x.my_nan_count, 0) + coalesce(x.my_inf_count, 0)
            + coalesce(x.golden_nan_count, 0) + coalesce(x.golden_inf_count, 0) > 0) AS has_nan_inf,
    CASE WHEN count(*) FILTER (WHERE m.io = 'out' AND x.passed IS NOT NULL) = 0 THEN NULL
         ELSE count(*) FILTER (WHERE m.io = 'out' AND x.passed = false) = 0 END      AS passed,
    count(*) FILTER (WHERE m.io = 'in' AND x.passed = false) = 0             AS inputs_passed,
    count(*) FILTER (WHERE m.io = 'out' AND x.passed = false) > 0
        AND count(*) FILTER (WHERE m.io = 'in' AND x.passed = false) = 0     AS born
FROM matches m
LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
WHERE m.cmp_id = ?
GROUP BY m.cmp_id, m.token_id, m.golden_node_id
"""


def refresh_verdicts(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, int | None]:
    """Rebuild `node_results` and `error_born` of one comparison; returns token -> golden node id."""
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM node_results WHERE cmp_id = ?", [cmp_id])
        con.execute(NODE_RESULTS_SQL, [cmp_id])
        verdicts = _born_per_token(con, cmp_id)
        evidence = _refine_with_precheck(con, cmp_id, verdicts)
        con.execute("DELETE FROM error_born WHERE cmp_id = ?", [cmp_id])
        for token, (gid, tid) in verdicts.items():
            con.execute("INSERT INTO error_born VALUES (?, ?, ?, ?, ?)", [cmp_id, token, gid, tid, evidence.get(token)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return {t: g for t, (g, _t) in verdicts.items()}


def _born_per_token(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, tuple[int | None, int | None]]:
    golden_run_row = first_row(con.execute("SELECT golden_run FROM comparisons WHERE cmp_id = ?", [cmp_id]))
    assert golden_run_row is not None
    golden_run = int(golden_run_row[0])
    parent: dict[int, int | None] = {}
    order: dict[int, tuple[int, int]] = {}
    for nid, pid, eo in con.execute(
        "SELECT node_id, parent_id, exec_order FROM nodes WHERE run_id = ?", [golden_run]
    ).fetchall():
        parent[int(nid)] = None if pid is None else int(pid)
        order[int(nid)] = (int(eo) if eo is not None else 1 << 30, int(nid))
    tokens = [
        int(t)
        for (t,) in con.execute(
            "SELECT DISTINCT token_id FROM node_results WHERE cmp_id = ? ORDER BY 1", [cmp_id]
        ).fetchall()
    ]
    candidates: dict[int, list[tuple[int, int | None]]] = defaultdict(list)
    for tok, gid, tid in con.execute(
        "SELECT token_id, golden_node_id, test_node_id FROM node_results WHERE cmp_id = ? AND born", [cmp_id]
    ).fetchall():
        candidates[int(tok)].append((int(gid), None if tid is None else int(tid)))
    out: dict[int, tuple[int | None, int | None]] = {}
    for tok in tokens:
        cands = candidates.get(tok, [])
        if not cands:
            out[tok] = (None, None)
            continue
        ids = {g for g, _ in cands}
        has_child_candidate: set[int] = set()
        for g in ids:
            p = parent.get(g)
            seen = 0
            while p is not None and seen < 10_000:
                has_child_candidate.add(p)
                p = parent.get(p)
                seen += 1
        deepest = [(g, t) for g, t in cands if g not in has_child_candidate]
        g, t = min(deepest, key=lambda c: order.get(c[0], (1 << 30, c[0])))
        out[tok] = (g, t)
    return out


def _refine_with_precheck(
    con: duckdb.DuckDBPyConnection, cmp_id: int, verdicts: dict[int, tuple[int | None, int | None]]
) -> dict[int, str]:
    """Pin the verdict down to one op of an ATB test run by re-running ops alone on their dumped inputs.

    When the golden module where the error is born maps to a group of fused test ops (say
    `1_Attention`), the first op of the group that disagrees with its own re-run is where the
    error is born; a leaf op's re-run says whether the op itself computes wrongly. Updates
    `verdicts` in place; returns token -> evidence line.
    """
    row = first_row(
        con.execute(
            "SELECT r.kind, r.run_id FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?",
            [cmp_id],
        )
    )
    if row is None or row[0] != "atb":
        return {}
    from workbench.analysis.precheck import precheck_group

    test_run = int(row[1])
    evidence: dict[int, str] = {}
    for token, (gid, tid) in list(verdicts.items()):
        if gid is None or tid is None:
            continue
        found = first_row(
            con.execute(
                "SELECT n.name, t.path FROM nodes n JOIN tensors t ON t.run_id = n.run_id AND t.node_id = n.node_id"
                " WHERE n.run_id = ? AND n.node_id = ? AND t.token_id = ? AND t.path IS NOT NULL LIMIT 1",
                [test_run, tid, token],
            )
        )
        if found is None:
            continue
        name, op_dir = str(found[0]), op_folder_of(str(found[1]))
        results = precheck_group(op_dir)  # a leaf op folder yields just itself
        if [Path(r.op_dir) for r in results] == [op_dir]:
            res = results[0]
            if res.supported and res.passed is False:
                evidence[token] = f"precheck: {name} disagrees with its own re-run on its dumped inputs"
            elif res.supported and res.passed:
                evidence[token] = (
                    f"precheck: {name} computes correctly from its dumped inputs (look at its parameters and inputs)"
                )
            continue
        for res in results:
            if res.supported and res.passed is False:
                rel = Path(res.op_dir).relative_to(op_dir).as_posix()
                sub = first_row(
                    con.execute("SELECT node_id FROM nodes WHERE run_id = ? AND name = ?", [test_run, f"{name}/{rel}"])
                )
                if sub is not None:
                    verdicts[token] = (gid, int(sub[0]))
                    evidence[token] = (
                        f"precheck: {name}/{rel} disagrees with its own re-run on its dumped inputs; "
                        f"the ops of {name} before it that could be re-run agree"
                    )
                break
    return evidence
