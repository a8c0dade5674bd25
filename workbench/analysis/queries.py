"""SQL over a catalog, read-only: ad-hoc text, `.sql` files and the saved queries in `queries/`."""

from __future__ import annotations

import datetime
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from workbench.catalog import first_row
from workbench.catalog.readonly import connect_read_only
from workbench.core.capped import SQL_FILE, FileRefused, read_text
from workbench.core.files import package_data
from workbench.core.output import render, text_table
from workbench.core.text import printable

QUERIES_DIR = package_data("queries")


def read_sql(path: Path) -> str:
    """A `.sql` file's text; `ValueError` naming the file when it cannot be read or is over its cap."""
    try:
        return read_text(path, SQL_FILE)
    except FileRefused as exc:
        raise ValueError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read SQL file ({getattr(exc, 'strerror', None) or exc})") from None


def saved_queries(folder: Path = QUERIES_DIR) -> dict[str, tuple[Path, str]]:
    """name -> (file, title); the title is the first `-- ` comment line of the file."""
    out: dict[str, tuple[Path, str]] = {}
    if not folder.is_dir():
        return out
    for f in sorted(folder.glob("*.sql")):
        title = ""
        for line in read_sql(f).splitlines():
            if line.startswith("--"):
                title = line.lstrip("- ").strip()
                break
        out[f.stem] = (f, title)
    return out


def resolve_sql(text: str) -> str:
    """SQL text from a saved query name, a `.sql` file path, or the text itself."""
    saved = saved_queries()
    if text in saved:
        return read_sql(saved[text][0])
    if text.endswith(".sql"):
        p = Path(text)
        if p.is_file():
            return read_sql(p)
        if p.name == text and p.stem in saved:  # `wb queries` shows the saved ones' files: their name as typed
            return read_sql(saved[p.stem][0])
        raise ValueError(f"{p}: SQL file not found")
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]*", text.strip()):
        # one bare word is a saved query's name, never SQL worth running
        names = ", ".join(saved) or "none found"
        raise ValueError(f"{text.strip()!r}: no saved query by that name (saved: {names}; `wb queries` lists them)")
    return text


def set_comparison(con: duckdb.DuckDBPyConnection, cmp_id: int | None) -> int | None:
    """Set the `cmp_id` variable saved queries read (default: newest comparison)."""
    if cmp_id is None:
        row = first_row(con.execute("SELECT max(cmp_id) FROM comparisons"))
        cmp_id = int(row[0]) if row and row[0] is not None else None
    con.execute("SET VARIABLE cmp_id = ?", [cmp_id if cmp_id is not None else -1])
    return cmp_id


@dataclass(frozen=True, slots=True)
class QueryResult:
    """A query's rows as DuckDB returned them (Python values), its column names and which columns hold numbers."""

    columns: list[str]
    numeric: list[bool]
    rows: list[tuple[Any, ...]]


_NUMBER_TYPES = frozenset(
    "TINYINT SMALLINT INTEGER BIGINT HUGEINT UTINYINT USMALLINT UINTEGER UBIGINT UHUGEINT FLOAT DOUBLE".split()
)


def query_rows(con: duckdb.DuckDBPyConnection, sql: str) -> QueryResult:
    """Run SQL; a DuckDB error becomes a one-line ValueError."""
    try:
        cur = con.execute(sql)
        described = cur.description or []
        rows = cur.fetchall() if described else []
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise ValueError(f"SQL error: {first}") from None
    kinds = [str(d[1]) for d in described]
    numeric = [k in _NUMBER_TYPES or k.startswith("DECIMAL") for k in kinds]
    return QueryResult([str(d[0]) for d in described], numeric, rows)


def format_rows(res: QueryResult, fmt: str, limit: int = 200) -> str:
    """A query's result as `fmt` (`core.output.render`): CSV and JSON whole, the table cut at `limit` rows."""

    def table() -> str:
        if not res.rows:
            return "(no rows)\n" if res.columns else "(no result)\n"
        shown = res.rows if limit <= 0 else res.rows[:limit]
        cols = [_table_column([r[i] for r in shown]) for i in range(len(res.columns))]
        lines = text_table(
            [printable(c) for c in res.columns], [list(cells) for cells in zip(*cols, strict=True)], res.numeric
        )
        if limit > 0 and len(res.rows) > limit:
            lines.append(f"... {len(res.rows) - limit} more rows (use --limit 0 or --format csv)")
        return "\n".join(lines) + "\n"

    names = unique_names(res.columns)  # CSV and JSON rows are keyed by name: `SELECT g.path, t.path` has two `path`
    if fmt == "csv":
        rows = [dict(zip(names, (_csv_value(v) for v in row), strict=True)) for row in res.rows]
        return render(fmt, rows, names, table)
    if fmt == "json":
        payload = [dict(zip(names, (_json_value(v) for v in row), strict=True)) for row in res.rows]
        return render(fmt, [], names, table, payload)
    return render(fmt, [], res.columns, table)


def unique_names(columns: Sequence[str]) -> list[str]:
    """The column names with a repeated one numbered as DuckDB numbers it in a table it creates (`path`, `path_1`)."""
    taken = set(columns)
    seen: set[str] = set()
    out = []
    for name in columns:
        if name in seen:
            k = 1
            while f"{name}_{k}" in taken:
                k += 1
            name = f"{name}_{k}"
            taken.add(name)
        seen.add(name)
        out.append(name)
    return out


def _table_column(values: list[Any]) -> list[str]:
    """One column's cells: floats with six decimals (in exponent form when a value is too small or large for
    that to show it), NULL as NULL, text escaped so a cell cannot break the line or drive the terminal."""
    floats = [abs(v) for v in values if isinstance(v, float) and math.isfinite(v) and v != 0.0]
    exp = bool(floats) and (min(floats) < 1e-4 or max(floats) >= 1e9)
    return [_table_cell(v, exp) for v in values]


TABLE_CELL_CHARS = 60  # a longer text cell is cut in the table (`...`); CSV and JSON give it whole


def _table_cell(v: Any, exp: bool) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        return f"{v:.6e}" if exp else f"{v:.6f}"
    text = printable(bytes(v).hex() if isinstance(v, bytes | bytearray | memoryview) else v)
    return text if len(text) <= TABLE_CELL_CHARS else text[: TABLE_CELL_CHARS - 3] + "..."


def _csv_value(v: Any) -> Any:
    """A CSV cell: numbers and text as they are (None: an empty cell), blobs as hex, the rest as text."""
    if v is None or isinstance(v, bool | int | float | str):
        return v
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    return str(v)


def _json_value(v: Any) -> Any:
    """A value JSON can hold: a NaN or infinite float as null, a date or time in ISO form, a decimal as a float,
    a blob as hex, lists and structs element by element."""
    if v is None or isinstance(v, bool | int | str):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, datetime.date | datetime.time):
        return v.isoformat()
    if isinstance(v, bytes | bytearray | memoryview):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): _json_value(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return str(v)


def run_query(
    catalog: Path,
    sql: str,
    *,
    fmt: str = "table",
    cmp_id: int | None = None,
    limit: int = 200,
    attach: Sequence[Path] = (),
) -> str:
    """Run SQL (text, file or saved name) on a confined read-only connection (`catalog.readonly`) and format
    the result; `attach` names files the SQL may use (DuckDB files by stem, CSV/Parquet/JSON as tables)."""
    text = resolve_sql(sql)
    con = connect_read_only(catalog, allow_files=attach)
    try:
        set_comparison(con, cmp_id)
        res = query_rows(con, text)
    finally:
        con.close()
    return format_rows(res, fmt, limit)
