"""Catalog writes of a comparison: its id, its node pairs and tensor pairs, and the run frames they are built from.

Nothing here reads a tensor; `compare.execution.executor` fills in the metrics of the pairs stored here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import duckdb
import numpy as np

from workbench.catalog import first_row
from workbench.catalog.schema import PAIR_RESULT_TABLES
from workbench.catalog.store import (
    insert_columns,
    node_columns,
    object_column,
    registered,
    run_meta,
    tensor_numel,
)
from workbench.compare.judging.judge import mark_judged
from workbench.compare.judging.thresholds import Thresholds
from workbench.compare.pairing.frames import Coded, NodeTable, RunFrames, TensorPairs, TensorTable
from workbench.compare.pairing.mapping import MappingFile, PairSpec
from workbench.compare.pairing.matching import NodeMatch, pair_tensors
from workbench.formats.model import Dump
from workbench.formats.quant_links import QuantLink, quant_links

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# columns with few distinct values (shape as text: `[4, 8]`) are loaded coded: a Python object per row would be
# ~60 bytes each, a third of the frame of a 150k-file dump
_RUN_TENSORS = """
WITH t AS (SELECT tensor_id, token_id, node_id, io, idx, dtype, shape::VARCHAR AS shape, numel, norm, mean
           FROM tensors WHERE run_id = $run),
     d AS (SELECT col, v, (row_number() OVER (PARTITION BY col ORDER BY v) - 1)::INTEGER AS code
           FROM (SELECT DISTINCT 'io' AS col, io AS v FROM t UNION ALL SELECT DISTINCT 'dtype', dtype FROM t
                 UNION ALL SELECT DISTINCT 'shape', shape FROM t)
           WHERE v IS NOT NULL)
