"""The one formatter of `--format table|csv|json` output (`wb advise`, `wb errcheck`, `wb query`, `wb logits`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from workbench.core.text import FORMULA_STARTS, csv_safe

OUTPUT_FORMATS = ("table", "csv", "json")


def check_format(fmt: str) -> None:
    """Refuse an output format other than table, csv or json, in one line."""
    if fmt not in OUTPUT_FORMATS:
        raise ValueError(f"--format {fmt!r}: expected {', '.join(OUTPUT_FORMATS[:-1])} or {OUTPUT_FORMATS[-1]}")


def csv_text(rows: Iterable[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Rows as CSV text with a header line (None: an empty cell); text cells a spreadsheet would evaluate are
    neutralised (`core.text.csv_safe`)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(columns), lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: csv_safe(v) for k, v in r.items()} for r in rows)
    return buf.getvalue()


def report_cell(value: object) -> object:
    """One cell of a CSV report as pandas' `to_csv(na_rep="", float_format="%.10g")` wrote it (the reports' format
    since the first release: None and NaN empty, floats to 10 significant digits), text made safe for spreadsheets
    (`csv_safe`)."""
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if value != value else f"{value:.10g}"
    if isinstance(value, str):
        return csv_safe(value)
    return value


_FLOAT_TYPES = frozenset({"DOUBLE", "FLOAT", "REAL"})
_INT_TYPES = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)
_FORMULA_START_CODES = ", ".join(str(ord(c)) for c in FORMULA_STARTS)  # `csv_safe`'s quick check, as code points


def report_line_sql(columns: Sequence[tuple[str, str]], csv_safe_function: str) -> str:
    """A DuckDB expression of one CSV line of a report over `columns` ((name, DuckDB type name), in order): what
    `csv.writer(lineterminator="\\n")` writes of `report_cell` of each value, byte for byte, built inside DuckDB
    (no Python object per cell). NULL and NaN empty, floats `%.10g`, booleans `True`/`False`, integers as they
    are; text through `csv_safe` (registered by the caller as the SQL function `csv_safe_function`, called only
    for text its quick check does not clear), quoted where this Python's `csv` quotes (a comma, a quote, a newline,
    and a carriage return where its `csv` quotes one: 3.11's does not), quotes doubled. Other types are refused
    (`ValueError`): their text would not be Python's."""
    cells = []
    for name, kind in columns:
        col = '"' + name.replace('"', '""') + '"'
        if kind in _FLOAT_TYPES:
            cells.append(f"CASE WHEN isnan({col}) THEN NULL ELSE printf('%.10g', CAST({col} AS DOUBLE)) END")
        elif kind in _INT_TYPES:
            cells.append(f"CAST({col} AS VARCHAR)")
        elif kind == "BOOLEAN":
            cells.append(f"CASE WHEN {col} THEN 'True' WHEN NOT {col} THEN 'False' END")
        elif kind == "VARCHAR":
            maybe_formula = f"unicode({col}) IN ({_FORMULA_START_CODES}) OR contains({col}, ';')"
            cells.append(
                f"CASE WHEN {col} = '' THEN NULL WHEN {maybe_formula} "
                f"THEN {_quoted_sql(f'{csv_safe_function}({col})')} ELSE {_quoted_sql(col)} END"
            )
        else:
            raise ValueError(f"a report column of type {kind} ({name}): no CSV rule for it")
    return "concat(" + ", ',', ".join(cells) + ")"


def _csv_quotes(char: str) -> bool:
    """Whether this Python's `csv.writer(lineterminator="\\n")` quotes a cell holding `char`."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(["a" + char, "b"])
    return buf.getvalue().startswith('"')


# the characters that make this Python's `csv` quote a cell (asked once: whether a carriage return does varies)
_QUOTED_BY = [c for c in ',"\n\r' if _csv_quotes(c)]


def _quoted_sql(text: str) -> str:
    holds = " OR ".join(f"contains({text}, chr({ord(c)}))" for c in _QUOTED_BY)
    return f"CASE WHEN {holds} THEN '\"' || replace({text}, '\"', '\"\"') || '\"' ELSE {text} END"


def report_csv(rows: Sequence[Mapping[str, object]], columns: Sequence[str]) -> str:
    """Rows as a CSV report's text (`report_cell` each cell), with a header line."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([report_cell(r.get(c)) for c in columns] for r in rows)
    return buf.getvalue()


def text_table(heads: Sequence[str], cells: Sequence[Sequence[str]], right: Sequence[bool] = ()) -> list[str]:
    """Aligned columns, two spaces apart; `right[i]` right-aligns column i; the last column is never padded."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(heads)]
    last = len(heads) - 1

    def line(values: Sequence[str]) -> str:
        parts = []
        for i, (v, w) in enumerate(zip(values, widths, strict=True)):
            if i < len(right) and right[i]:
                parts.append(v.rjust(w))
            else:
                parts.append(v if i == last else v.ljust(w))
        return "  ".join(parts).rstrip()

    return [line(heads), *(line(c) for c in cells)]


def render(
    fmt: str,
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str],
    table: Callable[[], str],
    payload: object | None = None,
) -> str:
    """The text to print, ending in a newline: `rows` as CSV (`columns`), `payload` (default: the rows) as
    JSON, or the command's own `table()`."""
    check_format(fmt)
    if fmt == "csv":
        return csv_text(rows, columns)
    if fmt == "json":
        return json.dumps(list(rows) if payload is None else payload, indent=1) + "\n"
    text = table()
    return text if text.endswith("\n") else text + "\n"
