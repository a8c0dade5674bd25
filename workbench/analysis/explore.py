"""Read-only SQL the workbench app needs: trees, per-token node status, heatmaps, pair detail, SQL console.

Headless on purpose (no Textual import): the app's thread workers call these methods and post
the results as messages. Everything shown comes from SQL aggregates (`node_results`); tensors
are read only for the one pair shown in the detail pane (histogram and top-k worst elements).
Each call takes its own cursor of one read-only connection, so workers on several threads can
query at once.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import duckdb
import numpy as np

from workbench.analysis.token_view import StripCell, strip_cells

Side = Literal["golden", "test"]

# Heatmap / tree colouring metrics: node_results column, label, better direction.
# `higher_is_better` metrics (cosine) fail below their bound; the others fail above it.
METRICS: dict[str, tuple[str, str, bool]] = {
    "cosine_similarity": ("min_cosine", "cosine", True),
    "relative_euclidean_distance": ("max_rel_euclid", "rel. euclid", False),
    "kl_divergence": ("max_kl", "KL", False),
    "max_relative_error": ("max_rel_err", "max rel err", False),
    "mean_relative_error": ("mean_rel_err", "mean rel err", False),
    "max_absolute_error": ("max_abs_err", "max abs err", False),
    "added_error": ("added_error", "added error", False),
}
# Bounds used for colouring when the comparison stores none for a metric (docs/metrics.md defaults).
DEFAULT_BOUNDS: dict[str, float] = {
    "cosine_similarity": 0.99,
    "relative_euclidean_distance": 0.05,
    "kl_divergence": 0.005,
    "max_relative_error": 0.5,
    "mean_relative_error": 0.05,
    "max_absolute_error": 1.0,
    "added_error": 0.02,
}
MAX_DETAIL_ELEMENTS = 256 * 1024 * 1024  # refuse to load a pair bigger than this (elements per side)
DIFF_CHUNK = 4 * 1024 * 1024  # elements per chunk when computing the error distribution
HIST_EDGES = np.arange(-12.0, 6.5, 0.5)  # log10 |error| bins: half decades from 1e-12 to 1e6


class ExploreError(Exception):
    """A catalog the app cannot show; the message is one line naming the file."""


@dataclass(frozen=True, slots=True)
class ComparisonInfo:
    """The comparison shown: runs, thresholds, tokens and size."""

    cmp_id: int
    golden_run: int
    test_run: int
    golden_path: str
    test_path: str
    golden_kind: str
    test_kind: str
    thresholds: dict[str, Any]
    tokens: list[int]
    n_pairs: int
    comparisons: list[int]
    test_dtype: str | None = None

    def bound(self, metric: str) -> float:
        """Pass/fail bound of a colouring metric for the test dtype (stored thresholds, else a default)."""
        return bound_from_thresholds(self.thresholds, metric, self.test_dtype)


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One topology node as the trees show it."""

    node_id: int
    name: str
    type: str
    parent_id: int | None
    depth: int
    exec_order: int | None
    layer: int | None
    shape: str
    counterpart: int | None  # matched node on the other side
    has_tensors: bool

    @property
    def short_name(self) -> str:
        for sep in (".", "/"):
            if sep in self.name:
                return self.name.rsplit(sep, 1)[-1]
        return self.name


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A golden node's roll-up for one token (from `node_results`)."""

    node_id: int
    counterpart: int | None
    passed: bool | None
    worst: float | None  # value of the colouring metric
    added_error: float | None
    has_nan_inf: bool
    born: bool


@dataclass(slots=True)
class Heatmap:
    """Rows (layers, or ops of one layer) x tokens of one metric, plus failing and NaN/Inf marks."""

    metric: str
    layer: int | None  # None: one row per layer; else one row per op of this layer
    row_labels: list[str]
    row_nodes: list[int | None]  # golden node id per row (op rows), None for layer rows
    row_layers: list[int | None]
    tokens: list[int]
    values: np.ndarray  # float64 [rows, tokens], NaN where nothing was compared
    failed: np.ndarray  # bool [rows, tokens]
    nan_inf: np.ndarray  # bool [rows, tokens]


