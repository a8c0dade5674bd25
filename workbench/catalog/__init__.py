"""The DuckDB catalog: schema, opening, ingesting. Light to import: names, the error type, one helper."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.core.files import CATALOG_NAME as CATALOG_NAME

if TYPE_CHECKING:
    import duckdb


class CatalogError(Exception):
    """A catalog that cannot be used; the message names the file."""


def first_row(result: duckdb.DuckDBPyConnection) -> tuple[Any, ...] | None:
    """The first row of an executed query, consuming the whole result (DuckDB 2 keeps it open otherwise)."""
    rows = result.fetchall()
    return rows[0] if rows else None


_FULL_MARKERS = ("no space left", "file too large", "disk quota", "errno 28", "errno 27")


def storage_message(exc: BaseException) -> str:
    """One line for a DuckDB/OS error; a full disk (ENOSPC, EFBIG, EDQUOT) is named as such."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    low = text.lower()
    errno = getattr(exc, "errno", None)
    if errno in (27, 28, 122) or any(m in low for m in _FULL_MARKERS):
        return f"disk full or file size limit reached while writing ({first[:160]})"
    return first[:240]
