"""`catalog_guard`: a catalog write whose storage errors become one line naming the catalog."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from workbench.catalog import CatalogError, storage_message
from workbench.core.interrupts import signal_inside

T = TypeVar("T")


def catalog_guard(catalog: Path, fn: Callable[[], T]) -> T:
    """Run `fn`; a DuckDB or storage error becomes a one-line `CatalogError` naming the catalog and saying
    what is kept (a failed write never loses what was committed before)."""
    import duckdb

    try:
        return fn()
    except duckdb.InterruptException:
        raise  # a signal, not a storage fault: `guarded` says interrupted or terminated
    except duckdb.Error as exc:
        interrupt = signal_inside(exc)
        if interrupt is not None:  # a signal, not a storage fault, even when DuckDB wrapped it
            raise interrupt from None
        raise CatalogError(
            f"{catalog}: {storage_message(exc)}; nothing committed was lost (earlier runs and comparisons are kept)"
        ) from None
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise
        raise CatalogError(
            f"{exc.filename or catalog}: {storage_message(exc)}; nothing committed was lost "
            "(earlier runs and comparisons are kept)"
        ) from None
