"""Dumps of outputs only (msit `tensor_part=1`, msprobe `data_mode: ["output"]`): an op named `error born at` has
no input pair, so "its outputs fail while its inputs pass" was never checked there. Its inputs are taken, as the
advisor takes them, to be what ran just before it (data flows in execution order), and `wb compare`, the app's
detail pane and the HTML report say so."""

from __future__ import annotations

import html
import importlib.util
from pathlib import Path

import pytest

from tests.conftest import run_wb
from tests.fixtures import stats_dumps
from workbench.analysis.explorer.explore import Explorer
from workbench.analysis.verdicts.born import INPUTS_UNCHECKED

needs_msit = pytest.mark.skipif(importlib.util.find_spec("msit_llm") is None, reason="msit_llm not installed")
needs_msprobe = pytest.mark.skipif(importlib.util.find_spec("msprobe") is None, reason="msprobe not installed")


@pytest.mark.parametrize("tool", [pytest.param("msit", marks=needs_msit), pytest.param("msprobe", marks=needs_msprobe)])
def test_an_op_born_with_no_input_dumped_says_its_inputs_are_unchecked(tmp_path: Path, tool: str) -> None:
    tokens = stats_dumps.dump(tool, "full", tmp_path / "golden", outputs_only=True)
    stats_dumps.dump(tool, "full", tmp_path / "bad", bf16=True, scale=1.05, forced=tokens, outputs_only=True)
    sub = "" if tool == "msit" else "dump"
    out, con = stats_dumps.compare(tmp_path / "golden" / sub, tmp_path / "bad" / sub, tmp_path / "o")
    born = stats_dumps.born(con) - {None}
    assert born and out.count(INPUTS_UNCHECKED) == len(born), out  # once per op, not once per token
    # msit's module outputs: the one after a passing output is the planted one. msprobe's also holds the float32
    # calls inside the bf16 model's norms: they failed float32's bounds with no input to judge what they carried in,
    # and were named in the noise with the planted module only the advisor's origin beside them; what ran before
    # them now stands in for their inputs (`compare.judging.carried`) and the planted module is born at every token
    assert len(out.split("error born at: ")) - 1 == len(tokens), out
    assert all("layers.1.mlp" in str(b) for b in born), (born, out)
    assert "the advisor's most likely origin here is" not in out, out
    con.close()
    catalog = tmp_path / "o" / "catalog.duckdb"
    ex = Explorer(catalog)
    try:
        verdict = ex.verdict(0)
        assert verdict.golden is not None and verdict.inputs_unchecked
        detail = ex.pair_detail(verdict.golden, 0)
        assert detail.born_inputs_unchecked and not any(p.io == "in" for p in detail.pairs)
        assert verdict.origin_name is None  # the op born is the one the advisor would name
    finally:
        ex.close()
    report = tmp_path / "report.html"
    proc = run_wb("report", str(catalog), "-o", str(report))
    assert proc.returncode == 0, proc.stderr
    page = report.read_text(encoding="utf-8")
    assert html.escape(INPUTS_UNCHECKED) in page
    assert html.escape("the advisor's most likely origin here is") not in page


@pytest.mark.parametrize("tool", [pytest.param("msit", marks=needs_msit), pytest.param("msprobe", marks=needs_msprobe)])
def test_an_op_born_with_its_inputs_dumped_says_nothing_of_them(tmp_path: Path, tool: str) -> None:
    """The same defect with inputs dumped: the inputs were judged, and nothing is added under the verdict. msprobe
    also dumps the rotary embedding's `Tensor.sin`/`Tensor.cos` calls, whose float32 outputs fail from the
    bf16-rounded `inv_freq`: the known cause of the module they run in explains them (they were named `error born
    at` at the decode tokens)."""
    tokens = stats_dumps.dump(tool, "full", tmp_path / "golden")
    stats_dumps.dump(tool, "full", tmp_path / "bad", bf16=True, scale=1.05, forced=tokens)
    sub = "" if tool == "msit" else "dump"
    out, con = stats_dumps.compare(tmp_path / "golden" / sub, tmp_path / "bad" / sub, tmp_path / "o")
    born = [
        r[0]
        for r in con.execute(
            "SELECT n.name FROM error_born e JOIN nodes n ON n.run_id = 1 "
            "AND n.node_id = e.golden_node_id ORDER BY e.token_id"
        ).fetchall()
    ]
    assert len(born) == len(tokens) and all("layers.1.mlp" in b for b in born), (born, out)
    assert INPUTS_UNCHECKED not in out
    if tool == "msprobe":
        assert "also standing out, explained: Tensor.sin.0.forward (tokens " in out, out
    con.close()
