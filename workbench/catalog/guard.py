"""`catalog_guard`: a catalog write whose storage errors become one line naming the catalog."""

from __future__ import annotations

import errno
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from workbench.catalog import CatalogError, storage_message
from workbench.core.interrupts import signal_inside

T = TypeVar("T")


def catalog_guard(catalog: Path, fn: Callable[[], T]) -> T:
    """Run `fn`; a DuckDB or storage error becomes a one-line `CatalogError` naming the catalog and saying
    what is kept (a failed write never loses what was committed before)."""
    try:
        return fn()
    except Exception as exc:
        # DuckDB is not imported up front (~60 ms): an error of its own means it is loaded
        duckdb = sys.modules.get("duckdb")
        if duckdb is not None and isinstance(exc, duckdb.InterruptException):
            raise  # a signal, not a storage fault: `guarded` says interrupted or terminated
        if duckdb is not None and isinstance(exc, duckdb.Error):
            interrupt = signal_inside(exc)
            if interrupt is not None:  # a signal, not a storage fault, even when DuckDB wrapped it
                raise interrupt from None
            raise CatalogError(
                f"{catalog}: {storage_message(exc)}; nothing committed was lost (earlier runs and comparisons are kept)"
            ) from None
        if not isinstance(exc, OSError) or exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        raise CatalogError(
            f"{exc.filename or catalog}: {storage_message(exc)}; nothing committed was lost "
            "(earlier runs and comparisons are kept)"
        ) from None
