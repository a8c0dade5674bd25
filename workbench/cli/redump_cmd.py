"""`wb redump`: re-dump one op at one token with full tensors by re-running the recorded command."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, fail, guarded, open_comparison, say
from workbench.core.exits import EXIT_NOT_CONFIRMED
from workbench.core.files import DEFAULT_CATALOG

# one paragraph per string: --help wraps them to the terminal (a docstring's line breaks would stay)
HELP = "\n\n".join(
    (
        "Re-dump one op at one token with full tensors: the run's recorded command, shown first, run after a yes.",
        "The new dump is ingested into the same catalog and the comparison's pairs of the op are recomputed. "
        "The command, its folder and environment are shown first and run only after a yes (`--yes`, or `y` on a "
        "terminal); a record not signed here by this user is flagged as recorded elsewhere or edited.",
    )
)


@app.command(help=HELP)
def redump(
    node: Annotated[str, typer.Argument(help="The golden node (module name) whose op to re-dump.")],
    token: Annotated[int, typer.Option("--token", "-t", help="The token to re-dump.")] = 0,
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog of the comparison.")] = Path(
        DEFAULT_CATALOG
    ),
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: the latest).")] = None,
    side: Annotated[str, typer.Option("--side", help="test or golden.")] = "test",
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop the re-run after this many seconds.")] = None,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Run the recorded command without asking (it is still shown).", show_default=False
        ),
    ] = False,
) -> None:
    """Re-dump one op at one token with full tensors: the run's recorded command, shown first, run after a yes."""
    from workbench.core.progress import Progress
    from workbench.jobs.redump import RedumpCancelled, RedumpError, RedumpPlan, describe, plan_redump, run_redump

    if side not in ("test", "golden"):
        raise fail(f"--side must be test or golden, not {side!r}")

    def find() -> RedumpPlan:
        with open_comparison(catalog, cmp_id) as (con, cid):
            try:
                return plan_redump(con, cid, node, token, catalog, side)
            except RedumpError as exc:
                raise fail(str(exc)) from None

    plan = guarded(find)
    say("wb redump will run this recorded command:")
    for line in describe(plan):
        say(f"  {line}")
    if not yes:
        if not sys.stdin.isatty():
            raise fail("not run: a recorded command needs your yes (--yes, or y on a terminal)", EXIT_NOT_CONFIRMED)
        try:
            answer = input("run it? [y/N] ").strip().lower()
        except EOFError:
            answer = ""
        if answer not in ("y", "yes"):
            raise fail("not run (answered no)", EXIT_NOT_CONFIRMED)
    tty = sys.stderr.isatty()

    def show(p: Progress) -> None:
        if tty:
            sys.stderr.write(f"\r[{p.done}/{p.total}] {p.stage[:60]}  {p.message[:60]}".ljust(120))
            sys.stderr.flush()

    cancel = threading.Event()
    try:
        res = run_redump(catalog, plan, confirmed=True, progress=show, cancel=cancel, timeout_s=timeout)
    except KeyboardInterrupt:
        cancel.set()
        raise fail("interrupted; the catalog is unchanged", 130) from None
    except RedumpCancelled as exc:
        raise fail(str(exc), 130) from None
    except RedumpError as exc:
        raise fail(str(exc)) from None
    if tty:
        sys.stderr.write("\n")
    say(f"dump written: {res.dump_dir} (run {res.run_id})")
    say(f"{res.tensors_updated} tensors now full, {res.pairs_recomputed} pairs recomputed; log: {res.log}")
    for note in res.notes:
        say(f"note: {note}")
