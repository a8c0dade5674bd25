"""`wb precheck`: re-run ops alone on their dumped inputs (ATB op folders, torch modules and API calls)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from workbench.cli.common import app, guarded, open_comparison, say

if TYPE_CHECKING:
    from workbench.analysis.checks.precheck.result import PrecheckResult


@app.command()
def precheck(
    path: Annotated[
        Path | None,
        typer.Argument(
            help="An ATB op / group / token folder, or a torch dump: a module folder ({dev}/{token}/{module}), "
            "a token folder, or any dump level (msit torch, msprobe)."
        ),
    ] = None,
    token: Annotated[
        int | None,
        typer.Option("--token", "-t", help="Token to check (torch: default the first; ATB: default every token)."),
    ] = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            "-n",
            help="One node: a torch module by name, an ATB op or group by its folder path below the token "
            "(3_Prefill_layer/1_Attention), or a catalog's golden node.",
        ),
    ] = None,
    catalog: Annotated[
        Path | None, typer.Option("--catalog", "-c", help="Check a node of a comparison in this catalog.")
    ] = None,
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: the latest).")] = None,
    side: Annotated[str, typer.Option("--side", help="test or golden (catalog mode).")] = "test",
    thresholds: Annotated[
        Path | None, typer.Option("--thresholds", help="TOML file overriding pass/fail bounds (ATB ops).")
    ] = None,
    show_all: Annotated[bool, typer.Option("--all", help="Also list ops that pass.")] = False,
) -> None:
    """Re-run ops alone on their dumped inputs with a float64 reference; report the ops that disagree.

    Torch modules and API calls are judged with msit opcheck's standard (share of elements within a relative
    error: bf16 2^-8 / fp16 2^-10 over 99.9%, fp32 2^-20 over 99.99%); ATB ops with the compare thresholds.
    `ok` only when every stage ran. Exit 0: every op with a reference ran fully and passed; 1: an op disagrees;
    4: nothing disagrees but something was not checked or could not run (or nothing ran).
    """

    def go() -> int:
        from workbench.analysis.checks.precheck.result import CANNOT_RUN, DISAGREE, NO_REFERENCE, OK, tally

        results = _results()
        for r in results:
            label = r.name or r.op_dir
            verdict = r.verdict
            unchecked = f"  {r.unchecked_text}" if r.not_checked else ""
            if verdict == NO_REFERENCE:
                if show_all or len(results) == 1:
                    say(f"skip  {label}  ({r.reason})")
            elif verdict == DISAGREE:
                worst = ", ".join(
                    f"{o.label or f'out{o.index}'}: {','.join(o.failed_metrics) or o.reason}"
                    for o in r.outputs
                    if o.passed is False
                )
                say(f"FAIL  {label}  {worst}{unchecked}" + (f"  ({r.reason})" if r.reason else ""))
            elif verdict == CANNOT_RUN:
                why = r.reason or ""
                say(f"?     {label}  " + (why if why.startswith(CANNOT_RUN) else f"{CANNOT_RUN}: {why}"))
            elif verdict == OK:
                if show_all or len(results) == 1:
                    say(f"ok    {label}" + (f"  ({r.reason})" if r.reason else ""))
            else:  # not checked: some stages ran and passed, others did not run
                passed = ", ".join(o.label or f"out{o.index}" for o in r.outputs if o.passed)
                say(f"?     {label}{unchecked}" + (f"  (passed: {passed})" if passed else ""))
        counts = tally(results)
        say(counts.line())
        return counts.exit_code

    def _results() -> list[PrecheckResult]:
        from workbench.analysis.checks.precheck.run_torch import precheck_path
        from workbench.analysis.checks.precheck.torch_inputs import CannotRun

        try:
            if catalog is not None:
                return _catalog_results(catalog)
            if path is None:
                raise ValueError("give a dump folder, or --catalog with --node")
            if not path.is_dir():
                raise ValueError(f"{path}: no such folder")
            from workbench.formats.atb import token_folders

            tokens_below = token_folders(path)
            if tokens_below or _is_atb(path):
                from workbench.analysis.checks.precheck.run_atb import precheck_group
                from workbench.compare.judging.thresholds import Thresholds

                th = Thresholds.load(thresholds)
                found: list[PrecheckResult] = []
                folders = _atb_token_folders(path, tokens_below, token)
                for folder in folders:
                    here = precheck_group(folder, thresholds=th)  # an op folder yields itself
                    if node is not None:  # the whole token ran (an op's params are judged against its peers)
                        here = [r for r in here if (r.name or "") == node or (r.name or "").startswith(node + "/")]
                    if len(folders) > 1:  # several tokens: say which one each op ran at
                        here = [replace(r, name=f"token {folder.name}: {r.name or r.op_dir}") for r in here]
                    found += here
                if not found and node is not None:
                    raise ValueError(
                        f"{path}: no ATB op {node!r} here (ATB ops and groups are named by their folder path below "
                        "the token folder, e.g. 3_Prefill_layer/3_RmsNormOperation)"
                    )
                if not found:
                    raise ValueError(
                        f"{path}: no ATB op folders here or below (give a dump folder, its tensors/{{dev}}_{{pid}} "
                        "folder, a token folder, a layer folder or an op folder)"
                    )
                return found
            return precheck_path(path, token, node)
        except CannotRun as exc:
            raise ValueError(str(exc)) from None

    def _catalog_results(cat: Path) -> list[PrecheckResult]:
        from workbench.analysis.checks.precheck.run_catalog import precheck_catalog

        if node is None:
            raise ValueError("--catalog needs --node (a golden node name)")
        if side not in ("test", "golden"):
            raise ValueError(f"--side must be test or golden, not {side!r}")
        with open_comparison(cat, cmp_id) as (con, cid):
            tok = token
            if tok is None:
                row = con.execute("SELECT min(token_id) FROM node_results WHERE cmp_id = ?", [cid]).fetchone()
                tok = int(row[0]) if row and row[0] is not None else 0
            return precheck_catalog(con, cid, node, tok, side)

    code = guarded(go)
    if code:
        raise typer.Exit(code)


def _atb_token_folders(path: Path, tokens_below: list[Path], token: int | None) -> list[Path]:
    """The folders `--token` leaves to check in an ATB dump (all of them without it)."""
    if token is None:
        return tokens_below or [path]
    if not tokens_below:
        raise ValueError(f"{path}: --token needs a folder above the token folders (this one is inside a token)")
    picked = [f for f in tokens_below if f.name == str(token)]
    if not picked:
        held = ", ".join(sorted({f.name for f in tokens_below}, key=lambda n: (len(n), n)))
        raise ValueError(f"{path}: no token {token} here (tokens: {held})")
    return picked


def _is_atb(path: Path) -> bool:
    """An ATB op/group/token folder (`{index}_{OpType}` folders, or `before`/`after` below)."""
    import re

    op = re.compile(r"^[0-9]+_\w+$", re.ASCII)
    if op.match(path.name) or (path / "after").is_dir() or (path / "before").is_dir():
        return True
    try:
        return (
            any(p.is_dir() and op.match(p.name) and not p.name.startswith("root") for p in path.iterdir())
            and not (path.parent / "model_tree.json").exists()
        )
    except OSError:
        return False
