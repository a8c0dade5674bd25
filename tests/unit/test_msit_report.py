"""The msit CSV report (`analysis.reporting.report.write_msit_csv`): read in one sorted query up to `CSV_SLICE`
rows, a slice of tokens at a time above; the same bytes either way."""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench.analysis.reporting.report as report
from tests.conftest import TinyDumps
from workbench.catalog.store import open_catalog
from workbench.core.text import csv_safe
from workbench.jobs.compare import run_compare


@pytest.mark.parametrize("tokens", [None, {1, 2}, {0}])
def test_one_query_and_token_slices_write_the_same_report(
    tiny_dumps: TinyDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokens: set[int] | None
) -> None:
    catalog = tmp_path / "c.duckdb"
    res = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1)
    con = open_catalog(catalog)
    try:
        whole = report.write_msit_csv(con, res.cmp_id, tmp_path, tokens).read_bytes()
        monkeypatch.setattr(report, "CSV_SLICE", 5)  # a slice per token at most (each token has more rows)
        sliced = report.write_msit_csv(con, res.cmp_id, tmp_path, tokens, suffix="_sliced").read_bytes()
    finally:
        con.close()
    lines = whole.decode().splitlines()
    assert len(lines) > 1 + 5 and lines[0].startswith("token_id,data_id,")
    assert [line.split(",")[1] for line in lines[1:]] == [str(i) for i in range(len(lines) - 1)]
    if tokens is not None:
        assert {int(line.split(",")[0]) for line in lines[1:]} == tokens  # (the test run's tokens are the golden's)
    assert sliced == whole


def test_cells_are_written_as_pandas_to_csv_wrote_them(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    """The rows are formatted without pandas, cell for cell as `DataFrame.to_csv(na_rep="", float_format="%.10g")`
    wrote them before: NULL and NaN empty, Inf as `inf`, -0.0 as `-0`, text a spreadsheet would run quoted."""

    from workbench.catalog.schema import MSIT_CSV_COLUMNS

    catalog = tmp_path / "c.duckdb"
    res = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1)
    con = open_catalog(catalog)
    try:
        pair_ids = [r[0] for r in con.execute("SELECT pair_id FROM metrics ORDER BY pair_id LIMIT 4").fetchall()]
        odd = ["'nan'::DOUBLE", "NULL", "'inf'::DOUBLE", "-0.0::DOUBLE"]
        for pid, value in zip(pair_ids, odd, strict=True):
            con.execute(
                f"UPDATE metrics SET cosine_similarity = {value}, kl_divergence = {value}, passed = NULL, "
                'cmp_fail_reason = \'=HYPERLINK("x"), a "quoted" reason\' WHERE pair_id = ?',
                [pid],
            )
        con.execute("UPDATE nodes SET type = '@SUM(A1)' WHERE node_id = (SELECT min(golden_node_id) FROM matches)")
        written = report.write_msit_csv(con, res.cmp_id, tmp_path).read_text(encoding="utf-8")
        frame = con.execute(
            f"SELECT {', '.join(MSIT_CSV_COLUMNS)}, passed FROM comparison WHERE cmp_id = ? ORDER BY data_id",
            [res.cmp_id],
        ).df()
    finally:
        con.close()
    frame["data_id"] = range(len(frame))
    for col in frame.columns:  # text columns made safe for spreadsheets, as the report does
        if frame[col].dtype.kind == "O":
            frame[col] = frame[col].map(csv_safe)
    expected = frame.to_csv(index=False, na_rep="", float_format="%.10g", lineterminator="\n")
    assert written == expected
    assert ",inf," in written and ",-0," in written and "'=HYPERLINK" in written and "'@SUM(A1)" in written


