"""The msit CSV report (`analysis.reporting.report.write_msit_csv`): read in one sorted query up to `CSV_SLICE`
rows, a slice of tokens at a time above; the same bytes either way."""

from __future__ import annotations

from pathlib import Path

import pytest

import workbench.analysis.reporting.report as report
from tests.conftest import TinyDumps
from workbench.catalog.store import open_catalog
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
