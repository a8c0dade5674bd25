"""`wb advise`: the root-cause advisor's ranking of the ops, per token."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, guarded
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
    from workbench.catalog.store import first_row, open_catalog

    def go() -> None:
        if fmt not in ("table", "csv", "json"):
            raise ValueError(f"--format {fmt!r}: expected table, csv or json")
        if top < 0:
            raise ValueError(f"--top {top}: expected 0 (all) or more")
        if not catalog.is_file():
            raise ValueError(f"{catalog}: no such catalog (run `wb compare -o DIR` first, or pass --catalog FILE)")
        con = open_catalog(catalog, read_only=True)
        try:
            cid = cmp_id
            if cid is None:
                row = first_row(con.execute("SELECT max(cmp_id) FROM comparisons"))
                if row is None or row[0] is None:
                    raise ValueError(f"{catalog}: no comparison in this catalog (run `wb compare` first)")
                cid = int(row[0])
            elif first_row(con.execute("SELECT 1 FROM comparisons WHERE cmp_id = ?", [cid])) is None:
                raise ValueError(f"{catalog}: no comparison {cid} (see `wb query 'SELECT * FROM comparisons'`)")
            if token is not None:
                has = first_row(
                    con.execute("SELECT 1 FROM matches WHERE cmp_id = ? AND token_id = ? LIMIT 1", [cid, token])
                )
                if has is None:
                    raise ValueError(f"{catalog}: comparison {cid} has no token {token}")
            items = run_advise(con, cid, token=token, top=top or None)
        finally:
            con.close()
        rows = [{k: asdict(a)[k] for k in COLUMNS} for a in items]
        if fmt == "json":
            typer.echo(json.dumps(rows, indent=1))
        elif fmt == "csv":
            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
            typer.echo(buf.getvalue(), nl=False)
        else:
            typer.echo(_table(rows, cid, SIGNIFICANT, NAN_INF_SCORE), nl=False)

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
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    out = io.StringIO()
    out.write(f"comparison {cmp_id}; score = error an op adds / what its peers add (>= {significant:g}: stands out)\n")
    line = "  ".join(h.ljust(w) if i < len(heads) - 1 else h for i, (h, w) in enumerate(zip(heads, widths)))
    out.write(line + "\n")
    for c in cells:
        out.write("  ".join(v.ljust(w) if i < len(c) - 1 else v for i, (v, w) in enumerate(zip(c, widths))) + "\n")
    return out.getvalue()
