"""Where the error is born: per-node roll-ups and the per-token verdict.

A node *gives birth* to the error at a token when one of its outputs fails while all its
inputs pass. The verdict for a token is the earliest such node in execution order, taking
the deepest one: a parent module is never named when one of its children qualifies
(the child is where the error actually appears). A node whose error the advisor explains by a known cause
(a rotary table computed from an inv_freq rounded by `model.to(bfloat16)`) gives way to a later one that
no cause explains: that one is the defect the user is after.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from workbench.catalog import first_row
from workbench.catalog.lookup import has_statistics_only_pairs
from workbench.core.advice import STANDS_OUT
from workbench.formats.atb import op_folder_of

if TYPE_CHECKING:
    from workbench.analysis.verdicts.advisor import Advice

_NODE_RESULTS_SQL = """
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
    -- statistics-only pairs: the same difference of their bounds (what the advisor reads too)
    coalesce(max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'out'),
             max({stat_bound}) FILTER (WHERE m.io = 'out'))
        - coalesce(max(x.relative_euclidean_distance) FILTER (WHERE m.io = 'in'),
                   max({stat_bound}) FILTER (WHERE m.io = 'in'), 0)          AS added_error,
    -- NaN/Inf that one side has and the other lacks (an attention mask's -inf on both sides is no anomaly)
    -- (statistics-only pairs: a NaN bound, NaN/Inf statistics on one side)
    bool_or(coalesce(x.my_nan_count, 0) <> coalesce(x.golden_nan_count, 0)
            OR coalesce(x.my_inf_count, 0) <> coalesce(x.golden_inf_count, 0)
            OR (x.relative_euclidean_distance IS NULL AND x.cosine_similarity IS NULL
                AND coalesce(isnan({stat_bound}), false)))                   AS has_nan_inf,
    CASE WHEN count(*) FILTER (WHERE m.io = 'out' AND x.passed IS NOT NULL) = 0 THEN NULL
         ELSE count(*) FILTER (WHERE m.io = 'out' AND x.passed = false) = 0 END      AS passed,
    count(*) FILTER (WHERE m.io = 'in' AND x.passed = false) = 0             AS inputs_passed,
    count(*) FILTER (WHERE m.io = 'out' AND x.passed = false) > 0
        AND count(*) FILTER (WHERE m.io = 'in' AND x.passed = false) = 0     AS born,
    -- statistics-only outputs: their bound colours the heatmap (NaN where NaN/Inf statistics differ: max is NaN)
    max({stat_bound}) FILTER (WHERE m.io = 'out' AND x.relative_euclidean_distance IS NULL
                                         AND x.cosine_similarity IS NULL)    AS max_stat_bound
FROM matches m
LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
{stat_join}
WHERE m.cmp_id = ?
GROUP BY m.cmp_id, m.token_id, m.golden_node_id
"""


def node_results_sql(on_statistics: bool) -> str:
    """The roll-up of one comparison's pairs into `node_results` (parameter: its cmp_id); `on_statistics`: it has
    pairs without tensor metrics (compared on statistics only), whose bounds it then reads."""
    if on_statistics:
        join = "LEFT JOIN stat_metrics s ON s.cmp_id = m.cmp_id AND s.pair_id = m.pair_id"
        return _NODE_RESULTS_SQL.format(stat_bound="s.stat_rel_euclid_bound", stat_join=join)
    return _NODE_RESULTS_SQL.format(stat_bound="NULL::DOUBLE", stat_join="")


def refresh_verdicts(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, int | None]:
    """Rebuild `node_results`, `error_born` and `advice` of one comparison; returns token -> golden node id.

    Also refreshes the logits and token input status (`analysis.verdicts.token_inputs`): a token whose inputs differ
    between the runs names no op (its `error_born` row keeps NULL with the reason as evidence) and gets no
    advisor origin. Where no op is born at a token, the advisor's first op (when it stands out of its
    peers' noise) is what the ATB precheck refines, and the evidence is stored with that advice.
    """
    from workbench.analysis.verdicts.advisor import SIGNIFICANT, compute_advice, write_advice
    from workbench.analysis.verdicts.selection import selection_evidence
    from workbench.analysis.verdicts.token_inputs import refresh_token_analysis

    refresh_token_analysis(con, cmp_id)
    differ = {
        int(t): str(r)
        for t, r in con.execute(
            "SELECT token_id, reason FROM token_status WHERE cmp_id = ? AND inputs_differ", [cmp_id]
        ).fetchall()
    }
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM node_results WHERE cmp_id = ?", [cmp_id])
        # a comparison without statistics-only pairs skips the statistics' join (~0.2 s of 1.2 s at 1.9M pairs)
        con.execute(node_results_sql(has_statistics_only_pairs(con, cmp_id)), [cmp_id])
        candidates = _born_candidates(con, cmp_id)
        advice = compute_advice(con, cmp_id)
        verdicts: dict[int, tuple[int | None, int | None]] = {}
        crossings: dict[int, str] = {}  # tokens whose every candidate carries its inputs' error across the bounds
        for tok, cands in candidates.items():
            carrying = {a.golden_node_id: a for a in advice.get(tok, []) if a.carries}
            born_here = [c for c in cands if c[0] not in carrying]
            verdicts[tok] = _born_unexplained(born_here, advice.get(tok, []))
            if cands and not born_here:
                crossings[tok] = carried_across(carrying[cands[0][0]])
        for token in verdicts.keys() & differ.keys():
            verdicts[token] = (None, None)
        origins: dict[int, tuple[int | None, int | None]] = {
            tok: (items[0].golden_node_id, items[0].test_node_id)
            for tok, items in advice.items()
            if items
            and tok not in differ
            and verdicts.get(tok, (None, None))[0] is None
            and items[0].score >= SIGNIFICANT
        }
        evidence = {**selection_evidence(con, cmp_id, verdicts), **_refine_with_precheck(con, cmp_id, verdicts)}
        evidence.update(crossings)  # their verdict names none: nothing else is said of them
        evidence.update(differ)
        origin_evidence = _refine_with_precheck(con, cmp_id, origins)
        con.execute("DELETE FROM error_born WHERE cmp_id = ?", [cmp_id])
        for token, (gid, tid) in verdicts.items():
            con.execute("INSERT INTO error_born VALUES (?, ?, ?, ?, ?)", [cmp_id, token, gid, tid, evidence.get(token)])
        write_advice(con, cmp_id, advice, origins, origin_evidence)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return {t: g for t, (g, _t) in verdicts.items()}


# What `wb compare`, the HTML report and the app say under an op named `error born at` none of whose inputs was
# judged (a dump of outputs only: msit `tensor_part=1`, msprobe `data_mode: ["output"]`): "inputs pass" is unchecked.
INPUTS_UNCHECKED = (
    "no input of it was dumped (or compared): 'inputs pass' rests on what ran just before it (an output that "
    "passes, or the enclosing module's inputs), as data flows in the order the ops ran"
)


def _unjudged_inputs(con: duckdb.DuckDBPyConnection, cmp_id: int, nodes: list[tuple[int, int]]) -> set[tuple[int, int]]:
    """The (token, golden node)s of `nodes` that have no input pair judged pass or fail."""
    if not nodes:
        return set()
    rows = con.execute(
        "SELECT b.token_id, b.node_id FROM (SELECT unnest(?) AS token_id, unnest(?) AS node_id) b WHERE NOT EXISTS ("
        "  SELECT 1 FROM matches m JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id "
        "  WHERE m.cmp_id = ? AND m.token_id = b.token_id AND m.golden_node_id = b.node_id AND m.io = 'in' "
        "  AND x.passed IS NOT NULL)",
        [[t for t, _ in nodes], [g for _, g in nodes], cmp_id],
    ).fetchall()
    return {(int(t), int(g)) for t, g in rows}


def inputs_unchecked(con: duckdb.DuckDBPyConnection, cmp_id: int, born: dict[int, int]) -> set[int]:
    """The tokens of `born` (token -> golden node) whose node has no input pair judged pass or fail."""
    return {t for t, _ in _unjudged_inputs(con, cmp_id, list(born.items()))}


def carried_across(advice: Advice) -> str:
    """The evidence of a token whose only op failing with passing inputs adds no more than passing on their error
    may (`Advice.carries`): what is said instead of `error born at`."""
    return (
        f"no op is born: {advice.golden_node}'s output fails carrying its inputs' error across the bounds "
        f"({advice.reason})"
    )


def _born_unexplained(cands: list[tuple[int, int | None]], advice: list[Advice]) -> tuple[int | None, int | None]:
    """The earliest candidate whose error no known cause explains (the advisor's `cause`). When every candidate is
    explained: none if the advisor's first op stands out unexplained (it names that one), else the earliest."""
    explained = {a.golden_node_id for a in advice if a.cause}
    first = next((c for c in cands if c[0] not in explained), None)
    if first is not None or not cands:
        return first or (None, None)
    top = advice[0] if advice else None
    return (None, None) if top is not None and top.cause is None and top.score >= STANDS_OUT else cands[0]


def _born_candidates(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, list[tuple[int, int | None]]]:
    """Per token, the nodes where an error is born (outputs fail, inputs pass), the deepest only, in execution
    order (empty where none is)."""
    golden_run_row = first_row(con.execute("SELECT golden_run FROM comparisons WHERE cmp_id = ?", [cmp_id]))
    assert golden_run_row is not None
    golden_run = int(golden_run_row[0])
    parent: dict[int, int | None] = {}
    order: dict[int, tuple[int, int]] = {}
    ends: dict[int, int] = {}
    for nid, pid, eo, end in con.execute(
        "SELECT node_id, parent_id, exec_order, end_order FROM nodes WHERE run_id = ?", [golden_run]
    ).fetchall():
        parent[int(nid)] = None if pid is None else int(pid)
        order[int(nid)] = (int(eo) if eo is not None else 1 << 30, int(nid))
        ends[int(nid)] = int(end) if end is not None else order[int(nid)][0]
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
    unjudged = _unjudged_inputs(con, cmp_id, [(t, g) for t, cs in candidates.items() for g, _ in cs])
    if unjudged:
        failing_before = _failing_stand_ins(con, cmp_id, unjudged, parent, order, ends)
        for tok in {t for t, _ in failing_before}:
            candidates[tok] = [c for c in candidates[tok] if (tok, c[0]) not in failing_before]
    out: dict[int, list[tuple[int, int | None]]] = {}
    for tok in tokens:
        cands = candidates.get(tok, [])
        if not cands:
            out[tok] = []
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
        out[tok] = sorted(deepest, key=lambda c: order.get(c[0], (1 << 30, c[0])))
    return out


def _failing_stand_ins(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    unjudged: set[tuple[int, int]],
    parent: dict[int, int | None],
    order: dict[int, tuple[int, int]],
    ends: dict[int, int],
) -> set[tuple[int, int]]:
    """The (token, node)s of `unjudged` (outputs fail, no input judged) whose stand-in input fails: as the advisor
    reads it, the output of the op that completed last before the node started, or the inputs of its enclosing
    module where that module started later (data flows in execution order)."""
    tokens = sorted({t for t, _ in unjudged})
    done: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # token -> (end, start, node) judged outputs
    passed: dict[tuple[int, int], bool] = {}
    inputs_pass: dict[tuple[int, int], bool] = {}  # nodes whose inputs were judged: whether they pass
    for tok, gid, ok, in_pairs, in_ok in con.execute(
        "SELECT token_id, golden_node_id, passed, in_pairs, inputs_passed FROM node_results "
        "WHERE cmp_id = ? AND list_contains(?, token_id)",
        [cmp_id, tokens],
    ).fetchall():
        key = (int(tok), int(gid))
        if ok is not None and int(gid) in ends:
            done[int(tok)].append((ends[int(gid)], order[int(gid)][0], int(gid)))
            passed[key] = bool(ok)
        if in_pairs and in_ok is not None:
            inputs_pass[key] = bool(in_ok)
    for items in done.values():
        items.sort()
    out: set[tuple[int, int]] = set()
    for tok, gid in unjudged:
        start = order.get(gid, (1 << 30, gid))[0]
        items = done.get(tok, [])
        k = bisect.bisect_left(items, (start, -1, -1)) - 1
        before = items[k] if k >= 0 else None
        fails = before is not None and not passed[(tok, before[2])]
        anc = parent.get(gid)
        while anc is not None:
            if (tok, anc) in inputs_pass:
                if before is None or order[anc][0] > before[0]:
                    fails = not inputs_pass[(tok, anc)]
                break
            anc = parent.get(anc)
        if fails:
            out.add((tok, gid))
    return out


def _refine_with_precheck(
    con: duckdb.DuckDBPyConnection, cmp_id: int, verdicts: dict[int, tuple[int | None, int | None]]
) -> dict[int, str]:
    """Pin the verdict down to one op of an ATB test run by re-running ops alone on their dumped inputs.

    When the golden module where the error is born maps to a group of fused test ops (say
    `1_Attention`), the first op of the group that disagrees with its own re-run is where the
    error is born; a leaf op's re-run says whether the op itself computes wrongly. When the blamed
    op (or every op of its group) computes correctly from its inputs, the rest of its layer is
    prechecked too: a wrong op upstream in the layer (a RoPE, a cache write, an attention scale)
    shows its error only further down, in a module the golden run has. Updates `verdicts` in
    place; returns token -> evidence line.
    """
    row = first_row(
        con.execute(
            "SELECT r.kind, r.run_id FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?",
            [cmp_id],
        )
    )
    if row is None or row[0] != "atb":
        return {}
    from workbench.analysis.checks.precheck.run_atb import precheck_group

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
        if not op_dir.is_dir():
            continue
        results = precheck_group(op_dir)  # a leaf op folder yields just itself
        leaf = [Path(r.op_dir) for r in results] == [op_dir]
        failing = next((r for r in results if r.supported and r.passed is False), None)
        if failing is not None:
            if leaf:
                evidence[token] = f"precheck: {name} disagrees with its own re-run on its dumped inputs"
                continue
            rel = Path(failing.op_dir).relative_to(op_dir).as_posix()
            sub = _test_node(con, test_run, f"{name}/{rel}")
            if sub is not None:
                verdicts[token] = (gid, sub)
                evidence[token] = (
                    f"precheck: {name}/{rel} disagrees with its own re-run on its dumped inputs; "
                    f"the ops of {name} before it that could be re-run agree"
                )
            continue
        checked = sum(1 for r in results if r.supported and r.passed)
        ok_line = (
            f"{name} computes correctly from its dumped inputs"
            if leaf
            else f"the {checked} ops of {name} that could be re-run agree with their re-runs"
        )
        other = _precheck_rest_of_layer(con, cmp_id, test_run, name, op_dir)
        if other is not None:
            other_name, other_gid, other_tid = other
            verdicts[token] = (other_gid if other_gid is not None else gid, other_tid)
            # the blamed op first: the verdict moved to its group, the op first suspected is only the context
            evidence[token] = (
                f"precheck: {other_name} disagrees with its own re-run on its dumped inputs (found in the layer of "
                f"{name}, where the outputs first fail: {ok_line})"
            )
        elif checked:
            tail = " (look at its parameters and inputs)" if leaf else ""
            evidence[token] = f"precheck: {ok_line}; so do the other ops of its layer{tail}"
    return evidence


def _test_node(con: duckdb.DuckDBPyConnection, test_run: int, name: str) -> int | None:
    sub = first_row(con.execute("SELECT node_id FROM nodes WHERE run_id = ? AND name = ?", [test_run, name]))
    return None if sub is None else int(sub[0])


_INTERMEDIATE_METHODS = ("auto-attention-core", "auto-swiglu")  # an op's output paired with the next module's input


def _precheck_rest_of_layer(
    con: duckdb.DuckDBPyConnection, cmp_id: int, test_run: int, name: str, op_dir: Path
) -> tuple[str, int | None, int] | None:
    """The first op of `name`'s layer outside `op_dir` failing its precheck: (test op name, golden, test node)."""
    from workbench.analysis.checks.precheck.run_atb import precheck_group

    parts = name.split("/")
    if len(parts) < 2 or len(op_dir.parents) < len(parts) - 1:
        return None
    layer_dir = op_dir.parents[len(parts) - 2]
    for res in precheck_group(layer_dir):
        if not (res.supported and res.passed is False):
            continue
        path = Path(res.op_dir)
        if path == op_dir or op_dir in path.parents:
            continue
        full = f"{parts[0]}/{path.relative_to(layer_dir).as_posix()}"
        tid = _test_node(con, test_run, full)
        if tid is None:
            continue
        return full, _golden_for_test_op(con, cmp_id, test_run, tid), tid
    return None


def _golden_for_test_op(con: duckdb.DuckDBPyConnection, cmp_id: int, test_run: int, tid: int) -> int | None:
    """The golden module a test op belongs to: its own match when one module matches it, else its group's."""
    node: int | None = tid
    while node is not None:
        golden = {
            int(g)
            for g, method in con.execute(
                "SELECT golden_node_id, method FROM node_matches WHERE cmp_id = ? AND test_node_id = ?", [cmp_id, node]
            ).fetchall()
            if method not in _INTERMEDIATE_METHODS
        }
        if len(golden) == 1:
            return golden.pop()
        parent = first_row(
            con.execute("SELECT parent_id FROM nodes WHERE run_id = ? AND node_id = ?", [test_run, node])
        )
        node = None if parent is None or parent[0] is None else int(parent[0])
    return None
