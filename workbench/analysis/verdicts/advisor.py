"""Root-cause advisor: per token, the ops ranked by the error they add beyond their inputs and their noise.

Pass/fail (`analysis/verdicts/born.py`) names an op only when its output crosses a bound while its inputs do
not. On a bf16/fp16 run every op carries rounding noise and a real bug may add a few percent without
crossing anything, or everything fails at once. The advisor needs no bound:

- per (token, golden node) it takes the worst relative error of the outputs (`o`) and of the inputs
  (`i`; where no input was dumped, the output of the op that completed last before this one started,
  or the input of the enclosing module when that is more recent); the error the node *adds* is
  `a = sqrt(max(o^2 - i^2, 0))` (independent errors add in quadrature);
- a module's *own* error is what its descendants do not explain: `sqrt(max(a^2 - max(max_desc(a)^2,
  sum_children(a^2)), 0))` (its direct children in sequence add in quadrature; of those reading the same input,
  the largest),
  so a child that adds the parent's error is ranked before its parent; a child in its peers' noise explains
  nothing (a decoder layer that adds its input twice while its children are clean: the layer is the finding);
- the score compares `own` with what the same op adds at the same token in the other layers (the
  median, plus the spread (MAD) of those layers), floored by the test dtype's rounding (bf16 2^-8,
  fp16 2^-11, ...): an op that adds 5x what its peers add scores 5;
- an op whose output has NaN/Inf its inputs lack ranks first.

Only the metrics already in the catalog are read (no tensor is read again). Results are stored in
the `advice` table at compare time (`store_advice`, called by `refresh_verdicts`); `advise` reads
them, or computes them on the fly for a catalog written before the table existed.
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import duckdb

from workbench.analysis.verdicts import quant_noise
from workbench.analysis.verdicts.causes import (
    CAUSE_LEAD,
    ROUNDING,
    cause_in,
    error_gain,
    errors_add,
    errors_add_per_element,
    is_lookup,
    is_sum,
    is_table_call,
    known_cause,
    kv_cache_cause,
    reads_a_kv_cache,
)
from workbench.catalog.lookup import has_table, judged_on_statistics_only
from workbench.catalog.store import first_row, insert_rows
from workbench.compare.judging.dtypes import compared_compute_dtype
from workbench.compare.judging.gain import few_elements_stretch
from workbench.core.advice import NAN_INF_SCORE, NO_PEERS, STANDS_OUT
from workbench.core.median import median
from workbench.formats.token_ids import INT_DTYPES

MAX_SCORE = 1.0e6  # finite scores are capped below it (an op adding error where its peers add exactly none)
SIGNIFICANT = STANDS_OUT  # score from which an op clearly stands out of its peers' noise
_EXPLAINED_RANK = STANDS_OUT - 1e-6  # where an explained op ranks: after every op standing out unexplained
MIN_PEERS = 2  # peers needed to judge an op against its own kind
_MAD_WEIGHT = 1.0  # how much of the peers' spread is counted as their noise
# An op passes on the error it receives with a gain that is not exactly 1 (a Linear or a norm stretches
# some directions): error carried in at `i` can come out at sqrt(1 + GAIN_NOISE^2) * i with nothing wrong.
# Measured on clean ops downstream of planted defects (bench/advisor_defects.py): own/i is below 0.45 for
# 90 % of them. Matters where the dtype's rounding is far below the carried error (fp16 after a defect).
GAIN_NOISE = 0.4


# An elementwise product's output of at most this many elements may carry up to the sum of its factors' largest
# elementwise relative errors (`causes.errors_add_per_element`): over a handful of elements a factor's small element
# off by 2 % shows 0.1 % in its norm and, scaled up by the other factor, 0.7 % in the output's (a clean fp16
# DeepSeek-V3's 4-element rotary product). Past it the largest elementwise error mostly sits at a near-zero value
# and would excuse anything.
_FEW_FOR_ELEMENTWISE = 64


def gain_noise(numel: int | None, op_type: str | None) -> float:
    """`GAIN_NOISE`, or the spread of a norm ratio over a projection's few outputs where that is larger (under ~180
    elements: sqrt(stretch^2 - 1) of `gain.few_elements_stretch`, 1.31 at 4 elements, 0.53 at 64): a router's logits
    over 4 experts carry their input's error at a gain far from 1 with nothing wrong."""
    stretch = few_elements_stretch(numel, op_type)
    return max(GAIN_NOISE, math.sqrt(stretch * stretch - 1.0))


@dataclass(frozen=True)
class Advice:
    """One ranked op of one token (rank 1 = most likely origin of the error)."""

    rank: int
    token_id: int
    golden_node_id: int
    test_node_id: int | None
    golden_node: str
    test_node: str | None
    score: float
    reason: str
    cause: str | None = None  # a known cause that explains its error (`core.advice.known_cause`)
    # what it adds is within what passing on its inputs' error may add: an output failing with passing inputs is
    # that error carried across the bounds, not born there (`born.refresh_verdicts`; not stored, so not compared)
    carries: bool = field(default=False, compare=False)


@dataclass(slots=True)
class _Row:
    """What the advisor knows of one golden node at one token."""

    node_id: int
    test_node_id: int | None
    out_err: float
    in_err: float | None  # NULL when no input pair could be compared
    new_nan_inf: bool
    in_nan_inf: bool
    dtype: str | None
    in_from: str = "inputs"
    weight_err: float | None = None  # worst error of its weight inputs (ATB: weights are op inputs)
    weight_nan_inf: bool = False  # a weight input holds NaN/Inf the golden one does not
    nan_inf_born: bool = False
    added: float = 0.0
    own: float = 0.0
    ref: float = 0.0
    peers: int = 0
    peer_label: str = ""
    score: float = 0.0
    reason: str = ""
    cause: str | None = None
    quant: bool = False  # judged against its expected quantization noise (`quant_noise`)
    carried_from: int | None = None  # the op whose explained error reaches it unseen (`_carried_causes`)
    side_from: int | None = None  # a known-cause op whose output it takes besides its inputs (`_split_inputs`)
    side_err: float | None = None  # that input's error, not counted in `in_err`
    test_type: str | None = None  # the paired test node's type where it is not the golden node's (dumps of one kind)
    measured: bool = True  # False: no position of its output is finite on both sides (out_err 0 stands in)
    # every pair of the comparison compared on statistics only: its errors are lower bounds (`stat_rel_euclid_bound`)
    bounds_only: bool = False
    numel: int | None = None  # elements of its worst output (`gain.few_elements_stretch`)
    carries: bool = False  # `Advice.carries`
    # the most relative error its inputs' errors may reach in its output, where that is known: an elementwise
    # product's factors' largest elementwise relative errors, summed; a sum's inputs' absolute errors, summed, over
    # its output's norm
    in_reach: float | None = None


