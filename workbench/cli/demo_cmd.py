"""`wb demo`: the built-in demo (a small Llama, golden and test dumps, one planted defect)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from workbench.cli.common import app, guarded
from workbench.cli.compare_cmd import compare_request, run_compare_cli


@app.command()
def demo(
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the demo dumps and catalog.")] = Path("wb_demo"),
    no_tui: Annotated[
        bool, typer.Option("--no-tui", help="Stop after the summary; do not open the app.", show_default=False)
    ] = False,
    defect: Annotated[
        str | None,
        typer.Option("--defect", metavar="NAME", help="Planted defect (see `wb demo --list-defects`)."),
    ] = None,
    stack: Annotated[
        str,
        typer.Option(
            "--stack",
            metavar="STACK",
            help="Test stack: atb (ATB-structured, bf16), torch (HF bf16), torchair (GE dumps of the compiled graph, "
            "bf16, against its FX dump) or quant (int8 fake-quantized, fp32).",
        ),
    ] = "atb",
    list_defects: Annotated[
        bool,
        typer.Option("--list-defects", help="List the defects each test stack can plant.", show_default=False),
    ] = False,
    theme: Annotated[str | None, typer.Option("--theme", help="Theme for the app.")] = None,
    tp: Annotated[
        int,
        typer.Option(
            "--tp",
            metavar="N",
            help="Run the ATB stack tensor-parallel on N ranks (one dump folder per rank; default defect "
            "allreduce_scale).",
        ),
    ] = 1,
    scheme: Annotated[
        str | None,
        typer.Option("--scheme", metavar="SCHEME", help="--stack quant: w8a16 or w8a8 (the default)."),
    ] = None,
) -> None:
    """Build a small Llama, dump a golden (fp32) and a test run (bf16, one planted defect), compare, open the app."""
    from workbench import demo as demo_mod

    if list_defects:
        for st in demo_mod.STACKS:
            default = " (the default stack)" if st == "atb" else ""
            typer.echo(f"--stack {st}{default}:")
            for name, text in demo_mod.available_defects(st).items():
                typer.echo(f"  {name:16s} {text}")
        return
    from workbench.core.files import CATALOG_NAME

    guarded(lambda: demo_mod.check_choice(stack, defect, tp, scheme))  # before anything is built or replaced

    def go() -> Any:
        plan = demo_mod.make_demo(out, stack=stack, defect=defect, log=typer.echo, tp=tp, scheme=scheme)
        res = run_compare_cli(compare_request(plan.golden, plan.test, out, mapping=plan.mapping))
        demo_mod.finish_demo(out, plan)
        typer.echo(f"planted defect: {plan.description}")
        if stack == "quant":
            from workbench.cli.advise_cmd import print_fallback

            if plan.expected:
                typer.echo(f"expected: the advisor names {plan.expected} at every token")
            print_fallback(out / CATALOG_NAME, res.cmp_id, 3)
        else:
            typer.echo(f"expected: error born at {plan.expected} (token {plan.expected_token})")
        return res

    res = guarded(go)
    interactive = sys.stdin.isatty() and sys.stdout.isatty() and not os.environ.get("CI")

    if no_tui or not interactive:
        typer.echo(f"open the app on it: wb open {out / CATALOG_NAME}")
        return

    def launch_app() -> int:
        from workbench.app.launch import launch, make_app

        return launch(make_app(catalog=out / CATALOG_NAME, theme=theme, cmp_id=res.cmp_id))

    code = guarded(launch_app)
    if code:
        raise typer.Exit(code)
