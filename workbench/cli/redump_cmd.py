"""`wb redump`: re-dump one op at one token with full tensors by re-running the recorded command."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Annotated

import typer

from workbench.cli.common import app, fail, guarded, open_comparison
from workbench.core.files import DEFAULT_CATALOG


@app.command()
def redump(
    node: Annotated[str, typer.Argument(help="The golden node (module name) whose op to re-dump.")],
    token: Annotated[int, typer.Option("--token", "-t", help="The token to re-dump.")] = 0,
    catalog: Annotated[Path, typer.Option("--catalog", "-c", help="Catalog of the comparison.")] = Path(
        DEFAULT_CATALOG
    ),
    cmp_id: Annotated[int | None, typer.Option("--cmp", help="Comparison id (default: the latest).")] = None,
    side: Annotated[str, typer.Option("--side", help="test or golden.")] = "test",
    timeout: Annotated[float | None, typer.Option("--timeout", help="Stop the re-run after this many seconds.")] = None,
) -> None:
    """Re-run the command recorded in the run's manifest for just this op and token, with full tensors in and
    out; the new dump is ingested into the same catalog and the comparison's pairs of the op are recomputed."""
    from workbench.core.progress import Progress
    from workbench.jobs.redump import RedumpCancelled, RedumpError, run_redump

    if side not in ("test", "golden"):
        raise fail(f"--side must be test or golden, not {side!r}")

    def find() -> int:
        with open_comparison(catalog, cmp_id) as (_con, found):
            return found

    cid = guarded(find)
    tty = sys.stderr.isatty()

    def show(p: Progress) -> None:
        if tty:
            sys.stderr.write(f"\r[{p.done}/{p.total}] {p.stage[:60]}  {p.message[:60]}".ljust(120))
            sys.stderr.flush()

    cancel = threading.Event()
    try:
        res = run_redump(catalog, cid, node, token, side=side, progress=show, cancel=cancel, timeout_s=timeout)
    except KeyboardInterrupt:
        cancel.set()
        raise fail("interrupted; the catalog is unchanged", 130) from None
    except RedumpCancelled as exc:
        raise fail(str(exc), 130) from None
    except RedumpError as exc:
        raise fail(str(exc)) from None
    if tty:
        sys.stderr.write("\n")
    typer.echo(f"dump written: {res.dump_dir} (run {res.run_id})")
    typer.echo(f"{res.tensors_updated} tensors now full, {res.pairs_recomputed} pairs recomputed; log: {res.log}")
    for note in res.notes:
        typer.echo(f"note: {note}")
