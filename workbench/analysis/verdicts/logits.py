"""Logits per token: is the test run's next-token distribution the golden run's?

For each token the logits are found on both sides (the `lm_head` / `LmHead` output, else the model's own
output, else the token's last linear call projecting onto the vocabulary: msprobe's `level: L1` records calls only),
reduced to the last position's vocabulary row, and compared in float64: cosine, KL(golden || test)
of the softmaxes, the top-1 of each side, the overlap of the top-5 sets, the probability of the golden top
token in both runs and its change (as llama.cpp's KL statistics report), and the L1 distance of the two
probability vectors. Pass/fail: the `logits` rule of the thresholds (`workbench/data/thresholds.toml`,
cosine and KL bounds per test dtype; `docs/metrics.md`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import duckdb
import numpy as np

from workbench.catalog import first_row
from workbench.catalog.lookup import has_statistics_only_pairs
from workbench.catalog.store import registered, typed_columns
from workbench.compare.judging.judge import model_node
from workbench.compare.judging.thresholds import NAN_INF, Thresholds
from workbench.core.metrics import spec
from workbench.formats.arrays import read_array
from workbench.formats.model import Dump, DumpError, canonical_dtype

COSINE = spec("cosine_similarity").name
KL = spec("kl_divergence").name
LOGITS_NODE = "logits"  # the node name the thresholds' `logits` rule matches
_LOGITS_RE = re.compile(r"lm_?head|logits", re.IGNORECASE)
_PROJECTION_RE = re.compile(r"linear|matmul", re.IGNORECASE)  # a call or module that may be an LM head
_EMBEDDING_RE = re.compile(r"embedding", re.IGNORECASE)
_FLOAT = ("float", "bfloat")
# a logits candidate's row (`_candidate`): an output tensor `t` of a node `n`
_CANDIDATE_COLUMNS = (
    "t.token_id, n.name, n.type, n.parent_id IS NULL, coalesce(n.exec_order, -1), t.idx, t.path, t.dtype, t.shape"
)
TOP_K = 5


@dataclass(frozen=True, slots=True)
class Candidate:
    """One output tensor of one node that may hold a token's logits."""

    token: int
    node: str
    node_type: str | None
    is_root: bool
    order: int
    index: int
    path: str | None
    dtype: str | None
    shape: tuple[int, ...] | None
    projection: bool = False  # a linear call whose output's last dimension is the vocabulary (no LM head is named)


@dataclass(slots=True)
class LogitsRow:
    """The logits comparison of one token (the columns of the catalog table `logits`)."""

    token_id: int
    golden_node: str | None = None
    test_node: str | None = None
    dtype: str | None = None  # the test logits' dtype: picks the thresholds
    vocab: int | None = None
    cosine_similarity: float | None = None
    kl_divergence: float | None = None
    golden_top1: int | None = None
    test_top1: int | None = None
    top1_agree: bool | None = None
    top5_overlap: int | None = None  # how many of the golden top-5 ids are in the test top-5
    golden_top_p_golden: float | None = None  # probability of the golden top-1 id in the golden run
    golden_top_p_test: float | None = None  # ... and in the test run
    golden_top_p_delta: float | None = None  # test - golden
    prob_l1: float | None = None  # sum |p_golden - p_test|
    passed: bool | None = None
    failed_metrics: str | None = None
    reason: str | None = None  # why nothing could be compared
    golden_path: str | None = None
    test_path: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LogitsRow))


def is_float(dtype: str | None) -> bool:
    return dtype is None or str(dtype).startswith(_FLOAT)