"""


def load_frames(con: duckdb.DuckDBPyConnection, run_id: int) -> RunFrames:
    """The nodes and tensors of one run, as `compare.pairing.matching` takes them.

    Only what matching and planning read: no paths (`compare.execution.executor` reads them from the catalog as it
    plans), and `io`, `dtype` and `shape` (as text) coded."""
    kind_row = first_row(con.execute("SELECT kind, meta FROM runs WHERE run_id = ?", [run_id]))
    assert kind_row is not None
    nodes = NodeTable.of_rows(
        con.execute(
            "SELECT node_id, name, type, parent_id, exec_order, layer, phase, params FROM nodes "
            "WHERE run_id = ? ORDER BY node_id",
            [run_id],
        ).fetchall()
    )
    values: dict[str, list[str]] = {
        str(c): list(v)
        for c, v in con.execute(
            _RUN_TENSORS + "SELECT col, list(v ORDER BY code) FROM d GROUP BY col", {"run": run_id}
        ).fetchall()
    }
    cols = con.execute(
        _RUN_TENSORS + "SELECT t.tensor_id::BIGINT AS tensor_id, t.token_id::BIGINT AS token_id, "
        "t.node_id::BIGINT AS node_id, coalesce(a.code, -1) AS io, t.idx::BIGINT AS idx, "
        "coalesce(b.code, -1) AS dtype, coalesce(c.code, -1) AS shape, coalesce(t.numel, -1) AS numel, "
        "coalesce(t.norm, 'NaN'::DOUBLE) AS norm, coalesce(t.mean, 'NaN'::DOUBLE) AS mean FROM t "
        "LEFT JOIN d a ON a.col = 'io' AND a.v = t.io LEFT JOIN d b ON b.col = 'dtype' AND b.v = t.dtype "
        "LEFT JOIN d c ON c.col = 'shape' AND c.v = t.shape ORDER BY t.tensor_id",
        {"run": run_id},
    ).fetchnumpy()

    def coded(col: str) -> Coded:
        return Coded(np.asarray(cols[col], dtype=np.int32), values.get(col, []))

    tensors = TensorTable(
        np.asarray(cols["tensor_id"], dtype=np.int64),
        np.asarray(cols["token_id"], dtype=np.int64),
        np.asarray(cols["node_id"], dtype=np.int64),
        coded("io"),
        np.asarray(cols["idx"], dtype=np.int64),
        coded("dtype"),
        coded("shape"),
        np.asarray(cols["numel"], dtype=np.int64),
        np.asarray(cols["norm"], dtype=np.float64),
        np.asarray(cols["mean"], dtype=np.float64),
    )
    return RunFrames(run_id, str(kind_row[0]), nodes, tensors, quant=_quant_of(kind_row[1]))


def frames_of_dump(dump: Dump, run_id: int) -> RunFrames:
    """What `load_frames` reads back right after `ingest_dump` wrote `dump` as run `run_id`, made from the dump
    itself: the same tables, without the catalog round trip (~15 ms a dump of ~800 files)."""
    node_ids, rows = node_columns(dump)
    nodes = NodeTable(
        np.asarray(rows["node_id"], dtype=np.int64),
        rows["name"],
        rows["type"],
        rows["parent_id"],
        rows["exec_order"],
        rows["layer"],
        rows["phase"],
        rows["params"],
    )
    ts, n = dump.tensors, len(dump.tensors)
    roles: list[str | None] = [t.role for t in ts]
    tensors = TensorTable(
        np.arange(n, dtype=np.int64),
        np.fromiter((t.token for t in ts), np.int64, n),
        np.fromiter((node_ids[t.node] for t in ts), np.int64, n),
        _sorted_coded(roles, str),
        np.fromiter((t.index for t in ts), np.int64, n),
        _sorted_coded([t.dtype for t in ts], str),
        _sorted_coded([t.shape for t in ts], lambda shape: str(list(shape))),
        np.fromiter((_known(tensor_numel(t.shape), -1) for t in ts), np.int64, n),
        np.fromiter((_known(None if t.stats is None else t.stats.norm, np.nan) for t in ts), np.float64, n),
        np.fromiter((_known(None if t.stats is None else t.stats.mean, np.nan) for t in ts), np.float64, n),
        np.fromiter(
            (v for t in ts for v in (t.payload.file_key[:2] if t.payload is not None else _NO_FILE)), np.int64, 2 * n
        ).reshape(n, 2),
    )
    return RunFrames(run_id, str(dump.kind), nodes, tensors, quant=_quant_of(run_meta(dump)))


_NO_FILE = (-1, -1)


def _sorted_coded(keys: list[K | None], text: Callable[[K], str]) -> Coded:
    """`Coded` of each key's `text` (None: NULL), its values in text order as `load_frames` codes them; one text
    made per distinct key, not per row (a 150k-file dump's shapes are a few dozen)."""
    order = sorted((text(k), k) for k in {k for k in keys if k is not None})
    index = {k: i for i, (_t, k) in enumerate(order)}
    codes = np.fromiter((-1 if k is None else index[k] for k in keys), np.int32, len(keys))
    return Coded(codes, [t for t, _k in order])


def _known(value: V | None, missing: V) -> V:
    return missing if value is None else value


def _quant_of(meta: object) -> list[QuantLink]:
    """The int tensors a run's manifest declares with their scales (`formats/quant_links.py`); [] if none."""
    try:
        parsed = json.loads(meta) if isinstance(meta, str) else meta
        return quant_links(parsed)[0] if isinstance(parsed, dict) else []
    except ValueError:  # reported when the dump was read
        return []


def comparison_for_runs(
    con: duckdb.DuckDBPyConnection, golden_run: int, test_run: int, mapping: MappingFile | None, thresholds: Thresholds
) -> tuple[int, bool]:
    """The comparison of these runs under this mapping (made if new) and whether its thresholds changed."""
    digest = mapping.digest() if mapping and not mapping.is_empty() else "none"
    row = first_row(
        con.execute(
            "SELECT cmp_id, thresholds FROM comparisons WHERE golden_run = ? AND test_run = ? "
            "AND mapping_digest = ? ORDER BY cmp_id DESC LIMIT 1",
            [golden_run, test_run, digest],
        )
    )
    th_json = thresholds.to_json()
    if row:
        changed = (row[1] is None) or json.loads(row[1]) != json.loads(th_json)
        if changed:
            con.execute("UPDATE comparisons SET thresholds = ? WHERE cmp_id = ?", [th_json, row[0]])
        return int(row[0]), changed
    nxt = first_row(con.execute("SELECT nextval('cmp_seq')"))
    assert nxt is not None
    cmp_id = int(nxt[0])
    con.execute(
        "INSERT INTO comparisons (cmp_id, golden_run, test_run, mapping_digest, mapping, thresholds) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            cmp_id,
            golden_run,
            test_run,
            digest,
            "".join(mapping.json_chunks()) if mapping and not mapping.is_empty() else None,
            th_json,
        ],
    )
    mark_judged(con, cmp_id)  # a new comparison: every pair it gets is judged by this wb's rules
    return cmp_id, False


