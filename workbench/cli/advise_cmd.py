"""`wb advise`: the root-cause advisor's ranking of the ops, per token."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.cli.common import app, check_format, guarded, open_comparison, render, say, say_lines, text_table
from workbench.core.advice import score_text
from workbench.core.files import DEFAULT_CATALOG

QUANT_NOTE = "; a quantized linear's score is its error / the int8 rounding its own scales predict"
COLUMNS = ("rank", "token_id", "golden_node", "test_node", "score", "reason", "golden_node_id", "test_node_id")


@app.command()
def advise(
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path(DEFAULT_CATALOG),
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: newest).")] = None,
    token: Annotated[int | None, typer.Option("--token", "-t", help="Only this token (golden token id).")] = None,
    top: Annotated[int, typer.Option("--top", "-k", help="Ops per token (0: all).")] = 5,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
    fallback: Annotated[
        int | None,
        typer.Option(
            "--fallback",
            metavar="K",
            help="Quantized run: the K linears whose keeping in float gains most (estimated; measured on the demo).",
        ),
    ] = None,
) -> None:
    """Rank the ops by the error they add beyond their inputs and their peers' noise (most likely origin first)."""
    if fallback is not None:

        def pick() -> int:
            with open_comparison(catalog, cmp_id) as (_, cid):
                return cid

        guarded(lambda: check_format(fmt))
        print_fallback(catalog, guarded(pick), fallback, fmt)
        return
    from workbench.analysis.verdicts.advisor import ORDER_RULE, SIGNIFICANT, above_higher, inputs_differ
    from workbench.analysis.verdicts.advisor import advise as run_advise
    from workbench.analysis.verdicts.fallback import quantized_linears
    from workbench.catalog import first_row

    def go() -> None:
        check_format(fmt)
        if top < 0:
            raise ValueError(f"--top {top}: expected 0 (all) or more")
        with open_comparison(catalog, cmp_id) as (con, cid):
            if token is not None:
                has = first_row(
                    con.execute("SELECT 1 FROM matches WHERE cmp_id = ? AND token_id = ? LIMIT 1", [cid, token])
                )
                if has is None:
                    raise ValueError(f"{catalog}: comparison {cid} has no token {token}")
            items = run_advise(con, cid, token=token, top=top or None)
            differ = {t: why for t, why in inputs_differ(con, cid).items() if token is None or t == token}
            quantized = bool(quantized_linears(con, cid))
        rows = [{k: asdict(a)[k] for k in COLUMNS} for a in items]
        notes = [f"token {t}: {why}: no op ranked" for t, why in sorted(differ.items())]

        def table() -> str:
            marked = above_higher(items)
            shown = [{**row, "above_higher": (row["token_id"], row["rank"]) in marked} for row in rows]
            rule = ORDER_RULE + (QUANT_NOTE if quantized else "")
            return _table(shown, cid, SIGNIFICANT, rule, bool(notes))

        text = render(fmt, rows, COLUMNS, table)
        if fmt == "json":
            typer.echo(text, nl=False)
        else:  # table and CSV cells may quote op names: each line escaped as `say` does
            say_lines(text)
        for note in notes:  # on stderr for csv and json, whose stdout is data
            say(note, err=fmt != "table")

    guarded(go)


def _table(
    rows: list[dict[str, object]],
    cmp_id: int,
    significant: float,
    rule: str,
    differ: bool = False,
) -> str:
    if not rows:
        return "" if differ else f"comparison {cmp_id}: nothing to rank (no op with a compared output)\n"
    heads = ("rank", "token_id", "golden_node", "test_node", "score", "reason")
    cells = [
        [
            str(r["rank"]),
            str(r["token_id"]),
            str(r["golden_node"]),
            "" if r["test_node"] is None else str(r["test_node"]),
            score_text(float(str(r["score"]))) + ("^" if r.get("above_higher") else ""),
            str(r["reason"]),
        ]
        for r in rows
    ]
    head = f"comparison {cmp_id}; score = error an op adds / what its peers add (>= {significant:g}: stands out)"
    return "\n".join([head, rule, *text_table(heads, cells)]) + "\n"


FALLBACK_COLUMNS = ("rank", "linear", "added", "gain", "final_before", "final_after", "golden_node_id")


def print_fallback(catalog: Path, cmp_id: int, k: int, fmt: str = "table") -> None:
    """Print the fallback list of a quantized comparison (a table, or its rows as CSV or JSON); on `wb demo --stack
    quant`'s runs, measure its gain (the demo re-run with those linears in float: logits KL and top-1 agreement
    against fp32, before and after), printed after the table or on stderr beside CSV and JSON."""
    from workbench.analysis.verdicts.fallback import demo_recipe
    from workbench.analysis.verdicts.fallback import fallback as rank_fallback
    from workbench.catalog.store import open_catalog

    def ranked() -> tuple[list[Any], tuple[str, str | None] | None]:
        con = open_catalog(catalog, read_only=True)
        try:
            return rank_fallback(con, cmp_id, k), demo_recipe(con, cmp_id)
        finally:
            con.close()

    items, recipe = guarded(ranked)
    err = fmt != "table"  # beside CSV and JSON, stdout is data: the notes go to stderr
    if not items:
        if err:
            typer.echo("[]" if fmt == "json" else ",".join(FALLBACK_COLUMNS))
        say(f"comparison {cmp_id}: no quantized linear with a compared output", err=err)
        return

    def table() -> str:
        cells = [[str(f.rank), f.linear, f"{f.added:.3g}", f"{f.gain:.3g}", f"{f.final_after:.3g}"] for f in items]
        head = (
            f"fallback (comparison {cmp_id}): keep in float, best first; final output rel. error "
            f"{items[0].final_before:.3g} (estimated after each)"
        )
        return "\n".join([head, *text_table(("rank", "linear", "adds", "est. gain", "est. final error"), cells)]) + "\n"

    rows = [{c: getattr(f, c) for c in FALLBACK_COLUMNS} for f in items]
    text = render(fmt, rows, FALLBACK_COLUMNS, table)
    if fmt == "json":
        typer.echo(text, nl=False)
    else:
        say_lines(text)
    if recipe is None:
        say("measured gain: only on `wb demo --stack quant` runs (re-run your model with these in float)", err=err)
        return
    from workbench import demo as demo_mod

    def measure() -> tuple[tuple[float, float], tuple[float, float]]:
        demo_mod.check_choice("quant", recipe[1], 1, recipe[0])  # the recorded names must be the demo's own
        return demo_mod.measure_fallback(recipe[0], recipe[1], [f.linear for f in items])

    (kl0, top0), (kl1, top1) = guarded(measure)
    say(
        f"measured gain (the demo re-run with these {len(items)} in float, against fp32): logits KL "
        f"{kl0:.3g} -> {kl1:.3g}, top-1 agreement {top0:.0%} -> {top1:.0%}",
        err=err,
    )