# one io side of a golden node at a token: test node (or the known-cause op of a side input), worst relative error,
# new NaN/Inf, test dtype, the element count of its worst pair
_IO = tuple[int | None, float | None, bool, str | None, int | None]


@dataclass(slots=True)
class _Node:
    node_id: int
    name: str
    type: str
    parent_id: int | None
    exec_order: int
    end_order: int
    layer: int | None
    pattern: str = ""  # `_pattern` of the node, set once its run's nodes are loaded (ranked again at every token)
    op_label: str = ""  # `_op_label` of the node, likewise


# whether a pair's test tensor holds NaN/Inf its golden one does not: by the counts of a tensor comparison, else (a
# statistics-only side) by NaN/Inf statistics on the test side only (`x` metrics, `tt`/`gt` test/golden tensors)
_NEW_NAN_INF = """CASE WHEN coalesce(x.my_nan_count, x.my_inf_count, x.golden_nan_count, x.golden_inf_count) IS NOT NULL
                    THEN coalesce(x.my_nan_count, 0) + coalesce(x.my_inf_count, 0)
                         > coalesce(x.golden_nan_count, 0) + coalesce(x.golden_inf_count, 0)
                    ELSE NOT coalesce(isfinite(tt.max) AND isfinite(tt.min) AND isfinite(tt.mean)
                                      AND isfinite(tt.norm), true)
                         AND coalesce(isfinite(gt.max) AND isfinite(gt.min) AND isfinite(gt.mean)
                                      AND isfinite(gt.norm), true) END"""

# a NaN bound (NaN/Inf statistics on one side) measures nothing: `_NEW_NAN_INF` says what it means
_STAT_BOUND_FINITE = "CASE WHEN NOT isnan(s.stat_rel_euclid_bound) THEN s.stat_rel_euclid_bound END"

_PAIR_ERR = f"""coalesce(x.relative_euclidean_distance,
                CASE WHEN x.cosine_similarity IS NOT NULL
                     THEN sqrt(greatest(0.0, 2.0 * (1.0 - x.cosine_similarity))) END,
                {_STAT_BOUND_FINITE})"""
_ROWS_SQL = f"""
SELECT m.token_id, m.golden_node_id, m.io,
       arg_min(m.test_node_id, m.pair_id) AS test_node_id,
       max({_PAIR_ERR}) AS err,
       sum({_PAIR_ERR}) AS err_sum,  -- a product's inputs: their relative errors add (`causes.errors_add`)
       arg_max(gt.numel, {_PAIR_ERR}) AS numel,  -- of its worst pair (an output's: `few_elements_stretch`)
       sum(x.max_relative_error) AS max_rel_sum,  -- an elementwise product's factors' (`_FEW_FOR_ELEMENTWISE`)
       sum({_PAIR_ERR} * gt.norm) AS abs_err_sum,  -- a sum's inputs' absolute errors (`causes.is_sum`)
       arg_max(gt.norm, {_PAIR_ERR}) AS norm,  -- its worst pair's golden norm
       bool_or({_NEW_NAN_INF}) AS new_nan_inf,
       mode(tt.dtype) AS dtype
FROM matches m
JOIN comparisons c ON c.cmp_id = m.cmp_id
LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
LEFT JOIN stat_metrics s ON s.cmp_id = m.cmp_id AND s.pair_id = m.pair_id
LEFT JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id
LEFT JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id
WHERE m.cmp_id = ? AND m.method <> 'quant'  -- dequantized int tensors: the quantization noise model reads them
GROUP BY m.token_id, m.golden_node_id, m.io
"""


