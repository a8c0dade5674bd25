"""`wb open`: the workbench app on two dumps or a catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, guarded
from workbench.core.files import DEFAULT_OUTPUT


@app.command("open")
def open_cmd(
    golden: Annotated[Path, typer.Argument(help="Golden dump folder, or a catalog.duckdb to open.")],
    test: Annotated[Path | None, typer.Argument(help="Test dump folder.")] = None,
    mapping: Annotated[Path | None, typer.Option("-mf", "--mapping", help="Mapping file or folder.")] = None,
    out: Annotated[Path, typer.Option("-o", "--output", help="Folder for the catalog when comparing.")] = Path(
        DEFAULT_OUTPUT
    ),
    theme: Annotated[str | None, typer.Option("--theme", help="Theme name from themes/.")] = None,
) -> None:
    """Open the workbench app on two dumps (ingested and compared first) or on an existing catalog."""
    from workbench.catalog import CATALOG_NAME

    def go() -> int:
        from workbench.app.launch import launch

        if test is None:
            if golden.is_dir():
                cat = golden / CATALOG_NAME
                if not cat.exists():
                    raise ValueError(f"{golden}: a dump folder needs a TEST folder too (or pass a catalog file)")
                return launch(catalog=cat, theme=theme)
            if not golden.exists():
                raise ValueError(f"{golden}: no such catalog")
            return launch(catalog=golden, theme=theme)
        for p in (golden, test):
            if not p.exists():
                raise ValueError(f"{p}: no such folder")
        out.mkdir(parents=True, exist_ok=True)
        return launch(catalog=out / CATALOG_NAME, golden=golden, test=test, mapping=mapping, theme=theme)

    code = guarded(go)
    if code:
        raise typer.Exit(code)
