"""The `wb` console script: a Ctrl-C or SIGTERM that arrives while Python is still loading the command line ends
with one line and exit 130/143, like one that arrives later, never with a traceback. Standard library only."""

from __future__ import annotations

import os
import signal
import sys
from typing import NoReturn

from workbench.core.exits import EXIT_INTERRUPTED, EXIT_TERMINATED


def _end(what: str, code: int) -> NoReturn:
    sys.stderr.write(f"wb: {what}\n")
    sys.stderr.flush()
    os._exit(code)


def _terminated(_signum: int, _frame: object) -> None:
    _end("terminated", EXIT_TERMINATED)


def main() -> None:
    """Load `workbench.cli` (typer, the commands: ~0.2 s) and run it; `workbench.cli.main` takes over the signals."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        from workbench.cli import main as run
    except KeyboardInterrupt:
        _end("interrupted", EXIT_INTERRUPTED)
    run()
