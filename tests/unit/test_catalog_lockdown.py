"""Issue 21 item 3: every DuckDB connection is confined, and a catalog's views and macros are never trusted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import duckdb
import pytest

from tests.fixtures.hostile_cases import pair_pair, wb
from tests.fixtures.hostile_catalog import SECRET, plant, plant_works
from workbench.analysis.explorer.explore import ExploreError, Explorer
from workbench.catalog import CatalogError
from workbench.catalog.readonly import connect_read_only
from workbench.catalog.schema import SCHEMA_VERSION
from workbench.catalog.store import open_catalog


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A compared catalog (golden, test, out folder) with the planted objects of `tests/fixtures/hostile_catalog.py`."""
    g, t = pair_pair(tmp_path)
    r = wb("compare", "-gp", g, "-mp", t, "-o", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    for f in (tmp_path / "out").glob("*.csv"):
        f.unlink()
    plant(tmp_path / "out" / "catalog.duckdb", tmp_path / "secret.txt")
    return g, t, tmp_path / "out"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of the test's own: DuckDB would install extensions below it."""
    h = tmp_path / "home"
    h.mkdir()
    monkeypatch.setenv("HOME", str(h))
    return h


def _no_trace(tmp: Path, *results: subprocess.CompletedProcess[str]) -> None:
    for r in results:
        text = r.stdout + r.stderr
        assert SECRET not in text
        assert "httpfs" not in text and "Traceback" not in text
    assert not (tmp / "home" / ".duckdb").exists()  # no extension was downloaded or installed


def test_the_plant_is_live_under_duckdb_defaults(planted: tuple[Path, Path, Path], tmp_path: Path) -> None:
    with_macro, without = plant_works(planted[2] / "catalog.duckdb", tmp_path)
    assert "httpfs" in with_macro
    assert without == SECRET


def test_read_only_commands_refuse_a_planted_catalog(
    planted: tuple[Path, Path, Path], tmp_path: Path, home: Path
) -> None:
    cat = planted[2] / "catalog.duckdb"
    q = wb("query", "SELECT golden_op_type FROM comparison", "-c", cat)
    a = wb("advise", "-c", cat)
    for r in (q, a):
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert str(cat) in lines[0] and "not wb's" in lines[0]
        assert "macro array_to_string" in lines[0] and "view comparison" in lines[0]
    _no_trace(tmp_path, q, a)
    with pytest.raises(ExploreError, match="not wb's"):  # wb open on the catalog: the app's explorer
        Explorer(cat)


def test_compare_and_ingest_replace_planted_objects(
    planted: tuple[Path, Path, Path], tmp_path: Path, home: Path
) -> None:
    g, t, out = planted
    cat = out / "catalog.duckdb"
    ing = wb("ingest", g, "-c", cat)
    assert ing.returncode == 0, ing.stderr
    plant(cat, tmp_path / "secret.txt")  # again, for the compare
    cmp = wb("compare", "-gp", g, "-mp", t, "-o", out)
    assert cmp.returncode == 0, cmp.stderr
    (csv,) = out.glob("*.csv")
    text = csv.read_text()
    assert SECRET not in text and "Linear" in text  # the op type of the real view
    q = wb("query", "SELECT DISTINCT golden_op_type, golden_shape FROM comparison", "-c", cat, "-f", "csv")
    assert q.returncode == 0 and 'Linear,"[4, 8]"' in q.stdout, q.stdout + q.stderr
    a = wb("advise", "-c", cat)
    assert a.returncode == 0 and "root." in a.stdout
    _no_trace(tmp_path, ing, cmp, q, a)
    ex = Explorer(cat)
    try:
        assert ex.run_sql("SELECT note FROM notes").rows == [("kept",)]  # a table wb does not know is left alone
    finally:
        ex.close()


def test_every_connection_is_confined(tmp_path: Path) -> None:
    secret = tmp_path / "s.txt"
    secret.write_text(SECRET)
    cat = tmp_path / "c.duckdb"
    rw = open_catalog(cat)
    try:
        for sql in (
            f"SELECT content FROM read_text('{secret}')",
            f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
            "SET enable_external_access = true",
            "SET autoinstall_known_extensions = true",
        ):
            with pytest.raises(duckdb.Error, match=r"disabled by configuration|configuration has been locked"):
                rw.execute(sql)
    finally:
        rw.close()
    ro = connect_read_only(cat)
    try:
        with pytest.raises(duckdb.Error, match="disabled by configuration"):
            ro.execute(f"SELECT content FROM read_text('{secret}')")
    finally:
        ro.close()
    assert not (tmp_path / "x.csv").exists()


def test_a_table_in_place_of_a_view_and_a_view_in_place_of_a_table(tmp_path: Path) -> None:
    cat = tmp_path / "c.duckdb"
    open_catalog(cat).close()
    con = duckdb.connect(str(cat))
    con.execute("DROP VIEW rank_summary; CREATE TABLE rank_summary AS SELECT 1 AS x")
    con.execute("DROP TABLE advice; CREATE VIEW advice AS SELECT 1 AS x")
    con.close()
    with pytest.raises(CatalogError, match="view advice in place of the table"):
        connect_read_only(cat)
    open_catalog(cat).close()
    ro = connect_read_only(cat)
    try:
        assert ro.execute("SELECT count(*) FROM advice").fetchall() == [(0,)]
        assert ro.execute("SELECT count(*) FROM rank_summary").fetchall() == [(0,)]
    finally:
        ro.close()


def test_a_catalog_created_now_is_the_one_the_full_checks_make(tmp_path: Path) -> None:
    """A catalog `open_catalog` creates skips the search for planted objects (there can be none); it ends up as
    one made from an existing empty DuckDB file, which goes through every check."""
    empty = tmp_path / "empty.duckdb"
    duckdb.connect(str(empty)).close()
    made: list[list[tuple[object, ...]]] = []
    for cat in (tmp_path / "new.duckdb", empty):
        open_catalog(cat).close()
        ro = connect_read_only(cat)  # refuses views, tables or macros that are not wb's
        try:
            made.append(
                ro.execute(
                    "SELECT 'table', table_name, sql FROM duckdb_tables() WHERE database_name = current_database() "
                    "UNION ALL SELECT 'view', view_name, sql FROM duckdb_views() WHERE NOT internal "
                    "AND database_name = current_database() UNION ALL SELECT 'meta', key, value FROM meta ORDER BY 1, 2"
                ).fetchall()
            )
        finally:
            ro.close()
    assert made[0] == made[1]
    assert ("meta", "schema_version", str(SCHEMA_VERSION)) in made[0] and len(made[0]) > 10


@pytest.mark.parametrize(
    ("view", "current"),
    [("comparison", "gt.idx, m.pair_id)"), ("rank_summary", "AS not_judged")],
)
def test_a_view_an_earlier_release_wrote_opens_read_only_and_is_brought_up_to_date(
    tmp_path: Path, view: str, current: str
) -> None:
    """A catalog made before the comparison view numbered tied rows by pair, or before the rank summary counted
    in-place targets apart: the app and the read-only commands open it as it is (the view is one wb shipped), and the
    next compare or ingest replaces it; a view wb never shipped is still refused."""
    from workbench.catalog.schema import OUR_VIEWS, PAST_VIEWS

    cat = tmp_path / "c.duckdb"
    open_catalog(cat).close()
    con = duckdb.connect(str(cat))
    con.execute(PAST_VIEWS[view][0])
    con.close()
    connect_read_only(cat).close()  # no refusal
    con = open_catalog(cat)
    try:
        stored = con.execute("SELECT sql FROM duckdb_views() WHERE view_name = ?", [view]).fetchall()[0][0]
    finally:
        con.close()
    assert current in stored  # replaced by the current one
    con = duckdb.connect(str(cat))
    con.execute(OUR_VIEWS[view].replace("SELECT", "SELECT 1 AS planted,", 1))
    con.close()
    with pytest.raises(CatalogError, match=f"view {view}"):
        connect_read_only(cat)
