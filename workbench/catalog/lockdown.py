"""Every DuckDB connection wb opens, and what of a catalog file wb trusts.

A catalog comes from someone else as often as not, so a connection can reach nothing but its database: no file
or URL is read or written through SQL (`enable_external_access = false`), no extension is installed or loaded
on demand, and the configuration is locked. The SQL objects under wb's names (the views of `schema.py`, the
tables of its DDL) are wb's own: read-write, a view under one of those names is replaced by wb's definition and
a macro that shadows a DuckDB function (`lower`, `count`: it would change what wb's own SQL computes) is dropped;
read-only, where nothing can be repaired, such a catalog is refused. Tables and views under other names are
left alone; wb never reads them.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from workbench.catalog import CatalogError
from workbench.catalog.schema import OUR_TABLES, OUR_VIEWS, PAST_VIEWS

LOCKED: dict[str, str | bool | int | float | list[str]] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
}


def connect(path: Path, *, read_only: bool, lock: bool = True) -> duckdb.DuckDBPyConnection:
    """A connection to `path` with external access and extension loading off (`lock`: the configuration locked
    too; without it the caller turns access off and locks once it has attached what it was asked to)."""
    config = dict(LOCKED)
    if lock:
        config["lock_configuration"] = True
    else:
        config["enable_external_access"] = True
    return duckdb.connect(str(path), read_only=read_only, config=config)


def _shadowing_macros(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
    """(name, type) of the catalog's macros that share a name with a DuckDB function."""
    # the catalog's own macros first: most have none, and then DuckDB's functions are not listed a second time
    # to be matched against them (~15 ms of each open)
    if not con.execute(
        "SELECT 1 FROM duckdb_functions() WHERE NOT internal AND database_name = current_database() "
        "AND function_type IN ('macro', 'table_macro') LIMIT 1"
    ).fetchall():
        return []
    rows = con.execute(
        "SELECT DISTINCT function_name, function_type FROM duckdb_functions() "
        "WHERE NOT internal AND database_name = current_database() AND function_type IN ('macro', 'table_macro') "
        "AND function_name IN (SELECT function_name FROM duckdb_functions() WHERE internal) ORDER BY 1"
    ).fetchall()
    return [(str(n), str(t)) for n, t in rows]


def _not_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """wb's table names that the catalog holds as something else (a view)."""
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_type <> 'BASE TABLE' ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]) in OUR_TABLES]


def _our_names_as_tables(con: duckdb.DuckDBPyConnection) -> list[str]:
    """wb's view names that the catalog holds as a table."""
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_catalog = current_database() "
        "AND table_schema = 'main' AND table_type = 'BASE TABLE' ORDER BY 1"
    ).fetchall()
    return [str(r[0]) for r in rows if str(r[0]) in OUR_VIEWS]


def restore_read_write(con: duckdb.DuckDBPyConnection) -> bool:
    """Remove what stands under wb's names or shadows DuckDB's functions (planted views, macros); True when
    something was removed (the caller then re-runs the DDL). wb's views are recreated by the caller."""
    removed = False
    for name, kind in _shadowing_macros(con):
        con.execute(f'DROP MACRO {"TABLE " if kind == "table_macro" else ""}IF EXISTS main."{name}"')
        removed = True
    for name in _not_tables(con):
        con.execute(f'DROP VIEW IF EXISTS main."{name}"')
        removed = True
    for name in _our_names_as_tables(con):
        con.execute(f'DROP TABLE IF EXISTS main."{name}"')
        removed = True
    return removed


def view_is_ours(con: duckdb.DuckDBPyConnection, name: str, ddl: str) -> bool:
    """Whether the file holds view `name` exactly as wb's `ddl` makes it (missing: False)."""
    return _has_view(con, name) and not view_differs(con, name, ddl)


def _has_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(
        con.execute(
            "SELECT 1 FROM duckdb_views() WHERE NOT internal AND NOT temporary AND view_name = ? "
            "AND database_name = current_database() AND schema_name = 'main'",
            [name],
        ).fetchall()
    )


def view_differs(con: duckdb.DuckDBPyConnection, name: str, ddl: str) -> bool:
    """Whether the file's view `name` is not wb's `ddl` (compared as DuckDB normalises both; missing: False)."""
    stored = con.execute(
        "SELECT sql FROM duckdb_views() WHERE NOT internal AND NOT temporary AND view_name = ? "
        "AND database_name = current_database() AND schema_name = 'main'",
        [name],
    ).fetchall()
    if not stored:
        return False
    try:
        con.execute(ddl.replace("CREATE OR REPLACE VIEW", "CREATE OR REPLACE TEMP VIEW", 1))
    except duckdb.Error:
        return True  # wb's view cannot even be built on these tables: the file's is another one
    try:
        ours = con.execute("SELECT sql FROM duckdb_views() WHERE temporary AND view_name = ?", [name]).fetchall()
    finally:
        con.execute(f'DROP VIEW IF EXISTS temp.main."{name}"')
    return not ours or str(ours[0][0]).replace("CREATE TEMP VIEW", "CREATE VIEW", 1) != str(stored[0][0])


def check_read_only(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """On a read-only connection, where nothing can be repaired: a catalog whose views under wb's names are not
    wb's, whose tables are views or whose macros shadow DuckDB's functions is refused (`CatalogError` naming the
    file and what was found)."""
    bad = [f"macro {n}" for n, _ in _shadowing_macros(con)]
    bad += [f"view {n} in place of the table" for n in _not_tables(con)]
    bad += [f"table {n} in place of the view" for n in _our_names_as_tables(con)]
    bad += [
        f"view {n}"
        for n, ddl in OUR_VIEWS.items()
        if view_differs(con, n, ddl) and all(view_differs(con, n, past) for past in PAST_VIEWS.get(n, ()))
    ]
    if bad:
        raise CatalogError(
            f"{path}: holds SQL objects that are not wb's ({', '.join(bad[:4])}; planted, or made by another wb "
            "version): not trusted; a wb compare or wb ingest into this catalog replaces them"
        )