@dataclass(frozen=True, slots=True)
class PairRow:
    """One compared tensor pair of the selected node and token."""

    pair_id: int
    io: str
    golden_index: int
    test_index: int
    metrics: dict[str, float | None]
    failed_metrics: list[str]
    passed: bool | None
    golden: dict[str, Any]  # dtype, shape, min, max, mean, std, norm, nan, inf, path
    test: dict[str, Any]
    fail_reason: str | None


@dataclass(slots=True)
class TensorDiff:
    """Error distribution and worst elements of one pair, read from its two tensor files."""

    pair_id: int
    numel: int
    hist_edges: list[float]  # log10(|error|) bin edges
    hist_counts: list[int]
    exact: int  # elements with zero error
    nonfinite: int
    top: list[tuple[tuple[int, ...], float, float, float]]  # index, golden, test, abs error
    error: str | None = None


@dataclass(slots=True)
class PairDetail:
    """Everything the detail pane shows for a golden node at a token."""

    node_id: int
    token: int
    golden_name: str
    golden_type: str
    test_name: str | None
    test_type: str | None
    pairs: list[PairRow]
    born_name: str | None  # verdict for this token
    born_here: bool


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A node with tensors and no counterpart."""

    node_id: int
    name: str
    type: str
    layer: int | None
    exec_order: int | None
    outs: int
    ins: int


@dataclass(frozen=True, slots=True)
class NodePair:
    """A current node-level pair (what the mapping editor can unpair)."""

    golden: str
    test: str
    method: str


@dataclass(slots=True)
class ResultSet:
    """A SQL console result: columns, at most `limit` rows, and whether more existed."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    elapsed_ms: float = 0.0
    types: list[str] = field(default_factory=list)


def bound_from_thresholds(thresholds: dict[str, Any], metric: str, dtype: str | None = None) -> float:
    """A metric's bound in a comparison's thresholds JSON (`[dtype.X]` tables of thresholds.toml).

    The table of `dtype` is used, else the one of `default_dtype`; other layouts are searched for the
    metric name; the documented default applies when the metric has no bound.
    """
    tables = thresholds.get("dtype")
    if isinstance(tables, dict) and tables:
        for key in (dtype, thresholds.get("default_dtype"), "float32"):
            table = tables.get(key) if isinstance(key, str) else None
            if isinstance(table, dict) and metric in table:
                value = _bound_value(table[metric])
                if value is not None:
                    return value
        return DEFAULT_BOUNDS.get(metric, 1.0)
    found: list[tuple[int, float]] = []

    def walk(obj: Any, path: tuple[str, ...]) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k == metric:
                    val = _bound_value(v)
                    if val is not None:
                        score = 2 if dtype and dtype in path else (1 if not any(p in _DTYPES for p in path) else 0)
                        found.append((score, val))
                else:
                    walk(v, (*path, str(k)))

    walk(thresholds, ())
    if found:
        return max(found, key=lambda x: x[0])[1]
    return DEFAULT_BOUNDS.get(metric, 1.0)


_DTYPES = ("float16", "bfloat16", "float32", "float64", "fp16", "bf16", "fp32")


def _bound_value(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):
        for key in ("min", "max", "bound", "threshold", "value", "limit"):
            if isinstance(v.get(key), (int, float)) and not isinstance(v.get(key), bool):
                return float(v[key])
    return None


def severity(value: float, metric: str, bound: float) -> float:
    """Error severity of a value: 0 perfect, 1 at the pass/fail bound, >1 failing; NaN stays NaN."""
    if value is None or math.isnan(value):
        return math.nan
    higher_better = METRICS.get(metric, ("", "", False))[2]
    if higher_better:
        gap = max(1.0 - bound, 1e-12)
        return max(0.0, (1.0 - value) / gap)
    if bound <= 0:
        return 0.0 if value <= 0 else math.inf
    return max(0.0, value / bound)


def severity_array(values: np.ndarray, metric: str, bound: float) -> np.ndarray:
    """`severity` over an array (NaN stays NaN)."""
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        if METRICS.get(metric, ("", "", False))[2]:
            out = (1.0 - v) / max(1.0 - bound, 1e-12)
        elif bound <= 0:
            out = np.where(v <= 0, 0.0, np.inf)
            out[np.isnan(v)] = np.nan
        else:
            out = v / bound
    return np.where(np.isnan(out), np.nan, np.maximum(out, 0.0))