def pick_logits(cands: Iterable[Candidate]) -> dict[int, Candidate]:
    """Token -> the tensor holding its logits: the last `lm_head`/`LmHead`/`logits` output in execution order,
    else the model's own first output (the root node, when the dump has exactly one: a dump whose top level holds
    several modules, as msprobe's does, has no model output, and a first module's output is never logits);
    only floating tensors with a vocabulary dimension."""
    named: dict[int, Candidate] = {}
    root: dict[int, Candidate] = {}
    cands = list(cands)
    roots_at: dict[int, set[str]] = {}
    for c in cands:
        if c.is_root:
            roots_at.setdefault(c.token, set()).add(c.node)
    # an op inside a named graph (a tensor-parallel `LmHead/1_AllGatherOperation`) holds a part or another
    # layout of the graph's logits: the outermost named node speaks for it
    outer = {c.node for c in cands if _LOGITS_RE.search(c.node) or (c.node_type and _LOGITS_RE.search(c.node_type))}
    for c in cands:
        if any(c.node.startswith(o + "/") for o in outer if o != c.node):
            continue
        if not is_float(c.dtype) or (c.shape is not None and (len(c.shape) == 0 or c.shape[-1] < 2)):
            continue
        if _LOGITS_RE.search(c.node) or (c.node_type and _LOGITS_RE.search(c.node_type)):
            best = named.get(c.token)
            if best is None or (c.order, -c.index) > (best.order, -best.index):
                named[c.token] = c
        elif c.is_root and model_node(roots_at[c.token]) == c.node:  # the judge's rule: the one root
            best = root.get(c.token)
            if best is None or c.index < best.index:
                root[c.token] = c
    last_projection: dict[int, Candidate] = {}
    for c in cands:
        if c.projection and is_float(c.dtype):
            best = last_projection.get(c.token)
            if best is None or (c.order, -c.index) > (best.order, -best.index):
                last_projection[c.token] = c
    return {**last_projection, **root, **named}


def vocabulary_size(embedding_inputs: Iterable[tuple[str | None, tuple[int, ...] | None]]) -> int | None:
    """The vocabulary of a run: the first dimension of its word embedding's 2-D floating input (the table, as
    msprobe's `Functional.embedding` takes it), when every such input agrees (None: no table dumped)."""
    rows = {shape[0] for dtype, shape in embedding_inputs if shape is not None and len(shape) == 2 and is_float(dtype)}
    return rows.pop() if len(rows) == 1 else None


def _named(regex: re.Pattern[str], node: str, node_type: str | None) -> bool:
    return bool(regex.search(node) or (node_type and regex.search(node_type)))


def _needs_projection(cands: list[Candidate]) -> bool:
    """No candidate names the logits (no LM head, no single root): the last vocabulary projection stands in."""
    if any(_named(_LOGITS_RE, c.node, c.node_type) for c in cands):
        return False
    return model_node({c.node for c in cands if c.is_root}) is None


def stand_in_logits(rows: Iterable[LogitsRow]) -> str | None:
    """What stood in for the logits when the dumps hold no LM head, as `wb compare` and `wb logits` say it: "the
    model's output, X" or "the last linear call onto the vocabulary, X" (None: an LM head's output was judged)."""
    for r in rows:
        node = r.golden_node or r.test_node
        if node is not None and not _LOGITS_RE.search(node):
            what = "the last linear call onto the vocabulary" if _PROJECTION_RE.search(node) else "the model's output"
            return f"{what}, {node}"
    return None


def candidates_from_dump(dump: Dump) -> list[Candidate]:
    """The output tensors of a dump read from disk, as logits candidates."""
    nodes = dump.node_map()
    out = []
    for t in dump.tensors:
        if t.role != "out" or t.path is None:
            continue
        n = nodes.get(t.node)
        order = n.exec_order if n is not None and n.exec_order is not None else -1
        out.append(
            Candidate(
                t.token,
                t.node,
                n.type if n else None,
                n is not None and n.parent is None,
                order,
                t.index,
                t.path,
                t.dtype,
                t.shape,
            )
        )
    if not _needs_projection(out):
        return out
    vocab = vocabulary_size(
        (t.dtype, t.shape)
        for t in dump.tensors
        if t.role == "in" and _named(_EMBEDDING_RE, t.node, n.type if (n := nodes.get(t.node)) else None)
    )
    if vocab is None:
        return out
    return [
        replace(c, projection=True)
        if c.shape and c.shape[-1] == vocab and _named(_PROJECTION_RE, c.node, c.node_type)
        else c
        for c in out
    ]


