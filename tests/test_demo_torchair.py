"""`wb demo --stack torchair` end to end, as a user runs it: FX golden, GE test, the verdict at every token."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_wb
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
    assert "unmatched: golden 0 of" in text and "fused 8" in text, text
    assert "inputs differ" not in text  # both runs recorded the ids they were fed
    test = open_dump(out / "test")
    assert test.problems == [] and any(n.type == "AutomaticBufferFusionOp" for n in test.nodes)


def test_torchair_demo_lists_its_defects() -> None:
    listing = run_wb("demo", "--list-defects").stdout
    assert "--stack torchair" in listing and "down_proj" in listing.split("--stack torchair")[1]
