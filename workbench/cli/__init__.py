"""The `wb` command line (typer). Every failure a user can cause is one line on stderr, never a traceback.

One module per command (or family of commands); each registers itself on `common.app`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from pathlib import Path

from workbench.cli import (  # noqa: F401  (registration)
    advise_cmd,
    badcase_cmd,
    catalog_cmds,
    compare_cmd,
    demo_cmd,
    dump_cmd,
    errcheck_cmd,
    logits_cmd,
    open_cmd,
    precheck_cmd,
    redump_cmd,
    report_cmd,
)
from workbench.cli.common import (
    EXIT_CRASH,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    REPORT_AT,
    Terminated,
    app,
    on_sigterm,
    use_plain_help,
)
from workbench.core.interrupts import keep_interrupts_from_finalizers

use_plain_help(app)  # every command is registered by now (the imports above)


def main() -> None:
    """The `wb` console script. Ends the process without the interpreter's teardown: every catalog and
    file is closed by then, and tearing down DuckDB/numpy objects costs ~0.15 s per
    command.

    `--debug` (anywhere on the line) or `WB_DEBUG=1` shows the traceback of a crash (exit 3)."""
    if "--debug" in sys.argv[1:]:
        sys.argv.remove("--debug")
        os.environ["WB_DEBUG"] = "1"
    _only_the_named_command(sys.argv[1:2])
    with contextlib.suppress(ValueError):  # not the main thread (embedded): leave signals alone
        signal.signal(signal.SIGTERM, on_sigterm)
        keep_interrupts_from_finalizers()
    code: int = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
        interrupt = _interrupt_typer_swallowed(exc)
        if interrupt is not None:
            code = _say_interrupted(interrupt)
    except KeyboardInterrupt as exc:  # before a command started: nothing to keep
        code = _say_interrupted(exc)
    except Exception as exc:  # a bug: one line, the traceback only on request
        from workbench.core.text import printable

        if os.environ.get("WB_DEBUG"):
            traceback.print_exc()
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        sys.stderr.write(
            printable(f"wb: internal error (a bug in wb): {type(exc).__name__}{at}: {first}")
            + f"; please report it ({REPORT_AT}); --debug shows the traceback\n"
        )
        code = EXIT_CRASH
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _only_the_named_command(first: list[str]) -> None:
    """A command line that starts with a command's name builds that command alone: typer builds the click command
    of every registered one (their parameters, from the signatures) whatever the line, ~10 ms, and only the named
    one runs. Anything else (no command, `--help`, a misspelt name: its suggestions) sees them all."""
    if not first:
        return
    chosen = [
        info
        for info in app.registered_commands
        if info.callback is not None
        and (info.name or info.callback.__name__.lower().replace("_", "-")) == first[0]  # typer's naming
    ]
    if len(chosen) == 1:
        app.registered_commands[:] = chosen


def _interrupt_typer_swallowed(exc: SystemExit) -> KeyboardInterrupt | None:
    """The interrupt typer turned into a silent exit 130 (one that came while it parsed the command line, before
    `guarded` could say anything); None for every other exit."""
    inner = exc.__context__
    cause = inner.__cause__ if inner is not None else None
    return cause if isinstance(cause, KeyboardInterrupt) else None


def _say_interrupted(exc: KeyboardInterrupt) -> int:
    terminated = isinstance(exc, Terminated)
    sys.stderr.write(f"wb: {'terminated' if terminated else 'interrupted'}\n")
    return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