def candidates_from_catalog(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Candidate]:
    """The output tensors of an ingested run, as logits candidates."""
    rows = con.execute(
        f"SELECT {_CANDIDATE_COLUMNS} FROM tensors t JOIN nodes n ON n.run_id = t.run_id AND n.node_id = t.node_id "
        "WHERE t.run_id = ? AND t.io = 'out' AND t.path IS NOT NULL AND (n.parent_id IS NULL "
        "OR regexp_matches(n.name, ?, 'i') OR regexp_matches(coalesce(n.type, ''), ?, 'i'))",
        [run_id, _LOGITS_RE.pattern, _LOGITS_RE.pattern],
    ).fetchall()
    cands = [_candidate(r) for r in rows]
    if not _needs_projection(cands):
        return cands
    vocab = _run_vocabulary(con, run_id)
    if vocab is None:
        return cands
    projections = con.execute(
        f"SELECT {_CANDIDATE_COLUMNS} FROM tensors t JOIN nodes n ON n.run_id = t.run_id AND n.node_id = t.node_id "
        "WHERE t.run_id = ? AND t.io = 'out' AND t.path IS NOT NULL AND t.shape[-1] = ? "
        "AND (regexp_matches(n.name, ?, 'i') OR regexp_matches(coalesce(n.type, ''), ?, 'i'))",
        [run_id, vocab, _PROJECTION_RE.pattern, _PROJECTION_RE.pattern],
    ).fetchall()
    return cands + [_candidate(r, projection=True) for r in projections]


def _candidate(row: tuple[Any, ...], projection: bool = False) -> Candidate:
    """A candidate from a row of `_CANDIDATE_COLUMNS`."""
    t, name, typ, root, order, idx, path, dtype, shape = row
    return Candidate(
        int(t), str(name), typ, bool(root), int(order), int(idx), str(path), dtype, _shape(shape), projection
    )


def _run_vocabulary(con: duckdb.DuckDBPyConnection, run_id: int) -> int | None:
    """`vocabulary_size` of an ingested run, from its word embedding's inputs."""
    return vocabulary_size(
        (dtype, _shape(shape))
        for dtype, shape in con.execute(
            "SELECT DISTINCT t.dtype, t.shape FROM tensors t JOIN nodes n ON n.run_id = t.run_id "
            "AND n.node_id = t.node_id WHERE t.run_id = ? AND t.io = 'in' AND len(t.shape) = 2 "
            "AND (regexp_matches(n.name, ?, 'i') OR regexp_matches(coalesce(n.type, ''), ?, 'i'))",
            [run_id, _EMBEDDING_RE.pattern, _EMBEDDING_RE.pattern],
        ).fetchall()
    )


def _shape(value: Any) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def last_row(path: str) -> tuple[np.ndarray, str]:
    """The last position's vocabulary row of a logits file, as float64, and the file's dtype."""
    raw = read_array(path)
    arr = np.asarray(raw.array)
    if arr.ndim == 0 or arr.size == 0:
        raise DumpError(path, f"holds a tensor of shape {tuple(arr.shape)}, not logits")
    row = arr.reshape(-1, arr.shape[-1])[-1]
    if raw.dtype == "bfloat16":
        row = (row.astype(np.uint32) << 16).view(np.float32)
    if not is_float(raw.dtype):
        raise DumpError(path, f"holds {raw.dtype}, not logits")
    return row.astype(np.float64), raw.dtype


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = float(np.max(x))
    return x - (top + math.log(float(np.sum(np.exp(x - top)))))


def logits_metrics(golden: np.ndarray, test: np.ndarray) -> dict[str, Any]:
    """The per-token metrics of two vocabulary rows (float64)."""
    g_norm, t_norm = float(np.linalg.norm(golden)), float(np.linalg.norm(test))
    if g_norm == 0.0 and t_norm == 0.0:
        cos = 1.0
    else:
        cos = float(np.dot(golden, test)) / (max(g_norm, 1e-12) * max(t_norm, 1e-12))
    lp, lq = _log_softmax(golden), _log_softmax(test)
    p, q = np.exp(lp), np.exp(lq)
    kl = max(float(np.dot(p, lp - lq)), 0.0)
    k = min(TOP_K, golden.size)
    g_top = np.argsort(-golden, kind="stable")[:k]
    t_top = np.argsort(-test, kind="stable")[:k]
    g1, t1 = int(g_top[0]), int(t_top[0])
    return {
        COSINE: cos,
        KL: kl,
        "golden_top1": g1,
        "test_top1": t1,
        "top1_agree": g1 == t1,
        "top5_overlap": len(set(g_top.tolist()) & set(t_top.tolist())),
        "golden_top_p_golden": float(p[g1]),
        "golden_top_p_test": float(q[g1]),
        "golden_top_p_delta": float(q[g1] - p[g1]),
        "prob_l1": float(np.sum(np.abs(p - q))),
    }


