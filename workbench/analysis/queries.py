"""SQL over a catalog, read-only: ad-hoc text, `.sql` files and the saved queries in `queries/`."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import duckdb
import pandas as pd

from workbench.catalog import first_row
from workbench.catalog.readonly import connect_read_only
from workbench.core.capped import SQL_FILE, FileRefused, read_text
from workbench.core.files import package_data
from workbench.core.output import render
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
        if not p.is_file():
            raise ValueError(f"{p}: SQL file not found")
        return read_sql(p)
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


def query_df(con: duckdb.DuckDBPyConnection, sql: str) -> pd.DataFrame:
    """Run SQL; a DuckDB error becomes a one-line ValueError."""
    try:
        return con.execute(sql).df()
    except duckdb.Error as exc:
        first = str(exc).strip().splitlines()[0]
        raise ValueError(f"SQL error: {first}") from None


def format_df(df: pd.DataFrame, fmt: str, limit: int = 200) -> str:
    """A query's result as `fmt` (`core.output.render`): CSV and JSON whole, the table cut at `limit` rows."""

    def table() -> str:
        shown = df if limit <= 0 else df.head(limit)
        # a cell holding a file name with a newline or an escape sequence must not break or drive the terminal
        shown = shown.map(lambda v: printable(v) if isinstance(v, str) else v)
        with pd.option_context("display.max_columns", None, "display.width", 200, "display.max_colwidth", 60):
            text = shown.to_string(index=False) if len(shown) else "(no rows)"
        if limit > 0 and len(df) > limit:
            text += f"\n... {len(df) - limit} more rows (use --limit 0 or --format csv)"
        return text + "\n"

    cells = df.astype(object).where(df.notna(), None) if fmt == "csv" else df.head(0)
    rows = cells.to_dict(orient="records") if fmt == "csv" else []
    payload = json.loads(df.to_json(orient="records", date_format="iso")) if fmt == "json" else None
    return render(fmt, rows, [str(c) for c in df.columns], table, payload)


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
        df = query_df(con, text)
    finally:
        con.close()
    return format_df(df, fmt, limit)
