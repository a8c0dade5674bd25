"""`wb demo --stack torchair` end to end, as a user runs it: FX golden, GE test, the verdict at every token."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import invoke_wb, run_wb
from workbench.analysis.explorer.explore import Explorer
from workbench.formats import open_dump


def test_torchair_demo_names_the_planted_op_at_every_token(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = run_wb("demo", "--stack", "torchair", "--out", str(out), "--no-tui", timeout=1200)
    assert res.returncode in (0, 1), res.stdout + res.stderr
    text = res.stdout
    assert "golden: " in text and "(torchair_fx)" in text and "(torchair_ge)" in text
    assert "expected: error born at MatMulV2_20" in text, text
    for token in range(4):
        assert f"error born at: mm_20-aten.mm.default (token {token})  [test op: MatMulV2_20]" in text, text
    assert "unmatched: golden 0 of" in text and "fused 8" in text and "graph-output 1" in text, text
    assert "inputs differ" not in text  # both runs recorded the ids they were fed
    assert "first divergent token: 0 (" in text, text  # the logits: the graphs' outputs
    test = open_dump(out / "test")
    assert test.problems == [] and any(n.type == "AutomaticBufferFusionOp" for n in test.nodes)

    # downstream, unchanged: the app's headless layer (heatmap by the module the FX node ran in, trees), the
    # advisor, SQL
    catalog = out / "catalog.duckdb"
    ex = Explorer(catalog)
    try:
        heat = ex.heatmap()
        assert heat.row_labels == ["pre", "L0", "L1", "L2", "L3", "post"]
        assert not heat.failed[:3].any() and heat.failed[3].all()  # fails from layer 2 on, at every token
        planted = ex.golden_node_id("mm_20-aten.mm.default")
        assert planted is not None and ex.group_of(planted) == 2
        assert all(ex.worst_node(tok, 2) == planted for tok in range(4))
        test_rows = ex.tree_rows("test")
        assert [r.exec_order for r in test_rows] == sorted(r.exec_order for r in test_rows)  # graph order
    finally:
        ex.close()
    advice = run_wb("advise", "--catalog", str(catalog), "--token", "3", "--top", "1")
    assert advice.returncode == 0 and "MatMulV2_20" in advice.stdout, advice.stdout + advice.stderr
    sql = run_wb(
        "query", "--catalog", str(catalog), "SELECT method, count(*) AS n FROM node_matches GROUP BY 1 ORDER BY 1"
    )
    assert sql.returncode == 0 and "fused" in sql.stdout and "fx-name" in sql.stdout, sql.stdout + sql.stderr


def test_torchair_demo_lists_its_defects() -> None:
    listing = invoke_wb("demo", "--list-defects").stdout
    assert "--stack torchair" in listing and "down_proj" in listing.split("--stack torchair")[1]
