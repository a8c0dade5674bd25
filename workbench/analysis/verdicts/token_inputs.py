"""Were both runs fed the same tokens? From the first token whose inputs differ on, nothing compares like with like.

The ids each run was fed at each token come from, in this order: the ids our dumpers record in the manifest,
the integer inputs of the word embedding in the dump, the statistics a statistics-only dump recorded of that input
(exact ids where max = min, as at every decode token; else only whether the inputs differ), else the previous
token's top-1 of each side (a run that did not follow the other's tokens and decodes greedily feeds its own top-1
back). `refresh_token_analysis`
stores the logits rows and this status per token (`logits`, `token_status`), which `born.refresh_verdicts`
applies: no op is named for a token whose inputs differ.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import duckdb

from workbench.analysis.verdicts.logits import LogitsRow, rows_from_catalog, store_logits
from workbench.catalog.store import bool_column, insert_columns, int_column, object_column
from workbench.formats.model import DumpError
from workbench.formats.token_ids import INT_DTYPES, follows, is_embedding_node, read_ids, recorded_input_ids


@dataclass(slots=True)
class TokenInputs:
    """One token's input status (a row of the catalog table `token_status`)."""

    token_id: int
    inputs_differ: bool | None = None
    golden_input_id: int | None = None
    test_input_id: int | None = None
    source: str | None = None
    reason: str | None = None


def _run_meta(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, Any]:
    row = con.execute("SELECT meta FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None or row[0] is None:
        return {}
    meta = json.loads(row[0]) if isinstance(row[0], str) else row[0]
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True, slots=True)
class EmbeddingInput:
    """What a dump holds of the integer input of a token's word embedding: its ids (read from the file, or exact
    from statistics whose max equals min), else only its recorded statistics."""

    ids: list[int] | None
    shape: tuple[int, ...] | None = None
    stats: tuple[float | None, ...] = ()


# Statistics of the same ids computed by two runs may differ in the last bits (mean and norm are float
# reductions); beyond this they come from different ids.
_STAT_REL_TOL = 1e-6
_STAT_NAMES = ("min", "max", "mean", "norm")