def compute_advice(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, list[Advice]]:
    """Rank every compared golden node of every token of comparison `cmp_id` (nothing is stored)."""
    row = first_row(
        con.execute(
            "SELECT c.golden_run, c.test_run, coalesce(g.kind = t.kind, false) FROM comparisons c "
            "LEFT JOIN runs g ON g.run_id = c.golden_run LEFT JOIN runs t ON t.run_id = c.test_run WHERE c.cmp_id = ?",
            [cmp_id],
        )
    )
    if row is None:
        raise ValueError(f"comparison {cmp_id} is not in the catalog")
    golden_run, test_run, one_kind = int(row[0]), int(row[1]), bool(row[2])
    nodes = _load_nodes(con, golden_run)
    test_names: dict[int, str] = {}
    test_types: dict[int, str] = {}  # only between dumps of one kind: a torch module and an ATB op always differ
    for n, name, typ in con.execute("SELECT node_id, name, type FROM nodes WHERE run_id = ?", [test_run]).fetchall():
        test_names[int(n)] = str(name)
        if typ and one_kind:
            test_types[int(n)] = str(typ)
    per_token: dict[int, dict[int, dict[str, _IO]]] = defaultdict(dict)
    products = {g for g, n in nodes.items() if errors_add(n.type)}
    elementwise = {g for g, n in nodes.items() if errors_add_per_element(n.type)}
    product_reach: dict[tuple[int, int], float] = {}  # (token, elementwise product) -> its factors' largest, summed
    sums = {g for g, n in nodes.items() if is_sum(n.type)}
    sum_reach: dict[tuple[int, int], list[float | None]] = {}  # (token, sum) -> [inputs' abs errors, output's norm]
    for tok, gid, io, tid, err_max, err_sum, numel, max_rel_sum, abs_err_sum, norm, nan_inf, dtype in _fetch_slices(
        con.execute(_ROWS_SQL, [cmp_id])
    ):
        if int(gid) in sums:
            reach = sum_reach.setdefault((int(tok), int(gid)), [None, None])
            reach[0 if io == "in" else 1] = abs_err_sum if io == "in" else norm
        err = err_sum if io == "in" and int(gid) in products else err_max
        per_token[int(tok)].setdefault(int(gid), {})[str(io)] = (
            None if tid is None else int(tid),
            None if err is None or (isinstance(err, float) and math.isnan(err)) else float(err),
            bool(nan_inf),
            None if dtype is None else str(dtype),
            None if numel is None else int(numel),
        )
        if io == "in" and int(gid) in elementwise and max_rel_sum is not None and math.isfinite(max_rel_sum):
            product_reach[(int(tok), int(gid))] = float(max_rel_sum)
    run_dtype = compared_compute_dtype(con, cmp_id)  # as the judge: a bf16 run's many float32 calls (L1) do not count
    sources = {g for g, n in nodes.items() if known_cause(n.type, run_dtype) is not None}
    for (tok, gid), split in _split_inputs(
        con, cmp_id, golden_run, ROUNDING.get(run_dtype or "", 0.0), sources, products
    ).items():
        ios = per_token.get(tok, {}).get(gid)
        if ios is not None and "in" in ios:
            tid, _err, _nan_inf, dtype, numel = ios["in"]
            # NaN/Inf in a weight input are the op's own, as a weight's error is: its activations decide what came in
            ios["in"] = (tid, split.act_err, split.act_nan_inf, dtype, numel)
            if split.weight_err is not None or split.weight_nan_inf:
                ios["weight"] = (tid, split.weight_err, split.weight_nan_inf, dtype, numel)
            if split.side_err is not None:
                ios["side"] = (split.side_from, split.side_err, False, dtype, numel)
    differ = inputs_differ(con, cmp_id)
    expect = quant_noise.quant_expectations(con, cmp_id)  # {} unless the test run is quantized
    bounds_only = judged_on_statistics_only(con, cmp_id)
    out: dict[int, list[Advice]] = {}
    attention = {g for g, n in nodes.items() if reads_a_kv_cache(n.type)}
    table_arguments = _table_arguments(nodes)  # of every node: once, not at every token
    cached: dict[int, tuple[int, float]] = {}  # attention -> (earlier token, its largest input error up to now)
    for tok in sorted(per_token):
        if tok in differ:  # the runs were fed different tokens: nothing compares like with like
            out[tok] = []
            per_token.pop(tok)
            continue
        rows = _rows_of_token(per_token.pop(tok), nodes)  # each token's rows freed once ranked
        for r in rows.values():
            r.in_reach = product_reach.pop((tok, r.node_id), None)
            abs_in, out_norm = sum_reach.pop((tok, r.node_id), (None, None))
            if abs_in is not None and out_norm and math.isfinite(abs_in) and math.isfinite(out_norm):
                r.in_reach = abs_in / out_norm  # its inputs' errors added, relative to its output
            other = test_types.get(r.test_node_id) if r.test_node_id is not None else None
            if other is not None and nodes[r.node_id].type and other != nodes[r.node_id].type:
                r.test_type = other
            r.bounds_only = bounds_only
        quant = {g: e for (t, g), e in expect.items() if t == tok}
        ranked = _rank(rows, nodes, quant, run_dtype, cached, table_arguments=table_arguments)
        for g in attention & rows.keys():
            err = rows[g].in_err
            if err is not None and err > cached.get(g, (tok, 0.0))[1]:
                cached[g] = (tok, err)
        out[tok] = [
            Advice(
                rank=i + 1,
                token_id=tok,
                golden_node_id=r.node_id,
                test_node_id=r.test_node_id,
                golden_node=nodes[r.node_id].name,
                test_node=None if r.test_node_id is None else test_names.get(r.test_node_id),
                score=round(r.score, 4),
                reason=r.reason,
                cause=r.cause,
                carries=r.carries,
            )
            for i, r in enumerate(ranked)
        ]
    return out


def inputs_differ(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, str]:
    """token -> why the runs' inputs differ there (`token_status`, `verdicts.token_inputs`): no op is ranked there."""
    if not has_table(con, "token_status"):
        return {}
    return {
        int(t): str(r or "inputs differ")
        for t, r in con.execute(
            "SELECT token_id, reason FROM token_status WHERE cmp_id = ? AND inputs_differ", [cmp_id]
        ).fetchall()
    }


def store_advice(con: duckdb.DuckDBPyConnection, cmp_id: int) -> None:
    """Recompute and store the `advice` rows of one comparison (the caller owns the transaction)."""
    write_advice(con, cmp_id, compute_advice(con, cmp_id))


def write_advice(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    advice: dict[int, list[Advice]],
    refined: dict[int, tuple[int | None, int | None]] | None = None,
    evidence: dict[int, str] | None = None,
) -> None:
    """Replace the `advice` rows of `cmp_id` by `advice`.

    `refined` (token -> golden, test node) is where a precheck pinned the first op down: that
    golden node moves to rank 1 with that test op; `evidence` (token -> line) is stored with it.
    """
    con.execute("DELETE FROM advice WHERE cmp_id = ?", [cmp_id])
    rows: list[tuple[object, ...]] = []
    for tok, items in advice.items():
        items = list(items)
        if refined and tok in refined and items:
            gid, tid = refined[tok]
            k = next((i for i, a in enumerate(items) if a.golden_node_id == gid), 0)
            first = replace(items.pop(k), test_node_id=tid)
            items.insert(0, first)
        for rank, a in enumerate(items, start=1):
            ev = (evidence or {}).get(tok) if rank == 1 else None
            rows.append((cmp_id, tok, rank, a.golden_node_id, a.test_node_id, a.score, a.reason, ev))
    insert_rows(con, "advice", rows)


def advise(
    con: duckdb.DuckDBPyConnection, cmp_id: int, token: int | None = None, top: int | None = None
) -> list[Advice]:
    """The ranked ops of comparison `cmp_id` (all tokens, or one), best first per token; `top` per token.

    Reads the `advice` table written at compare time; a catalog without it (older wb, or a
    comparison never refreshed) is ranked on the fly, without writing.
    """
    if top is not None and top < 1:
        raise ValueError(f"top {top}: must be at least 1")
    stored = (
        has_table(con, "advice")
        and (first_row(con.execute("SELECT count(*) FROM advice WHERE cmp_id = ?", [cmp_id])) or (0,))[0] > 0
    )
    if stored:
        cond = "" if token is None else " AND a.token_id = ?"
        lim = "" if top is None else f" AND a.rank <= {int(top)}"
        params: list[object] = [cmp_id] if token is None else [cmp_id, token]
        rows = con.execute(
            "SELECT a.rank, a.token_id, a.golden_node_id, a.test_node_id, gn.name, tn.name, a.score, a.reason "
            "FROM advice a JOIN comparisons c ON c.cmp_id = a.cmp_id "
            "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = a.golden_node_id "
            "LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = a.test_node_id "
            f"WHERE a.cmp_id = ?{cond}{lim} ORDER BY a.token_id, a.rank",
            params,
        ).fetchall()
        return [
            Advice(
                int(r[0]),
                int(r[1]),
                int(r[2]),
                None if r[3] is None else int(r[3]),
                str(r[4]),
                None if r[5] is None else str(r[5]),
                float(r[6]),
                str(r[7]),
                cause_in(str(r[7])),  # the reason carries it
            )
            for r in rows
        ]
    computed = compute_advice(con, cmp_id)
    out: list[Advice] = []
    for tok in sorted(computed):
        if token is not None and tok != token:
            continue
        out.extend(computed[tok][:top] if top is not None else computed[tok])
    return out


