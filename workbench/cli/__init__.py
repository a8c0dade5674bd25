"""The `wb` command line (typer). Every failure a user can cause is one line on stderr, never a traceback.

One module per command (or family of commands); each registers itself on `common.app`.
"""

from __future__ import annotations

import contextlib
import os
import sys

from workbench.cli import (  # noqa: F401  (registration)
    catalog_cmds,
    compare_cmd,
    demo_cmd,
    dump_cmd,
    errcheck_cmd,
    open_cmd,
    precheck_cmd,
    redump_cmd,
)
from workbench.cli.common import app


def main() -> None:
    """The `wb` console script. Ends the process without the interpreter's teardown: every catalog and
    file is closed by then, and tearing down pandas/DuckDB/numpy objects costs ~0.15 s per command."""
    code: int = 0
    try:
        app()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
