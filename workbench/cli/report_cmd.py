"""`wb report`: one self-contained HTML file to share what a comparison found."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, guarded
from workbench.core.files import DEFAULT_CATALOG


@app.command()
def report(
    catalog: Annotated[
        Path | None, typer.Argument(help="Catalog file (default: wb_out/catalog.duckdb), or give it with -c.")
    ] = None,
    catalog_option: Annotated[
        Path | None, typer.Option("--catalog", "-c", help="Catalog file, as every other command takes it.")
    ] = None,
    out: Annotated[Path, typer.Option("--output", "-o", help="The HTML file to write.")] = Path("wb_report.html"),
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: newest).")] = None,
) -> None:
    """Write one self-contained HTML file (verdict, heatmap, logits, advisor, precheck, commands) to share."""
    from workbench.analysis.explorer.views import ExploreError
    from workbench.analysis.reporting.html_report import write_report

    def go() -> None:
        if catalog is not None and catalog_option is not None and catalog != catalog_option:
            raise ValueError(f"two catalogs given ({catalog} and -c {catalog_option}): give one")
        chosen = catalog or catalog_option or Path(DEFAULT_CATALOG)
        if not chosen.is_file():
            raise ValueError(f"{chosen}: no such catalog (run `wb compare -o DIR` first, or pass the catalog file)")
        try:
            facts = write_report(chosen, out, cmp_id)
        except ExploreError as exc:
            raise ValueError(str(exc)) from None
        failing = sum(1 for c in facts.strip if c.passed is False)
        typer.echo(
            f"report: {out} (comparison {facts.info.cmp_id}, {len(facts.info.tokens)} tokens, "
            f"{failing} with failing logits)"
        )

    guarded(go)
