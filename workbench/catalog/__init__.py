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