def connect_read_only(catalog: str | Path) -> duckdb.DuckDBPyConnection:
    """Open a catalog read-only, confined to itself (`catalog.readonly`); one-line `ExploreError` otherwise."""
    from workbench.catalog import CatalogError
    from workbench.catalog.readonly import connect_read_only as confined

    try:
        return confined(catalog)
    except CatalogError as exc:
        raise ExploreError(str(exc)) from None


class Explorer:
    """Read-only queries over one comparison of a catalog."""

    def __init__(self, catalog: str | Path, cmp_id: int | None = None) -> None:
        self.catalog = Path(catalog)
        self._con = connect_read_only(self.catalog)
        self._lock = threading.Lock()
        try:
            self.info = self._load_info(cmp_id)
        except duckdb.Error as exc:
            self._con.close()
            raise ExploreError(f"{self.catalog}: not a usable wb catalog ({str(exc).splitlines()[0]})") from None
        except BaseException:
            self._con.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def _cur(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            return self._con.cursor()

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        cur = self._cur()
        try:
            return cur.execute(sql, list(params)).fetchall()
        finally:
            cur.close()

    def _numpy(self, sql: str, params: Sequence[Any] = ()) -> dict[str, np.ndarray]:
        cur = self._cur()
        try:
            return cur.execute(sql, list(params)).fetchnumpy()
        finally:
            cur.close()

    def close(self) -> None:
        """Close the connection (the app does this before a write, then opens a new Explorer)."""
        with self._lock:
            self._con.close()

    # ------------------------------------------------------------------ comparison
    def _load_info(self, cmp_id: int | None) -> ComparisonInfo:
        ids = [int(r[0]) for r in self._rows("SELECT cmp_id FROM comparisons ORDER BY cmp_id")]
        if not ids:
            raise ExploreError(f"{self.catalog}: no comparison in this catalog (run `wb compare` first)")
        if cmp_id is None:
            cmp_id = ids[-1]
        elif cmp_id not in ids:
            raise ExploreError(f"{self.catalog}: no comparison {cmp_id} (have {', '.join(map(str, ids))})")
        row = self._rows(
            "SELECT c.golden_run, c.test_run, c.thresholds, g.path, g.kind, t.path, t.kind FROM comparisons c "
            "LEFT JOIN runs g ON g.run_id = c.golden_run LEFT JOIN runs t ON t.run_id = c.test_run "
            "WHERE c.cmp_id = ?",
            [cmp_id],
        )[0]
        try:
            thresholds = json.loads(row[2]) if row[2] else {}
        except (TypeError, ValueError):
            thresholds = {}
        # error_born has one row per compared token: far smaller than node_results
        tokens = [
            int(r[0])
            for r in self._rows("SELECT DISTINCT token_id FROM error_born WHERE cmp_id = ? ORDER BY 1", [cmp_id])
        ]
        if not tokens:
            tokens = [
                int(r[0])
                for r in self._rows("SELECT DISTINCT token_id FROM node_results WHERE cmp_id = ? ORDER BY 1", [cmp_id])
            ]
        if not tokens:
            tokens = [
                int(r[0])
                for r in self._rows("SELECT DISTINCT token_id FROM matches WHERE cmp_id = ? ORDER BY 1", [cmp_id])
            ]
        n_pairs = int(self._rows("SELECT count(*) FROM matches WHERE cmp_id = ?", [cmp_id])[0][0])
        dt = self._rows(
            "SELECT dtype FROM tensors WHERE run_id = ? AND token_id = ? AND dtype IS NOT NULL "
            "GROUP BY dtype ORDER BY count(*) DESC LIMIT 1",
            [row[1], tokens[0] if tokens else 0],
        )
        return ComparisonInfo(
            cmp_id,
            int(row[0]),
            int(row[1]),
            str(row[3] or "?"),
            str(row[5] or "?"),
            str(row[4] or "?"),
            str(row[6] or "?"),
            thresholds if isinstance(thresholds, dict) else {},
            tokens,
            n_pairs,
            ids,
            str(dt[0][0]) if dt else None,
        )

    def logits_strip(self) -> list[StripCell]:
        """One cell per token: the logits verdict, KL, and why the runs' inputs differ (`analysis.logits`)."""
        cur = self._cur()
        try:
            return strip_cells(cur, self.info.cmp_id, self.info.tokens)
        finally:
            cur.close()

    def run_id(self, side: Side) -> int:
        return self.info.golden_run if side == "golden" else self.info.test_run

    # ------------------------------------------------------------------ trees
    def tree_rows(self, side: Side) -> list[TreeRow]:
        """Every node of one side in execution order, with its output shape and counterpart."""
        run = self.run_id(side)
        me, other = ("golden_node_id", "test_node_id") if side == "golden" else ("test_node_id", "golden_node_id")
        first_token = self.info.tokens[0] if self.info.tokens else 0
        rows = self._rows(
            f"""
            WITH shapes AS (
                SELECT node_id, arg_min(shape, idx) AS shape, count(*) AS n
                FROM tensors WHERE run_id = ? AND token_id = ? AND io = 'out' GROUP BY node_id
            ), anyt AS (
                SELECT DISTINCT node_id FROM tensors WHERE run_id = ? AND token_id = ?
            ), cp AS (
                SELECT {me} AS node_id, min({other}) AS counterpart FROM node_matches
                WHERE cmp_id = ? GROUP BY {me}
            )
            SELECT n.node_id, n.name, coalesce(n.type, ''), n.parent_id, coalesce(n.depth, 0), n.exec_order,
                   n.layer, s.shape, cp.counterpart, a.node_id IS NOT NULL
            FROM nodes n
            LEFT JOIN shapes s USING (node_id)
            LEFT JOIN anyt a USING (node_id)
            LEFT JOIN cp USING (node_id)
            WHERE n.run_id = ?
            ORDER BY n.exec_order NULLS LAST, n.node_id""",
            [run, first_token, run, first_token, self.info.cmp_id, run],
        )
        return [
            TreeRow(
                int(r[0]),
                str(r[1]),
                str(r[2]),
                None if r[3] is None else int(r[3]),
                int(r[4]),
                None if r[5] is None else int(r[5]),
                None if r[6] is None else int(r[6]),
                _shape_text(r[7]),
                None if r[8] is None else int(r[8]),
                bool(r[9]),
            )
            for r in rows
        ]

    def node_status(self, token: int, metric: str) -> dict[int, NodeStatus]:
        """Per golden node roll-up at one token, coloured by `metric` (a key of METRICS)."""
        col = METRICS[metric][0]
        rows = self._rows(
            f"SELECT golden_node_id, test_node_id, passed, {col}, added_error, coalesce(has_nan_inf, false), "
            "coalesce(born, false) FROM node_results WHERE cmp_id = ? AND token_id = ?",
            [self.info.cmp_id, token],
        )
        return {
            int(r[0]): NodeStatus(
                int(r[0]), None if r[1] is None else int(r[1]), r[2], _f(r[3]), _f(r[4]), bool(r[5]), bool(r[6])
            )
            for r in rows
        }

    def born(self, token: int) -> tuple[int | None, int | None]:
        """(golden node id, test node id) where the error is born at `token` (None when all passes)."""
        rows = self._rows(
            "SELECT golden_node_id, test_node_id FROM error_born WHERE cmp_id = ? AND token_id = ?",
            [self.info.cmp_id, token],
        )
        if not rows:
            return None, None
        g, t = rows[0]
        return (None if g is None else int(g)), (None if t is None else int(t))

    def born_all(self) -> dict[int, str | None]:
        """token -> golden op name where the error is born."""
        return {
            int(r[0]): r[1]
            for r in self._rows(
                "SELECT b.token_id, n.name FROM error_born b LEFT JOIN nodes n ON n.run_id = ? "
                "AND n.node_id = b.golden_node_id WHERE b.cmp_id = ? ORDER BY 1",
                [self.info.golden_run, self.info.cmp_id],
            )
        }

    # ------------------------------------------------------------------ heatmap
    def heatmap(self, metric: str, layer: int | None = None) -> Heatmap:
        """Token x layer (or token x op of one layer) aggregate of `metric` from node_results."""
        col = METRICS[metric][0]
        higher_better = METRICS[metric][2]
        agg = f"min(r.{col})" if higher_better else f"max(r.{col})"
        tokens = self.info.tokens
        cmp_id, grun = self.info.cmp_id, self.info.golden_run
        if layer is None:
            # rows: "pre" (nodes before the first layer), each layer, "post" (after the last one)
            bounds = self._rows(
                "SELECT min(exec_order), max(exec_order) FROM nodes WHERE run_id = ? AND layer IS NOT NULL", [grun]
            )[0]
            lo = bounds[0] if bounds[0] is not None else 0
            rows = self._numpy(
                f"""
                SELECT CASE WHEN n.layer IS NOT NULL THEN n.layer
                            WHEN coalesce(n.exec_order, 0) < ? THEN -1 ELSE 1000000000 END AS k,
                       r.token_id AS tok, {agg} AS val, sum(coalesce(r.out_failed, 0)) > 0 AS fail,
                       bool_or(coalesce(r.has_nan_inf, false)) AS nan
                FROM node_results r JOIN nodes n ON n.run_id = ? AND n.node_id = r.golden_node_id
                WHERE r.cmp_id = ? AND n.parent_id IS NOT NULL
                GROUP BY 1, 2""",
                [lo, grun, cmp_id],
            )
            keys = sorted({int(x) for x in np.unique(rows["k"])})
            labels = [("pre" if k == -1 else "post" if k == 1_000_000_000 else f"L{k}") for k in keys]
            row_nodes: list[int | None] = [None] * len(keys)
            row_layers: list[int | None] = [None if k in (-1, 1_000_000_000) else k for k in keys]
        else:
            nodes = self._rows(
                "SELECT node_id, name FROM nodes WHERE run_id = ? AND layer = ? ORDER BY exec_order NULLS LAST, "
                "node_id",
                [grun, layer],
            )
            has = {
                int(r[0])
                for r in self._rows(
                    "SELECT DISTINCT r.golden_node_id FROM node_results r JOIN nodes n ON n.run_id = ? AND "
                    "n.node_id = r.golden_node_id WHERE r.cmp_id = ? AND n.layer = ?",
                    [grun, cmp_id, layer],
                )
            }
            nodes = [r for r in nodes if int(r[0]) in has]
            keys = [int(r[0]) for r in nodes]
            prefix = _common_prefix([str(r[1]) for r in nodes])
            labels = [str(r[1])[len(prefix) :] or f"(layer {layer})" for r in nodes]
            row_nodes = list(keys)
            row_layers = [layer] * len(keys)
            rows = self._numpy(
                f"""
                SELECT r.golden_node_id AS k, r.token_id AS tok, {agg} AS val,
                       sum(coalesce(r.out_failed, 0)) > 0 AS fail,
                       bool_or(coalesce(r.has_nan_inf, false)) AS nan
                FROM node_results r JOIN nodes n ON n.run_id = ? AND n.node_id = r.golden_node_id
                WHERE r.cmp_id = ? AND n.layer = ? GROUP BY 1, 2""",
                [grun, cmp_id, layer],
            )
        values = np.full((len(keys), len(tokens)), np.nan)
        failed = np.zeros((len(keys), len(tokens)), dtype=bool)
        nan_inf = np.zeros((len(keys), len(tokens)), dtype=bool)
        if rows["k"].size and keys:
            i, ok_i = _positions(np.asarray(keys, dtype=np.int64), np.asarray(rows["k"], dtype=np.int64))
            j, ok_j = _positions(np.asarray(tokens, dtype=np.int64), np.asarray(rows["tok"], dtype=np.int64))
            ok = ok_i & ok_j
            i, j = i[ok], j[ok]
            values[i, j] = np.ma.filled(np.ma.asarray(rows["val"]).astype(np.float64), np.nan)[ok]
            failed[i, j] = np.ma.filled(np.ma.asarray(rows["fail"]), False)[ok]
            nan_inf[i, j] = np.ma.filled(np.ma.asarray(rows["nan"]), False)[ok]
        return Heatmap(metric, layer, labels, row_nodes, row_layers, list(tokens), values, failed, nan_inf)

    def worst_node(self, token: int, layer: int | None, metric: str) -> int | None:
        """The golden node to select for a layer cell: where the error is born in it, else its worst op."""
        col, _, higher_better = METRICS[metric]
        order = f"r.{col} ASC NULLS LAST" if higher_better else f"r.{col} DESC NULLS LAST"
        layer_sql = "n.layer = ?" if layer is not None else "n.layer IS NULL"
        params: list[Any] = [self.info.golden_run, self.info.cmp_id, token]
        if layer is not None:
            params.append(layer)
        rows = self._rows(
            f"SELECT r.golden_node_id FROM node_results r JOIN nodes n ON n.run_id = ? AND "
            f"n.node_id = r.golden_node_id WHERE r.cmp_id = ? AND r.token_id = ? AND {layer_sql} "
            f"AND n.parent_id IS NOT NULL ORDER BY coalesce(r.born, false) DESC, n.depth DESC, {order}, "
            "n.exec_order LIMIT 1",
            params,
        )
        return int(rows[0][0]) if rows else None

    # ------------------------------------------------------------------ detail
    def pair_detail(self, golden_node_id: int, token: int) -> PairDetail:
        """Metrics and statistics of every tensor pair of a golden node at a token, and the verdict."""
        info = self.info
        # the counterpart at this token (node_results), else any match: prefill and decode graphs differ
        names = self._rows(
            "SELECT g.name, g.type, t.name, t.type FROM nodes g "
            "LEFT JOIN node_results r ON r.cmp_id = ? AND r.token_id = ? AND r.golden_node_id = g.node_id "
            "LEFT JOIN node_matches m ON m.cmp_id = ? AND m.golden_node_id = g.node_id "
            "LEFT JOIN nodes t ON t.run_id = ? AND t.node_id = coalesce(r.test_node_id, m.test_node_id) "
            "WHERE g.run_id = ? AND g.node_id = ? LIMIT 1",
            [info.cmp_id, token, info.cmp_id, info.test_run, info.golden_run, golden_node_id],
        )
        gname, gtype, tname, ttype = names[0] if names else (f"#{golden_node_id}", "", None, None)
        stat_cols = "dtype, shape, min, max, mean, std, norm, nan_count, inf_count, path"
        rows = self._rows(
            f"""
            SELECT m.pair_id, m.io, gt.idx, tt.idx,
                   x.cosine_similarity, x.max_relative_error, x.mean_relative_error, x.max_absolute_error,
                   x.mean_absolute_error, x.kl_divergence, x.relative_euclidean_distance, x.max_ulp_error,
                   x.snr_db, x.one_thousandth_err_ratio, x.five_thousandths_err_ratio,
                   x.failed_metrics, x.passed, x.cmp_fail_reason,
                   {", ".join("gt." + c for c in stat_cols.split(", "))},
                   {", ".join("tt." + c for c in stat_cols.split(", "))},
                   x.golden_nan_count, x.golden_inf_count, x.my_nan_count, x.my_inf_count
            FROM matches m
            JOIN tensors gt ON gt.run_id = ? AND gt.tensor_id = m.golden_tensor_id
            JOIN tensors tt ON tt.run_id = ? AND tt.tensor_id = m.test_tensor_id
            LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id
            WHERE m.cmp_id = ? AND m.golden_node_id = ? AND m.token_id = ?
            ORDER BY m.io DESC, gt.idx, tt.idx""",
            [info.golden_run, info.test_run, info.cmp_id, golden_node_id, token],
        )
        metric_names = (
            "cosine_similarity",
            "max_relative_error",
            "mean_relative_error",
            "max_absolute_error",
            "mean_absolute_error",
            "kl_divergence",
            "relative_euclidean_distance",
            "max_ulp_error",
            "snr_db",
            "one_thousandth_err_ratio",
            "five_thousandths_err_ratio",
        )
        keys = stat_cols.split(", ")
        pairs = []
        for r in rows:
            metrics = {k: _f(v) for k, v in zip(metric_names, r[4:15])}
            g = dict(zip(keys, r[18:28]))
            t = dict(zip(keys, r[28:38]))
            g["nan_count"] = r[38] if r[38] is not None else g["nan_count"]
            g["inf_count"] = r[39] if r[39] is not None else g["inf_count"]
            t["nan_count"] = r[40] if r[40] is not None else t["nan_count"]
            t["inf_count"] = r[41] if r[41] is not None else t["inf_count"]
            g["shape"], t["shape"] = _shape_text(g["shape"]), _shape_text(t["shape"])
            failed = [s.strip() for s in str(r[15] or "").split(",") if s.strip()]
            pairs.append(PairRow(int(r[0]), str(r[1]), int(r[2]), int(r[3]), metrics, failed, r[16], g, t, r[17]))
        born_g, _ = self.born(token)
        born_name = None
        if born_g is not None:
            bn = self._rows("SELECT name FROM nodes WHERE run_id = ? AND node_id = ?", [info.golden_run, born_g])
            born_name = str(bn[0][0]) if bn else None
        return PairDetail(
            golden_node_id,
            token,
            str(gname),
            str(gtype or ""),
            tname,
            ttype,
            pairs,
            born_name,
            born_g == golden_node_id,
        )

    def tensor_diff(self, pair: PairRow, k: int = 8) -> TensorDiff:
        """Histogram of log10|error| and the k worst elements of ONE pair, read from its two files."""
        import warnings

        from workbench.formats.model import DumpError
        from workbench.formats.tensor_io import load_tensor

        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

        gpath, tpath = pair.golden.get("path"), pair.test.get("path")
        if not gpath or not tpath:
            return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], "statistics-only dump: no tensor data")
        try:
            g = load_tensor(gpath)
            if g.numel() > MAX_DETAIL_ELEMENTS:
                raise DumpError(gpath, f"{g.numel():,} elements is too large to show")
            t = load_tensor(tpath)
        except DumpError as exc:
            return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], str(exc))
        if g.numel() != t.numel():
            return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], f"shapes differ: {tuple(g.shape)} vs {tuple(t.shape)}")
        shape = tuple(int(s) for s in g.shape)
        gflat, tflat = g.detach().reshape(-1), t.detach().reshape(-1)
        n = int(gflat.numel())
        counts = np.zeros(len(HIST_EDGES) - 1, dtype=np.int64)
        exact = nonfinite = 0
        cand_score: list[np.ndarray] = []
        cand_index: list[np.ndarray] = []
        cand_g: list[np.ndarray] = []
        cand_t: list[np.ndarray] = []
        # in chunks, so the float64 working copies stay small whatever the tensor size
        for start in range(0, n, DIFF_CHUNK):
            gc = gflat[start : start + DIFF_CHUNK].double().numpy()
            tc = tflat[start : start + DIFF_CHUNK].double().numpy()
            err = np.abs(gc - tc)
            finite = np.isfinite(err)
            nonfinite += int(err.size - int(finite.sum()))
            fe = err[finite]
            exact += int((fe == 0).sum())
            pos = fe[fe > 0]
            if pos.size:
                logs = np.clip(np.log10(pos), HIST_EDGES[0], HIST_EDGES[-1] - 1e-9)
                counts += np.histogram(logs, bins=HIST_EDGES)[0]
            score = np.where(finite, err, np.inf)
            kk = min(k, score.size)
            if kk:
                idx = np.argpartition(-score, kk - 1)[:kk]
                cand_score.append(score[idx])
                cand_index.append(idx + start)
                cand_g.append(gc[idx])
                cand_t.append(tc[idx])
        del g, t, gflat, tflat
        top: list[tuple[tuple[int, ...], float, float, float]] = []
        if cand_score:
            sc, ix = np.concatenate(cand_score), np.concatenate(cand_index)
            gv, tv = np.concatenate(cand_g), np.concatenate(cand_t)
            order = np.lexsort((ix, -sc))[:k]  # worst first, then by position
            for j in order:
                index = tuple(int(x) for x in np.unravel_index(int(ix[j]), shape)) if shape else ()
                top.append((index, float(gv[j]), float(tv[j]), float(abs(gv[j] - tv[j]))))
        nz = np.nonzero(counts)[0]
        edges: list[float] = []
        hist: list[int] = []
        if nz.size:
            lo, hi = int(nz[0]), int(nz[-1]) + 1
            edges = [float(x) for x in HIST_EDGES[lo : hi + 1]]
            hist = [int(c) for c in counts[lo:hi]]
        return TensorDiff(pair.pair_id, n, edges, hist, exact, nonfinite, top)

    # ------------------------------------------------------------------ mapping editor
    def unmatched(self, side: Side) -> list[Unmatched]:
        """Nodes of one side with tensors and no counterpart in this comparison, in execution order."""
        run = self.run_id(side)
        col = "golden_node_id" if side == "golden" else "test_node_id"
        rows = self._rows(
            f"""
            WITH t AS (
                SELECT node_id, count(*) FILTER (WHERE io = 'out') AS outs, count(*) FILTER (WHERE io = 'in') AS ins
                FROM tensors WHERE run_id = ? AND token_id = ? GROUP BY node_id
            )
            SELECT n.node_id, n.name, coalesce(n.type, ''), n.layer, n.exec_order, t.outs, t.ins
            FROM nodes n JOIN t USING (node_id)
            WHERE n.run_id = ? AND n.node_id NOT IN (SELECT {col} FROM node_matches WHERE cmp_id = ?)
            ORDER BY n.exec_order NULLS LAST, n.node_id""",
            [run, self.info.tokens[0] if self.info.tokens else 0, run, self.info.cmp_id],
        )
        return [
            Unmatched(
                int(r[0]),
                str(r[1]),
                str(r[2]),
                None if r[3] is None else int(r[3]),
                None if r[4] is None else int(r[4]),
                int(r[5]),
                int(r[6]),
            )
            for r in rows
        ]

    def node_pairs(self) -> list[NodePair]:
        """Current node-level pairs of the comparison, in golden execution order."""
        info = self.info
        rows = self._rows(
            "SELECT g.name, t.name, m.method FROM node_matches m "
            "JOIN nodes g ON g.run_id = ? AND g.node_id = m.golden_node_id "
            "JOIN nodes t ON t.run_id = ? AND t.node_id = m.test_node_id "
            "WHERE m.cmp_id = ? ORDER BY g.exec_order NULLS LAST, g.node_id",
            [info.golden_run, info.test_run, info.cmp_id],
        )
        return [NodePair(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def stored_mapping(self) -> dict[str, Any] | None:
        """The mapping JSON stored with the comparison, if any."""
        rows = self._rows("SELECT mapping FROM comparisons WHERE cmp_id = ?", [self.info.cmp_id])
        if not rows or not rows[0][0]:
            return None
        try:
            data = json.loads(rows[0][0])
        except (TypeError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    # ------------------------------------------------------------------ SQL console
    def run_sql(self, sql: str, limit: int = 1000) -> ResultSet:
        """Run SQL on the read-only connection (`getvariable('cmp_id')` is set); errors raise ValueError."""
        import time

        cur = self._cur()
        start = time.perf_counter()
        try:
            cur.execute("SET VARIABLE cmp_id = ?", [self.info.cmp_id])
            rel = cur.execute(sql)
            if rel.description is None:
                return ResultSet([], [], False, (time.perf_counter() - start) * 1000)
            columns = [str(d[0]) for d in rel.description]
            types = [str(d[1]) for d in rel.description]
            rows = rel.fetchmany(limit + 1)
        except duckdb.Error as exc:
            raise ValueError(str(exc).strip().splitlines()[0]) from None
        finally:
            cur.close()
        return ResultSet(columns, rows[:limit], len(rows) > limit, (time.perf_counter() - start) * 1000, types)


def _positions(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of each value in `keys` (any order) and whether it was found."""
    sorter = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys, values, sorter=sorter)
    pos = np.clip(pos, 0, max(len(keys) - 1, 0))
    idx = sorter[pos] if len(keys) else pos
    found = keys[idx] == values if len(keys) else np.zeros(values.shape, dtype=bool)
    return idx, found


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def _shape_text(shape: Any) -> str:
    if shape is None:
        return ""
    return "[" + ", ".join(str(int(s)) for s in shape) + "]"


def _common_prefix(names: list[str]) -> str:
    if len(names) < 2:
        return ""
    shortest = min(names, key=len)
    if all(n == shortest or n.startswith((shortest + ".", shortest + "/")) for n in names):
        return shortest + ("/" if "/" in shortest and "." not in shortest.rsplit("/", 1)[-1] else ".")
    first, last = min(names), max(names)
    i = 0
    while i < len(first) and i < len(last) and first[i] == last[i]:
        i += 1
    prefix = first[:i]
    cut = max(prefix.rfind("."), prefix.rfind("/"))
    return prefix[: cut + 1] if cut >= 0 else ""
