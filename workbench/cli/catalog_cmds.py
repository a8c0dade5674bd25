"""`wb ingest`, `wb query`, `wb queries`: the catalog from the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, check_format, guarded, say, say_lines
from workbench.core.files import DEFAULT_CATALOG


@app.command()
def ingest(
    dump: Annotated[Path, typer.Argument(help="A dump folder (msit torch, ATB or msprobe).")],
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path(DEFAULT_CATALOG),
    follow_symlinks: Annotated[
        bool,
        typer.Option("--follow-symlinks", help="Read files whose symbolic links lead outside the dump (off: refused)."),
    ] = False,
) -> None:
    """Add one dump to a catalog (skipped when the same content is already there)."""
    from workbench.catalog.guard import catalog_guard
    from workbench.catalog.store import ingest_dump, open_catalog
    from workbench.formats import open_dump

    def go() -> None:
        d = open_dump(dump, follow_symlinks=follow_symlinks)
        con = catalog_guard(catalog, lambda: open_catalog(catalog))
        try:
            res = catalog_guard(catalog, lambda: ingest_dump(con, d))
        finally:
            con.close()
        verb = "already in the catalog as" if res.skipped else "ingested as"
        say(f"{d.root} ({d.kind}, {res.n_nodes} nodes, {res.n_tensors} tensors) {verb} run {res.run_id} in {catalog}")
        for p in res.problems:
            say(f"problem: {p}")

    guarded(go)


@app.command()
def query(
    sql: Annotated[str, typer.Argument(help="SQL text, a .sql file, or the name of a saved query in queries/.")],
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog file.")] = Path(DEFAULT_CATALOG),
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
    cmp_id: Annotated[
        int | None, typer.Option("--cmp", help="Comparison id for saved queries (default: newest).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", help="Rows shown in table format (0: all).")] = 200,
    attach: Annotated[
        list[Path] | None,
        typer.Option(
            "--attach",
            help="A file the SQL may use (repeatable): a DuckDB file is attached read-only by its stem, "
            "a CSV/TSV/Parquet/JSON file becomes a table of that name. Nothing else outside the catalog is reachable.",
        ),
    ] = None,
) -> None:
    """Run SQL on a catalog, read-only and confined to it. Saved queries use getvariable('cmp_id')."""
    from workbench.analysis.queries import run_query

    def go() -> None:
        check_format(fmt)
        text = run_query(catalog, sql, fmt=fmt, cmp_id=cmp_id, limit=limit, attach=attach or ())
        say_lines(text)

    guarded(go)


@app.command("queries")
def list_queries() -> None:
    """List the saved queries (use their names with `wb query NAME`)."""
    from workbench.analysis.queries import saved_queries

    for name, (path, title) in saved_queries().items():
        say(f"{name:28s} {title}   ({path})")
