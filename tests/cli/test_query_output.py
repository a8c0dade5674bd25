"""`wb query`'s three output formats on DuckDB's own values (no pandas in between), and a reader that stops early."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
from pathlib import Path

from tests.conftest import ROOT, WB, run_wb, wb_loading
from workbench.catalog.store import open_catalog
from workbench.core.exits import EXIT_BROKEN_PIPE

# one row of every kind a catalog query can give: a decimal, a date, a list, a struct, a blob, NULL, NaN, Inf, a
# tiny float, a big integer, text with a newline and with an escape sequence
ODD = (
    "SELECT 1.5::DECIMAL(4, 2) AS d, DATE '2024-01-02' AS dt, [1, 2] AS l, {'a': 1} AS s, 'x'::BLOB AS b, "
    "NULL::INTEGER AS n, 'nan'::DOUBLE AS f, 'inf'::DOUBLE AS g, 1e-9::DOUBLE AS tiny, 12345678901::BIGINT AS big, "
    "E'two\\nlines' AS nl, E'\\x1b[31mred' AS esc"
)


def _catalog(tmp_path: Path) -> Path:
    cat = tmp_path / "catalog.duckdb"
    open_catalog(cat).close()
    return cat


def test_table_csv_and_json_of_every_kind_of_value(tmp_path: Path) -> None:
    cat = _catalog(tmp_path)
    table = run_wb("query", ODD, "-c", str(cat))
    assert table.returncode == 0, table.stderr
    head, row = table.stdout.splitlines()
    assert head.split() == ["d", "dt", "l", "s", "b", "n", "f", "g", "tiny", "big", "nl", "esc"]
    cells = row.split("  ")
    assert [c.strip() for c in cells if c.strip()] == [
        "1.50", "2024-01-02", "[1, 2]", "{'a': 1}", "78", "NULL", "nan", "inf", "1.000000e-09", "12345678901",
        "two\\nlines", "\\x1b[31mred",
    ]  # fmt: skip
    # numbers right-aligned under their heading, text left-aligned
    assert head.index(" big") + len(" big") == row.index("12345678901") + len("12345678901")
    assert head.index("dt") == row.index("2024-01-02")

    as_csv = run_wb("query", ODD, "-c", str(cat), "-f", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    (parsed,) = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    # printed text never drives the terminal: the escape comes out escaped
    assert parsed == {
        "d": "1.50", "dt": "2024-01-02", "l": "[1, 2]", "s": "{'a': 1}", "b": "78", "n": "", "f": "nan", "g": "inf",
        "tiny": "1e-09", "big": "12345678901", "nl": "two\nlines", "esc": "\\x1b[31mred",
    }  # fmt: skip

    as_json = run_wb("query", ODD, "-c", str(cat), "-f", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert "NaN" not in as_json.stdout and "Infinity" not in as_json.stdout  # strict JSON
    assert json.loads(as_json.stdout) == [
        {
            "d": 1.5, "dt": "2024-01-02", "l": [1, 2], "s": {"a": 1}, "b": "78", "n": None, "f": None, "g": None,
            "tiny": 1e-09, "big": 12345678901, "nl": "two\nlines", "esc": "\x1b[31mred",
        }
    ]  # fmt: skip


def test_table_columns_share_one_float_form_and_rows_are_cut_at_the_limit(tmp_path: Path) -> None:
    cat = _catalog(tmp_path)
    sql = "SELECT i, CASE WHEN i = 2 THEN 1e-7 ELSE i / 3 END AS x, i / 4 AS y FROM range(5) t(i) ORDER BY i"
    res = run_wb("query", sql, "-c", str(cat), "--limit", "3")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].split() == ["i", "x", "y"]
    assert [line.split() for line in lines[1:4]] == [
        ["0", "0.000000e+00", "0.000000"],
        ["1", "3.333333e-01", "0.250000"],
        ["2", "1.000000e-07", "0.500000"],
    ]
    assert lines[4] == "... 2 more rows (use --limit 0 or --format csv)"
    empty = run_wb("query", "SELECT 1 AS x WHERE false", "-c", str(cat))
    assert empty.stdout == "(no rows)\n"
    long = run_wb("query", "SELECT repeat('ab', 40) AS path", "-c", str(cat))
    assert long.stdout.splitlines()[1] == "ab" * 28 + "a..."  # 60 characters in the table
    whole = run_wb("query", "SELECT repeat('ab', 40) AS path", "-c", str(cat), "-f", "csv")
    assert whole.stdout.splitlines()[1] == "ab" * 40


def test_a_query_loads_no_pandas(tmp_path: Path) -> None:
    cat = _catalog(tmp_path)
    for fmt in ("table", "csv", "json"):
        out, pandas = wb_loading("pandas", "query", "SELECT 42 AS x", "-c", str(cat), "-f", fmt)
        assert out.returncode == 0 and "42" in out.stdout and not pandas, (fmt, out.stdout, out.stderr)


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`wb query ... | head -1`: no error line, exit 141 (as a program SIGPIPE ends), whatever the rows left."""
    cat = _catalog(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [*WB, "query", "SELECT * FROM range(200000)", "-c", str(cat), "--limit", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE
    assert first.split() == [b"range"] and err == b""


def test_a_repeated_column_name_keeps_every_column(tmp_path: Path) -> None:
    """`SELECT g.path, t.path` (a golden and a test tensor) names two columns `path`: CSV gave the second's value
    under both headings and JSON dropped one. They are numbered as DuckDB numbers them in a table it creates."""
    cat = _catalog(tmp_path)
    sql = "SELECT 'golden' AS path, 'test' AS path, 3 AS n, 'taken' AS path_1"
    table = run_wb("query", sql, "-c", str(cat))
    assert table.returncode == 0, table.stderr
    assert table.stdout.split() == ["path", "path", "n", "path_1", "golden", "test", "3", "taken"]
    as_csv = run_wb("query", sql, "-c", str(cat), "-f", "csv")
    assert as_csv.stdout.splitlines() == ["path,path_2,n,path_1", "golden,test,3,taken"], as_csv.stdout
    as_json = run_wb("query", sql, "-c", str(cat), "-f", "json")
    assert json.loads(as_json.stdout) == [{"path": "golden", "path_2": "test", "n": 3, "path_1": "taken"}]


def test_a_saved_query_by_its_file_name(tmp_path: Path) -> None:
    """`wb queries` lists each saved query with its file: `wb query unmatched_nodes.sql` runs it (it said `SQL file
    not found`) unless a file of that name is in the current folder, which wins; a missing one still says so."""
    cat = _catalog(tmp_path)
    by_name = run_wb("query", "unmatched_nodes", "-c", str(cat), "-f", "csv")
    by_file_name = run_wb("query", "unmatched_nodes.sql", "-c", str(cat), "-f", "csv")
    assert by_name.returncode == by_file_name.returncode == 0, by_file_name.stderr
    assert by_file_name.stdout == by_name.stdout and by_name.stdout.startswith("side,name,"), by_name.stdout
    (tmp_path / "unmatched_nodes.sql").write_text("SELECT 42 AS mine", encoding="utf-8")
    own = run_wb("query", "unmatched_nodes.sql", "-c", str(cat), "-f", "csv", cwd=tmp_path)
    assert own.stdout.splitlines() == ["mine", "42"], own.stdout
    missing = run_wb("query", "no_such_query.sql", "-c", str(cat))
    assert missing.returncode != 0 and "no_such_query.sql: SQL file not found" in missing.stderr, missing.stderr
