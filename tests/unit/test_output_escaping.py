"""Issue 21 item 5: text from a file reaches the terminal escaped, and no CSV wb writes holds a formula."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import numpy as np

from tests.fixtures.hostile_cases import pair_pair, wb
from workbench.core.output import report_cell
from workbench.core.text import csv_safe

CONTROLS = ("\x1b", "\x07", "\r", "\x9b")
EVIL_KEY = "\x1b]0;pwned\x07k1"
FORMULAS = ['=HYPERLINK("http://evil.invalid","click")', "@SUM(1+1)", "+1+2", "-2+3", "\tTAB", "a;=cmd"]


def _raw(text: str) -> bool:
    return any(c in text for c in CONTROLS)


def test_csv_safe_follows_msit() -> None:
    for f in FORMULAS:
        assert csv_safe(f) == "'" + f
    for plain in ("-0.5", "+1e5", "-inf", "nan", "root.model.layers.0", "/abs/path.pth", "", "a-b"):
        assert csv_safe(plain) == plain
    assert csv_safe(-0.5) == -0.5 and csv_safe(None) is None and csv_safe(True) is True


def test_badcase_escapes_the_terminal_and_neutralises_its_csv(tmp_path: Path) -> None:
    golden, test = [], []
    prompts = ["\x1b[2J\x1b[Hcleared", "line\rOVERWRITE", *FORMULAS]
    for i, p in enumerate(prompts):
        key = EVIL_KEY if i == 0 else ("-0.5" if i == 1 else f"k{i}")
        golden.append({"id": key, "prompt": p, "output_ids": [1, 2, 3]})
        test.append({"id": key, "prompt": p, "output_ids": [1, 9, 3]})
    (tmp_path / "g.jsonl").write_text("".join(json.dumps(x) + "\n" for x in golden))
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(x) + "\n" for x in test))
    out = tmp_path / "bad.csv"
    run = f'{sys.executable} -c "import sys" {{prompt}} {{key}}'
    r = wb("badcase", "-gp", tmp_path / "g.jsonl", "-mp", tmp_path / "t.jsonl", "-o", out, "--run", run)
    assert r.returncode == 0, r.stderr
    assert not _raw(r.stdout + r.stderr)
    assert "\\x1b]0;pwned\\x07k1" in r.stdout  # shown escaped, in the table and the run: line
    assert any(ln.startswith("run: ") and "\\x1b" in ln for ln in r.stdout.splitlines())
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    by_prompt = {r["prompt"]: r for r in rows}
    for f in FORMULAS:
        assert "'" + f in by_prompt, f
    assert {r["key"] for r in rows} >= {"-0.5", EVIL_KEY}  # a number stays a number; the CSV keeps the data
    assert all(r["first_diff"] == "1" for r in rows), rows


def test_query_advise_and_compare_outputs(tmp_path: Path) -> None:
    g, t = pair_pair(tmp_path)
    for dev in (g, t):  # an op type from the dump: a formula with an escape sequence in it
        tree = json.loads((dev / "model_tree.json").read_text())
        tree["children"][0]["type"] = '=HYPERLINK("x")\x1b[31m'
        (dev / "model_tree.json").write_text(json.dumps(tree))
    r = wb("compare", "-gp", g, "-mp", t, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert not _raw(r.stdout + r.stderr)
    (report,) = (tmp_path / "out").glob("*.csv")
    types = {row["golden_op_type"] for row in csv.DictReader(io.StringIO(report.read_text()))}
    assert '\'=HYPERLINK("x")\x1b[31m' in types and "Linear" in types
    cat = tmp_path / "out" / "catalog.duckdb"
    sql = "SELECT '=1+1' AS a, -0.5 AS b, '-0.5' AS c, 'x;=y' AS d, chr(27) || '[2J' AS e"
    q = wb("query", sql, "-c", cat, "-f", "csv")
    assert q.returncode == 0 and q.stdout.splitlines()[1] == "'=1+1,-0.5,-0.5,'x;=y,\\x1b[2J", q.stdout
    q = wb("query", "SELECT DISTINCT golden_op_type FROM comparison", "-c", cat)
    assert q.returncode == 0 and "\\x1b[31m" in q.stdout and not _raw(q.stdout)
    for fmt in ("table", "csv"):
        a = wb("advise", "-c", cat, "-f", fmt, "-k", "0")
        assert a.returncode == 0 and not _raw(a.stdout), a.stderr


def test_a_report_cell_is_written_as_the_reports_always_were() -> None:
    """A report's cells (`report_cell`; the msit CSVs write the same in SQL, `report_line_sql`): None and NaN empty,
    floats to 10 significant digits, formula text neutralised, other values as they are."""
    values: list[object] = [
        None, float("nan"), float("inf"), float("-inf"), -0.0, 0.1, 1e-05, 123456789.123, 1 / 3, 7, True, False,
        "=cmd|' /C calc'!A0", "-0.5", "+x", "@sum", "root.model.layers.0", "", "[1, 2]", np.float64(2.5), np.nan,
    ]  # fmt: skip
    assert [report_cell(v) for v in values] == [
        "", "", "inf", "-inf", "-0", "0.1", "1e-05", "123456789.1", "0.3333333333", 7, True, False,
        "'=cmd|' /C calc'!A0", "-0.5", "'+x", "'@sum", "root.model.layers.0", "", "[1, 2]", "2.5", "",
    ]  # fmt: skip


def test_a_report_line_built_in_duckdb_is_what_csv_writes_of_the_report_cells() -> None:
    """`report_line_sql` (the msit CSVs' lines, built inside DuckDB) writes every value as `csv.writer` writes
    `report_cell` of it: floats of every magnitude, NaN, Inf, -0, NULL, booleans, integers, and text with commas,
    quotes, newlines, carriage returns, formula starts (ASCII and full-width), `;` triggers, numbers a formula
    check lets through, combining marks and the empty string."""
    import itertools
    import random

    import duckdb

    from workbench.core.output import report_line_sql

    rng = random.Random(7)
    floats: list[float | None] = [None, float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-05, 1.5e-4]
    floats += [0.1, 1 / 3, 123456789.123, 1e100, -5e-324, 9999999999.5, 0.99999999995]
    floats += [rng.choice([-1, 1]) * rng.random() * 10 ** rng.uniform(-40, 40) for _ in range(400)]
    texts: list[str | None] = [None, "", "plain", "a,b", 'say "x"', "two\nlines", "cr\rhere", "\r=x", "=1+1"]
    texts += ["-0.5", "-inf", "+x", "@sum", "%p", "\tx", "x;=y", "x;a", "\uff1d1", "=\u0301", " =x", "é,中", '"']
    chars = '=+-;,"\n\r a1.'
    texts += ["".join(c) for c in itertools.product(chars, repeat=3)]
    reals = [x for x in floats if x is None or x != x or abs(x) == float("inf") or abs(x) < 1e30]  # REAL: < 3.4e38
    n = max(len(floats), len(texts))
    con = duckdb.connect()
    con.execute("CREATE TABLE t (i BIGINT, f DOUBLE, r REAL, b BOOLEAN, s VARCHAR, k INTEGER)")
    rows = [
        (i, floats[i % len(floats)], reals[(i * 7) % len(reals)], [True, False, None][i % 3], texts[i % len(texts)],
         None if i % 5 == 0 else -i)
        for i in range(n)
    ]  # fmt: skip
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?)", rows)
    con.create_function("safe_fn", csv_safe, ["VARCHAR"], "VARCHAR", side_effects=False)
    kinds = [(d[0], str(d[1])) for d in con.execute("SELECT * FROM t LIMIT 0").description]
    lines = [r[0] for r in con.execute(f"SELECT {report_line_sql(kinds, 'safe_fn')} FROM t ORDER BY i").fetchall()]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(
        [report_cell(v) for v in row] for row in con.execute("SELECT * FROM t ORDER BY i").fetchall()
    )
    assert len(lines) == n > 1000 and "\n".join(lines) + "\n" == buf.getvalue()
    assert any(",'=1+1," in line for line in lines)  # formula text neutralised in SQL too


def test_the_quick_check_before_the_formula_search_changes_no_cell() -> None:
    """`csv_safe` skips the regular expression for text that neither starts with a trigger nor holds `;`: every
    string of up to three characters from the triggers and their neighbours gets what the expression alone gives."""
    import contextlib
    import itertools

    from workbench.core.text import _FORMULA

    def a_number(value: str) -> bool:
        with contextlib.suppress(ValueError):
            return float(value) is not None
        return False

    chars = "=+-@%\t\r;a1. e,\uff1d\uff0b\uff0d\uff20"
    strings = ["".join(c) for k in range(4) for c in itertools.product(chars, repeat=k)]
    expected = ["'" + s if _FORMULA.search(s) and not a_number(s) else s for s in strings]
    assert len(strings) > 5000 and [csv_safe(s) for s in strings] == expected
    assert csv_safe("/dump/0/root.model/output.pth") == "/dump/0/root.model/output.pth"
    assert csv_safe("x;=1") == "'x;=1"
