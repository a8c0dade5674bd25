"""The outputs of a comparison: msit-compatible CSV and the summary printed on stdout."""

from __future__ import annotations

import csv
import datetime as _dt
import secrets
from pathlib import Path
from typing import TextIO

import duckdb
import numpy as np

from workbench.analysis.reporting.summary import CompareResult
from workbench.analysis.verdicts.born import INPUTS_UNCHECKED
from workbench.analysis.verdicts.causes import cause_in
from workbench.catalog import first_row
from workbench.catalog.schema import MSIT_CSV_COLUMNS
from workbench.catalog.store import registered
from workbench.core.advice import added_inside, born_in_noise, elsewhere
from workbench.core.output import report_line_sql
from workbench.core.text import csv_safe
from workbench.core.tokens import token_text

CSV_SLICE = 16384  # report rows read sorted in one query at most (above: a slice of tokens at a time)
_FETCH_LINES = 4096  # report lines fetched from DuckDB at a time as they are written


def write_msit_csv(
    con: duckdb.DuckDBPyConnection, cmp_id: int, out_dir: Path, tokens: set[int] | None = None, suffix: str = ""
) -> Path:
    """msit's report columns by msit's names, rows in token then execution order; returns the file
    (`suffix`, e.g. `_rank1`, keeps the reports of several ranks apart).

    DuckDB writes each line (`core.output.report_line_sql`): Python only joins the lines. Up to `CSV_SLICE` rows
    are read sorted in one query. Above that the row order is read first (pair ids only), then the rows a slice of
    tokens at a time: sorting the full-width rows at once held every path and name of the comparison in DuckDB
    (~2 KB per pair). Runs on a cursor of its own: a thread may write the report while `con` computes verdicts."""
    path = _fresh_path(out_dir, f"msit_cmp_report{suffix}")
    listed = None if tokens is None else ",".join(str(int(t)) for t in sorted(tokens))
    tok = "" if listed is None else f" AND golden_token_id IN ({listed})"
    names = [*MSIT_CSV_COLUMNS, "passed"]
    only = "" if listed is None else f" AND token_id IN ({listed})"
    with _ReportCursor(con) as rc:
        # the view has a row per match of the comparison, at most (every other table joins one row to a match)
        n = first_row(rc.cur.execute(f"SELECT count(*) FROM matches WHERE cmp_id = ?{only}", [cmp_id]))
        with open(path, "x", encoding="utf-8", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerow(names)
            if n is None or int(n[0]) <= CSV_SLICE:
                cols = ", ".join(
                    "row_number() OVER (ORDER BY data_id) - 1 AS data_id" if c == "data_id" else c for c in names
                )
                _write_lines(fh, _report_lines(rc, f"SELECT {cols} FROM comparison WHERE cmp_id = ?{tok}", [cmp_id]))
            else:
                _write_sliced(rc, fh, cmp_id, tok, names)
    return path


def _write_sliced(rc: _ReportCursor, fh: TextIO, cmp_id: int, tok: str, names: list[str]) -> None:
    """The report's rows a slice of tokens at a time (see `write_msit_csv`)."""
    order = rc.cur.execute(
        f"SELECT pair_id, golden_token_id FROM comparison WHERE cmp_id = ?{tok} ORDER BY data_id", [cmp_id]
    ).fetchnumpy()
    pair_ids, row_tokens = np.asarray(order["pair_id"]), np.asarray(order["golden_token_id"])
    cols = ", ".join("s.pos AS data_id" if c == "data_id" else f"c.{c}" for c in names)
    for lo, hi in _token_slices(row_tokens):
        with registered(rc.cur, "_csv_slice", {"pair_id": pair_ids[lo:hi], "pos": np.arange(lo, hi)}):
            lines = _report_lines(
                rc,
                f"SELECT {cols} FROM comparison c JOIN _csv_slice s ON s.pair_id = c.pair_id "
                "WHERE c.cmp_id = ? AND c.golden_token_id BETWEEN ? AND ?",
                [cmp_id, int(row_tokens[lo]), int(row_tokens[hi - 1])],
            )
            _write_lines(fh, lines)


class _ReportCursor:
    """A cursor of a connection that knows `csv_safe` as an SQL function (for `report_line_sql`) while it is open.
    The function's name is drawn anew each time: a Python function is the database's, not the cursor's, and a name
    fixed in advance could already stand for a macro of the catalog's."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.cur = con.cursor()
        self.csv_safe = f"wb_csv_safe_{secrets.token_hex(8)}"
        try:
            self.cur.create_function(self.csv_safe, csv_safe, ["VARCHAR"], "VARCHAR", side_effects=False)
        except BaseException:
            self.cur.close()
            raise

    def __enter__(self) -> _ReportCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.cur.remove_function(self.csv_safe)
        finally:
            self.cur.close()


def _report_lines(rc: _ReportCursor, select: str, params: list[object]) -> duckdb.DuckDBPyConnection:
    """The rows of `select` (its columns in report order, `data_id` among them) as CSV lines sorted by `data_id`, a
    query to fetch them from."""
    kinds = [(d[0], str(d[1])) for d in rc.cur.execute(f"SELECT * FROM ({select}) LIMIT 0", params).description]
    return rc.cur.execute(f"SELECT {report_line_sql(kinds, rc.csv_safe)} FROM ({select}) ORDER BY data_id", params)


def _write_lines(fh: TextIO, result: duckdb.DuckDBPyConnection, first: list[tuple[str]] | None = None) -> None:
    """The lines of `result` (`_report_lines`), after `first` (lines already fetched from it), written to `fh`."""
    rows = first or result.fetchmany(_FETCH_LINES)
    while rows:
        fh.write("\n".join([r[0] for r in rows]))
        fh.write("\n")
        rows = result.fetchmany(_FETCH_LINES)


# msit's statistics comparison report (`CSV_STATISTICS_HEADER` of msit_llm.common.constant), in its order
MSIT_STAT_CSV_COLUMNS: tuple[str, ...] = (
    "token_id",
    "data_id",
    "golden_data_path",
    "golden_op_type",
    "my_data_path",
    "my_op_type",
    "max_stat_absolute_error",
    "max_stat_relative_error",
    "min_stat_absolute_error",
    "min_stat_relative_error",
    "mean_stat_absolute_error",
    "mean_stat_relative_error",
    "l2norm_stat_absolute_error",
    "l2norm_stat_relative_error",
)


def write_msit_stats_csv(
    con: duckdb.DuckDBPyConnection, cmp_id: int, out_dir: Path, tokens: set[int] | None = None, suffix: str = ""
) -> Path | None:
    """The pairs compared on statistics only, as msit writes its statistics comparison
    (`statstics_cmp_report_*.csv`, msit's spelling; its columns): the max/min/mean/L2-norm differences; None when
    no pair was. A tensor without a file is named `{node}:{io}{index}` where msit has the statistics' path."""
    tok = "" if tokens is None else f" AND golden_token_id IN ({','.join(str(int(t)) for t in sorted(tokens))})"
    cols = []
    for c in MSIT_STAT_CSV_COLUMNS:
        if c == "golden_data_path":
            c = "coalesce(golden_data_path, golden_node || ':' || io || golden_index) AS golden_data_path"
        elif c == "my_data_path":
            c = "coalesce(my_data_path, test_node || ':' || io || test_index) AS my_data_path"
        cols.append(c)
    select = f"SELECT {', '.join(cols)} FROM comparison WHERE cmp_id = ? AND on_statistics{tok}"
    with _ReportCursor(con) as rc:
        lines = _report_lines(rc, select, [cmp_id])
        first = lines.fetchmany(_FETCH_LINES)
        if not first:
            return None
        path = _fresh_path(out_dir, f"statstics_cmp_report{suffix}")  # msit's own spelling
        with open(path, "x", encoding="utf-8", newline="") as fh:
            csv.writer(fh, lineterminator="\n").writerow(MSIT_STAT_CSV_COLUMNS)
            _write_lines(fh, lines, first)
    return path


def _fresh_path(out_dir: Path, stem: str) -> Path:
    """`OUT/STEM_TIMESTAMP.csv`, or `..._2.csv` and on for a second report in the same second: never another file."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d%H%M%S")
    path = out_dir / f"{stem}_{stamp}.csv"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{stem}_{stamp}_{n}.csv"
    return path


def _token_slices(row_tokens: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) row ranges of about `CSV_SLICE` rows that end where a token ends (rows are token-major)."""
    bounds = np.flatnonzero(np.diff(row_tokens)) + 1  # where a new token starts
    out: list[tuple[int, int]] = []
    lo = 0
    for b in [*bounds.tolist(), len(row_tokens)]:
        if b - lo >= CSV_SLICE or b == len(row_tokens):
            if b > lo:
                out.append((lo, b))
            lo = b
    return out


def format_summary(
    res: CompareResult,
    golden_label: str,
    test_label: str,
    csv_path: Path | None,
    first_divergent: str | None = None,
    inputs_differ: dict[int, str] | None = None,
    show_stale: bool = False,
) -> list[str]:
    """The lines `wb compare` prints; `first_divergent` (the logits line) and `inputs_differ` (token -> the line
    that replaces its verdict) come from the token analysis; `show_stale` lists the mapping's stale pairs."""
    inputs_differ = inputs_differ or {}
    cov = res.coverage
    lines = [
        f"golden: {golden_label}",
        f"test:   {test_label}",
        f"pairs compared: {res.pairs} ({res.computed} computed now, {res.skipped} already in the catalog); "
        f"failed: {res.failed}; not comparable: {res.uncomparable}"
        + (f"; not judged: {res.not_judged} (in-place targets before the write)" if res.not_judged else ""),
        f"unmatched: golden {res.unmatched_golden} of {res.golden_nodes} nodes with tensors, "
        f"test {res.unmatched_test} of {res.test_nodes} nodes with tensors",
    ]
    if res.on_statistics:
        lines.insert(
            3,
            f"on statistics only: {res.on_statistics} of {res.pairs} pairs judged on max/min/mean/norm (a lower bound "
            "of the rel. euclidean distance: a failure is certain, a pass weaker evidence)",
        )
    if res.mapping_check is not None:
        lines.extend(res.mapping_check.lines(show_stale))
    cats = cov.get("categories") or {}
    if cats:
        matched = sum(m for m, _ in cats.values())
        total = sum(n for _, n in cats.values())
        parts = ", ".join(f"{k} {m}/{n}" for k, (m, n) in sorted(cats.items()))
        lines.append(
            f"coverage: {matched}/{total} golden Linear/norm/attention/MLP modules matched "
            f"({100 * matched / max(total, 1):.0f}%: {parts})"
        )
    if cov.get("by_method"):
        methods = ", ".join(f"{k} {v}" for k, v in sorted(cov["by_method"].items()))
        lines.append(f"node pairs matched by: {methods}")
    if res.shape_mismatch and res.shape_mismatch * 2 >= res.pairs:
        lines.append(
            f"warning: {res.shape_mismatch} of {res.pairs} pairs differ in shape: are golden and test "
            "dumps of the same model and the same input?"
        )
    elif res.shape_mismatch:
        lines.append(f"note: {res.shape_mismatch} pairs differ in shape (see cmp_fail_reason)")
    lines.extend(res.call_drift)  # `note: ...` or `warning: ...`
    for line in res.problems[:20]:
        lines.append(f"problem: {line}")
    if len(res.problems) > 20:
        lines.append(f"problem: ... and {len(res.problems) - 20} more (see runs.problems in the catalog)")
    if first_divergent is not None:
        lines.append(first_divergent)
    if res.first_failing_token is not None:
        lines.append(f"first token with an error born: {res.first_failing_token}")
    explained: set[str] = set()
    unchecked: set[str] = set()  # born ops whose inputs were not judged, said once
    for tok in sorted(res.born.keys() | inputs_differ.keys()):
        name = res.born.get(tok)
        origin = res.origins.get(tok)
        if tok in inputs_differ:
            lines.append(inputs_differ[tok])
        elif (name is None or res.quantized) and origin is not None and origin.stands_out:
            test_name = origin.test_node
            suffix = f"  [test op: {test_name}]" if test_name and test_name != origin.golden_node else ""
            lines.append(f"most likely origin: {origin.golden_node} (token {tok}): {origin.reason}{suffix}")
            if origin.golden_node in res.explained:  # its reason carries the cause
                explained.add(origin.golden_node)
            if origin.evidence:
                lines.append(f"  {origin.evidence}")
        elif res.quantized:  # every quantized op fails the float thresholds: its expected noise is the measure
            lines.append(
                f"token {tok}: no quantized op adds more than its int8 rounding predicts "
                "(`wb advise --fallback K`: the linears worth keeping in float)"
            )
        elif name is None:
            quiet = (
                f"; nothing stands out of the noise (largest: {origin.golden_node}, {origin.score:.1f}x its peers)"
                if origin is not None
                else ""
            )
            if tok in res.born_evidence:  # failing with passing inputs, but carrying their error (`carried_across`)
                lines.append(f"token {tok}: {res.born_evidence[tok]}")
            else:
                lines.append(
                    f"token {tok}: no error born (every output passes, or no op fails with passing inputs){quiet}"
                )
        else:
            test_name = res.born_test.get(tok)
            suffix = f"  [test op: {test_name}]" if test_name and test_name != name else ""
            lines.append(f"error born at: {name} (token {tok}){suffix}")
            if tok in res.born_inputs_unchecked and name not in unchecked:  # once per op, not once per token
                unchecked.add(name)
                lines.append(f"  {INPUTS_UNCHECKED}")
            if tok in res.born_evidence:
                lines.append(f"  {res.born_evidence[tok]}")
            else:
                inside = res.born_inside.get(tok)
                score, inside_name, inside_score = res.born_score.get(tok), None, None
                if inside is not None:
                    inside_name, inside_score = inside.name, inside.score
                if note := added_inside(score, inside_name, inside_score):
                    lines.append(f"  {note}")
                elif note := born_in_noise(score, inside=inside_score):
                    lines.append(f"  {note}")
                    if (
                        origin is not None
                        and origin.stands_out
                        and origin.golden_node != name
                        and cause_in(origin.reason) is None  # an explained op is not where this error comes from
                    ):
                        lines.append(f"  {elsewhere(origin.golden_node, origin.score, tok)}")
            if name in res.explained and name not in explained:  # once per op, not once per token
                explained.add(name)
                lines.append(f"  {res.explained[name][0]}")
    for name, (cause, toks) in res.explained.items():
        if name not in explained:
            at = f"token {toks[0]}" if len(set(toks)) == 1 else f"tokens {token_text(toks)}"
            lines.append(f"also standing out, explained: {name} ({at}): {cause}")
    if csv_path is not None:
        lines.append(f"report: {csv_path}")
    lines.append(f"catalog: {res.catalog}")
    return lines
