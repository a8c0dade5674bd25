"""A statistics-only comparison in the heatmap, the report and a re-judge: msit's own dumper in statistics mode
(`dump_statistics_mode=1`), a tiny Qwen2 in fp32 against fp16 whose layer 1 up_proj weight x1e7 overflows (suite case
`inf1`). Such pairs have no tensor metrics: the heatmap drew every cell `·` (none) while the verdict line said
`error born at`; a re-judge read the NaN bound back as NULL ("not comparable")."""

from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb
import pytest
from textual.widgets import Static

from bench import advisor_defects
from tests.app.test_app_pilot import _text, ready, trees, wait_for
from tests.conftest import run_wb
from tests.fixtures.app_catalogs import SIZE
from workbench.analysis.explorer.explore import Explorer
from workbench.app.heatmap import GLYPH_NAN, HeatmapView
from workbench.app.launch import make_app

CASE = "inf1"
OP = "root.model.layers.1.mlp.up_proj"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def stats_overflow(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(golden dump, test dump, catalog) of the statistics-only fp16 overflow, compared once."""
    pytest.importorskip("msit_llm", reason="msit_llm not installed")
    base = tmp_path_factory.mktemp("stats_overflow")
    spec = next(c for c in advisor_defects.CASES if c.name == CASE)
    job = {"model": spec.model, "dumper": "msit", "prompt": 16, "stats": True}
    (base / "golden").mkdir()
    (base / "test").mkdir()
    golden = advisor_defects.run_dump({**job, "out": str(base / "golden")})
    tokens = json.loads((base / "golden" / "tokens.json").read_text())
    test = advisor_defects.run_dump(
        {**job, "out": str(base / "test"), "case": CASE, "dtype": "float16", "tokens": tokens}
    )
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(base / "out"), "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert f"error born at: {OP} (token 0)" in proc.stdout, proc.stdout
    return golden, test, base / "out" / "catalog.duckdb"


def _nan_bounds(catalog: Path) -> tuple[int, int]:
    """(pairs whose statistics bound is NaN, of those the ones failed)."""
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        row = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE x.passed = false) FROM stat_metrics s "
            "JOIN metrics x USING (cmp_id, pair_id) WHERE isnan(s.stat_rel_euclid_bound)"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    return int(row[0]), int(row[1])


def test_heatmap_shades_statistics_pairs_by_their_bound_and_marks_nan(stats_overflow: tuple[Path, Path, Path]) -> None:
    """Layers before the overflow are shaded (passing severities from the statistics bound, marked as such); the
    overflowing layer and every later one carry the NaN/Inf mark; the op's own row too when drilled in."""
    explorer = Explorer(stats_overflow[2])
    try:
        hm = explorer.heatmap()
        layer1 = hm.row_labels.index("L1")
        before = [i for i, label in enumerate(hm.row_labels) if label in ("pre", "L0")]
        assert before, hm.row_labels
        for i in before:
            assert all(0.0 <= v < 1.0 for v in hm.values[i]), (hm.row_labels[i], hm.values[i])
            assert hm.from_statistics[i].all() and not hm.nan_inf[i].any() and not hm.failed[i].any()
        for i in range(layer1, len(hm.row_labels)):
            assert hm.nan_inf[i].all() and hm.failed[i].all(), (hm.row_labels[i], hm.nan_inf[i])
        ops = explorer.heatmap(layer=1)
        row = next(i for i, label in enumerate(ops.row_labels) if label == "mlp.up_proj")
        assert ops.nan_inf[row].all()
        gate = next(i for i, label in enumerate(ops.row_labels) if label == "mlp.gate_proj")
        assert not ops.nan_inf[gate].any() and all(0.0 <= v < 1.0 for v in ops.values[gate])
        # colouring by the rel. euclidean distance: the bound itself (a lower bound of it), under its own bound
        red = explorer.heatmap("relative_euclidean_distance")
        assert all(0.0 <= v < 0.005 for i in before for v in red.values[i]), red.values
        # a colouring statistics say nothing of stays empty
        assert all(math.isnan(v) for v in explorer.heatmap("cosine_similarity").values.ravel())
        # the logits strip: what their statistics say at each token, not "logits not compared"
        cells = explorer.logits_strip()
        assert len(cells) == 3 and all(c.passed is False and c.on_statistics for c in cells), cells
        assert cells[0].describe().startswith("token 0: logits' statistics FAIL"), cells[0].describe()
    finally:
        explorer.close()


def test_report_says_statistics_cells_are_a_lower_bound(
    stats_overflow: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "report.html"
    proc = run_wb("report", str(stats_overflow[2]), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert "pairs compared on statistics only (max/min/mean/norm) are shaded by a lower bound" in html
    assert "severity at least" in html and "! NaN/Inf" in html and "on statistics only" in html
    assert html.count('<td class="fail">statistics FAIL</td>') == 3  # the verdict table's logits, token by token


def test_nan_inf_locations_lists_statistics_pairs_from_the_overflowing_op(
    stats_overflow: tuple[Path, Path, Path],
) -> None:
    """The saved query listed pairs by their NaN/Inf counts, which a statistics-only dump does not record: it listed
    nothing. It now lists pairs whose statistics are NaN/Inf, the op that made them first."""
    import csv
    import io

    res = run_wb("query", "nan_inf_locations", "-c", str(stats_overflow[2]), "-f", "csv")
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert rows, res.stderr
    assert (rows[0]["token_id"], rows[0]["golden_node"], rows[0]["io"]) == ("0", OP, "out"), rows[0]
    assert all(r["on_statistics"] == "True" and r["my_max_value"] == "nan" for r in rows[:3]), rows[:3]


def test_advisor_says_its_errors_are_lower_bounds(stats_overflow: tuple[Path, Path, Path]) -> None:
    """Every pair compared on statistics: the errors the advisor's reasons quote are the statistics' lower bounds of
    the relative euclidean distance, and they say so."""
    res = run_wb("advise", "-c", str(stats_overflow[2]), "--top", "3", "--token", "0")
    assert res.returncode == 0, res.stderr
    first = next(line for line in res.stdout.splitlines() if line.startswith("1 "))
    assert first.split()[2:5] == [OP, OP, "NaN/Inf"], first  # its score is NaN/Inf born there, not a number
    measured = [line for line in res.stdout.splitlines() if "output rel. error" in line]
    assert measured and all("(lower bounds, from max/min/mean/norm)" in line for line in measured), res.stdout


def test_rejudge_keeps_a_nan_statistics_bound_failing(stats_overflow: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Compared again with other thresholds, the pairs are re-judged from the catalog: a NaN bound read back as
    NULL judged nothing (171 pairs "not comparable", nothing born); it still fails."""
    golden, test, catalog = stats_overflow
    nan_pairs, failed = _nan_bounds(catalog)
    assert nan_pairs > 0 and failed == nan_pairs
    rejudged = tmp_path / "out"
    rejudged.mkdir()
    copy = rejudged / "catalog.duckdb"
    copy.write_bytes(catalog.read_bytes())
    looser = tmp_path / "looser.toml"
    looser.write_text("[dtype.float16]\nrelative_euclidean_distance = { max = 0.01 }\n")
    proc = run_wb(
        "compare", "-gp", str(golden), "-mp", str(test), "-o", str(rejudged), "--workers", "1",
        "--thresholds", str(looser),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"error born at: {OP} (token 0)" in proc.stdout, proc.stdout
    assert _nan_bounds(copy) == (nan_pairs, nan_pairs)


@pytest.mark.anyio
async def test_app_heatmap_and_legend_on_a_statistics_only_catalog(stats_overflow: tuple[Path, Path, Path]) -> None:
    app = make_app(catalog=stats_overflow[2])
    async with app.run_test(size=SIZE) as pilot:
        screen = await ready(pilot, app)
        view = screen.query_one(HeatmapView)
        await wait_for(pilot, lambda: view.data is not None and view.data.layer is None)
        assert view.data is not None
        legend = _text(screen.query_one("#legend", Static))
        assert "statistics only: a lower bound" in legend, legend
        layer1 = view.data.row_labels.index("L1")
        line = view.render_line(1 + layer1).text  # the header is the first line
        assert line.count(GLYPH_NAN) == len(view.data.tokens), line
        layer0 = view.render_line(1 + view.data.row_labels.index("L0")).text
        assert GLYPH_NAN not in layer0 and "·" not in layer0, layer0
        # the detail's verdict rests on the statistics bound: that row, not eleven rows of `-`
        detail = screen.query_one("#detail", Static)
        await wait_for(pilot, lambda: "up_proj" in _text(detail) and "out0" in _text(detail), timeout=30)
        text = _text(detail)
        bound = next(line for line in text.splitlines() if line.startswith("rel euclid >="))
        assert bound.split()[3:5] == ["nan", "✗"], text
        assert "max rel diff" in text and "cosine" not in text, text
        # `a` colours the trees by the error each op adds: the difference of its bounds (it drew nothing here)
        golden, _ = trees(screen)
        await pilot.press("a")
        await wait_for(pilot, lambda: golden.color_by_added)
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        added = {g: st.added_error for g, st in screen.status.items()}
        finite = [g for g, a in added.items() if a is not None and math.isfinite(a)]
        assert len(finite) >= 10, added  # those before the overflow (after it the bounds are NaN)
        assert any(golden._signature(golden.rows[g])[1] >= 0 for g in finite if g in golden.rows)


def test_a_version_1_catalog_is_read_as_is_and_upgraded_by_a_write(
    stats_overflow: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """A catalog an earlier wb wrote (schema version 1: no `node_results.max_stat_bound`) opens read-only for the
    heatmap (statistics-only cells unshaded, as that wb showed them); the first write adds the column and sets
    version 2, which that earlier wb then refuses in one line instead of failing its roll-up's insert."""
    from workbench.catalog.schema import SCHEMA_VERSION
    from workbench.catalog.store import open_catalog

    old = tmp_path / "catalog.duckdb"
    old.write_bytes(stats_overflow[2].read_bytes())
    con = duckdb.connect(str(old))
    con.execute("ALTER TABLE node_results DROP COLUMN max_stat_bound")
    con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    con.execute("DELETE FROM meta WHERE key = 'schema_digest'")
    con.close()
    explorer = Explorer(old)
    try:
        hm = explorer.heatmap()
        assert not hm.from_statistics.any() and hm.nan_inf[hm.row_labels.index("L1")].all()
        assert explorer.worst_node(0, 1) is not None
    finally:
        explorer.close()
    open_catalog(old).close()
    con = duckdb.connect(str(old), read_only=True)
    try:
        version = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        columns = {r[0] for r in con.execute("DESCRIBE node_results").fetchall()}
    finally:
        con.close()
    assert version == (str(SCHEMA_VERSION),) and SCHEMA_VERSION == 2 and "max_stat_bound" in columns