def insert_node_matches(con: duckdb.DuckDBPyConnection, cmp_id: int, matches: list[NodeMatch]) -> None:
    """Add node pairs to a comparison (inside the caller's transaction)."""
    # one row per node pair (docs/catalog.md): a pair matched for several tensor selections (fused q/k/v,
    # gate/up) is still one pair; one already stored (an editor re-pair) is not added again
    first: dict[tuple[int, int], NodeMatch] = {}
    for m in matches:
        first.setdefault((m.golden_node_id, m.test_node_id), m)
    if not first:
        return
    kept = list(first.values())
    columns = {
        "golden_node_id": np.asarray([m.golden_node_id for m in kept], dtype=np.int64),
        "test_node_id": np.asarray([m.test_node_id for m in kept], dtype=np.int64),
        "method": object_column([m.method for m in kept]),
        "confidence": np.asarray([m.confidence for m in kept], dtype=np.float64),
        "evidence": object_column([m.evidence for m in kept]),
    }
    with registered(con, "_nm", columns):
        con.execute(
            "INSERT INTO node_matches SELECT ?, n.golden_node_id, n.test_node_id, n.method, n.confidence, n.evidence "
            "FROM _nm n WHERE NOT EXISTS (SELECT 1 FROM node_matches o WHERE o.cmp_id = ? "
            "AND o.golden_node_id = n.golden_node_id AND o.test_node_id = n.test_node_id)",
            [cmp_id, cmp_id],
        )


def store_node_matches(con: duckdb.DuckDBPyConnection, cmp_id: int, matches: list[NodeMatch]) -> None:
    """Replace the node pairs of a comparison."""
    con.execute("BEGIN TRANSACTION")
    con.execute("DELETE FROM node_matches WHERE cmp_id = ?", [cmp_id])
    insert_node_matches(con, cmp_id, matches)
    con.execute("COMMIT")


def store_pairs(con: duckdb.DuckDBPyConnection, cmp_id: int, pairs: TensorPairs) -> TensorPairs:
    """Insert tensor pairs not yet in the catalog; return every pair of `pairs` with its pair_id."""
    known = {
        (int(g), int(t)): int(p)
        for g, t, p in con.execute(
            "SELECT golden_tensor_id, test_tensor_id, pair_id FROM matches WHERE cmp_id = ?", [cmp_id]
        ).fetchall()
    }
    keys = zip(pairs.golden_tensor_id.tolist(), pairs.test_tensor_id.tolist())
    ids = np.asarray([known.get(k, -1) for k in keys] if known else [-1] * len(pairs), dtype=np.int64)
    new = ids < 0
    if new.any():
        start_row = first_row(
            con.execute("SELECT coalesce(max(pair_id), -1) + 1 FROM matches WHERE cmp_id = ?", [cmp_id])
        )
        assert start_row is not None
        start = int(start_row[0])
        ids[new] = np.arange(start, start + int(new.sum()), dtype=np.int64)
        added = replace(pairs.take(new), pair_id=ids[new])
        insert_columns(con, "matches", added.columns(_MATCH_COLUMNS), select="?, *", params=[cmp_id])
    return replace(pairs, pair_id=ids)


# the columns of `matches` after cmp_id, in the table's order
_MATCH_COLUMNS = (
    "pair_id",
    "token_id",
    "test_token_id",
    "golden_tensor_id",
    "test_tensor_id",
    "golden_node_id",
    "test_node_id",
    "io",
    "method",
    "confidence",
    "transform",
)


