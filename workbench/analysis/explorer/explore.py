"""Read-only SQL the workbench app needs: trees, per-token node status, heatmaps, pair detail, SQL console.

Headless on purpose (no Textual, no torch import): the app's thread workers call these methods and
post the results (`analysis.explorer.views`) as messages. Everything shown comes from SQL aggregates
(`node_results`); tensors are read only for the one pair shown in the detail pane
(`analysis.explorer.tensor_diff`). Colours are severities (`analysis.explorer.severity`) against the comparison's own
thresholds. Each call takes its own cursor of one read-only connection, so workers on several
threads can query at once.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

from workbench.analysis.explorer.layer_groups import with_layer_groups
from workbench.analysis.explorer.ranks import RankEntry, rank_group
from workbench.analysis.explorer.severity import VERDICT, colouring, severity, severity_array, verdict_columns
from workbench.analysis.explorer.token_view import StripCell, strip_cells
from workbench.analysis.explorer.views import (
    BORN_ADVISOR,
    BORN_FAILS,
    BORN_PRECHECK,
    ComparisonInfo,
    ComparisonSummary,
    ExploreError,
    Heatmap,
    NodePair,
    NodeStatus,
    NodeTensors,
    PairDetail,
    PairRow,
    ResultSet,
    Side,
    TensorDiff,
    TensorStats,
    TokenStatus,
    TokenVerdict,
    TreeRow,
    Unmatched,
)
from workbench.analysis.verdicts.causes import cause_in, is_lookup
from workbench.compare.judging.carried import carried_errors
from workbench.compare.judging.dtypes import compared_compute_dtype, more_precise
from workbench.compare.judging.gain import CARRIED_GAIN, carried_gain
from workbench.compare.judging.thresholds import Thresholds
from workbench.core.advice import NO_PEERS, STANDS_OUT
from workbench.core.metrics import ALL_METRICS, BY_NAME, REL_EUCLID, STAT_BOUND_JUDGED_AS, STAT_METRIC_NAMES
from workbench.formats.overwrites import NOT_JUDGED, overwritten_target

if TYPE_CHECKING:
    from workbench.catalog.lookup import InsideOrigin
    from workbench.compare.pairing.fingerprint import MappingCheck
    from workbench.compare.pairing.mapping import MappingFile

__all__ = ["POST", "PRE", "ExploreError", "Explorer"]

# heatmap row groups outside the decoder layers (layers are numbered from 0)
PRE = -1  # ops before the first layer
POST = 1_000_000_000  # ops after the last layer
SIDES: tuple[Side, Side] = ("golden", "test")
STATUS_CACHE = 64  # per-token roll-ups kept (a token's is one dict of its nodes' NodeStatus)
STAT_COLUMNS = ("dtype", "shape", "min", "max", "mean", "std", "norm", "nan_count", "inf_count", "path")


def info_verdict_columns(info: ComparisonInfo) -> list[tuple[str, str, float]]:
    """(metric, node_results column, bound) of the comparison's verdict metrics for its test dtype."""
    return verdict_columns(info.thresholds, info.test_dtype)


def _stored_thresholds(text: Any) -> tuple[Thresholds, str | None]:
    """The thresholds stored with a comparison; the package defaults (and why) when they cannot be read."""
    if not text:
        return Thresholds.load(), "no thresholds stored with this comparison: package defaults shown"
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("not a table")
        return Thresholds.from_dict(data, "stored thresholds"), None
    except (TypeError, ValueError) as exc:
        return Thresholds.load(), f"stored thresholds unreadable ({str(exc)[:80]}): package defaults shown"


_NOT_A_CATALOG_HINT = "wb open takes a catalog.duckdb written by `wb compare`, its folder, or two dump folders"