def advice_evidence(con: duckdb.DuckDBPyConnection, cmp_id: int) -> dict[int, str]:
    """token -> the evidence line stored with its rank-1 op (empty for catalogs without the table)."""
    if not has_table(con, "advice"):
        return {}
    return {
        int(t): str(e)
        for t, e in con.execute(
            "SELECT token_id, evidence FROM advice WHERE cmp_id = ? AND rank = 1 AND evidence IS NOT NULL", [cmp_id]
        ).fetchall()
    }


# ----------------------------------------------------------------------------------------------


# The ranks follow the score with three exceptions (`write_advice`, `_rank`, `_children_first`); what `wb advise`
# and the app print with the list, and docs/guide.md explains.
ORDER_RULE = (
    "order: score, highest first, except: an op a precheck pinned down comes first; an op whose error a known "
    "cause explains comes after those standing out unexplained (such ops in the order they ran, one carrying "
    "another's error right after it); an op carrying half or more of a parent's added error (a third, if it "
    "stands out itself) comes right before that parent (^: ranked above a higher score)"
)


def above_higher(items: list[Advice]) -> set[tuple[int, int]]:
    """(token, rank) of each op ranked above an op of its token with a higher score (an exception of `ORDER_RULE`)."""
    out: set[tuple[int, int]] = set()
    best_below: dict[int, float] = {}
    for a in sorted(items, key=lambda a: (a.token_id, -a.rank)):
        if a.score < best_below.get(a.token_id, -math.inf):
            out.add((a.token_id, a.rank))
        best_below[a.token_id] = max(best_below.get(a.token_id, -math.inf), a.score)
    return out


def _load_nodes(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, _Node]:
    out: dict[int, _Node] = {}
    for nid, name, typ, pid, eo, end, layer in con.execute(
        "SELECT node_id, name, type, parent_id, exec_order, end_order, layer FROM nodes WHERE run_id = ?", [run_id]
    ).fetchall():
        start = int(eo) if eo is not None else 1 << 30
        out[int(nid)] = _Node(
            int(nid),
            str(name),
            str(typ or ""),
            None if pid is None else int(pid),
            start,
            int(end) if end is not None else start,
            None if layer is None else int(layer),
        )
    for node in out.values():
        node.pattern = _pattern(node)
        node.op_label = _op_label(node, out)
    _call_roles(out)
    return out


def _call_roles(nodes: dict[int, _Node]) -> None:
    """A call named by a counter (msprobe's `Functional.linear.20.forward`; a counter equal to the layer index is no
    layer index) inside a module whose name holds one gets its role in that module as its pattern: the module's
    pattern, its type and its place among the module's calls of that type
    (`Module.model.layers.*.mlp.down_proj.Linear.forward/Functional.linear#0`). Its peers are then the same call of
    the same module in the other layers, not every call of its type (a down_proj's linear among the q, k, v, o, gate
    and up projections of every layer)."""
    seen: dict[tuple[int, str], int] = defaultdict(int)
    for node in sorted(nodes.values(), key=lambda n: (n.exec_order, n.node_id)):
        parent = nodes.get(node.parent_id) if node.parent_id is not None else None
        if parent is None or parent.pattern == parent.name or not _COUNTED_CALL.match(node.name):
            continue
        place = seen[(parent.node_id, node.type)]
        seen[(parent.node_id, node.type)] += 1
        node.pattern = f"{parent.pattern}/{node.type}#{place}"
        node.op_label = f"{parent.op_label}'s {node.type}"


def _rows_of_token(data: dict[int, dict[str, _IO]], nodes: dict[int, _Node]) -> dict[int, _Row]:
    rows: dict[int, _Row] = {}
    for gid, ios in data.items():
        out = ios.get("out")
        # an output with no position finite on both sides has no error to measure; it is kept where its NaN/Inf
        # are new (the op that makes a whole tensor NaN/Inf is where they appear), and counts as nobody's peer
        if out is None or gid not in nodes or (out[1] is None and not out[2]):
            continue
        inp = ios.get("in")
        tid = out[0] if out[0] is not None else (inp[0] if inp else None)
        weight = ios.get("weight")
        side = ios.get("side")
        rows[gid] = _Row(
            gid,
            tid,
            0.0 if out[1] is None else out[1],
            None if inp is None else inp[1],
            out[2],
            bool(inp and inp[2]),
            out[3],
            weight_err=None if weight is None else weight[1],
            weight_nan_inf=bool(weight and weight[2]),
            side_from=None if side is None else side[0],
            side_err=None if side is None else side[1],
            measured=out[1] is not None,
            numel=out[4],
        )
    # inputs not dumped: the op that completed last before this one started, or the enclosing
    # module's input when that module started after it (data flows in execution order)
    done = sorted((nodes[g].end_order, g) for g in rows)
    ends = [e for e, _ in done]
    for gid, r in rows.items():
        if r.in_err is not None:
            continue
        node = nodes[gid]
        k = bisect.bisect_left(ends, node.exec_order) - 1
        prev = done[k] if k >= 0 else None
        best: tuple[int, float, str] | None = None
        if prev is not None:
            p = rows[prev[1]]
            if p.measured:
                best = (prev[0], p.out_err, f"the output of {_short(nodes[prev[1]].name)}")
            r.in_nan_inf = r.in_nan_inf or p.new_nan_inf or p.in_nan_inf
        anc = node.parent_id
        while anc is not None and anc in nodes:
            ar = rows.get(anc)
            recorded = data.get(anc, {}).get("in")
            if recorded is not None and recorded[2]:  # NaN/Inf enter a module around it: not born in it
                r.in_nan_inf = True
            if ar is not None and ar.in_err is not None:
                if best is None or nodes[anc].exec_order > best[0]:
                    best = (nodes[anc].exec_order, ar.in_err, f"the input of {_short(nodes[anc].name)}")
                break
            anc = nodes[anc].parent_id
        if best is not None:
            r.in_err, r.in_from = best[1], best[2]
        else:
            r.in_err, r.in_from = 0.0, "nothing before it"
    return rows


