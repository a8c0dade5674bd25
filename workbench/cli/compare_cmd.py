"""`wb compare`: two dumps in, a catalog, an msit CSV and the verdict out (the work: `jobs/compare_dumps.py`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from workbench.cli.common import ProgressPrinter, app, fail, guarded, say
from workbench.core.files import CATALOG_NAME, DEFAULT_OUTPUT

if TYPE_CHECKING:
    from workbench.analysis.reporting.summary import CompareResult
    from workbench.jobs.compare_dumps import CompareRequest


def compare_request(
    golden: Path,
    test: Path,
    out: Path,
    *,
    mapping: Path | None = None,
    tokens: str | None = None,
    workers: int | None = None,
    thresholds: Path | None = None,
    follow_symlinks: bool = False,
    ray: str | None = None,
    show_stale: bool = False,
) -> CompareRequest:
    """The options of `wb compare` as the compare job's request (a bad `--tokens` fails here, before anything
    is read)."""
    from workbench.core.tokens import token_ranges
    from workbench.jobs.compare_dumps import CompareRequest

    return CompareRequest(
        golden,
        test,
        out / CATALOG_NAME,
        report_dir=out,
        mapping=mapping,
        tokens=token_ranges(tokens),
        workers=workers,
        thresholds=thresholds,
        follow_symlinks=follow_symlinks,
        ray=ray,
        show_stale=show_stale,
    )


def run_compare_cli(request: CompareRequest, quiet: bool = False) -> CompareResult:
    """Shared by `wb compare` and `wb demo`: run the compare job, print its lines; the last rank's result."""
    from workbench.jobs.compare_dumps import compare_dumps

    return compare_dumps(request, progress=None if quiet else ProgressPrinter(), emit=say).result


@app.command()
def compare(
    golden: Annotated[Path, typer.Option("-gp", "--golden-path", help="Golden dump (any level msit accepts).")],
    test: Annotated[Path, typer.Option("-mp", "--my-path", help="Test dump (any level msit accepts).")],
    mapping: Annotated[
        Path | None,
        typer.Option(
            "-mf",
            "--mapping",
            help="Mapping file (wb-mapping JSON), msit's op_mapping_file.json, or a folder with them.",
        ),
    ] = None,
    out: Annotated[
        Path, typer.Option("-o", "--output", help="Output folder: catalog.duckdb and the CSV report.")
    ] = Path(DEFAULT_OUTPUT),
    tokens: Annotated[str | None, typer.Option("--tokens", help="Tokens to compare, e.g. 0-3,7.")] = None,
    workers: Annotated[int | None, typer.Option("--workers", "-j", help="Worker processes (default: cores).")] = None,
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
    follow_symlinks: Annotated[
        bool,
        typer.Option("--follow-symlinks", help="Read files whose symbolic links lead outside the dump (off: refused)."),
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS|auto|local",
            help="Compute the pairs on a Ray cluster, on the nodes holding the files (`local` starts one here; "
            "needs pip install 'workbench[ray]').",
        ),
    ] = None,
    show_stale: Annotated[
        bool, typer.Option("--show-stale", help="List every mapping pair that no longer fits the dumps, and why.")
    ] = False,
) -> None:
    """Compare two dumps op by op: OUT/catalog.duckdb, an msit-compatible CSV, and where the error is born."""
    res = guarded(
        lambda: run_compare_cli(
            compare_request(
                golden,
                test,
                out,
                mapping=mapping,
                tokens=tokens,
                workers=workers,
                thresholds=thresholds,
                follow_symlinks=follow_symlinks,
                ray=ray,
                show_stale=show_stale,
            )
        )
    )
    if res.pairs == 0 or res.uncomparable >= res.pairs:
        raise fail("nothing could be compared (no matched tensor pairs with readable data)", 1)