def pending_pairs(con: duckdb.DuckDBPyConnection, cmp_id: int) -> TensorPairs:
    """The stored pairs of a comparison that have no metrics yet."""
    return TensorPairs.of_rows(
        con.execute(
            "SELECT token_id, test_token_id, golden_tensor_id, test_tensor_id, golden_node_id, test_node_id, io, "
            "method, confidence, transform, pair_id FROM matches WHERE cmp_id = ? AND pair_id NOT IN "
            "(SELECT pair_id FROM metrics WHERE cmp_id = ?) ORDER BY pair_id",
            [cmp_id, cmp_id],
        ).fetchall()
    )


def store_tensor_pairs(con: duckdb.DuckDBPyConnection, cmp_id: int, pairs: TensorPairs) -> TensorPairs:
    """`store_pairs` in its own transaction."""
    if not len(pairs):
        return pairs
    con.execute("BEGIN TRANSACTION")
    try:
        stored = store_pairs(con, cmp_id, pairs)
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    return stored


def comparison_runs(
    con: duckdb.DuckDBPyConnection, catalog: str | Path, cmp_id: int
) -> tuple[RunFrames, RunFrames, Thresholds]:
    """The golden and test frames of an existing comparison and the thresholds it was judged with."""
    row = first_row(con.execute("SELECT golden_run, test_run, thresholds FROM comparisons WHERE cmp_id = ?", [cmp_id]))
    if row is None:
        raise ValueError(f"{catalog}: no comparison {cmp_id}")
    golden, test = load_frames(con, int(row[0])), load_frames(con, int(row[1]))
    th = Thresholds.from_dict(json.loads(row[2])) if row[2] else Thresholds.load(None)
    return golden, test, th


def edit_node_pairs(
    con: duckdb.DuckDBPyConnection,
    cmp_id: int,
    golden: RunFrames,
    test: RunFrames,
    pairs: Sequence[PairSpec],
    remove: Sequence[tuple[str, str]] = (),
) -> tuple[TensorPairs, int]:
    """Unpair `remove` (golden, test node names) and pair `pairs`, in one transaction.

    Returns the tensor pairs of the new node pairs (with pair ids) and how many tensor pairs were added.
    """
    g_names, t_names = golden.by_name(), test.by_name()
    con.execute("BEGIN TRANSACTION")
    try:
        for g, t in remove:
            gid, tid = g_names.get(g), t_names.get(t)
            if gid is None or tid is None:
                continue
            for table in PAIR_RESULT_TABLES:
                con.execute(
                    f"DELETE FROM {table} WHERE cmp_id = ? AND pair_id IN (SELECT pair_id FROM matches "
                    "WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?)",
                    [cmp_id, cmp_id, gid, tid],
                )
            con.execute(
                "DELETE FROM matches WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?", [cmp_id, gid, tid]
            )
            con.execute(
                "DELETE FROM node_matches WHERE cmp_id = ? AND golden_node_id = ? AND test_node_id = ?",
                [cmp_id, gid, tid],
            )
        new_matches = []
        for p in pairs:
            gid, tid = g_names.get(p.golden), t_names.get(p.test)
            if gid is None:
                raise ValueError(f"golden node {p.golden!r} is not in comparison {cmp_id}")
            if tid is None:
                raise ValueError(f"test node {p.test!r} is not in comparison {cmp_id}")
            new_matches.append(
                NodeMatch(gid, tid, "editor", 1.0, "paired in the mapping editor", p.golden_tensor, p.test_tensor)
            )
        insert_node_matches(con, cmp_id, new_matches)
        tp = pair_tensors(new_matches, golden, test)
        before = first_row(con.execute("SELECT count(*) FROM matches WHERE cmp_id = ?", [cmp_id]))
        stored = store_pairs(con, cmp_id, tp) if len(tp) else tp
        after = first_row(con.execute("SELECT count(*) FROM matches WHERE cmp_id = ?", [cmp_id]))
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
    assert before is not None and after is not None
    return stored, int(after[0]) - int(before[0])