_IN_SQL = f"""
SELECT m.token_id, m.golden_node_id, gt.max, gt.min, gt.mean, gt.norm, gt.dtype,
       coalesce(x.relative_euclidean_distance,
                CASE WHEN x.cosine_similarity IS NOT NULL
                     THEN sqrt(greatest(0.0, 2.0 * (1.0 - x.cosine_similarity))) END,
                {_STAT_BOUND_FINITE}) AS err,
       {_NEW_NAN_INF} AS new_nan_inf
FROM matches m
JOIN comparisons c ON c.cmp_id = m.cmp_id
JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id
LEFT JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id
LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
LEFT JOIN stat_metrics s ON s.cmp_id = m.cmp_id AND s.pair_id = m.pair_id
WHERE m.cmp_id = ? AND m.io = 'in' AND m.method <> 'quant'
"""


def _fetch_slices(cur: duckdb.DuckDBPyConnection, size: int = 8192) -> Iterator[tuple[Any, ...]]:
    """A query's rows, fetched `size` at a time: one Python tuple per row of a whole comparison at once is tens
    of MB at 100k pairs."""
    while rows := cur.fetchmany(size):
        yield from rows


def _stat_key(
    values: tuple[object, ...], known: dict[tuple[object, ...], tuple[float, ...] | None]
) -> tuple[float, ...] | None:
    """The statistics to 9 significant digits (None where one is missing or NaN); `known`: the keys made so far
    (a tensor's statistics come back as a node's output and the next one's input, and a weight at every token)."""
    key = known.get(values, _NO_KEY)
    if key is not _NO_KEY:
        return key
    out: tuple[float, ...] | None = None
    for v in values:
        if v is None or not isinstance(v, float | int) or v != v:
            break
    else:
        out = tuple([float(f"{float(v):.9g}") for v in values])  # type: ignore[arg-type]
    known[values] = out
    return out


_NO_KEY: tuple[float, ...] = ()  # not in `_stat_key`'s `known` yet


@dataclass(frozen=True, slots=True)
class _InputSplit:
    """A node's dumped inputs at one token, by role (`_split_inputs`)."""

    act_err: float  # what it carries in: its activation inputs' worst error (their sum for a product)
    weight_err: float | None  # worst error of its weight inputs (ATB: weights are op inputs)
    side_err: float | None  # worst error of inputs that are a known-cause op's output (the rotary tables)
    side_from: int | None  # that op (golden node)
    act_nan_inf: bool = False  # NaN/Inf new in an input that is not a weight
    weight_nan_inf: bool = False  # NaN/Inf new in a weight input (a weight that overflows the test dtype)


def _split_inputs(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    golden_run: int,
    floor: float,
    sources: set[int],
    products: set[int],
) -> dict[tuple[int, int], _InputSplit]:
    """(token, golden node) -> its inputs by role, for nodes with a weight input or a side input.

    A wrong weight input: a golden input that no op output at that token holds (same max/min/mean/norm), that is
    the same at two tokens or more (or the dump has one token), and whose error exceeds `floor` (the run's
    rounding: a weight cast to the test dtype carries less). ATB graphs take their weights as inputs, so a wrong
    weight arrives as input error; it is the consuming op's own error, not carried in.

    A side input: the output of one of `sources` (ops whose error a known cause may explain: the rotary
    embedding), as msprobe dumps the cos/sin tables a decoder layer and its attention take as keyword arguments.
    Their error reaches the output with a gain far below 1 (~0.2-0.4 in an attention), so counting it as carried
    in would hide whatever the layer adds; it is set apart (`_carried_causes` weighs it), as where msit does not
    dump the tables at all. A node whose every input is a side input keeps them as its inputs, and a product
    (`q * cos`, msprobe's `mix` level) takes the table as a factor, whose error reaches it whole: carried in."""
    outs: dict[int, set[tuple[float, ...]]] = defaultdict(set)
    known: dict[tuple[object, ...], tuple[float, ...] | None] = {}
    source_outs: dict[int, dict[tuple[float, ...], int]] = defaultdict(dict)
    for tok, gid, *vals in _fetch_slices(
        con.execute(
            "SELECT token_id, node_id, max, min, mean, norm FROM tensors WHERE run_id = ? AND io = 'out'", [golden_run]
        )
    ):
        key = _stat_key(tuple(vals), known)
        if key is not None:
            outs[int(tok)].add(key)
            if int(gid) in sources:
                source_outs[int(tok)][key] = int(gid)
    rows = [  # integer inputs (token ids, positions) are data, never weights
        (int(tok), int(gid), None if str(dtype) in INT_DTYPES else _stat_key((mx, mn, mean, norm), known), err, nan)
        for tok, gid, mx, mn, mean, norm, dtype, err, nan in _fetch_slices(con.execute(_IN_SQL, [cmp_id]))
    ]
    seen_at: dict[tuple[float, ...], set[int]] = defaultdict(set)
    for tok, _gid, key, _err, _nan in rows:
        if key is not None:
            seen_at[key].add(tok)
    one_token = len({tok for tok, *_ in rows}) == 1
    acts: dict[tuple[int, int], list[float | None]] = defaultdict(list)
    weights: dict[tuple[int, int], list[float | None]] = defaultdict(list)
    sides: dict[tuple[int, int], list[tuple[float | None, int]]] = defaultdict(list)
    nan_in: dict[tuple[int, int], list[bool]] = defaultdict(lambda: [False, False])  # (activation, weight) NaN/Inf
    for tok, gid, key, err, nan in rows:
        value = None if err is None or (isinstance(err, float) and math.isnan(err)) else float(err)
        src = source_outs[tok].get(key) if key is not None and tok in source_outs else None
        if src is not None and src != gid:
            sides[(tok, gid)].append((value, src))
            nan_in[(tok, gid)][0] |= bool(nan)
            continue
        is_weight = (
            ((value is not None and value > floor) or bool(nan))
            and key is not None
            and key not in outs[tok]
            and (one_token or len(seen_at[key]) >= 2)
        )
        (weights if is_weight else acts)[(tok, gid)].append(value)
        nan_in[(tok, gid)][1 if is_weight else 0] |= bool(nan)
    out: dict[tuple[int, int], _InputSplit] = {}
    for k in weights.keys() | sides.keys():
        known_w = [v for v in weights.get(k, []) if v is not None]
        known_a = [v for v in acts.get(k, []) if v is not None]
        side = [(v, src) for v, src in sides.get(k, []) if v is not None]
        if side and k not in acts and k not in weights:
            continue  # nothing but side inputs: they are what it takes in
        if side and k[1] in products:  # a factor (`q * cos`): its error reaches the product whole, carried in
            known_a += [v for v, _src in side]
            side = []
        worst_side = max(side) if side else None
        carried = sum(known_a) if k[1] in products else max(known_a, default=0.0)  # a product's factors add
        out[k] = _InputSplit(
            carried,
            max(known_w) if known_w else None,
            None if worst_side is None else worst_side[0],
            None if worst_side is None else worst_side[1],
            nan_in[k][0],
            nan_in[k][1],
        )
    return out


