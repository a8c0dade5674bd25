"""The one way to open a catalog for reading: a DuckDB connection that can reach nothing but the catalog.

User SQL (`wb query`, the app's SQL console) runs on this connection, so it must not become a door to the
filesystem or the network: external access is off (no `COPY ... TO`, `EXPORT DATABASE`, `read_csv`,
`read_blob`, `read_text`, `glob`, `ATTACH` of other files), extensions are neither installed nor loaded
on demand (`INSTALL httpfs`, a SQLite file), and the configuration is locked so the SQL cannot turn any of
it back on (`SET enable_external_access`, `SET log_query_path`, profiling output files).

Files a user wants beside the catalog are named up front (`allow_files`): a DuckDB file is attached
read-only under its stem, a CSV, Parquet or JSON file is loaded into a temporary table of that name,
all before the lock, so the SQL itself never opens a file. A catalog whose views under wb's names are not
wb's is refused (`lockdown.check_read_only`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import duckdb

from workbench.catalog import CatalogError
from workbench.catalog.lockdown import check_read_only, connect
from workbench.catalog.schema import SCHEMA_VERSION
from workbench.core.capped import ATTACHED, FileRefused, check_file, check_regular

_READERS = {".csv": "read_csv", ".tsv": "read_csv", ".parquet": "read_parquet", ".json": "read_json_auto"}
_DUCKDB_SUFFIXES = (".duckdb", ".db", ".ddb")
DUCKDB_MAGIC = b"DUCK"  # bytes 8-11 of every DuckDB database file


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def attach_name(path: Path) -> str:
    """The SQL name an attached file gets: its stem, letters/digits/underscore only."""
    name = re.sub(r"\W", "_", path.stem, flags=re.ASCII) or "attached"
    return f"f_{name}" if name[0].isdigit() else name


def _attach(con: duckdb.DuckDBPyConnection, path: Path, taken: set[str]) -> None:
    if not path.exists():
        raise CatalogError(f"{path}: --attach file not found")
    try:
        check_file(path, ATTACHED)
    except FileRefused as exc:
        raise CatalogError(str(exc)) from None
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read ({exc.strerror or exc})") from None
    name = attach_name(path)
    if name in taken:
        raise CatalogError(f"{path}: --attach name {name!r} is used twice; rename one of the files")
    taken.add(name)
    quoted = str(path.resolve()).replace("'", "''")
    suffix = path.suffix.lower()
    try:
        if suffix in _DUCKDB_SUFFIXES:
            con.execute(f"ATTACH '{quoted}' AS \"{name}\" (READ_ONLY)")
        elif suffix in _READERS:
            con.execute(f"CREATE TEMP TABLE \"{name}\" AS SELECT * FROM {_READERS[suffix]}('{quoted}')")
        else:
            raise CatalogError(f"{path}: --attach takes a DuckDB, CSV, TSV, Parquet or JSON file")
    except duckdb.Error as exc:
        raise CatalogError(f"{path}: cannot attach ({_first_line(exc)})") from None


def schema_version_of(con: duckdb.DuckDBPyConnection, path: Path) -> int | None:
    """The catalog's schema version; None without a `meta` table; `CatalogError` naming the file when unreadable."""
    try:
        has_meta = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'meta' AND table_schema = 'main'"
        ).fetchall()
        if not has_meta or not has_meta[0][0]:
            return None
        rows = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall()
    except duckdb.Error as exc:
        raise CatalogError(f"{path}: not a usable wb catalog ({_first_line(exc)})") from None
    if not rows:
        return None
    try:
        return int(str(rows[0][0]).strip())
    except ValueError:
        raise CatalogError(f"{path}: not a wb catalog (schema version {str(rows[0][0])[:20]!r})") from None


def connect_read_only(
    path: str | Path, *, allow_files: Sequence[Path] = (), hint: str | None = None
) -> duckdb.DuckDBPyConnection:
    """Open a wb catalog read-only, confined to itself (and `allow_files`, attached now); `CatalogError` otherwise
    (`hint`, e.g. what the command takes, follows the line saying a file is no DuckDB database)."""
    p = Path(path)
    if not p.exists():
        raise CatalogError(f"{p}: catalog not found")
    if p.is_dir():
        raise CatalogError(f"{p}: is a folder, not a catalog file")
    try:
        check_regular(p, "catalog")
        with p.open("rb") as fh:
            head = fh.read(12)
    except FileRefused as exc:
        raise CatalogError(str(exc)) from None
    except OSError as exc:
        raise CatalogError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if head[8:12] != DUCKDB_MAGIC:
        raise CatalogError(f"{p}: not a DuckDB catalog" + (f" ({hint})" if hint else ""))
    try:
        # with files to attach, access is turned off and the configuration locked below, once they are in
        con = connect(p, read_only=True, lock=not allow_files)
    except duckdb.Error as exc:
        raise CatalogError(f"{p}: cannot open as a DuckDB catalog ({_first_line(exc)})") from None
    try:
        version = schema_version_of(con, p)
        if version is None:
            raise CatalogError(f"{p}: not a wb catalog (no schema version)")
        if version > SCHEMA_VERSION:
            raise CatalogError(
                f"{p}: catalog schema version {version} is newer than this wb supports ({SCHEMA_VERSION}); "
                "upgrade wb to open it"
            )
        check_read_only(con, p)
        if allow_files:
            taken = {"main", "temp", "system", p.stem}
            for f in allow_files:
                _attach(con, Path(f), taken)
            con.execute("SET enable_external_access = false")
            con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con