def compare_token(token: int, golden: Candidate | None, test: Candidate | None, th: Thresholds) -> LogitsRow:
    """One token's row; a missing or unreadable side gives a row with a reason and no verdict."""
    row = LogitsRow(token)
    if golden is not None:
        row.golden_node, row.golden_path = golden.node, golden.path
    if test is not None:
        row.test_node, row.test_path, row.dtype = test.node, test.path, canonical_dtype(test.dtype)
    if golden is None or test is None:
        row.reason = f"no logits on the {'golden' if golden is None else 'test'} side at this token"
        return row
    assert golden.path is not None and test.path is not None
    try:
        g, _ = last_row(golden.path)
        t, t_dtype = last_row(test.path)
    except DumpError as exc:
        row.reason = str(exc)
        return row
    row.dtype = canonical_dtype(t_dtype)
    if g.size != t.size:
        row.reason = f"vocabulary sizes differ: golden {g.size}, test {t.size}"
        return row
    row.vocab = int(g.size)
    g_ok, t_ok = np.isfinite(g), np.isfinite(t)
    nan_inf = bool((~t_ok & g_ok).any())
    both = g_ok & t_ok
    if not both.any():
        row.passed, row.failed_metrics, row.reason = False, NAN_INF, "no finite logit on both sides"
        return row
    if both.all():
        values = logits_metrics(g, t)
    else:  # metrics over the finite ids; top ids mapped back to vocabulary ids
        values = logits_metrics(g[both], t[both])
        ids = np.flatnonzero(both)
        values["golden_top1"], values["test_top1"] = int(ids[values["golden_top1"]]), int(ids[values["test_top1"]])
    for key, value in values.items():
        setattr(row, key, value)
    passed, failed = th.judge(
        {COSINE: row.cosine_similarity, KL: row.kl_divergence},
        row.dtype,
        node_name=LOGITS_NODE,
        nan_inf_mismatch=nan_inf,
    )
    row.passed = passed
    row.failed_metrics = ",".join(failed) if failed else None
    return row


def compare_logits(
    golden: Iterable[Candidate], test: Iterable[Candidate], th: Thresholds, tokens: Collection[int] | None = None
) -> list[LogitsRow]:
    """One row per token that has logits on either side (restricted to `tokens` when given)."""
    g, t = pick_logits(golden), pick_logits(test)
    keys = sorted(set(g) | set(t))
    if tokens is not None:
        keys = [k for k in keys if k in tokens]
    return [compare_token(k, g.get(k), t.get(k), th) for k in keys]


def statistics_only_logits_node(dump: Dump) -> str | None:
    """The logits node (an `lm_head`-like output) that `dump` kept as statistics only (no tensor file), else None."""
    for t in dump.tensors:
        if t.role == "out" and t.path is None and t.stats is not None and _LOGITS_RE.search(t.node):
            return t.node
    return None


def rows_from_dumps(golden: Dump, test: Dump, th: Thresholds, tokens: Collection[int] | None = None) -> list[LogitsRow]:
    """Logits rows of two dumps read from disk."""
    return compare_logits(candidates_from_dump(golden), candidates_from_dump(test), th, tokens)


def comparison_thresholds(con: duckdb.DuckDBPyConnection, cmp_id: int) -> Thresholds:
    """The thresholds a comparison was judged with (the defaults when none were stored)."""
    import json

    row = con.execute("SELECT thresholds FROM comparisons WHERE cmp_id = ?", [cmp_id]).fetchone()
    if row is None or row[0] is None:
        return Thresholds.load(None)
    return Thresholds.from_dict(json.loads(row[0]), f"comparison {cmp_id}")