def _number(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    return v if math.isfinite(v) else None


def _from_statistics(shape: Any, numel: Any, stats: tuple[float | None, ...]) -> EmbeddingInput | None:
    dims = tuple(int(d) for d in shape) if shape is not None else None
    lo, hi = stats[0], stats[1]
    if lo is None or hi is None:
        return None
    width = dims[-1] if dims else (int(numel) if numel is not None else None)
    if lo == hi and lo.is_integer() and width is not None and width > 0:
        return EmbeddingInput([int(lo)] * width, dims, stats)
    return EmbeddingInput(None, dims, stats)


def embedding_inputs(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, EmbeddingInput]:
    """Token -> the integer input of the run's word embedding (the first such node in execution order)."""
    rows = con.execute(
        "SELECT t.token_id, n.name, n.type, t.path, t.dtype, t.shape, t.numel, t.min, t.max, t.mean, t.norm "
        "FROM tensors t JOIN nodes n ON n.run_id = t.run_id AND n.node_id = t.node_id "
        "WHERE t.run_id = ? AND t.io = 'in' AND list_contains(?, t.dtype) "
        "ORDER BY t.token_id, n.exec_order NULLS LAST, t.idx",
        [run_id, sorted(INT_DTYPES)],
    ).fetchall()
    out: dict[int, EmbeddingInput] = {}
    for tok, name, typ, path, _dtype, shape, numel, *stats in rows:
        if int(tok) in out or not is_embedding_node(str(name), typ):
            continue
        found: EmbeddingInput | None = None
        if path is not None:
            try:
                found = EmbeddingInput(read_ids(str(path)))
            except DumpError:
                found = None
        if found is None:
            found = _from_statistics(shape, numel, tuple(_number(v) for v in stats))
        if found is not None:
            out[int(tok)] = found
    return out


def _statistics_differ(golden: EmbeddingInput, test: EmbeddingInput) -> str | None:
    """How two embedding inputs known by their statistics differ (None: not by more than rounding, which does not
    make them the same ids)."""
    if golden.shape is not None and test.shape is not None and golden.shape != test.shape:
        return f"the word embedding's input has shape {list(golden.shape)} vs {list(test.shape)}"
    for name, a, b in zip(_STAT_NAMES, golden.stats, test.stats, strict=False):
        if a is not None and b is not None and not math.isclose(a, b, rel_tol=_STAT_REL_TOL, abs_tol=0.0):
            return f"the word embedding's input has {name} {a:g} vs {b:g}"
    return None


_SOURCE_NOTES = {
    "top-1": " [from the previous token's top-1]",
    "embedding statistics": " [from the embedding input's statistics]",
}


def _first_difference(golden: list[int], test: list[int]) -> tuple[int | None, int | None]:
    for a, b in zip(golden, test, strict=False):
        if a != b:
            return a, b
    n = min(len(golden), len(test))
    return (golden[n] if n < len(golden) else None), (test[n] if n < len(test) else None)


def token_inputs(
    con: duckdb.DuckDBPyConnection, cmp_id: int, tokens: list[int], logits: dict[int, LogitsRow]
) -> list[TokenInputs]:
    """The input status of each token of a comparison (see the module docstring for the sources)."""
    runs = con.execute("SELECT golden_run, test_run FROM comparisons WHERE cmp_id = ?", [cmp_id]).fetchone()
    if runs is None:
        raise ValueError(f"no comparison {cmp_id} in the catalog")
    g_meta, t_meta = _run_meta(con, int(runs[0])), _run_meta(con, int(runs[1]))
    g_rec, t_rec = recorded_input_ids(g_meta), recorded_input_ids(t_meta)
    g_emb: dict[int, EmbeddingInput] | None = None
    t_emb: dict[int, EmbeddingInput] | None = None
    followed = follows(g_meta) or follows(t_meta)
    out: list[TokenInputs] = []
    since: int | None = None
    for tok in sorted(tokens):
        row = TokenInputs(tok)
        g_ids, t_ids = g_rec.get(tok), t_rec.get(tok)
        source = "manifest" if g_ids is not None and t_ids is not None else None
        by_statistics: str | None = None
        if source is None:
            if g_emb is None or t_emb is None:
                g_emb, t_emb = embedding_inputs(con, int(runs[0])), embedding_inputs(con, int(runs[1]))
            g_in, t_in = g_emb.get(tok), t_emb.get(tok)
            g_ids = g_ids if g_ids is not None else (g_in.ids if g_in is not None else None)
            t_ids = t_ids if t_ids is not None else (t_in.ids if t_in is not None else None)
            if g_ids is not None and t_ids is not None:
                source = "embedding"
                if (g_in is not None and g_in.stats) or (t_in is not None and t_in.stats):
                    source = "embedding statistics"
            elif g_in is not None and t_in is not None and g_in.stats and t_in.stats:
                by_statistics = _statistics_differ(g_in, t_in)
        if source is not None and g_ids is not None and t_ids is not None:
            row.source = source
            row.inputs_differ = g_ids != t_ids
            if row.inputs_differ:
                row.golden_input_id, row.test_input_id = _first_difference(g_ids, t_ids)
        elif by_statistics is not None:
            row.source = "embedding statistics"
            row.inputs_differ = True
        elif not followed and (prev := logits.get(tok - 1)) is not None and prev.top1_agree is not None:
            row.source = "top-1"
            row.inputs_differ = not prev.top1_agree
            if row.inputs_differ:
                row.golden_input_id, row.test_input_id = prev.golden_top1, prev.test_top1
        if row.inputs_differ:
            what = by_statistics or f"golden token id {row.golden_input_id}, test token id {row.test_input_id}"
            row.reason = f"inputs differ ({what}){_SOURCE_NOTES.get(row.source or '', '')}"
            since = tok if since is None else since
        elif since is not None:
            row.inputs_differ = True
            row.reason = f"inputs of token {since} differ: the runs' caches hold different tokens since then"
        out.append(row)
    return out


def store_token_status(con: duckdb.DuckDBPyConnection, cmp_id: int, rows: list[TokenInputs]) -> None:
    """Replace the `token_status` rows of a comparison."""
    columns = {
        "token_id": int_column([r.token_id for r in rows]),
        "inputs_differ": bool_column([r.inputs_differ for r in rows]),
        "golden_input_id": int_column([r.golden_input_id for r in rows]),
        "test_input_id": int_column([r.test_input_id for r in rows]),
        "source": object_column([r.source for r in rows]),
        "reason": object_column([r.reason for r in rows]),
    }
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute("DELETE FROM token_status WHERE cmp_id = ?", [cmp_id])
        insert_columns(
            con,
            "token_status (cmp_id, token_id, inputs_differ, golden_input_id, test_input_id, source, reason)",
            columns,
            select="?, token_id, inputs_differ, golden_input_id, test_input_id, source, reason",
            params=[cmp_id],
        )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def compared_tokens(con: duckdb.DuckDBPyConnection, cmp_id: int) -> list[int]:
    """The golden tokens a comparison holds pairs for."""
    return [
        int(t)
        for (t,) in con.execute(
            "SELECT DISTINCT token_id FROM matches WHERE cmp_id = ? ORDER BY 1", [cmp_id]
        ).fetchall()
    ]


def refresh_token_analysis(con: duckdb.DuckDBPyConnection, cmp_id: int) -> tuple[list[LogitsRow], list[TokenInputs]]:
    """Compute and store the logits rows and the input status of every token of a comparison's runs
    (a token's status depends on the tokens before it, so a `--tokens` selection does not narrow it)."""
    rows = rows_from_catalog(con, cmp_id)
    store_logits(con, cmp_id, rows)
    keys = sorted(set(compared_tokens(con, cmp_id)) | {r.token_id for r in rows})
    status = token_inputs(con, cmp_id, keys, {r.token_id: r for r in rows})
    store_token_status(con, cmp_id, status)
    return rows, status


def load_token_status(con: duckdb.DuckDBPyConnection, cmp_id: int) -> list[TokenInputs]:
    """The stored `token_status` rows of a comparison, in token order."""
    return [
        TokenInputs(int(r[0]), r[1], r[2], r[3], r[4], r[5])
        for r in con.execute(
            "SELECT token_id, inputs_differ, golden_input_id, test_input_id, source, reason FROM token_status "
            "WHERE cmp_id = ? ORDER BY token_id",
            [cmp_id],
        ).fetchall()
    ]


def token_lines(con: duckdb.DuckDBPyConnection, cmp_id: int) -> tuple[str, dict[int, str]]:
    """What `wb compare` prints about tokens: the first divergent token (the first whose logits fail, with its
    metrics) and, per token whose inputs differ, the line that replaces its verdict."""
    from workbench.analysis.verdicts.logits import (
        describe,
        first_failing,
        load_rows,
        stand_in_logits,
        statistics_only_logits,
    )

    rows = load_rows(con, cmp_id)
    first = first_failing(rows)
    stats_only = None if first is not None or any(r.passed for r in rows) else statistics_only_logits(con, cmp_id)
    stand_in = stand_in_logits(rows)
    said = f"; no LM head in the dumps: {stand_in}" if stand_in else ""
    if first is not None:
        head = f"first divergent token: {first.token_id} ({describe(first)}{said})"
    elif any(r.passed for r in rows):
        n = sum(1 for r in rows if r.passed)
        head = f"first divergent token: none (the logits of all {n} judged tokens pass{said})"
    elif stats_only is not None:
        head = f"first divergent token: unknown ({stats_only})"
    else:
        why = next((r.reason for r in rows if r.reason), "no lm_head/LmHead output or model output in the dumps")
        head = f"first divergent token: unknown (no logits compared: {why})"
    lines: dict[int, str] = {}
    since: int | None = None
    for st in load_token_status(con, cmp_id):
        if not st.inputs_differ:
            continue
        if since is None:
            since = st.token_id
            lines[st.token_id] = f"token {st.token_id}: {st.reason}: comparisons from here on are of different inputs"
        elif st.golden_input_id is not None or st.test_input_id is not None:
            lines[st.token_id] = f"token {st.token_id}: {st.reason}: no op named"
        else:
            lines[st.token_id] = f"token {st.token_id}: no op named (the inputs of token {since} differ)"
    return head, lines