def _short(name: str) -> str:
    return name[5:] if name.startswith("root.") else name


def _rank(
    rows: dict[int, _Row],
    nodes: dict[int, _Node],
    quant: dict[int, quant_noise.QuantExpect] | None = None,
    run_dtype: str | None = None,
    cached: dict[int, tuple[int, float]] | None = None,
    *,
    table_arguments: set[int],
) -> list[_Row]:
    """Score and order one token's rows. `cached`: attention node -> (an earlier token, the largest input error it
    had there), what its KV cache holds (`causes.kv_cache_cause`); `table_arguments`: `_table_arguments(nodes)`,
    the same at every token."""
    for r in rows.values():
        i = r.in_err or 0.0
        r.added = math.sqrt(max(r.out_err * r.out_err - i * i, 0.0))
    # own error: what no descendant explains (the most any one adds below it), nor its children in sequence (what
    # its direct children add, in quadrature: a decoder layer's attention, norm and MLP each add to the stream)
    below: dict[int, float] = defaultdict(float)
    # children reading the same input (q/k/v projections, gate and up) work side by side: the largest counts
    side_by_side: dict[int, dict[object, float]] = defaultdict(dict)
    for gid, r in rows.items():
        p = nodes[gid].parent_id
        if p is not None:
            same_input: object = r.in_err if r.in_from == "inputs" else -gid - 1  # one dumped input: one error
            group = side_by_side[p]
            group[same_input] = max(group.get(same_input, 0.0), r.added)
        seen = 0
        while p is not None and seen < 10_000:
            if r.added > below[p]:
                below[p] = r.added
            p = nodes[p].parent_id if p in nodes else None
            seen += 1
    for gid, r in rows.items():
        by_children = sum(a * a for a in side_by_side[gid].values()) if gid in side_by_side else 0.0
        r.own = math.sqrt(max(r.added * r.added - max(below[gid] ** 2, by_children), 0.0))
    q_below = quant_noise.expected_below(quant or {}, {g: n.parent_id for g, n in nodes.items()})
    # a module whose NaN/Inf a descendant produced is not where they appear
    nan_inf_below: set[int] = set()
    for gid, r in rows.items():
        if r.new_nan_inf and not r.in_nan_inf:
            p = nodes[gid].parent_id
            while p is not None and p in nodes and p not in nan_inf_below:
                nan_inf_below.add(p)
                p = nodes[p].parent_id
    # peers: the same op (name with its layer index masked) at the other layers, else the same type
    by_pattern: dict[str, list[int]] = defaultdict(list)
    by_type: dict[str, list[int]] = defaultdict(list)
    for gid, r in rows.items():
        if not r.measured:
            continue
        node = nodes[gid]
        by_pattern[node.pattern].append(gid)
        by_type[node.type].append(gid)
    for gid, r in rows.items():
        node = nodes[gid]
        floor = ROUNDING.get(r.dtype or "", 2.0**-24)
        same = [g for g in by_pattern[node.pattern] if g != gid] if node.layer is not None else []
        if len(same) >= MIN_PEERS:
            label = f"what {node.op_label} adds in the other {len(same)} layers"
        else:
            same = [g for g in by_type[node.type] if g != gid and nodes[g].layer is not None]
            label = f"what the other {len(same)} {node.type or 'ops'} of this type add" if same else ""
        if len(same) >= MIN_PEERS:
            vals = [rows[g].own for g in same]
            med = median(vals)
            mad = median([abs(v - med) for v in vals])
            ref = max(med + _MAD_WEIGHT * 1.4826 * mad, floor)
            r.peers = len(same)
        elif is_lookup(node.type):
            ref = floor  # its output is rows of its table, each rounded once to the test dtype: no more to add
            label = f"one {r.dtype or 'test dtype'} rounding ({_pow2(floor)}), all a lookup adds"
        else:
            ref = 2.0 * floor  # nothing to compare with: twice the rounding, to stay cautious
            label = f"twice the {r.dtype or 'test dtype'} rounding (2 x {_pow2(floor)}), {NO_PEERS}"
        if q_below.get(gid, 0.0) > ref:  # a module holding quantized ops: their noise adds up in it
            ref = q_below[gid]
            label = f"the int8 rounding its quantized ops are expected to add ({ref:.3g})"
        # the error an op passes on comes out at gain x what came in, give or take GAIN_NOISE; measured as added
        # (in quadrature) that is sqrt(gain^2 - 1 + GAIN_NOISE^2) x the input's (GAIN_NOISE for a gain of 1)
        gain = error_gain(node.type)
        noise = gain_noise(r.numel, node.type)
        carried = math.sqrt(gain * gain - 1.0 + noise * noise) * (r.in_err or 0.0)
        what = "an op" if gain == 1.0 else f"an op multiplying a relative error by {gain:g}"
        passing = f"passing on input error {r.in_err or 0.0:.3g}" + (
            f" onto {r.numel} elements" if noise > GAIN_NOISE else ""
        )
        summed = is_sum(node.type)
        if r.in_reach is not None and (summed or (r.numel is not None and r.numel <= _FEW_FOR_ELEMENTWISE)):
            # a product's elements carry their factors' errors: at most their largest, summed; a sum's output error is
            # at most its inputs' errors added, however far they cancel; and one rounding
            reach = r.in_reach + floor
            by_element = math.sqrt(max(reach * reach - (r.in_err or 0.0) ** 2, 0.0))
            if by_element > carried:
                carried = by_element
                what, passing = (
                    ("a sum", f"passing on its inputs' errors added, over its output's norm ({reach:.3g})")
                    if summed
                    else ("a product", f"passing on its factors' largest elementwise errors ({reach:.3g})")
                )
        if carried > ref:
            label = (
                f"what {what} {passing} may add ({carried:.3g}; "
                f"{label.removeprefix('what ').replace(' adds', f' adds {ref:.3g}', 1)})"
            )
            ref = carried
        r.carries = 0.0 < r.own <= carried and not r.new_nan_inf
        r.ref = ref
        r.peer_label = label
        r.score = min(r.own / ref, MAX_SCORE) if ref > 0 else 0.0
        r.nan_inf_born = r.new_nan_inf and not r.in_nan_inf and gid not in nan_inf_below
        if r.nan_inf_born:
            r.score = NAN_INF_SCORE
        r.cause = _known_cause_of(gid, nodes, r.dtype, run_dtype, table_arguments) if _stands_out_alone(r) else None
        if r.cause is None and cached and gid in cached and _stands_out_alone(r):
            # what it adds is within what an earlier token's keys and values carried, twice its input's now or more
            earlier, carried_in_cache = cached[gid]
            if carried_in_cache >= r.own and carried_in_cache >= 2.0 * (r.in_err or 0.0):
                r.cause = kv_cache_cause(earlier, carried_in_cache)
        if quant and gid in quant and not r.nan_inf_born:  # a quantized op: its own noise is the reference
            r.quant = True
            r.ref, score, r.peer_label, r.cause = quant_noise.judge(quant[gid], r.own, max(floor, carried))
            r.score = min(score, MAX_SCORE)
        r.reason = _reason(r, nodes)

    _carried_causes(rows, nodes, by_pattern)

    # an op whose error a known cause explains (a rotary table from a rounded inv_freq) yields the first places to
    # the ops that stand out unexplained: a defect elsewhere is what the user is after; it stays listed, with
    # its cause, and comes first when nothing else stands out
    # (an op carrying another's explained error comes right after it)
    def rank_key(r: _Row) -> tuple[float, int, bool, int]:
        capped = r.cause is not None and not r.quant  # a quantization fault is what the user is after
        at = nodes[r.node_id if r.carried_from is None else r.carried_from].exec_order
        return (-(min(r.score, _EXPLAINED_RANK) if capped else r.score), at, r.carried_from is not None, r.node_id)

    order = sorted(rows.values(), key=rank_key)
    return _children_first(order, nodes)


