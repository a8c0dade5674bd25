"""`wb precheck`: re-run ops alone on their dumped inputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, guarded


@app.command()
def precheck(
    path: Annotated[Path, typer.Argument(help="An ATB op folder, a group (layer) folder or a token folder of a dump.")],
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds.")
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list ops that pass.")] = False,
) -> None:
    """Re-run ATB ops alone on their dumped inputs with a float32/64 reference; report the ops that disagree."""
    from workbench.analysis.precheck import precheck_group
    from workbench.compare.thresholds import Thresholds

    def go() -> int:
        th = Thresholds.load(thresholds)
        if not path.is_dir():
            raise ValueError(f"{path}: no such folder")
        results = []
        folders = folders_to_check(path)
        for folder in folders:
            found = precheck_group(folder, thresholds=th)  # an op folder yields itself
            if len(folders) > 1:  # several tokens: say which one each op ran at
                found = [replace(r, name=f"token {folder.name}: {r.name or r.op_dir}") for r in found]
            results += found
        if not results:
            raise ValueError(
                f"{path}: no ATB op folders here or below (give a dump folder, its tensors/{{dev}}_{{pid}} folder, "
                "a token folder, a layer folder or an op folder)"
            )
        failed = 0
        for r in results:
            label = r.name or r.op_dir
            if not r.supported:
                if show_all:
                    typer.echo(f"skip  {label}  ({r.reason})")
                continue
            if r.passed is False:
                failed += 1
                worst = ", ".join(
                    f"out{o.index}: {','.join(o.failed_metrics) or o.reason}" for o in r.outputs if o.passed is False
                )
                typer.echo(f"FAIL  {label}  {worst}" + (f"  ({r.reason})" if r.reason else ""))
            elif r.passed is None:
                typer.echo(f"?     {label}  ({r.reason})")
            elif show_all:
                typer.echo(f"ok    {label}")
        checked = sum(1 for r in results if r.supported)
        typer.echo(
            f"{checked} ops re-run, {failed} disagree with their dumped outputs, {len(results) - checked} not supported"
        )
        return 1 if failed else 0

    code = guarded(go)
    if code:
        raise typer.Exit(code)


def folders_to_check(path: Path) -> list[Path]:
    """Where to look for ops: the token folders when `path` is a dump or lies above its tokens, else `path`
    itself (a token, layer or op folder)."""
    from workbench.formats.atb import token_folders

    tokens = token_folders(path)
    return tokens or [path]