class Explorer:
    """Read-only queries over one comparison of a catalog."""

    def __init__(self, catalog: str | Path, cmp_id: int | None = None) -> None:
        self.catalog = Path(catalog)
        from workbench.catalog import CatalogError
        from workbench.catalog.readonly import connect_read_only

        try:
            self._con = connect_read_only(self.catalog, hint=_NOT_A_CATALOG_HINT)
        except CatalogError as exc:
            raise ExploreError(str(exc)) from None
        self._lock = threading.Lock()
        self._cache_lock = threading.Lock()  # the per-token caches below: workers fill them, the UI thread peeks
        self._shapes: dict[tuple[str, int], dict[int, str]] = {}
        self._status: OrderedDict[tuple[int, str], dict[int, NodeStatus]] = OrderedDict()
        self._born: dict[int, tuple[int | None, int | None, str | None]] = {}
        self._verdicts: dict[int, TokenVerdict] = {}
        self._first_shape: dict[tuple[int, int], Any] | None = None
        self._quant_names: frozenset[str] | None = None
        self._stat_roll_up: bool | None = None
        self._containers: list[int] | None = None  # what the heatmap leaves out (`_left_out`)
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

    def _has_table(self, name: str) -> bool:
        from workbench.catalog.lookup import has_table

        cur = self._cur()
        try:
            return has_table(cur, name)
        finally:
            cur.close()

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
        """Close the connection (the app does this before a write, then opens a new Explorer). A worker thread's
        query still running on a cursor makes DuckDB refuse: wait for it (they take milliseconds), up to 10 s."""
        with self._lock:
            deadline = time.monotonic() + 10.0
            while True:
                try:
                    self._con.close()
                    return
                except duckdb.ResourceInUseException:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)

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
        thresholds, note = _stored_thresholds(row[2])
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
        test_dtype = self._test_dtype(cmp_id, int(row[1]))
        return ComparisonInfo(
            cmp_id,
            int(row[0]),
            int(row[1]),
            str(row[3] or "?"),
            str(row[5] or "?"),
            str(row[4] or "?"),
            str(row[6] or "?"),
            thresholds,
            tokens,
            n_pairs,
            ids,
            test_dtype,
            note,
        )

    def _test_dtype(self, cmp_id: int, test_run: int) -> str | None:
        """The dtype the test run computes in (`judge.compared_compute_dtype`); for a comparison of no floating
        tensor, the test run's most common dtype (the header shows it)."""
        cur = self._cur()
        try:
            found = compared_compute_dtype(cur, cmp_id)
        finally:
            cur.close()
        if found is None:
            rows = self._rows(
                "SELECT dtype FROM tensors WHERE run_id = ? AND dtype IS NOT NULL GROUP BY dtype "
                "ORDER BY count(*) DESC, dtype LIMIT 1",
                [test_run],
            )
            found = str(rows[0][0]) if rows else None
        return found

    def logits_strip(self) -> list[StripCell]:
        """One cell per token: the logits verdict, KL, and why the runs' inputs differ (`analysis.verdicts.logits`)."""
        cur = self._cur()
        try:
            return strip_cells(cur, self.info.cmp_id, self.info.tokens)
        finally:
            cur.close()

    def run_id(self, side: Side) -> int:
        return self.info.golden_run if side == "golden" else self.info.test_run

    # ------------------------------------------------------------------ trees
    # ------------------------------------------------------------------ trees
    def tree_rows(self, side: Side) -> list[TreeRow]:
        """Every node of one side in execution order, with its output shape and counterpart.

        `has_tensors` counts every token (a decode-only op has none at the first token); the shape is
        the first output's at the first token the node has tensors at. Calls that no module encloses are
        grouped by layer under rows of their own (`layer_groups`).
        """
        run = self.run_id(side)
        other_run = self.run_id("test" if side == "golden" else "golden")
        me, other = ("golden_node_id", "test_node_id") if side == "golden" else ("test_node_id", "golden_node_id")
        rows = self._rows(
            f"""
            WITH cp AS (
                SELECT {me} AS node_id, min({other}) AS counterpart FROM node_matches
                WHERE cmp_id = ? GROUP BY {me}
            )
            SELECT n.node_id, n.name, coalesce(n.type, ''), n.parent_id, coalesce(n.depth, 0), n.exec_order,
                   n.layer, cp.counterpart, o.layer
            FROM nodes n
            LEFT JOIN cp USING (node_id)
            LEFT JOIN nodes o ON o.run_id = ? AND o.node_id = cp.counterpart
            WHERE n.run_id = ?
            ORDER BY n.exec_order NULLS LAST, n.node_id""",
            [self.info.cmp_id, other_run, run],
        )
        counterpart_layers = {int(r[0]): int(r[8]) for r in rows if r[8] is not None}
        first = self._first_shapes()
        rows = [(*r[:7], first.get((run, int(r[0]))), r[7], (run, int(r[0])) in first) for r in rows]
        return with_layer_groups(self._tree_rows(rows), counterpart_layers)

    @staticmethod
    def _tree_rows(rows: list[tuple[Any, ...]]) -> list[TreeRow]:
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

    def _first_shapes(self) -> dict[tuple[int, int], Any]:
        """(run, node) -> the first output's shape at the first token it has tensors at (None: no output), for
        every node of both sides with tensors: one scan of `tensors` for both trees (it was four), kept."""
        with self._cache_lock:
            cached = self._first_shape
        if cached is None:
            rows = self._rows(
                "SELECT run_id, node_id, arg_min(shape, token_id * 1000000 + idx) FILTER (WHERE io = 'out') "
                "FROM tensors WHERE run_id IN (?, ?) GROUP BY run_id, node_id",
                [self.info.golden_run, self.info.test_run],
            )
            cached = {(int(r[0]), int(r[1])): r[2] for r in rows}
            with self._cache_lock:
                self._first_shape = cached
        return cached

    def shapes_at(self, side: Side, token: int) -> dict[int, str]:
        """node id -> its first output's shape at `token` (a prefill and a decode step differ); cached per token."""
        key = (side, token)
        with self._cache_lock:
            cached = self._shapes.get(key)
        if cached is not None:
            return cached
        rows = self._rows(
            "SELECT node_id, arg_min(shape, idx) FROM tensors WHERE run_id = ? AND token_id = ? AND io = 'out' "
            "GROUP BY node_id",
            [self.run_id(side), token],
        )
        shapes = {int(r[0]): _shape_text(r[1]) for r in rows}
        with self._cache_lock:
            self._shapes[key] = shapes
        return shapes

    def node_status(self, token: int, colour_by: str = VERDICT) -> dict[int, NodeStatus]:
        """Per golden node roll-up at one token; `worst` is the value of a colouring (see `severity`).

        Cached per (token, colouring) for this connection's life (the catalog is read-only here; an edit
        reopens a new Explorer): going back to a token costs nothing. Callers must not modify the dict."""
        key = (token, colour_by)
        with self._cache_lock:
            cached = self._status.get(key)
            if cached is not None:
                self._status.move_to_end(key)
                return cached
        out = self._node_status(token, colour_by)
        with self._cache_lock:
            self._status[key] = out
            while len(self._status) > STATUS_CACHE:
                self._status.popitem(last=False)
        return out

    def token_status(self, token: int, colour_by: str = VERDICT) -> TokenStatus:
        """Everything the trees show at `token` (roll-ups, verdict, shapes), each part cached after its query."""
        verdict = self.verdict(token)
        shapes: dict[str, dict[int, str]] = {side: self.shapes_at(side, token) for side in SIDES}
        return TokenStatus(token, self.node_status(token, colour_by), verdict, shapes)

    def cached_token_status(self, token: int, colour_by: str = VERDICT) -> TokenStatus | None:
        """`token_status` when every part of it is cached, else None: runs no query, so the UI thread may ask."""
        with self._cache_lock:
            status = self._status.get((token, colour_by))
            verdict = self._verdicts.get(token)
            shapes = {side: self._shapes.get((side, token)) for side in SIDES}
            if status is not None:
                self._status.move_to_end((token, colour_by))
        if status is None or verdict is None:
            return None
        ready: dict[str, dict[int, str]] = {side: shape for side, shape in shapes.items() if shape is not None}
        if len(ready) != len(SIDES):
            return None
        return TokenStatus(token, status, verdict, ready)

    def _node_status(self, token: int, colour_by: str) -> dict[int, NodeStatus]:
        info = self.info
        if colour_by == VERDICT:
            cols = info_verdict_columns(info)
            expr = ", ".join(c for _, c, _ in cols) or "NULL"
        else:
            expr = colouring(colour_by).column or "NULL"
        rows = self._rows(
            f"SELECT golden_node_id, test_node_id, passed, added_error, coalesce(has_nan_inf, false), "
            f"coalesce(born, false), {expr} FROM node_results WHERE cmp_id = ? AND token_id = ?",
            [info.cmp_id, token],
        )
        out: dict[int, NodeStatus] = {}
        for r in rows:
            if colour_by == VERDICT:
                sevs = [severity(_f(v), m, b) for (m, _, b), v in zip(cols, r[6:])]
                finite = [s for s in sevs if not math.isnan(s)]
                worst: float | None = max(finite) if finite else None
            else:
                worst = _f(r[6])
            out[int(r[0])] = NodeStatus(
                int(r[0]), None if r[1] is None else int(r[1]), r[2], worst, _f(r[3]), bool(r[4]), bool(r[5])
            )
        return out

    def born(self, token: int) -> tuple[int | None, int | None]:
        """(golden node id, test node id) where the error is born at `token` (None when all passes)."""
        g, t, _ = self.born_evidence(token)
        return g, t

    def born_evidence(self, token: int) -> tuple[int | None, int | None, str | None]:
        """The `error_born` row at `token`: golden node, the test op pinned down (precheck), the evidence (cached)."""
        with self._cache_lock:
            cached = self._born.get(token)
        if cached is None:
            cached = self._born_evidence(token)
            with self._cache_lock:
                self._born[token] = cached
        return cached

    def _born_evidence(self, token: int) -> tuple[int | None, int | None, str | None]:
        if self._judged_by_quant_noise():  # as `wb compare` says: the advisor names the origin, not error_born
            return None, None, None
        rows = self._rows(
            "SELECT golden_node_id, test_node_id, evidence FROM error_born WHERE cmp_id = ? AND token_id = ?",
            [self.info.cmp_id, token],
        )
        if not rows:
            return None, None, None
        g, t, ev = rows[0]
        return (None if g is None else int(g)), (None if t is None else int(t)), (None if not ev else str(ev))

    def verdict(self, token: int) -> TokenVerdict:
        """The verdict at `token` (cached): the op where the error is born (its outputs fail while its inputs pass,
        or a precheck pinned a test op of it down), else the advisor's first op when it stands out of its peers'
        noise, else nothing (saying why where the runs' inputs differ)."""
        with self._cache_lock:
            cached = self._verdicts.get(token)
        if cached is None:
            born_g, born_t, evidence = self.born_evidence(token)
            why, score = self._born_why(born_g, token, evidence)
            differ = self._inputs_differ(token) if born_g is None else None
            if born_g is None and differ is None:  # none born (its evidence may say why): the advisor's, if any
                found, found_score, found_evidence = self._standing_out(token)
                if found is not None:
                    born_g, score, evidence, why = found, found_score, found_evidence, BORN_ADVISOR
            inside = self._highest_inside(born_g, token) if why == BORN_FAILS and born_g is not None else None
            unchecked = why == BORN_FAILS and born_g is not None and self._inputs_unchecked(born_g, token)
            origin: tuple[int | None, float | None, str | None] = (None, None, None)
            if why == BORN_FAILS and score is not None and score < STANDS_OUT:
                origin = self._standing_out(token, unexplained=True)
            origin_name = self.node_name("golden", origin[0]) if origin[0] not in (None, born_g) else None
            cached = TokenVerdict(
                born_g,
                born_t,
                evidence,
                why,
                score,
                inside.name if inside is not None else None,
                inside.score if inside is not None else None,
                differ,
                unchecked,
                origin_name,
                origin[1] if origin_name is not None else None,
            )
            with self._cache_lock:
                self._verdicts[token] = cached
        return cached

    def born_all(self) -> dict[int, str | None]:
        """token -> golden op name where the error is born."""
        if self._judged_by_quant_noise():
            return {t: None for t in self.info.tokens}
        return {
            int(r[0]): r[1]
            for r in self._rows(
                "SELECT b.token_id, n.name FROM error_born b LEFT JOIN nodes n ON n.run_id = ? "
                "AND n.node_id = b.golden_node_id WHERE b.cmp_id = ? ORDER BY 1",
                [self.info.golden_run, self.info.cmp_id],
            )
        }

    # ------------------------------------------------------------------ heatmap
    def _first_layer_order(self) -> int:
        """Execution order of the first node in a layer: nodes outside layers before it are `pre`."""
        lo = self._rows(
            "SELECT min(exec_order) FROM nodes WHERE run_id = ? AND layer IS NOT NULL", [self.info.golden_run]
        )[0][0]
        return int(lo) if lo is not None else 0

    def _group_sql(self, group: int | None) -> tuple[str, list[Any]]:
        """SQL condition on `n` for a heatmap row group: a layer, PRE (before the layers) or POST (after)."""
        if group is None:
            return "n.layer IS NULL", []
        if group == PRE:
            return "n.layer IS NULL AND coalesce(n.exec_order, 0) < ?", [self._first_layer_order()]
        if group == POST:
            return "n.layer IS NULL AND coalesce(n.exec_order, 0) >= ?", [self._first_layer_order()]
        return "n.layer = ?", [group]

    def _cells(
        self, key_sql: str, where: str, params: list[Any], colour_by: str, key_params: Sequence[Any] = ()
    ) -> dict[str, np.ndarray]:
        """(key, token) aggregates: the colouring's worst value, any failed output, any NaN/Inf, and whether an
        output was compared on statistics only (its `stat_rel_euclid_bound`, a lower bound of the relative euclidean
        distance, colours the cell where that metric decides or is the colouring)."""
        info = self.info
        stat_bound = self._stat_bound_in(colour_by)
        stat_agg = "max(r.max_stat_bound)" if stat_bound is not None and self._has_stat_roll_up() else "NULL::DOUBLE"
        if colour_by == VERDICT:
            cols = info_verdict_columns(info)
            aggs = [
                f"{'min' if BY_NAME[m].higher_is_better else 'max'}(r.{c}) AS v{i}" for i, (m, c, _) in enumerate(cols)
            ] or ["NULL AS v0"]
        else:
            c = colouring(colour_by)
            aggs = [f"{'min' if c.higher_is_better else 'max'}(r.{c.column}) AS v0"]
        res = self._numpy(
            f"""
            SELECT {key_sql} AS k, r.token_id AS tok, {", ".join(aggs)},
                   sum(coalesce(r.out_failed, 0)) > 0 AS fail, bool_or(coalesce(r.has_nan_inf, false)) AS nan,
                   {stat_agg} AS stat_bound
            FROM node_results r JOIN nodes n ON n.run_id = ? AND n.node_id = r.golden_node_id
            WHERE r.cmp_id = ? AND NOT list_contains(?, n.node_id) AND {where}
            GROUP BY 1, 2""",
            [*key_params, info.golden_run, info.cmp_id, self._left_out(), *params],
        )
        if colour_by == VERDICT:
            sev = [
                severity_array(np.ma.filled(np.ma.asarray(res[f"v{i}"]).astype(np.float64), np.nan), m, b)
                for i, (m, _, b) in enumerate(cols)
            ]
            if sev:
                stacked = np.vstack(sev)
                with np.errstate(invalid="ignore"):
                    all_nan = np.all(np.isnan(stacked), axis=0)
                    val = np.where(all_nan, np.nan, np.nanmax(np.where(np.isnan(stacked), -1.0, stacked), axis=0))
            else:
                val = np.full(res["k"].shape, np.nan)
            res["val"] = val
        else:
            res["val"] = np.ma.filled(np.ma.asarray(res["v0"]).astype(np.float64), np.nan)
        stat = np.ma.filled(np.ma.asarray(res["stat_bound"]).astype(np.float64), np.nan)
        res["stat"] = ~np.isnan(stat)  # NaN bounds (NaN/Inf statistics) are the `nan` mark's, not a shade
        if stat_bound is not None and res["stat"].any():
            if colour_by == VERDICT:  # in severities, as the verdict's other values
                stat = severity_array(stat, STAT_BOUND_JUDGED_AS, stat_bound)
            with np.errstate(invalid="ignore"):
                res["val"] = np.where(np.isnan(res["val"]) | (stat > res["val"]), stat, res["val"])
        return res

    def _stat_bound_in(self, colour_by: str) -> float | None:
        """Where a statistics-only output's `stat_rel_euclid_bound` colours a cell: the relative euclidean distance's
        bound in the verdict (where that metric decides), the colouring's own bound when it is that metric (inf where
        it has none); None where statistics say nothing of the colouring."""
        if colour_by == VERDICT:
            return next((b for m, _, b in info_verdict_columns(self.info) if m == STAT_BOUND_JUDGED_AS), None)
        if colour_by == STAT_BOUND_JUDGED_AS:
            bound = self.info.bound(colour_by)
            return math.inf if bound is None else bound
        return None

    def _left_out(self) -> list[int]:
        """The golden nodes no heatmap row holds: the model's node and the nodes that enclose a layer (`LlamaModel`,
        `layers`), whose roll-up is the whole model's, not what runs before or after the layers."""
        if self._containers is None:
            rows = self._rows(
                "WITH RECURSIVE up(node_id) AS ("
                "  SELECT c.parent_id FROM nodes c"
                "  WHERE c.run_id = ? AND c.layer IS NOT NULL AND c.parent_id IS NOT NULL"
                "  UNION SELECT p.parent_id FROM up JOIN nodes p ON p.run_id = ? AND p.node_id = up.node_id"
                "  WHERE p.parent_id IS NOT NULL) "
                "SELECT DISTINCT u.node_id FROM up u JOIN nodes n ON n.run_id = ? AND n.node_id = u.node_id "
                "WHERE n.layer IS NULL",
                [self.info.golden_run] * 3,
            )
            from workbench.compare.judging.judge import model_node

            roots = self._rows(
                "SELECT node_id FROM nodes WHERE run_id = ? AND parent_id IS NULL", [self.info.golden_run]
            )
            model = model_node(roots)
            self._containers = sorted({int(r[0]) for r in rows} | ({int(model[0])} if model is not None else set()))
        return self._containers

    def _has_stat_roll_up(self) -> bool:
        """Whether `node_results` has `max_stat_bound` (a catalog opened read-only may predate it)."""
        if self._stat_roll_up is None:
            self._stat_roll_up = bool(
                self._rows(
                    "SELECT 1 FROM duckdb_columns() WHERE database_name = current_database() "
                    "AND table_name = 'node_results' AND column_name = 'max_stat_bound'"
                )
            )
        return self._stat_roll_up

    def heatmap(self, colour_by: str = VERDICT, layer: int | None = None) -> Heatmap:
        """Token x layer (`layer` None) or token x op of one row group (a layer, PRE or POST) of a colouring."""
        tokens = self.info.tokens
        grun = self.info.golden_run
        if layer is None:
            lo = self._first_layer_order()
            key_sql = "CASE WHEN n.layer IS NOT NULL THEN n.layer WHEN coalesce(n.exec_order, 0) < ? THEN ? ELSE ? END"
            cells = self._cells(key_sql, "true", [], colour_by, [lo, PRE, POST])
            keys = sorted({int(x) for x in np.unique(cells["k"])})
            keys = (
                [k for k in keys if k == PRE]
                + [k for k in keys if k not in (PRE, POST)]
                + [k for k in keys if k == POST]
            )
            labels = [("pre" if k == PRE else "post" if k == POST else f"L{k}") for k in keys]
            row_nodes: list[int | None] = [None] * len(keys)
            row_layers: list[int | None] = list(keys)
        else:
            where, params = self._group_sql(layer)
            nodes = self._rows(
                f"SELECT DISTINCT n.node_id, n.name, n.exec_order FROM node_results r JOIN nodes n ON n.run_id = ? "
                f"AND n.node_id = r.golden_node_id WHERE r.cmp_id = ? AND NOT list_contains(?, n.node_id) AND {where} "
                "ORDER BY n.exec_order NULLS LAST, n.node_id",
                [grun, self.info.cmp_id, self._left_out(), *params],
            )
            keys = [int(r[0]) for r in nodes]
            prefix = _common_prefix([str(r[1]) for r in nodes])
            whole = f"(layer {layer})" if layer not in (PRE, POST) else None
            labels = [_row_label(str(r[1]), prefix) or whole or str(r[1]) for r in nodes]
            row_nodes = list(keys)
            row_layers = [layer] * len(keys)
            cells = self._cells("r.golden_node_id", where, params, colour_by)
        values = np.full((len(keys), len(tokens)), np.nan)
        failed = np.zeros((len(keys), len(tokens)), dtype=bool)
        nan_inf = np.zeros((len(keys), len(tokens)), dtype=bool)
        from_statistics = np.zeros((len(keys), len(tokens)), dtype=bool)
        if cells["k"].size and keys:
            i, ok_i = _positions(np.asarray(keys, dtype=np.int64), np.asarray(cells["k"], dtype=np.int64))
            j, ok_j = _positions(np.asarray(tokens, dtype=np.int64), np.asarray(cells["tok"], dtype=np.int64))
            ok = ok_i & ok_j
            i, j = i[ok], j[ok]
            values[i, j] = np.asarray(cells["val"], dtype=np.float64)[ok]
            failed[i, j] = np.ma.filled(np.ma.asarray(cells["fail"]), False)[ok]
            nan_inf[i, j] = np.ma.filled(np.ma.asarray(cells["nan"]), False)[ok]
            from_statistics[i, j] = cells["stat"][ok]
        return Heatmap(
            colour_by, layer, labels, row_nodes, row_layers, list(tokens), values, failed, nan_inf, from_statistics
        )

    def worst_node(self, token: int, layer: int | None, colour_by: str = VERDICT) -> int | None:
        """The golden node to select for a row group's cell: where the error is born in it, else its worst op."""
        where, params = self._group_sql(layer)
        if colour_by == VERDICT:
            order = "coalesce(r.out_failed, 0) DESC, r.min_cosine ASC NULLS LAST"
            if self._has_stat_roll_up():  # statistics-only ops: the largest bound (NaN, from NaN/Inf, sorts first)
                order += ", r.max_stat_bound DESC NULLS LAST"
        else:
            c = colouring(colour_by)
            order = f"r.{c.column} {'ASC' if c.higher_is_better else 'DESC'} NULLS LAST"
        rows = self._rows(
            f"SELECT r.golden_node_id FROM node_results r JOIN nodes n ON n.run_id = ? AND "
            f"n.node_id = r.golden_node_id WHERE r.cmp_id = ? AND r.token_id = ? AND {where} "
            f"AND NOT list_contains(?, n.node_id) ORDER BY coalesce(r.born, false) DESC, n.depth DESC, {order}, "
            "n.exec_order LIMIT 1",
            [self.info.golden_run, self.info.cmp_id, token, *params, self._left_out()],
        )
        return int(rows[0][0]) if rows else None

    def group_of(self, golden_node_id: int) -> int | None:
        """The heatmap row group of a golden node: its layer, PRE or POST (None for the model's node)."""
        rows = self._rows(
            "SELECT layer, exec_order FROM nodes WHERE run_id = ? AND node_id = ?",
            [self.info.golden_run, golden_node_id],
        )
        if not rows or golden_node_id in self._left_out():
            return None
        layer, order = rows[0]
        if layer is not None:
            return int(layer)
        return PRE if (order or 0) < self._first_layer_order() else POST

    # ------------------------------------------------------------------ detail
    def pair_detail(self, golden_node_id: int, token: int) -> PairDetail:
        """Metrics and statistics of every tensor pair of a golden node at a token, and the verdict."""
        info = self.info
        # the counterpart at this token (node_results), else any match: prefill and decode graphs differ
        names = self._rows(
            "SELECT g.name, g.type, t.name, t.type, t.node_id FROM nodes g "
            "LEFT JOIN node_results r ON r.cmp_id = ? AND r.token_id = ? AND r.golden_node_id = g.node_id "
            "LEFT JOIN node_matches m ON m.cmp_id = ? AND m.golden_node_id = g.node_id "
            "LEFT JOIN nodes t ON t.run_id = ? AND t.node_id = coalesce(r.test_node_id, m.test_node_id) "
            "WHERE g.run_id = ? AND g.node_id = ? ORDER BY r.test_node_id IS NULL, m.test_node_id LIMIT 1",
            [info.cmp_id, token, info.cmp_id, info.test_run, info.golden_run, golden_node_id],
        )
        gname, gtype, tname, ttype, tid = names[0] if names else (f"#{golden_node_id}", "", None, None, None)
        keys = list(STAT_COLUMNS)
        n_metrics = len(ALL_METRICS)
        tensor_rows = self._rows(
            f"""
            SELECT m.pair_id, m.io, gt.idx, tt.idx,
                   {", ".join("gt." + c for c in keys)},
                   {", ".join("tt." + c for c in keys)},
                   tt.io, tn.name
            FROM matches m
            JOIN tensors gt ON gt.run_id = ? AND gt.tensor_id = m.golden_tensor_id
            JOIN tensors tt ON tt.run_id = ? AND tt.tensor_id = m.test_tensor_id
            LEFT JOIN nodes tn ON tn.run_id = tt.run_id AND tn.node_id = tt.node_id
            WHERE m.cmp_id = ? AND m.golden_node_id = ? AND m.token_id = ?
            ORDER BY m.io DESC, gt.idx, tn.exec_order NULLS LAST, tt.io DESC, tt.idx""",
            [info.golden_run, info.test_run, info.cmp_id, golden_node_id, token],
        )
        # the metrics of those few pairs by their ids: joined in the query above, DuckDB hashed the whole metrics
        # table (50-100 ms on a 1.9M-pair catalog, at every selection and token change)
        pair_ids = [int(r[0]) for r in tensor_rows]
        metric_cols = [*ALL_METRICS, "failed_metrics", "passed", "cmp_fail_reason"]
        count_cols = ["golden_nan_count", "golden_inf_count", "my_nan_count", "my_inf_count"]
        by_pair = self._pair_rows("metrics", [*metric_cols, *count_cols], pair_ids)
        # statistics metrics (the only ones of a pair with a statistics-only side): the detail's `rel euclid >=` rows
        stat_by_pair = {
            pid: dict(zip(STAT_METRIC_NAMES, x))
            for pid, x in self._pair_rows("stat_metrics", list(STAT_METRIC_NAMES), pair_ids).items()
        }
        absent = (None,) * (len(metric_cols) + len(count_cols))
        rows = []
        for r in tensor_rows:
            x = by_pair.get(int(r[0]), absent)
            stats_end = 4 + 2 * len(keys)
            rows.append((*r[:4], *x[: len(metric_cols)], *r[4:stats_end], *x[len(metric_cols) :], *r[stats_end:]))
        pairs = []
        s0 = 4 + n_metrics + 3
        for r in rows:
            metrics = {k: _f(v) for k, v in zip(ALL_METRICS, r[4 : 4 + n_metrics])}
            metrics.update({k: _f(v) for k, v in stat_by_pair.get(int(r[0]), {}).items()})
            g = dict(zip(keys, r[s0 : s0 + len(keys)]))
            t = dict(zip(keys, r[s0 + len(keys) : s0 + 2 * len(keys)]))
            counts = r[s0 + 2 * len(keys) : s0 + 2 * len(keys) + 4]
            test_io, test_node = r[-2], r[-1]
            for side, (nan, inf) in ((g, counts[0:2]), (t, counts[2:4])):
                side["nan_count"] = nan if nan is not None else side["nan_count"]
                side["inf_count"] = inf if inf is not None else side["inf_count"]
            g["shape"], t["shape"] = _shape_text(g["shape"]), _shape_text(t["shape"])
            failed = [s.strip() for s in str(r[4 + n_metrics] or "").split(",") if s.strip()]
            pairs.append(
                PairRow(
                    int(r[0]),
                    str(r[1]),
                    int(r[2]),
                    int(r[3]),
                    metrics,
                    failed,
                    r[5 + n_metrics],
                    g,
                    t,
                    r[6 + n_metrics],
                    str(test_io or ""),
                    str(test_node or ""),
                )
            )
        pairs = self._with_judged_notes(pairs, golden_node_id, token, str(gname), str(gtype or ""))
        v = self.verdict(token)
        born_g, born_t, evidence, why, score = v.golden, v.test, v.evidence, v.why, v.score
        born_name, born_type = self._node_name_type(info.golden_run, born_g)
        born_test = self._node_name(info.test_run, born_t)
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
            born_test,
            evidence,
            None if tid is None else int(tid),
            why,
            score,
            born_name is not None and born_name in self.quantized_linears(),
            is_lookup(born_type),
            born_g is not None and score is not None and self._scored_without_peers(born_g, token),
            v.inside_name,
            v.inside_score,
            v.inputs_differ,
            v.inputs_unchecked,
            v.origin_name,
            v.origin_score,
        )

    def _with_judged_notes(
        self, pairs: list[PairRow], golden_node_id: int, token: int, name: str, op_type: str
    ) -> list[PairRow]:
        """Each passing pair more precise than the run that its own dtype's bounds would fail says what judged it
        (`judge.judge_pair`): the run's dtype for an input, and for an output the error its inputs carried in
        (`carried.carried_errors`, as the judge read it). What an in-place call overwrites, before the write, says it
        is not judged (`overwrites.overwritten_target`)."""
        pairs = [
            replace(p, judged_note=NOT_JUDGED)
            if p.passed is None and overwritten_target(op_type, p.io, p.golden_index)
            else p
            for p in pairs
        ]
        run_dtype = self.info.test_dtype
        th = self.info.thresholds
        judged = [
            bool(p.passed)
            and more_precise(p.test.get("dtype"), run_dtype)
            and th.judge(p.metrics, p.test.get("dtype"), node_name=name, node_type=op_type, io=p.io)[0] is False
            for p in pairs
        ]
        if not any(judged):
            return pairs
        carried = None
        if any(p.io == "out" for p, j in zip(pairs, judged, strict=True) if j):
            cur = self._cur()
            try:
                carried = carried_errors(cur, self.info.cmp_id, [(token, golden_node_id)], run_dtype).get(
                    (token, golden_node_id)
                )
            finally:
                cur.close()
        out = []
        for p, j in zip(pairs, judged, strict=True):
            if j:
                dtype = p.test.get("dtype")
                if p.io == "in":
                    why = f"holds the error of what ran before it: judged by {run_dtype}'s bounds"
                else:
                    distance = p.metrics.get(REL_EUCLID) or 0.0
                    fed = f"{carried.rel_euclid:.3g}, {carried.source}" if carried else "unknown"
                    shape = p.test.get("shape")
                    numel = math.prod(shape) if isinstance(shape, list | tuple) else None
                    allowed = carried_gain(numel, op_type)
                    gain = f"{allowed:.3g}" + (f" over {numel} elements" if allowed > CARRIED_GAIN * 1.1 else "")
                    why = (
                        f"adds no error of its own (rel euclid {distance:.3g} <= {gain} x what it was "
                        f"fed: {fed}): judged by {run_dtype}'s bounds"
                    )
                p = replace(p, judged_note=f"{dtype} in a {run_dtype} run, over {dtype}'s bounds; it {why}")
            out.append(p)
        return out

    def _pair_rows(self, table: str, columns: list[str], pair_ids: list[int]) -> dict[int, tuple[Any, ...]]:
        """pair_id -> `columns` of `table` (metrics, stat_metrics) for a few pairs of this comparison, by their ids."""
        if not pair_ids:
            return {}
        rows = self._rows(
            f"SELECT pair_id, {', '.join(columns)} FROM {table} "
            f"WHERE cmp_id = ? AND pair_id IN ({', '.join('?' * len(pair_ids))})",
            [self.info.cmp_id, *pair_ids],
        )
        return {int(x[0]): tuple(x[1:]) for x in rows}

    def _scored_without_peers(self, golden_node_id: int, token: int) -> bool:
        """Whether the advisor scored a node at a token over twice the rounding, having no peers (its reason says
        `Nx twice the ... rounding ..., for want of peers`; an op judged on the error it carries in says more)."""
        rows = self._rows(
            "SELECT reason FROM advice WHERE cmp_id = ? AND token_id = ? AND golden_node_id = ? ORDER BY rank LIMIT 1",
            [self.info.cmp_id, token, golden_node_id],
        )
        reason = str(rows[0][0]) if rows and rows[0][0] is not None else ""
        return re.search(rf"\dx twice the [^;]*{re.escape(NO_PEERS)}", reason) is not None

    def _advice_score(self, golden_node_id: int, token: int) -> float | None:
        if not self._has_table("advice"):
            return None
        rows = self._rows(
            "SELECT score FROM advice WHERE cmp_id = ? AND token_id = ? AND golden_node_id = ? ORDER BY rank LIMIT 1",
            [self.info.cmp_id, token, golden_node_id],
        )
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    def _inputs_differ(self, token: int) -> str | None:
        """Why the runs' inputs differ at `token` (`token_status`), None where they do not or nobody knows."""
        if not self._has_table("token_status"):
            return None
        rows = self._rows(
            "SELECT reason FROM token_status WHERE cmp_id = ? AND token_id = ? AND inputs_differ",
            [self.info.cmp_id, token],
        )
        return str(rows[0][0] or "inputs differ") if rows else None

    def _inputs_unchecked(self, golden_node_id: int, token: int) -> bool:
        from workbench.analysis.verdicts.born import inputs_unchecked

        cur = self._cur()
        try:
            return token in inputs_unchecked(cur, self.info.cmp_id, {token: golden_node_id})
        finally:
            cur.close()

    def _highest_inside(self, golden_node_id: int, token: int) -> InsideOrigin | None:
        from workbench.catalog.lookup import highest_inside

        cur = self._cur()
        try:
            return highest_inside(cur, self.info.cmp_id, {token: golden_node_id}).get(token)
        finally:
            cur.close()

    def _born_why(self, born_g: int | None, token: int, evidence: str | None) -> tuple[str | None, float | None]:
        """Why the verdict names `born_g` (`BORN_FAILS` / `BORN_PRECHECK`), and the advisor's score of it."""
        if born_g is None:
            return None, None
        born = self._rows(
            "SELECT born FROM node_results WHERE cmp_id = ? AND token_id = ? AND golden_node_id = ?",
            [self.info.cmp_id, token, born_g],
        )
        fails = bool(born and born[0][0])
        why = BORN_PRECHECK if not fails and (evidence or "").startswith("precheck:") else BORN_FAILS
        return why, self._advice_score(born_g, token)

    def _judged_by_quant_noise(self) -> bool:
        """A quantized comparison: every quantized linear fails the float thresholds, so the stored `error born`
        (the first of them) says nothing; its ops are judged by the int8 noise their scales predict (the advisor)."""
        return self.quantized()  # the linears' names are read once (`quantized_linears`)

    def standing_out(self, token: int) -> int | None:
        """The advisor's first op at `token` when it stands out of its peers' noise (golden node), else None."""
        return self._standing_out(token)[0]

    def _standing_out(self, token: int, unexplained: bool = False) -> tuple[int | None, float | None, str | None]:
        """The advisor's first op at `token` (node, score, evidence) when it stands out of its peers' noise
        (`unexplained`: and no known cause explains it, the origin named beside an op born in the noise)."""
        if not self._has_table("advice"):
            return None, None, None
        rows = self._rows(
            "SELECT golden_node_id, score, evidence, reason FROM advice WHERE cmp_id = ? AND token_id = ? "
            "AND rank = 1 AND score >= ?",
            [self.info.cmp_id, token, STANDS_OUT],
        )
        if not rows or (unexplained and cause_in(str(rows[0][3] or "")) is not None):
            return None, None, None
        return int(rows[0][0]), float(rows[0][1]), None if not rows[0][2] else str(rows[0][2])

    def ranks(self) -> list[RankEntry]:
        """The ranks of this comparison's multi-rank compare (`analysis/explorer/ranks.py`); [] for a single rank."""
        return rank_group(self._rows, self.info.cmp_id)

    def golden_node_id(self, name: str) -> int | None:
        """The golden node of this comparison named `name`, if any."""
        rows = self._rows(
            "SELECT node_id FROM nodes WHERE run_id = ? AND name = ? ORDER BY node_id LIMIT 1",
            [self.run_id("golden"), name],
        )
        return int(rows[0][0]) if rows else None

    def node_name(self, side: Side, node_id: int | None) -> str | None:
        """The name of a node of one side (None for None or an unknown id)."""
        return self._node_name(self.run_id(side), node_id)

    def run_meta(self, side: Side) -> str | None:
        """The manifest a side's run was ingested with (`runs.meta`, JSON text), as stored."""
        rows = self._rows("SELECT CAST(meta AS VARCHAR) FROM runs WHERE run_id = ?", [self.run_id(side)])
        return None if not rows or rows[0][0] is None else str(rows[0][0])

    def _node_name_type(self, run: int, node_id: int | None) -> tuple[str | None, str | None]:
        if node_id is None:
            return None, None
        rows = self._rows("SELECT name, type FROM nodes WHERE run_id = ? AND node_id = ?", [run, node_id])
        if not rows:
            return None, None
        return str(rows[0][0]), None if rows[0][1] is None else str(rows[0][1])

    def _node_name(self, run: int, node_id: int | None) -> str | None:
        return self._node_name_type(run, node_id)[0]

    def tensor_diff(self, pair: PairRow, k: int = 8) -> TensorDiff:
        """Histogram of log10|error| and the k worst elements of ONE pair, read from its two files (no torch)."""
        from workbench.analysis.explorer.tensor_diff import tensor_diff  # the array readers: detail pane only

        return tensor_diff(pair, k)

    def node_tensors(self, side: Side, node_id: int, token: int) -> NodeTensors:
        """One node's own tensors at a token (else at the first token it has any), with their statistics."""
        run = self.run_id(side)
        name = self._rows("SELECT name, coalesce(type, '') FROM nodes WHERE run_id = ? AND node_id = ?", [run, node_id])
        toks = [
            int(r[0])
            for r in self._rows(
                "SELECT DISTINCT token_id FROM tensors WHERE run_id = ? AND node_id = ? ORDER BY 1", [run, node_id]
            )
        ]
        shown = token if token in toks or not toks else toks[0]
        cols = ", ".join(STAT_COLUMNS)
        rows = self._rows(
            f"SELECT io, idx, {cols} FROM tensors WHERE run_id = ? AND node_id = ? AND token_id = ? "
            "ORDER BY io DESC, idx",
            [run, node_id, shown],
        )
        tensors = []
        for r in rows:
            st = dict(zip(STAT_COLUMNS, r[2:]))
            tensors.append(
                TensorStats(
                    str(r[0]),
                    int(r[1]),
                    str(st.pop("dtype") or "-"),
                    _shape_text(st.pop("shape")),
                    st,
                    st.pop("path", None),
                )
            )
        n, t = (str(name[0][0]), str(name[0][1])) if name else (f"#{node_id}", "")
        return NodeTensors(side, node_id, n, t, shown, tensors, toks)

    # ------------------------------------------------------------------ advisor
    def advice(self, token: int | None = None, top: int | None = 50) -> tuple[list[Any], str]:
        """The advisor's ranked suspects (`analysis.verdicts.advisor.advise`), and a note when there are none."""
        from workbench.analysis.verdicts.advisor import advise

        cur = self._cur()
        try:
            rows = list(advise(cur, self.info.cmp_id, token=token, top=top))
        except duckdb.Error as exc:
            return [], f"the advisor could not read this catalog ({str(exc).splitlines()[0]})"
        finally:
            cur.close()
        return rows, "" if rows else "the advisor found nothing to suspect: every compared output passes"

    # ------------------------------------------------------------------ quantized runs
    def quantized(self) -> bool:
        """Whether the comparison's test run declares quantized linears (`formats/quant_links.py`)."""
        return bool(self.quantized_linears())

    def quantized_linears(self) -> frozenset[str]:
        """The names of the quantized linears the comparison's test run declares (read once)."""
        if self._quant_names is None:
            from workbench.analysis.verdicts.fallback import quantized_linears

            cur = self._cur()
            try:
                self._quant_names = frozenset(quantized_linears(cur, self.info.cmp_id))
            finally:
                cur.close()
        return self._quant_names

    def beyond_noise(self, token: int) -> dict[int, float]:
        """golden node -> the advisor's score at `token`: for a quantized op, its error over the int8 rounding its
        scales predict (`analysis/verdicts/quant_noise.py`); for the others, over what their peers add."""
        return {
            int(g): float(s)
            for g, s in self._rows(
                "SELECT golden_node_id, score FROM advice WHERE cmp_id = ? AND token_id = ?", [self.info.cmp_id, token]
            )
            if s is not None
        }

    def fallback(self, k: int = 5) -> list[Any]:
        """The quantized linears worth keeping in float, best first (`verdicts.fallback`; [] for a float run)."""
        from workbench.analysis.verdicts.fallback import fallback

        cur = self._cur()
        try:
            return list(fallback(cur, self.info.cmp_id, k))
        except ValueError:
            return []
        finally:
            cur.close()

    # ------------------------------------------------------------------ comparisons
    def comparisons(self) -> list[ComparisonSummary]:
        """Every comparison of the catalog, newest last."""
        rows = self._rows(
            """
            SELECT c.cmp_id, coalesce(g.path, '?'), coalesce(t.path, '?'), CAST(c.created_at AS VARCHAR),
                   (SELECT count(*) FROM metrics x WHERE x.cmp_id = c.cmp_id),
                   (SELECT count(*) FROM metrics x WHERE x.cmp_id = c.cmp_id AND x.passed = false)
            FROM comparisons c LEFT JOIN runs g ON g.run_id = c.golden_run LEFT JOIN runs t ON t.run_id = c.test_run
            ORDER BY c.cmp_id"""
        )
        return [
            ComparisonSummary(int(r[0]), str(r[1]), str(r[2]), str(r[3] or "")[:19], int(r[4]), int(r[5])) for r in rows
        ]

    # ------------------------------------------------------------------ mapping editor
    def unmatched(self, side: Side) -> list[Unmatched]:
        """Nodes of one side with tensors (at any token) and no counterpart in this comparison, in execution order."""
        run = self.run_id(side)
        col = "golden_node_id" if side == "golden" else "test_node_id"
        rows = self._rows(
            f"""
            WITH first AS (
                SELECT node_id, min(token_id) AS tok, count(DISTINCT token_id) AS ntok
                FROM tensors WHERE run_id = ? GROUP BY node_id
            ), t AS (
                SELECT x.node_id, count(*) FILTER (WHERE io = 'out') AS outs, count(*) FILTER (WHERE io = 'in') AS ins,
                       arg_min(x.numel, CASE WHEN x.io = 'out' THEN x.idx ELSE 1000000 + x.idx END) AS numel
                FROM tensors x JOIN first f ON f.node_id = x.node_id AND x.token_id = f.tok
                WHERE x.run_id = ? GROUP BY x.node_id
            )
            SELECT n.node_id, n.name, coalesce(n.type, ''), n.layer, n.exec_order, t.outs, t.ins, f.ntok, f.tok,
                   t.numel
            FROM nodes n JOIN t USING (node_id) JOIN first f USING (node_id)
            WHERE n.run_id = ? AND n.node_id NOT IN (SELECT {col} FROM node_matches WHERE cmp_id = ?)
            ORDER BY n.exec_order NULLS LAST, n.node_id""",
            [run, run, run, self.info.cmp_id],
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
                int(r[7]),
                int(r[8]),
                None if r[9] is None else int(r[9]),
            )
            for r in rows
        ]

    def node_pairs(self) -> list[NodePair]:
        """Current node-level pairs of the comparison (each once), in golden execution order."""
        info = self.info
        rows = self._rows(
            "SELECT g.name, t.name, min(m.method) FROM node_matches m "
            "JOIN nodes g ON g.run_id = ? AND g.node_id = m.golden_node_id "
            "JOIN nodes t ON t.run_id = ? AND t.node_id = m.test_node_id "
            "WHERE m.cmp_id = ? GROUP BY g.name, t.name, g.exec_order, g.node_id "
            "ORDER BY g.exec_order NULLS LAST, g.node_id, t.name",
            [info.golden_run, info.test_run, info.cmp_id],
        )
        return [NodePair(str(r[0]), str(r[1]), str(r[2])) for r in rows]

    def size_mismatches(self, golden: str, test: str) -> list[tuple[str, int, int]]:
        """Tensor pairs of two nodes whose element counts differ: (pair label, golden numel, test numel)."""
        info = self.info
        rows = self._rows(
            "SELECT DISTINCT m.io || gt.idx || '/' || tt.io || tt.idx, gt.numel, tt.numel FROM matches m "
            "JOIN nodes g ON g.run_id = ? AND g.node_id = m.golden_node_id AND g.name = ? "
            "JOIN tensors gt ON gt.run_id = ? AND gt.tensor_id = m.golden_tensor_id "
            "JOIN tensors tt ON tt.run_id = ? AND tt.tensor_id = m.test_tensor_id "
            "JOIN nodes t ON t.run_id = ? AND t.node_id = tt.node_id AND t.name = ? "
            "WHERE m.cmp_id = ? AND gt.numel <> tt.numel ORDER BY 1",
            [info.golden_run, golden, info.golden_run, info.test_run, info.test_run, test, info.cmp_id],
        )
        return [(str(r[0]), int(r[1]), int(r[2])) for r in rows]

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

    def check_mapping(self, mapping: MappingFile) -> MappingCheck:
        """Hold a mapping's explicit pairs against this comparison's dumps (stale pairs; the mapping editor)."""
        from workbench.compare.pairing.fingerprint import check_mapping

        cur = self._cur()
        try:
            return check_mapping(mapping, cur, self.info.golden_run, self.info.test_run, rules=False)
        finally:
            cur.close()

    def stamp_mapping(self, mapping: MappingFile, keep_stale: set[tuple[str, str]]) -> None:
        """Write this comparison's dumps into the mapping's fingerprint (stale pairs in `keep_stale` keep theirs)."""
        from workbench.compare.pairing.fingerprint import stamp_mapping

        cur = self._cur()
        try:
            stamp_mapping(mapping, cur, self.info.golden_run, self.info.test_run, keep_stale)
        finally:
            cur.close()

    def mapping_stale(self) -> list[tuple[str, str, str, str]]:
        """(kind, golden, test, reason) of the mapping entries this comparison did not use (none in an older
        catalog)."""
        try:
            rows = self._rows(
                "SELECT kind, golden, test, reason FROM mapping_stale WHERE cmp_id = ? ORDER BY kind, golden, test",
                [self.info.cmp_id],
            )
        except duckdb.CatalogException:
            return []
        return [(str(r[0]), str(r[1]), str(r[2]), str(r[3])) for r in rows]

    def call_drift(self) -> list[tuple[str, bool]]:
        """(line, paired again) of each kind of call the test run makes at some tokens only, as `wb compare` told
        them (`note: ...` where the calls were paired again at those tokens, `warning: ...` where pairs there may
        compare different calls); none in an older catalog."""
        try:
            rows = self._rows(
                "SELECT line, repaired FROM call_drift WHERE cmp_id = ? ORDER BY position", [self.info.cmp_id]
            )
        except (duckdb.CatalogException, duckdb.BinderException):
            return []
        return [(str(r[0]), bool(r[1])) for r in rows]

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


def _row_label(name: str, prefix: str) -> str:
    """An op's row in a layer's heatmap: its name without the group's common prefix (`mlp.down_proj` of
    `root.model.layers.1.`); an msprobe name by its short name (a layer holding modules and API calls has no common
    prefix, and every name ends with `.forward`)."""
    from workbench.formats.node_names import msprobe_short_name

    return msprobe_short_name(name) or name[len(prefix) :]


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