def rows_from_catalog(
    con: duckdb.DuckDBPyConnection, cmp_id: int, th: Thresholds | None = None, tokens: Collection[int] | None = None
) -> list[LogitsRow]:
    """Logits rows of an ingested comparison (tensor paths from the catalog)."""
    runs = con.execute("SELECT golden_run, test_run FROM comparisons WHERE cmp_id = ?", [cmp_id]).fetchone()
    if runs is None:
        raise ValueError(f"no comparison {cmp_id} in the catalog")
    th = th or comparison_thresholds(con, cmp_id)
    return compare_logits(
        candidates_from_catalog(con, int(runs[0])), candidates_from_catalog(con, int(runs[1])), th, tokens
    )


def store_logits(con: duckdb.DuckDBPyConnection, cmp_id: int, rows: list[LogitsRow]) -> None:
    """Replace the `logits` rows of a comparison (the tokens in `rows`)."""
    if not rows:
        return
    columns = typed_columns(
        {c: [getattr(r, c) for r in rows] for c in COLUMNS},
        ints=_INT_COLUMNS,
        floats=_FLOAT_COLUMNS,
        bools=_BOOL_COLUMNS,
    )
    cols = ", ".join(COLUMNS)
    con.execute("BEGIN TRANSACTION")
    try:
        with registered(con, "_logits", columns):
            con.execute(
                "DELETE FROM logits WHERE cmp_id = ? AND token_id IN (SELECT token_id FROM _logits)",
                [cmp_id],
            )
            con.execute(f"INSERT INTO logits (cmp_id, {cols}) SELECT ?, {cols} FROM _logits", [cmp_id])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def first_failing(rows: Iterable[LogitsRow]) -> LogitsRow | None:
    """The first token whose logits fail (never a passing or unjudged one)."""
    return next((r for r in sorted(rows, key=lambda r: r.token_id) if r.passed is False), None)


def describe(row: LogitsRow) -> str:
    """`cosine 0.99996, KL 0.012, top-1 golden 17 / test 17, p(golden top) 0.41 -> 0.33`."""
    parts = [f"cosine {_num(row.cosine_similarity)}", f"KL {_num(row.kl_divergence)}"]
    if row.golden_top1 is not None:
        parts.append(f"top-1 golden {row.golden_top1} / test {row.test_top1}")
    if row.golden_top_p_golden is not None:
        parts.append(f"p(golden top) {row.golden_top_p_golden:.4g} -> {row.golden_top_p_test:.4g}")
    if row.failed_metrics:
        parts.append(f"fails on {row.failed_metrics}")
    return ", ".join(parts)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


_STAT_LOGITS_SQL = """
WITH candidates AS (
    SELECT m.token_id, gn.name, coalesce(gn.exec_order, -1) AS exec_order, count(*) AS pairs,
           count(*) FILTER (WHERE x.passed = false) AS failed, count(x.passed) AS judged
    FROM matches m
    JOIN comparisons c ON c.cmp_id = m.cmp_id
    JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id
    JOIN tensors gt ON gt.run_id = c.golden_run AND gt.tensor_id = m.golden_tensor_id
    JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id
    LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
    WHERE m.cmp_id = ? AND m.io = 'out' AND (gt.path IS NULL OR tt.path IS NULL)
      AND (regexp_matches(gn.name, ?, 'i') OR regexp_matches(coalesce(gn.type, ''), ?, 'i'))
      AND (?::BIGINT IS NULL OR gt.shape[-1] = ?::BIGINT)  -- a vocabulary projection's output (no LM head named)
    GROUP BY m.token_id, gn.name, gn.exec_order
)
-- per token, the last logits-like op that ran (ATB's prefill and decode graphs each have their own LM head)
SELECT name, token_id, pairs, failed, judged FROM candidates
QUALIFY row_number() OVER (PARTITION BY token_id ORDER BY exec_order DESC, name) = 1
ORDER BY token_id
"""


@dataclass(frozen=True, slots=True)
class StatisticsLogits:
    """The logits (the last `lm_head`-like output) of a comparison that dumped them as statistics only."""

    node: str  # the logits op at the first token
    counts: dict[int, tuple[int, int, int]]  # token -> (pairs, failed, judged) of that token's logits op
    projection: bool = False  # no LM head named: the last linear call onto the vocabulary

    @property
    def what(self) -> str:
        """The logits op as the summary and the app name it."""
        return f"the last linear call onto the vocabulary, {self.node}" if self.projection else self.node

    def passed(self, token: int) -> bool | None:
        """Whether the logits' statistics pass at `token` (None: none judged there)."""
        _pairs, failed, judged = self.counts.get(token, (0, 0, 0))
        return False if failed else (True if judged else None)