def _carried_causes(rows: dict[int, _Row], nodes: dict[int, _Node], by_pattern: dict[str, list[int]]) -> None:
    """Give an op standing out the cause of an earlier op whose error reaches it unseen, where its peers cannot
    show what they add.

    transformers hands the rotary tables to every attention as keyword arguments, which msit does not dump: the
    attention is judged against a stand-in input (the norm before it) and the tables' error (a rounded
    `inv_freq`) counts as its own. The other layers' attentions receive the same tables, but their stand-in
    inputs carry more error than their outputs, so what they add reads as nothing; only the layer whose input is
    clean (layer 0) stands out. Such an op takes the cause when its own error is at most the tables' (a gain of
    1 at most): a defect adding more than that keeps standing out unexplained."""
    # where the dump records no order between them (a module's arguments computed by its parent before the call
    # and dumped after it), the source's parent being the op's ancestor is enough: it computed what it hands down
    sources = sorted(
        (nodes[g].end_order, g)
        for g, r in rows.items()
        if r.cause is not None and not r.quant and r.score >= STANDS_OUT and not r.nan_inf_born
    )
    if not sources:
        return
    for gid, r in rows.items():
        node = nodes[gid]
        unseen = r.in_from != "inputs" or r.side_from is not None  # what else it takes was not dumped, or set apart
        if r.cause is not None or not unseen or r.score < STANDS_OUT or r.nan_inf_born or r.quant or node.layer is None:
            continue
        ancestors = _ancestors(gid, nodes)
        source = next(
            (
                s
                for end, s in sources
                if (
                    s == r.side_from
                    or (r.side_from is None and (end < node.exec_order or nodes[s].parent_id in ancestors))
                )
                and r.own <= rows[s].out_err
            ),
            None,
        )
        peers = [rows[g] for g in by_pattern[node.pattern] if g != gid]
        if source is None or not _peers_hide_what_they_add(r, peers):
            continue
        src = rows[source]
        r.carried_from = source
        r.cause = (
            f"{CAUSE_LEAD}{_short(nodes[source].name)}'s error ({(src.cause or '').removeprefix(CAUSE_LEAD)}), "
            + (
                "which it takes besides its inputs; "
                if r.side_from == source
                else "which reaches it as an argument the dump does not hold; "
            )
            + "the other layers' inputs carry more error than their outputs and hide what they add"
        )
        r.reason = _reason(r, nodes)


def _table_arguments(nodes: dict[int, _Node]) -> set[int]:
    """Calls that compute a rotary table's argument with no module around them (msprobe's L1): a product run just
    before a sin or cos (`positions * inv_freq`, DeepSeek's; or `cos * attention_scaling` before the sin)."""
    top = sorted((n for n in nodes.values() if n.parent_id is None), key=lambda n: (n.exec_order, n.node_id))
    return {a.node_id for a, b in itertools.pairwise(top) if errors_add(a.type) and is_table_call(b.type)}


def _known_cause_of(
    gid: int, nodes: dict[int, _Node], dtype: str | None, run_dtype: str | None, table_arguments: set[int]
) -> str | None:
    """`known_cause` of an op, else of the module it runs inside, in the run's dtype: msprobe dumps the calls inside
    a rotary embedding (`Tensor.sin`, `Tensor.cos` and the product giving their argument, `_table_arguments`),
    computed in float32 from the `inv_freq` the run's dtype rounded (without the module, at msprobe's L1, such a
    call is taken for one)."""
    cause = known_cause(nodes[gid].type, dtype)
    if cause is None and (is_table_call(nodes[gid].type) or gid in table_arguments):
        cause = known_cause("rotary", run_dtype)  # a rotary call with no module around it (msprobe's L1)
    p = nodes[gid].parent_id
    while cause is None and p is not None and p in nodes:
        cause = known_cause(nodes[p].type, run_dtype)
        p = nodes[p].parent_id
    return cause


def _ancestors(gid: int, nodes: dict[int, _Node]) -> set[int]:
    out: set[int] = set()
    p = nodes[gid].parent_id
    while p is not None and p not in out:
        out.add(p)
        p = nodes[p].parent_id if p in nodes else None
    return out


