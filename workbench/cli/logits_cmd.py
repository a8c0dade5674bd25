"""`wb logits`: per-token logits of two dumps (cosine, KL in float64, top-k agreement), and the first failing token."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from workbench.cli.common import app, check_format, fail, guarded, say, say_lines, text_table
from workbench.core.output import report_csv

if TYPE_CHECKING:
    from workbench.analysis.verdicts.logits import LogitsRow
    from workbench.analysis.verdicts.token_inputs import TokenInputs

CSV_NAME = "logits.csv"
# (header, LogitsRow attribute, format) of the table view
TABLE = (
    ("token", "token_id", "d"),
    ("cosine", "cosine_similarity", ".6f"),
    ("KL", "kl_divergence", ".3e"),
    ("top1 g", "golden_top1", "d"),
    ("top1 t", "test_top1", "d"),
    ("agree", "top1_agree", "b"),
    ("top5", "top5_overlap", "d"),
    ("p(top) g", "golden_top_p_golden", ".4f"),
    ("p(top) t", "golden_top_p_test", ".4f"),
    ("dp", "golden_top_p_delta", "+.4f"),
    ("L1(p)", "prob_l1", ".4f"),
    ("passed", "passed", "b"),
)


def _cell(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if fmt == "b":
        return "yes" if value else "no"
    return format(value, fmt)


def format_table(rows: list[LogitsRow], notes: dict[int, str]) -> list[str]:
    """Aligned text table, one row per token, with a note (failed metrics, why not compared, inputs differ)."""
    head = [h for h, _, _ in TABLE] + ["note"]
    body = []
    for r in rows:
        note = "; ".join(
            x
            for x in (f"fails on {r.failed_metrics}" if r.failed_metrics else None, r.reason, notes.get(r.token_id))
            if x
        )
        body.append([_cell(getattr(r, attr), fmt) for _, attr, fmt in TABLE] + [note])
    return text_table(head, body, right=[True] * len(TABLE))


def _records(rows: list[LogitsRow], notes: dict[int, str]) -> list[dict[str, Any]]:
    return [{**r.as_dict(), "inputs": notes.get(r.token_id)} for r in rows]


def _csv(rows: list[LogitsRow], notes: dict[int, str]) -> str:
    records = _records(rows, notes)
    return report_csv(records, list(records[0]))


def verdict_line(rows: list[LogitsRow]) -> str:
    from workbench.analysis.verdicts.logits import describe, first_failing, stand_in_logits

    first = first_failing(rows)
    stand_in = stand_in_logits(rows)
    said = f" (no LM head in the dumps: judged {stand_in})" if stand_in else ""
    if first is not None:
        return f"first failing token: {first.token_id} ({describe(first)}){said}"
    unjudged = sum(1 for r in rows if r.passed is None)
    return "no token fails" + (f" ({unjudged} token(s) could not be judged)" if unjudged else "") + said


def _with_catalog(golden: Any, test: Any, th: Any, out: Path) -> tuple[list[LogitsRow], list[TokenInputs]]:
    """Store the rows (and the tokens' input status) in OUT/catalog.duckdb, in the comparison of these dumps."""
    from workbench.analysis.verdicts.logits import ensure_comparison, rows_from_catalog, store_logits
    from workbench.analysis.verdicts.token_inputs import compared_tokens, store_token_status, token_inputs
    from workbench.catalog import CATALOG_NAME
    from workbench.catalog.store import ingest_dump, open_catalog

    out.mkdir(parents=True, exist_ok=True)
    con = open_catalog(out / CATALOG_NAME)
    try:
        g_run, t_run = ingest_dump(con, golden).run_id, ingest_dump(con, test).run_id
        cmp_id = ensure_comparison(con, g_run, t_run, th)
        rows = rows_from_catalog(con, cmp_id, th)
        store_logits(con, cmp_id, rows)
        keys = sorted({r.token_id for r in rows} | set(compared_tokens(con, cmp_id)))
        status = token_inputs(con, cmp_id, keys, {r.token_id: r for r in rows})
        store_token_status(con, cmp_id, status)
    finally:
        con.close()
    return rows, status


def run_logits(
    golden: Path, test: Path, out: Path | None, fmt: str, thresholds: Path | None, tokens: str | None
) -> list[LogitsRow]:
    """Compare the logits of two dumps and print them (`fmt`); with `out`, also a CSV and the catalog."""
    from workbench.analysis.verdicts.logits import rows_from_dumps
    from workbench.compare.judging.thresholds import Thresholds
    from workbench.core.tokens import parse_tokens
    from workbench.formats import open_dump

    check_format(fmt)
    if out is not None:
        from workbench.analysis.verdicts.logits import COLUMNS
        from workbench.core.owned import check_replaceable

        check_replaceable(out / CSV_NAME, ",".join((*COLUMNS, "inputs")), "logits")
    th = Thresholds.load(thresholds)
    wanted = parse_tokens(tokens)
    g_dump, t_dump = open_dump(golden), open_dump(test)
    notes: dict[int, str] = {}
    if out is not None:
        rows, status = _with_catalog(g_dump, t_dump, th, out)
        notes = {s.token_id: s.reason for s in status if s.inputs_differ and s.reason}
    else:
        rows = rows_from_dumps(g_dump, t_dump, th)
    if wanted is not None:
        rows = [r for r in rows if r.token_id in wanted]
    if not rows:
        from workbench.analysis.verdicts.logits import statistics_only_logits_node

        for path, dump in ((golden, g_dump), (test, t_dump)):
            if (node := statistics_only_logits_node(dump)) is not None:
                raise ValueError(
                    f"{path}: the logits ({node}) were dumped as statistics only: no cosine, KL or top-1 per token "
                    "(`wb compare` judges their max/min/mean/norm); re-dump them with tensors (msit "
                    "dump_statistics_mode=0, msprobe task tensor)"
                )
        raise ValueError(
            f"no logits in {golden} or {test}: dump lm_head (msit dump_last_logits=True, or a full dump), "
            "ATB's LmHead, or the model's output (one root module; a first module's output is never taken)"
        )
    if out is not None:
        (out / CSV_NAME).write_text(_csv(rows, notes), encoding="utf-8")
    if fmt == "table":
        for line in format_table(rows, notes):
            say(line)
        say(verdict_line(rows))
    elif fmt == "json":
        typer.echo(json.dumps(_records(rows, notes), indent=1))
        say(verdict_line(rows), err=True)
    else:
        say_lines(_csv(rows, notes))
        say(verdict_line(rows), err=True)
    if out is not None:
        say(f"report: {out / CSV_NAME}", err=fmt != "table")
    return rows


@app.command()
def logits(
    golden: Annotated[Path, typer.Option("-gp", "--golden-path", help="Golden dump (any level msit accepts).")],
    test: Annotated[Path, typer.Option("-mp", "--my-path", help="Test dump (any level msit accepts).")],
    out: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Output folder: logits.csv and the rows in OUT/catalog.duckdb."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json (stdout).")] = "table",
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds (rule 'logits').")
    ] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to show, e.g. 0-3,7.")] = None,
) -> None:
    """Per-token logits: cosine, KL (float64), top-1/top-5 agreement, golden top probability; first failing token."""
    rows = guarded(lambda: run_logits(golden, test, out, fmt, thresholds, tokens))
    if all(r.passed is None for r in rows):
        raise fail("no token could be judged (see the note column)", 1)
