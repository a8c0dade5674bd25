"""The outputs of a comparison: msit-compatible CSV and the summary printed on stdout."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import duckdb

from workbench.catalog.schema import MSIT_CSV_COLUMNS
from workbench.compare.summary import CompareResult

_CSV_INJECTION = ("=", "+", "-", "@", "\t", "\r")


def write_msit_csv(
    con: duckdb.DuckDBPyConnection, cmp_id: int, out_dir: Path, tokens: set[int] | None = None, suffix: str = ""
) -> Path:
    """msit's report columns by msit's names, rows in token then execution order; returns the file
    (`suffix`, e.g. `_rank1`, keeps the reports of several ranks apart)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d%H%M%S")
    path = out_dir / f"msit_cmp_report{suffix}_{stamp}.csv"
    cols = ", ".join(MSIT_CSV_COLUMNS)
    tok = "" if tokens is None else f" AND golden_token_id IN ({','.join(str(int(t)) for t in sorted(tokens))})"
    result = con.execute(f"SELECT {cols}, passed FROM comparison WHERE cmp_id = ?{tok} ORDER BY data_id", [cmp_id])
    done = 0
    with open(path, "w", encoding="utf-8", newline="") as fh:
        while True:  # in slices of 16k rows: a million-pair report never sits in memory at once
            df = result.fetch_df_chunk(8)
            if done and df.empty:
                break
            df["data_id"] = range(done, done + len(df))
            # text cells a spreadsheet would evaluate as formulas get a leading quote (paths never start so)
            for col in ("golden_op_type", "my_op_type", "cmp_fail_reason"):
                df[col] = df[col].map(lambda v: f"'{v}" if isinstance(v, str) and v.startswith(_CSV_INJECTION) else v)
            df.to_csv(fh, index=False, header=done == 0, na_rep="", float_format="%.10g")
            done += len(df)
            if df.empty:
                break
    return path


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
        f"failed: {res.failed}; not comparable: {res.uncomparable}",
        f"unmatched: golden {res.unmatched_golden} of {res.golden_nodes} nodes with tensors, "
        f"test {res.unmatched_test} of {res.test_nodes} nodes with tensors",
    ]
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
    for line in res.problems[:20]:
        lines.append(f"problem: {line}")
    if len(res.problems) > 20:
        lines.append(f"problem: ... and {len(res.problems) - 20} more (see runs.problems in the catalog)")
    if first_divergent is not None:
        lines.append(first_divergent)
    if res.first_failing_token is not None:
        lines.append(f"first token with an error born: {res.first_failing_token}")
    for tok in sorted(res.born.keys() | inputs_differ.keys()):
        name = res.born.get(tok)
        origin = res.origins.get(tok)
        if tok in inputs_differ:
            lines.append(inputs_differ[tok])
        elif name is None and origin is not None and origin.stands_out:
            test_name = origin.test_node
            suffix = f"  [test op: {test_name}]" if test_name and test_name != origin.golden_node else ""
            lines.append(f"most likely origin: {origin.golden_node} (token {tok}): {origin.reason}{suffix}")
            if origin.evidence:
                lines.append(f"  {origin.evidence}")
        elif name is None:
            quiet = (
                f"; nothing stands out of the noise (largest: {origin.golden_node}, {origin.score:.1f}x its peers)"
                if origin is not None
                else ""
            )
            lines.append(f"token {tok}: no error born (every output passes, or no op fails with passing inputs){quiet}")
        else:
            test_name = res.born_test.get(tok)
            suffix = f"  [test op: {test_name}]" if test_name and test_name != name else ""
            lines.append(f"error born at: {name} (token {tok}){suffix}")
            if tok in res.born_evidence:
                lines.append(f"  {res.born_evidence[tok]}")
    if csv_path is not None:
        lines.append(f"report: {csv_path}")
    lines.append(f"catalog: {res.catalog}")
    return lines