def _peers_hide_what_they_add(r: _Row, peers: list[_Row]) -> bool:
    """Most peers' outputs carry less error than their inputs (what they add cannot be measured), and `r`'s input
    carries less than half of theirs: the peers cannot tell whether `r` adds more than they do. A peer with a
    cleaner input than `r`'s that does not stand out can: it received the same and added little."""
    if len(peers) < MIN_PEERS or r.in_err is None:
        return False
    if any(p.in_err is not None and p.in_err <= r.in_err and p.score < STANDS_OUT for p in peers):
        return False
    hidden = sum(p.in_err is not None and p.out_err <= p.in_err for p in peers)
    return 2 * hidden >= len(peers) and r.in_err < 0.5 * median([p.in_err or 0.0 for p in peers])


def _stands_out_alone(r: _Row) -> bool:
    """Its own error (what no descendant explains) stands out of its peers' noise, and is most of what it adds."""
    return r.score >= STANDS_OUT and not r.nan_inf_born and r.own >= r.added * 0.5


# The share of a parent's added error a child must add to explain it. A child that stands out may add a third: the
# parent's own code can multiply two tensors that both carry the child's error (SwiGLU after a fused gate_up
# projection: gate and up each off by e give a product off by ~2e, more where SiLU's slope exceeds 1).
_EXPLAINS_SHARE = 0.5
_EXPLAINS_SHARE_STANDING_OUT = 1.0 / 3.0


def _explains(child: _Row, parent: _Row) -> bool:
    """`child` adds half of `parent`'s added error or more (a third when the child stands out), and more than its own
    peers (score 1) unless the parent scores no higher; a child whose error stays in its peers' noise while the
    parent's own error stands out explains nothing (a whole decoder layer adding error its children do not: the
    residual added twice)."""
    share = _EXPLAINS_SHARE_STANDING_OUT if child.score >= STANDS_OUT else _EXPLAINS_SHARE
    if not child.added >= share * parent.added > 0:
        return False
    if _stands_out_alone(parent) and child.score < STANDS_OUT:
        return False
    return child.score >= 1.0 or child.score >= parent.score


def _children_first(order: list[_Row], nodes: dict[int, _Node]) -> list[_Row]:
    """Never a parent before a descendant that explains its added error (`_explains`)."""
    pos = {r.node_id: k for k, r in enumerate(order)}
    by_id = {r.node_id: r for r in order}
    first: dict[int, list[int]] = defaultdict(list)  # parent -> descendants ranked after it that go first
    for r in order:
        p = nodes[r.node_id].parent_id
        seen = 0
        while p is not None and seen < 10_000:
            parent = by_id.get(p)
            if parent is not None and pos[p] < pos[r.node_id] and _explains(r, parent):
                first[p].append(r.node_id)
            p = nodes[p].parent_id if p in nodes else None
            seen += 1
    out: list[_Row] = []
    placed: set[int] = set()

    def place(gid: int) -> None:
        if gid in placed:
            return
        placed.add(gid)
        for kid in sorted(first.get(gid, ()), key=pos.__getitem__):
            place(kid)
        out.append(by_id[gid])

    for r in order:
        place(r.node_id)
    return out


_LAYER_RE = re.compile(r"(?<=[._/])([0-9]+)(?=[._/]|$)")
# a call named by its API and a counter of its kind (msprobe's `Functional.linear.20.forward`), not by a module path
_COUNTED_CALL = re.compile(r"^(?!Module\.|Cell\.)[A-Za-z_]+\.[^/]+\.[0-9]+\.(?:forward|backward)$")


def _pattern(node: _Node) -> str:
    """The node's name with its layer index masked: `layers.*.mlp.down_proj` for every layer."""
    if node.layer is None:
        return node.name
    layer = str(node.layer)
    return _LAYER_RE.sub(lambda m: "*" if m.group(1) == layer else m.group(1), node.name, count=1)


def _op_label(node: _Node, nodes: dict[int, _Node]) -> str:
    """`LlamaMLP.down_proj`: the parent's type and the node's own name segment."""
    leaf = re.split(r"[./]", node.name)
    seg = next((s for s in reversed(leaf) if s and not s.isdigit() and s not in ("forward", "backward")), node.name)
    if node.type and seg == node.type:
        parts = [s for s in leaf if s and not s.isdigit() and s not in ("forward", "backward", node.type)]
        seg = parts[-1] if parts else seg
    parent = nodes.get(node.parent_id) if node.parent_id is not None else None
    ptype = parent.type if parent is not None and parent.type else ""
    return f"{ptype}.{seg}" if ptype else (f"{node.type} {seg}" if node.type and node.type != seg else seg)


def _pow2(x: float) -> str:
    e = math.log2(x)
    return f"2^{round(e)}" if abs(e - round(e)) < 1e-9 else f"{x:.2g}"


def _reason(r: _Row, nodes: dict[int, _Node]) -> str:
    src = "inputs" if r.in_from == "inputs" else r.in_from
    if r.measured:
        head = f"output rel. error {r.out_err:.3g} from {src} at {r.in_err or 0.0:.3g}"
        if r.bounds_only:
            head += " (lower bounds, from max/min/mean/norm)"
    else:
        head = f"output with no position finite on both sides, {src} at {r.in_err or 0.0:.3g}"
    if r.weight_err is not None and r.weight_err > max(r.in_err or 0.0, ROUNDING.get(r.dtype or "", 0.0)):
        head += f" (its weight input differs by {r.weight_err:.3g})"
    if r.weight_nan_inf:
        head += " (its weight input holds NaN/Inf: a weight out of the test dtype's range?)"
    if r.side_from is not None and r.side_err is not None:
        head += f" (and {_short(nodes[r.side_from].name)}'s output at {r.side_err:.3g}, counted apart)"
    if r.test_type is not None:
        head += f" (the test run has a {r.test_type} here, the golden run a {nodes[r.node_id].type})"
    if r.nan_inf_born:
        return f"NaN/Inf appear in its output and not in its inputs ({head})"
    if not r.measured:
        return f"{head}: not measured (its NaN/Inf come from its inputs or an op inside it)"
    if r.added <= 0:
        return f"{head}: adds nothing measurable"
    if r.own < r.added * 0.5:
        return f"{head}: most of it added inside (by its child ops); {r.score:.1f}x {r.peer_label}"
    return f"{head}: {r.score:.1f}x {r.peer_label}" + (f"; {r.cause}" if r.cause else "")