def statistics_logits(con: duckdb.DuckDBPyConnection, cmp_id: int) -> StatisticsLogits | None:
    """The statistics-only logits of comparison `cmp_id` per token; None when the logits were dumped with tensors
    (or not at all)."""
    if not has_statistics_only_pairs(con, cmp_id):  # (the query joins every output pair: ~0.2 s at 1.9M pairs)
        return None
    pattern = _LOGITS_RE.pattern
    rows = con.execute(_STAT_LOGITS_SQL, [cmp_id, pattern, pattern, None, None]).fetchall()
    projection = False
    if not rows:  # no LM head named (msprobe's `level: L1`): the last linear call onto the vocabulary
        run = first_row(con.execute("SELECT golden_run FROM comparisons WHERE cmp_id = ?", [cmp_id]))
        roots = con.execute("SELECT node_id FROM nodes WHERE run_id = ? AND parent_id IS NULL", [run[0] if run else -1])
        vocab = _run_vocabulary(con, int(run[0])) if run and model_node(roots.fetchall()) is None else None
        if vocab is None:
            return None
        proj = _PROJECTION_RE.pattern
        rows = con.execute(_STAT_LOGITS_SQL, [cmp_id, proj, proj, vocab, vocab]).fetchall()
        projection = True
    if not rows:
        return None
    counts = {int(t): (int(p), int(f), int(j)) for _n, t, p, f, j in rows}
    return StatisticsLogits(str(rows[0][0]), counts, projection)


def statistics_only_logits(con: duckdb.DuckDBPyConnection, cmp_id: int) -> str | None:
    """Why no token's logits were compared when the logits (an `lm_head` output) were dumped as statistics only,
    and what their statistics say; None when they were not."""
    found = statistics_logits(con, cmp_id)
    if found is None:
        return None
    pairs = sum(c[0] for c in found.counts.values())
    failed = sum(c[1] for c in found.counts.values())
    first = next((t for t, c in sorted(found.counts.items()) if c[1]), None)
    said = (
        f"their max/min/mean/norm first fail at token {first} ({failed} of {pairs} pairs fail)"
        if first is not None
        else f"their max/min/mean/norm pass at all {pairs} pairs"
    )
    return (
        f"the logits ({found.what}) were dumped as statistics only: no cosine, KL or top-1 per token; {said}; "
        "re-dump them with tensors to judge each token's next-token distribution"
    )


def load_rows(con: duckdb.DuckDBPyConnection, cmp_id: int) -> list[LogitsRow]:
    """The stored `logits` rows of a comparison, in token order."""
    cols = ", ".join(COLUMNS)
    out = []
    for values in con.execute(f"SELECT {cols} FROM logits WHERE cmp_id = ? ORDER BY token_id", [cmp_id]).fetchall():
        row = LogitsRow(**dict(zip(COLUMNS, values, strict=True)))
        out.append(row)
    return out


def ensure_comparison(con: duckdb.DuckDBPyConnection, golden_run: int, test_run: int, th: Thresholds) -> int:
    """The newest comparison of two ingested runs, created (no mapping, these thresholds) when there is none."""
    row = con.execute(
        "SELECT cmp_id FROM comparisons WHERE golden_run = ? AND test_run = ? ORDER BY cmp_id DESC LIMIT 1",
        [golden_run, test_run],
    ).fetchone()
    if row is not None:
        return int(row[0])
    nxt = con.execute("SELECT nextval('cmp_seq')").fetchone()
    assert nxt is not None
    con.execute(
        "INSERT INTO comparisons (cmp_id, golden_run, test_run, mapping_digest, mapping, thresholds) "
        "VALUES (?, ?, ?, 'none', NULL, ?)",
        [int(nxt[0]), golden_run, test_run, th.to_json()],
    )
    return int(nxt[0])


_INT_COLUMNS = ("token_id", "vocab", "golden_top1", "test_top1", "top5_overlap")
_BOOL_COLUMNS = ("top1_agree", "passed")
_FLOAT_COLUMNS = (COSINE, KL, "golden_top_p_golden", "golden_top_p_test", "golden_top_p_delta", "prob_l1")
