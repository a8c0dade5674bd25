"""`wb advise`: the root-cause advisor's ranking of the ops, per token."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, check_format, guarded, open_comparison, render, text_table
from workbench.core.files import DEFAULT_CATALOG

COLUMNS = ("rank", "token_id", "golden_node", "test_node", "score", "reason", "golden_node_id", "test_node_id")


@app.command()
def advise(
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path(DEFAULT_CATALOG),
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: newest).")] = None,
    token: Annotated[int | None, typer.Option("--token", "-t", help="Only this token (golden token id).")] = None,
    top: Annotated[int, typer.Option("--top", "-k", help="Ops per token (0: all).")] = 5,
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
) -> None:
    """Rank the ops by the error they add beyond their inputs and their peers' noise (most likely origin first)."""
    from workbench.analysis.advisor import NAN_INF_SCORE, SIGNIFICANT
    from workbench.analysis.advisor import advise as run_advise
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
        rows = [{k: asdict(a)[k] for k in COLUMNS} for a in items]
        typer.echo(render(fmt, rows, COLUMNS, lambda: _table(rows, cid, SIGNIFICANT, NAN_INF_SCORE)), nl=False)

    guarded(go)


def _table(rows: list[dict[str, object]], cmp_id: int, significant: float, nan_inf_score: float) -> str:
    if not rows:
        return f"comparison {cmp_id}: nothing to rank (no op with a compared output)\n"
    heads = ("rank", "token_id", "golden_node", "test_node", "score", "reason")
    cells = [
        [
            str(r["rank"]),
            str(r["token_id"]),
            str(r["golden_node"]),
            "" if r["test_node"] is None else str(r["test_node"]),
            f"{float(str(r['score'])):.1f}" if float(str(r["score"])) < nan_inf_score else "NaN/Inf",
            str(r["reason"]),
        ]
        for r in rows
    ]
    head = f"comparison {cmp_id}; score = error an op adds / what its peers add (>= {significant:g}: stands out)"
    return "\n".join([head, *text_table(heads, cells)]) + "\n"