def test_rows_sharing_a_golden_tensor_keep_one_order(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    """One golden tensor paired with several test tensors (a graph run twice, as TorchAir dumps it): the rows are
    numbered by pair, the same on every read (ties in the execution order used to come out in any order)."""
    catalog = tmp_path / "c.duckdb"
    res = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1)
    con = open_catalog(catalog)
    try:
        top = con.execute("SELECT max(pair_id) FROM matches").fetchall()[0][0]
        # every pair repeated under a new id, the copies inserted first (DuckDB then meets them first in a scan)
        con.execute("CREATE TEMP TABLE copies AS SELECT * REPLACE (pair_id + ? AS pair_id) FROM matches", [top + 1])
        con.execute("CREATE TEMP TABLE originals AS SELECT * FROM matches")
        con.execute("DELETE FROM matches")
        con.execute("INSERT INTO matches SELECT * FROM copies")
        con.execute("INSERT INTO matches SELECT * FROM originals")
        reads = [
            con.execute("SELECT pair_id FROM comparison WHERE cmp_id = ? ORDER BY data_id", [res.cmp_id]).fetchall()
            for _ in range(5)
        ]
    finally:
        con.close()
    assert len(reads[0]) == 2 * (top + 1) and all(r == reads[0] for r in reads)
    pairs = [p for (p,) in reads[0]]
    assert all(a < b for a, b in zip(pairs[::2], pairs[1::2], strict=True))  # the original before its copy


def test_work_beside_the_verdicts_sees_every_metric_and_its_error_is_raised(
    tiny_dumps: TinyDumps, tmp_path: Path
) -> None:
    """`run_compare(beside_verdicts=...)` (the CLI writes its CSVs there): a thread of its own, on a cursor that sees
    every pair's metrics, ended before `then`; what it raises, the compare raises, with the verdicts still stored."""
    import threading

    import duckdb

    seen: dict[str, object] = {}

    def beside(cur: duckdb.DuckDBPyConnection, cmp_id: int, golden_run: int) -> None:
        seen["thread"] = threading.current_thread().name
        seen["metrics"] = cur.execute("SELECT count(*) FROM metrics WHERE cmp_id = ?", [cmp_id]).fetchall()[0][0]
        seen["golden"] = golden_run
        seen["csv"] = report.write_msit_csv(cur, cmp_id, tmp_path).read_text(encoding="utf-8")

    def then(con: duckdb.DuckDBPyConnection, _res: object) -> None:
        seen["then_after_csv"] = "csv" in seen

    catalog = tmp_path / "c.duckdb"
    res = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1, beside_verdicts=beside, then=then)
    assert seen["thread"] != threading.current_thread().name and seen["then_after_csv"] is True
    assert seen["metrics"] == res.pairs > 0 and seen["golden"] == res.golden_run
    assert str(seen["csv"]).count("\n") == res.pairs + 1  # a header and a line per pair

    def fails(_cur: duckdb.DuckDBPyConnection, _cmp_id: int, _golden_run: int) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        run_compare(tiny_dumps.golden, tiny_dumps.bf16, catalog, workers=1, beside_verdicts=fails)
    con = open_catalog(catalog)
    try:
        assert con.execute("SELECT count(DISTINCT cmp_id) FROM error_born").fetchall()[0][0] == 2
    finally:
        con.close()


def test_a_pair_whose_metrics_were_deleted_is_computed_again_over_its_old_statistics_metrics(
    tiny_dumps: TinyDumps, tmp_path: Path
) -> None:
    """The compare inserts its rows (no INSERT OR REPLACE): a catalog whose re-dump deleted some pairs' metrics and
    kept their statistics metrics (as releases before 2026-11-27 did) is compared again without a key conflict, the
    same numbers back."""
    catalog = tmp_path / "c.duckdb"
    first = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1)
    con = open_catalog(catalog)
    try:
        before = con.execute("SELECT * FROM metrics ORDER BY pair_id").fetchall()
        stat_before = con.execute("SELECT * FROM stat_metrics ORDER BY pair_id").fetchall()
        assert len(stat_before) == len(before) == first.pairs > 4
        con.execute("DELETE FROM metrics WHERE pair_id % 3 = 0")  # what a re-dump of those tensors did
    finally:
        con.close()
    again = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, workers=1)
    con = open_catalog(catalog)
    try:
        after = con.execute("SELECT * FROM metrics ORDER BY pair_id").fetchall()
        stat_after = con.execute("SELECT * FROM stat_metrics ORDER BY pair_id").fetchall()
    finally:
        con.close()
    assert again.computed == len([r for r in before if r[1] % 3 == 0]) > 0
    assert after == before and stat_after == stat_before
