"""`wb open`: the workbench app on two dumps or a catalog."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, guarded
from workbench.core.files import DEFAULT_OUTPUT


@app.command("open")
def open_cmd(
    golden: Annotated[Path, typer.Argument(help="Golden dump folder, or a catalog.duckdb (or its folder) to open.")],
    test: Annotated[Path | None, typer.Argument(help="Test dump folder.")] = None,
    mapping: Annotated[Path | None, typer.Option("-mf", "--mapping", help="Mapping file or folder.")] = None,
    out: Annotated[Path, typer.Option("-o", "--output", help="Folder for the catalog when comparing.")] = Path(
        DEFAULT_OUTPUT
    ),
    theme: Annotated[str | None, typer.Option("--theme", help="Theme name from themes/.")] = None,
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to compare, e.g. 0-3,7.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Worker processes (default: cores).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
    cmp_id: Annotated[
        int | None,
        typer.Option("--cmp", help="Comparison to show when the catalog holds several (default: the newest)."),
    ] = None,
) -> None:
    """Open the workbench app on two dumps (ingested and compared first) or on an existing catalog."""
    from workbench.core.files import CATALOG_NAME

    def go() -> int:
        from workbench.app.launch import launch, make_app

        if test is None:
            if tokens is not None or workers is not None or thresholds is not None:
                raise ValueError("--tokens, --workers and --thresholds apply when comparing two dumps (GOLDEN TEST)")
            if golden.is_dir():
                cat = golden / CATALOG_NAME
                if not cat.exists():
                    raise ValueError(f"{golden}: a dump folder needs a TEST folder too (or pass a catalog file)")
                return launch(make_app(catalog=cat, theme=theme, cmp_id=cmp_id))
            if not golden.exists():
                raise ValueError(f"{golden}: no such catalog")
            check_catalog(golden, cmp_id)
            return launch(make_app(catalog=golden, theme=theme, cmp_id=cmp_id))
        for p in (golden, test):
            if not p.exists():
                raise ValueError(f"{p}: no such folder")
        from workbench.core.tokens import token_ranges
        from workbench.jobs.compare_dumps import CompareRequest

        ranges = token_ranges(tokens)  # a bad --tokens fails before anything is written
        out.mkdir(parents=True, exist_ok=True)
        if cmp_id is not None:
            raise ValueError("--cmp chooses a comparison of an existing catalog; with two dumps, one is made")
        request = CompareRequest(
            golden,
            test,
            out / CATALOG_NAME,
            mapping=mapping,
            tokens=ranges,
            workers=workers,
            thresholds=thresholds,
        )
        return launch(make_app(catalog=request.catalog, request=request, theme=theme))

    code = guarded(go)
    if code:
        raise typer.Exit(code)


def check_catalog(path: Path, cmp_id: int | None) -> None:
    """Refuse, in one line and before the app starts, a file that is not a wb catalog or a missing comparison."""
    from workbench.analysis.explorer.explore import ExploreError, Explorer

    try:
        Explorer(path, cmp_id).close()
    except ExploreError as exc:
        raise ValueError(str(exc)) from None
