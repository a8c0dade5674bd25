"""`wb demo`: the built-in demo (a small Llama, golden and test dumps, one planted defect)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.cli.common import app, guarded
from workbench.cli.compare_cmd import run_compare_cli


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the demo dumps and catalog.")] = Path("wb_demo"),
    no_tui: Annotated[bool, typer.Option("--no-tui", help="Stop after the summary; do not open the app.")] = False,
    defect: Annotated[
        str | None, typer.Option("--defect", help="Planted defect (see `wb demo --list-defects`).")
    ] = None,
    stack: Annotated[
        str, typer.Option("--stack", help="Test stack: atb (ATB-structured, bf16) or torch (HF bf16).")
    ] = "atb",
    list_defects: Annotated[bool, typer.Option("--list-defects", help="List the defects the demo can plant.")] = False,
    theme: Annotated[str | None, typer.Option("--theme", help="Theme for the app.")] = None,
) -> None:
    """Build a small Llama, dump a golden (fp32) and a test run (bf16, one planted defect), compare, open the app."""
    from workbench import demo as demo_mod

    if list_defects:
        for name, text in demo_mod.available_defects(stack).items():
            typer.echo(f"{name:16s} {text}")
        return

    def go() -> Any:
        plan = demo_mod.make_demo(out, stack=stack, defect=defect, log=typer.echo)
        res = run_compare_cli(plan.golden, plan.test, out, plan.mapping, None, None, None)
        typer.echo(f"planted defect: {plan.description}")
        typer.echo(f"expected: error born at {plan.expected} (token {plan.expected_token})")
        return res

    res = guarded(go)
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not os.environ.get("CI")
    if no_tui or not interactive:
        return
    from workbench.catalog import CATALOG_NAME

    def launch_app() -> int:
        from workbench.app.launch import launch

        return launch(catalog=out / CATALOG_NAME, theme=theme, cmp_id=res.cmp_id)

    code = guarded(launch_app)
    if code:
        raise typer.Exit(code)
