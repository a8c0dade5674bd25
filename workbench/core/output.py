"""The one formatter of `--format table|csv|json` output (`wb advise`, `wb errcheck`, `wb query`, `wb logits`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from workbench.core.text import csv_safe

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
