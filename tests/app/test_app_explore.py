"""The app's headless SQL layer (workbench.analysis.explorer.explore) on a real catalog with real tensor files."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

from tests.conftest import run_python
from tests.fixtures.app_catalogs import DEFECT, DEFECT_ID
from workbench.analysis.explorer.explore import POST, PRE, ExploreError, Explorer
from workbench.analysis.explorer.severity import VERDICT, scale_for, severity, severity_array
from workbench.analysis.explorer.views import BORN_ADVISOR
from workbench.catalog.schema import SCHEMA_VERSION
from workbench.compare.judging.thresholds import Thresholds
from workbench.core.advice import STANDS_OUT


def test_comparison_info_and_thresholds(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        info = ex.info
        assert info.cmp_id == 1 and info.comparisons == [1]
        assert info.tokens == [0, 1, 2, 3, 4]
        assert info.bound("cosine_similarity") == pytest.approx(0.99)  # stored thresholds JSON
        assert info.bound("kl_divergence") == pytest.approx(0.005)
        assert info.bound("added_error") == pytest.approx(0.05)  # measured and bounded in rel. euclidean distance
        assert info.bound("max_relative_error") is None  # no bound in the thresholds: none invented
        assert info.scale("kl_divergence").decides is False and info.scale("cosine_similarity").decides
        assert info.n_pairs > 0
        assert ex.born_all() == {0: None, 1: DEFECT, 2: DEFECT, 3: DEFECT, 4: DEFECT}
    finally:
        ex.close()


def test_bounds_and_severity() -> None:
    th = Thresholds.from_dict(
        {
            "verdict": ["cosine_similarity"],
            "default_dtype": "float32",
            "dtype": {
                "float16": {"cosine_similarity": {"min": 0.95}, "kl_divergence": {"max": 0.01}},
                "float32": {"cosine_similarity": {"min": 0.99}},
            },
        }
    )
    assert scale_for(th, "cosine_similarity", None).bound == 0.99
    assert scale_for(th, "cosine_similarity", "float16").bound == 0.95
    assert scale_for(th, "cosine_similarity", "bfloat16").bound == 0.99  # default dtype's table
    assert scale_for(th, "kl_divergence", "float16").bound == 0.01  # informational: shown, decides nothing
    assert not scale_for(th, "kl_divergence", "float16").decides
    assert scale_for(th, "kl_divergence", "float32").bound is None  # no bound: none invented
    assert scale_for(th, VERDICT, "float16").bound == 1.0
    assert severity(0.99, "cosine_similarity", 0.99) == pytest.approx(1.0)
    assert severity(1.0, "cosine_similarity", 0.99) == 0.0
    assert severity(0.1, "kl_divergence", 0.05) == pytest.approx(2.0)
    arr = severity_array(np.array([np.nan, 0.995, 0.9]), "cosine_similarity", 0.99)
    assert np.isnan(arr[0]) and arr[1] == pytest.approx(0.5) and arr[2] == pytest.approx(10.0)


def test_heatmap_layers_and_drill_down(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        hm = ex.heatmap("cosine_similarity")
        assert hm.row_labels == ["pre", "L0", "L1", "L2", "post"]
        assert hm.tokens == [0, 1, 2, 3, 4]
        # the defect (layer 1, from token 1) fails there and downstream, never before
        assert not hm.failed[:2].any()
        assert hm.failed[2:, 1:].all() and not hm.failed[:, 0].any()
        assert hm.nan_inf[2, 4] and hm.nan_inf.sum() >= 1  # NaN planted at the last token
        assert np.nanmin(hm.values[2:, 1:]) < 0.99 < np.nanmin(hm.values[:2])
        ops = ex.heatmap("relative_euclidean_distance", layer=1)
        assert ops.row_labels[0] == "(layer 1)" and "down_proj" in ops.row_labels
        row = ops.row_labels.index("down_proj")
        assert ops.row_nodes[row] == DEFECT_ID
        assert ops.failed[row, 1:].all()
        before = ops.row_labels.index("up_proj")
        assert not ops.failed[before].any()
        assert ex.worst_node(2, 1, "cosine_similarity") == DEFECT_ID
    finally:
        ex.close()


def test_trees_status_and_unmatched(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        golden, test = ex.tree_rows("golden"), ex.tree_rows("test")
        assert len(golden) == len(test) == 3 * 13 + 4
        assert [r.exec_order for r in golden] == sorted(r.exec_order for r in golden)  # type: ignore[type-var]
        by_name = {r.name: r for r in golden}
        assert by_name[DEFECT].counterpart == DEFECT_ID and by_name[DEFECT].shape == "[1, 1, 16]"
        assert by_name["root.model.layers.0.act_fn"].counterpart is None  # named `act` on the test side
        status = ex.node_status(2, "cosine_similarity")
        assert status[DEFECT_ID].passed is False and status[DEFECT_ID].born
        assert status[DEFECT_ID - 2].passed is True and DEFECT_ID - 1 not in status  # act_fn: unmatched
        assert ex.born(2) == (DEFECT_ID, DEFECT_ID) and ex.born(0) == (None, None)
        ug, ut = ex.unmatched("golden"), ex.unmatched("test")
        assert [u.name for u in ug] == [f"root.model.layers.{i}.act_fn" for i in range(3)]
        assert [u.name for u in ut] == [f"root.model.layers.{i}.act" for i in range(3)]
        assert ug[0].outs == 1 and ug[0].ins == 1
        pairs = ex.node_pairs()
        assert (DEFECT, DEFECT, "name") in [(p.golden, p.test, p.method) for p in pairs]
    finally:
        ex.close()


def test_pair_detail_reads_only_the_selected_pair(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        detail = ex.pair_detail(DEFECT_ID, 4)
        assert detail.born_here and detail.born_name == DEFECT
        assert [p.io for p in detail.pairs] == ["out", "in"]
        out = detail.pairs[0]
        assert out.passed is False and "cosine_similarity" in out.failed_metrics
        assert out.golden["dtype"] == "float32" and out.test["dtype"] == "float16"
        assert out.test["nan_count"] == 3  # from the metrics row
        diff = ex.tensor_diff(out, k=4)
        g = np.load(out.golden["path"]).astype(np.float64).ravel()
        t = np.load(out.test["path"]).astype(np.float64).ravel()
        err = np.abs(g - t)
        assert diff.numel == 16 and diff.nonfinite == 3 == int(np.isnan(t).sum())
        assert sum(diff.hist_counts) + diff.exact + diff.nonfinite == diff.numel
        assert all(np.isnan(e) or np.isinf(e) for _, _, _, e in diff.top[:3])  # non-finite first
        finite = np.sort(err[np.isfinite(err)])[::-1]
        assert diff.top[3][3] == pytest.approx(finite[0])
        idx = diff.top[3][0]
        assert len(idx) == 3 and g.reshape(1, 1, 16)[idx] == pytest.approx(diff.top[3][1])
        other = ex.pair_detail(DEFECT_ID, 0)
        assert not other.born_here and other.pairs[0].passed is True
        # nothing is born at token 0: the verdict is the advisor's first op when it stands out, and says so
        assert other.born_why == BORN_ADVISOR and other.born_score is not None and other.born_score >= STANDS_OUT
        assert other.born_name is not None and other.born_name != DEFECT
    finally:
        ex.close()


def test_tensor_diff_reports_bad_files_in_one_line(small_catalog: Path, tmp_path: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        pair = ex.pair_detail(DEFECT_ID, 2).pairs[0]
        bad = tmp_path / "bad.npy"
        bad.write_bytes(b"not a numpy file")
        pair.golden["path"] = str(bad)
        diff = ex.tensor_diff(pair)
        assert diff.error is not None and str(bad) in diff.error and "\n" not in diff.error
    finally:
        ex.close()


def test_sql_console_is_read_only(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        res = ex.run_sql(
            "SELECT token_id, count(*) AS n FROM comparison WHERE cmp_id = getvariable('cmp_id') GROUP BY 1 ORDER BY 1"
        )
        assert res.columns == ["token_id", "n"] and [r[0] for r in res.rows] == [0, 1, 2, 3, 4]
        big = ex.run_sql("SELECT * FROM range(50)", limit=10)
        assert len(big.rows) == 10 and big.truncated
        with pytest.raises(ValueError, match="read-only"):
            ex.run_sql("DELETE FROM metrics")
        with pytest.raises(ValueError):
            ex.run_sql("SELEC nonsense")
        assert ex.run_sql("SELECT count(*) FROM metrics").rows[0][0] > 0
    finally:
        ex.close()


def test_bad_catalogs_give_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ExploreError, match="catalog not found"):
        Explorer(tmp_path / "missing.duckdb")
    with pytest.raises(ExploreError, match="is a folder"):
        Explorer(tmp_path)
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"hello, not a database" * 100)
    with pytest.raises(ExploreError, match="not a DuckDB catalog"):
        Explorer(junk)
    csv = tmp_path / "x.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(ExploreError, match=r"x\.csv: not a DuckDB catalog \(wb open takes"):
        Explorer(csv)
    plain = tmp_path / "plain.duckdb"
    con = duckdb.connect(str(plain))
    con.execute("CREATE TABLE x (a INT)")
    con.close()
    with pytest.raises(ExploreError, match="not a wb catalog"):
        Explorer(plain)
    newer = tmp_path / "newer.duckdb"
    con = duckdb.connect(str(newer))
    con.execute("CREATE TABLE meta (key VARCHAR, value VARCHAR)")
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(ExploreError, match="newer than this wb supports"):
        Explorer(newer)


def test_explore_is_headless() -> None:
    code = (
        "import sys, workbench.analysis.explorer.explore; "
        "bad = [m for m in ('textual', 'torch', 'pandas') if m in sys.modules]; print(bad); "
        "sys.exit(1 if bad else 0)"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stdout + out.stderr


def test_tensor_diff_in_chunks_matches_one_pass(small_catalog: Path) -> None:
    from workbench.analysis.explorer.tensor_diff import tensor_diff

    ex = Explorer(small_catalog)
    try:
        pair = ex.pair_detail(DEFECT_ID, 3).pairs[0]
        whole = ex.tensor_diff(pair, k=5)
        chunked = tensor_diff(pair, k=5, chunk=3)  # 16 elements -> 6 chunks
        assert chunked.top == whole.top and chunked.hist_counts == whole.hist_counts
        assert chunked.hist_edges == whole.hist_edges and chunked.exact == whole.exact
        g = np.load(pair.golden["path"]).astype(np.float64).ravel()
        t = np.load(pair.test["path"]).astype(np.float64).ravel()
        assert [e for *_, e in whole.top] == pytest.approx(sorted(np.abs(g - t), reverse=True)[:5])
    finally:
        ex.close()


def test_pre_and_post_rows_drill_into_their_own_ops(demo_catalog: Path) -> None:
    """`pre` holds the ops before the first layer, `post` those after the last: each drills into its own."""
    ex = Explorer(demo_catalog)
    try:
        hm = ex.heatmap()
        assert hm.row_labels[0] == "pre" and hm.row_labels[-1] == "post"
        assert hm.row_layers[0] == PRE and hm.row_layers[-1] == POST
        pre, post = ex.heatmap(VERDICT, PRE), ex.heatmap(VERDICT, POST)
        assert "embed_tokens" in pre.row_labels and "lm_head" in post.row_labels
        assert not set(pre.row_nodes) & set(post.row_nodes)
        names = {r.node_id: r.name for r in ex.tree_rows("golden")}
        pre_pick = ex.worst_node(1, PRE)
        post_pick = ex.worst_node(1, POST)
        assert pre_pick in pre.row_nodes and "norm" not in names[pre_pick]  # never root.model.norm
        assert post_pick in post.row_nodes
        assert ex.group_of(post_pick) == POST and ex.group_of(pre_pick) == PRE
    finally:
        ex.close()


def test_verdict_colouring_is_the_worst_verdict_severity(small_catalog: Path) -> None:
    ex = Explorer(small_catalog)
    try:
        hm = ex.heatmap(VERDICT)
        cos, euc = ex.heatmap("cosine_similarity"), ex.heatmap("relative_euclidean_distance")
        expect = np.fmax(
            severity_array(cos.values, "cosine_similarity", 0.99),
            severity_array(euc.values, "relative_euclidean_distance", 0.05),
        )
        np.testing.assert_allclose(hm.values, expect)
        # a failing cell is beyond the bound (severity > 1) and a passing one within it
        assert (hm.values[hm.failed & ~hm.nan_inf] > 1).all()
        status = ex.node_status(2, VERDICT)
        assert status[DEFECT_ID].worst is not None and status[DEFECT_ID].worst > 1
    finally:
        ex.close()


def test_decode_only_ops_are_listed_and_node_tensors_shown(demo_catalog: Path) -> None:
    ex = Explorer(demo_catalog)
    try:
        unmatched = ex.unmatched("test")
        decode_only = [u for u in unmatched if u.first_token > 0]
        assert decode_only, "ops that only run at decode tokens must be pairable too"
        assert all(u.out_numel is None or u.out_numel > 0 for u in unmatched)
        node = ex.node_tensors("test", decode_only[0].node_id, 0)
        assert node.token == decode_only[0].first_token and node.tensors  # shown at a token where it ran
        assert node.tensors[0].stats["norm"] is not None
        pairs = ex.node_pairs()
        assert len(pairs) == len({(p.golden, p.test) for p in pairs})  # one row per pair
    finally:
        ex.close()


def test_detail_pane_reads_tensors_without_torch(small_catalog: Path) -> None:
    """The detail pane's histogram and worst elements come from numpy: the app process never imports torch."""
    code = (
        "import sys; from workbench.analysis.explorer.explore import Explorer; "
        f"ex = Explorer({str(small_catalog)!r}); d = ex.pair_detail({DEFECT_ID}, 3); "
        "diff = ex.tensor_diff(d.pairs[0]); assert diff.numel == 16 and diff.top, diff; "
        "print('torch' in sys.modules); sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stdout + out.stderr


def test_per_token_views_are_cached_and_agree_with_a_fresh_read(small_catalog: Path) -> None:
    """Going back to a token reuses its roll-up, verdict and shapes (issue 26 item 10); they equal a fresh read."""
    ex = Explorer(small_catalog)
    try:
        tokens = ex.info.tokens
        first = {t: (ex.node_status(t), ex.born_evidence(t), ex.shapes_at("golden", t)) for t in tokens}
        for t in tokens:
            again = (ex.node_status(t), ex.born_evidence(t), ex.shapes_at("golden", t))
            assert again[0] is first[t][0] and again[2] is first[t][2]
    finally:
        ex.close()
    fresh = Explorer(small_catalog)
    try:
        for t in tokens:
            assert fresh.node_status(t) == first[t][0]
            assert fresh.born_evidence(t) == first[t][1]
            assert fresh.shapes_at("golden", t) == first[t][2]
        assert fresh.node_status(tokens[0], "cosine_similarity") != fresh.node_status(tokens[0])  # keyed by colouring
    finally:
        fresh.close()
