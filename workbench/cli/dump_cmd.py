"""`wb dump --exec`: dump any torch script's model with no change to the script."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, fail


@app.command()
def dump(
    exec_: Annotated[
        str, typer.Option("--exec", help='The command to run, e.g. "python run.py --prompt hi" (quoted).')
    ],
    out: Annotated[Path, typer.Option("-o", "--output", help="Dump folder (msit's layout is written below it).")],
    tokens: Annotated[
        str | None, typer.Option("--tokens", help="Forward calls (tokens) to dump, e.g. 0-3,7 (default: 0).")
    ] = None,
    modules: Annotated[
        str | None,
        typer.Option("--modules", help="Module classes to dump, comma separated (e.g. Linear,LlamaRMSNorm)."),
    ] = None,
    stats_only: Annotated[
        bool, typer.Option("--stats-only", help="Statistics only (statistics.csv), no tensor files.")
    ] = False,
    weights: Annotated[bool, typer.Option("--weights", help="Also save every weight once (for wb precheck).")] = False,
    fx: Annotated[
        bool,
        typer.Option(
            "--fx",
            help="Dump the model's aten graph (torch.compile on the CPU, every node's inputs and outputs in msit's "
            "FX layout, TorchAir's golden side) instead of its modules.",
        ),
    ] = False,
    follow_tokens: Annotated[
        Path | None,
        typer.Option(
            "--follow-tokens",
            help="A golden dump written by wb: the script's model is fed the golden run's generated tokens.",
        ),
    ] = None,
) -> None:
    """Run a torch script and dump the model it builds (msit's layout, plus wb's manifest), no code change.

    The first model the script calls is hooked (a Hugging Face PreTrainedModel, or any module with
    parameters and submodules); its forward calls are the tokens. The command is recorded for `wb redump`.
    With `--fx` the model's forward is compiled instead and every aten node dumped (msit's FX layout).
    With `--follow-tokens GOLDEN` every step's logits are replaced, after they are dumped, by ones whose only
    choice is the golden run's token (teacher forcing), so a test run compares like with like at every token.
    """
    from workbench.core.tokens import parse_tokens
    from workbench.dump.autohook import hook_env

    try:
        argv = shlex.split(exec_)
    except ValueError as exc:
        raise fail(f"--exec: cannot split the command ({exc})") from None
    if not argv:
        raise fail("--exec: empty command")
    try:
        token_set = parse_tokens(tokens) if tokens else None
    except ValueError as exc:
        raise fail(f"--tokens: {exc}") from None
    out_dir = out.resolve()
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise fail(f"{out}: cannot create the dump folder ({exc.strerror or exc})") from None
    config: dict[str, object] = {
        "dump_path": str(out_dir),
        "token_range": sorted(token_set) if token_set else [0],
        "dump_statistics_mode": 1 if stats_only else 0,
        "dump_weight": weights,
        "exec_command": exec_,
        "exec_cwd": os.getcwd(),
    }
    if follow_tokens is not None:
        from workbench.formats.model import DumpError
        from workbench.formats.token_ids import generated_ids

        try:
            ids = generated_ids(follow_tokens)
        except DumpError as exc:
            raise fail(f"--follow-tokens: {exc}") from None
        # the ids travel with the command, so a re-dump follows them even when the golden dump has moved
        config["follow_tokens"] = str(follow_tokens.resolve())
        config["follow_ids"] = ids
    if fx:
        config["fx"] = True
    if modules:
        config["module_list"] = [m.strip() for m in modules.split(",") if m.strip()]
    pattern = "msit_fx_dump/worldsize*" if fx else "msit_dump_*/torch_tensors/*"
    before = set(out_dir.glob(pattern))
    try:
        proc = subprocess.run(argv, env={**os.environ, **hook_env(config)}, check=False)
    except OSError as exc:
        raise fail(f"--exec: cannot run {argv[0]}: {exc.strerror or exc}") from None
    made = sorted(set(out_dir.glob(pattern)) - before)
    if proc.returncode != 0:
        raise fail(
            f"the command exited with code {proc.returncode}" + (f"; partial dump: {made[-1]}" if made else ""),
            proc.returncode if 0 < proc.returncode < 128 else 1,
        )
    if not made:
        raise fail("the command ran but built no torch model to dump (no nn.Module with parameters was called)", 1)
    for d in made:
        typer.echo(f"dump written: {d}")
    if follow_tokens is not None:
        typer.echo(f"followed the golden run's {len(ids)} generated tokens ({follow_tokens})")
