"""The quantized test stack (W8A16, W8A8): its dumps, dequantized comparison, the quantization-noise advisor,
the fallback list. Real demo model, real dumps (our msit-layout dumper), real catalog; the CLI as a subprocess."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest

from tests.conftest import invoke_wb, run_wb
from workbench.analysis.verdicts.advisor import advise
from workbench.analysis.verdicts.fallback import fallback
from workbench.analysis.verdicts.quant_noise import quant_expectations
from workbench.core.advice import STANDS_OUT
from workbench.demo import make_demo
from workbench.formats.arrays import read_array
from workbench.formats.detect import open_dump
from workbench.formats.quant_links import quant_links
from workbench.jobs.compare import run_compare

# (defect, scheme) -> (the planted linear, a word its reason must carry)
CASES = {
    ("act_clip", "w8a8"): ("root.model.layers.2.mlp.down_proj", "clipping"),
    ("weight_scale", "w8a16"): ("root.model.layers.1.mlp.up_proj", "weight scale inconsistent with the data"),
    ("weight_scale", "w8a8"): ("root.model.layers.1.mlp.up_proj", "weight scale inconsistent with the data"),
    ("offset_twice", "w8a8"): ("root.model.layers.1.mlp.down_proj", "offset"),
    ("float_layer", "w8a8"): ("root.model.layers.3.mlp.down_proj", "keep it in float"),
    ("float_layer", "w8a16"): ("root.model.layers.3.mlp.down_proj", "keep it in float"),
}


def _demo(out: Path, defect: str | None, scheme: str) -> tuple[Path, int]:
    plan = make_demo(out, stack="quant", defect=defect, scheme=scheme, log=lambda _s: None)
    catalog = out / "catalog.duckdb"
    res = run_compare(plan.golden, plan.test, catalog, workers=1)
    return catalog, res.cmp_id


_BUILT: dict[tuple[str | None, str], tuple[Path, int]] = {}


def _built(tmp_path_factory: pytest.TempPathFactory, defect: str | None, scheme: str) -> tuple[Path, int]:
    key = (defect, scheme)
    if key not in _BUILT:
        _BUILT[key] = _demo(tmp_path_factory.mktemp(f"quant_{defect}_{scheme}"), defect, scheme)
    return _BUILT[key]


@pytest.mark.parametrize("scheme", ["w8a16", "w8a8"])
def test_dump_holds_int_tensors_scales_and_the_rule(tmp_path_factory: pytest.TempPathFactory, scheme: str) -> None:
    catalog, cmp_id = _built(tmp_path_factory, None, scheme)
    con = duckdb.connect(str(catalog), read_only=True)
    test_path = con.execute(
        "SELECT r.path FROM comparisons c JOIN runs r ON r.run_id = c.test_run WHERE c.cmp_id = ?", [cmp_id]
    ).fetchone()
    con.close()
    assert test_path is not None
    dump = open_dump(test_path[0])
    links, linears = quant_links(dump.meta)
    assert len(linears) == 27  # 4 layers x 7 linears, less layer 3's down_proj (lm_head too stays float)
    by_key = {(t.token, t.node, t.role, t.index): t for t in dump.tensors}
    lin = "root.model.layers.1.mlp.down_proj"
    w = by_key[(0, f"{lin}.matmul", "in", 1)]
    assert w.dtype == "int8"
    q = read_array(w.path or "").array
    assert np.abs(q).max() == 127  # a symmetric per-channel grid reaches its end in each channel
    if scheme == "w8a8":
        assert by_key[(0, f"{lin}.quant_input", "out", 0)].dtype == "int8"
        assert by_key[(0, f"{lin}.quant_input", "out", 2)].dtype == "int32"  # the asymmetric offset
        assert by_key[(0, f"{lin}.matmul", "out", 0)].dtype == "int32"  # the accumulator
        assert {(x.tensor.node, x.dtype) for x in links} >= {(f"{lin}.quant_input", "int8"), (f"{lin}.matmul", "int32")}
    else:
        assert links == []  # W8A16: activations stay float; the int8 weights have no golden counterpart
        assert by_key[(0, f"{lin}.matmul", "out", 0)].dtype == "float32"


def test_int_tensors_compared_dequantized_and_said_so(tmp_path_factory: pytest.TempPathFactory) -> None:
    catalog, cmp_id = _built(tmp_path_factory, None, "w8a8")
    con = duckdb.connect(str(catalog), read_only=True)
    rows = con.execute(
        "SELECT tn.name, m.io, m.transform, x.relative_euclidean_distance, x.cmp_fail_reason, tt.dtype "
        "FROM matches m JOIN comparisons c USING (cmp_id) JOIN metrics x USING (cmp_id, pair_id) "
        "JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = m.test_node_id "
        "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
        "WHERE m.cmp_id = ? AND m.method = 'quant' AND m.token_id = 0",
        [cmp_id],
    ).fetchall()
    why = con.execute(
        "SELECT evidence FROM node_matches WHERE cmp_id = ? AND method = 'quant' LIMIT 1", [cmp_id]
    ).fetchone()
    con.close()
    assert len(rows) == 2 * 27
    for name, io, transform, err, reason, dtype in rows:
        assert reason is None
        assert dtype == ("int8" if io == "in" else "int32")
        assert "t.mul:#" in transform and (("t.sub:#" in transform) == (io == "in" and "down_proj" in name))
        assert err < 0.15  # int8 rounding plus the error carried in: dequantized, not raw integers (error ~1e2)
    assert why is not None and "compared dequantized" in why[0]


@pytest.mark.parametrize(("defect", "scheme"), list(CASES))
def test_advisor_names_the_planted_layer_and_why(
    tmp_path_factory: pytest.TempPathFactory, defect: str, scheme: str
) -> None:
    catalog, cmp_id = _built(tmp_path_factory, defect, scheme)
    planted, word = CASES[(defect, scheme)]
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        first = [a for a in advise(con, cmp_id) if a.rank == 1]
        ranked = fallback(con, cmp_id, 3)
    finally:
        con.close()
    assert [a.token_id for a in first] == [0, 1, 2, 3]
    for a in first:
        assert a.golden_node == planted, (a.token_id, a.reason)
        assert a.score >= STANDS_OUT and word in a.reason, a.reason
    assert ranked[0].linear == planted and ranked[0].gain > 0


@pytest.mark.parametrize("scheme", ["w8a16", "w8a8"])
def test_clean_quantized_run_recommends_by_gain_and_calls_nothing_a_defect(
    tmp_path_factory: pytest.TempPathFactory, scheme: str
) -> None:
    catalog, cmp_id = _built(tmp_path_factory, None, scheme)
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        items = advise(con, cmp_id)
        expect = quant_expectations(con, cmp_id)
        ranked = fallback(con, cmp_id, 4)
    finally:
        con.close()
    assert all(a.score < STANDS_OUT and a.cause is None for a in items), [a for a in items if a.score >= STANDS_OUT]
    # the expectation from the scales alone is within a factor 2 of what each quantized linear adds
    assert len(expect) == 27 * 4 and all(0.0 < e.expected < 0.05 for e in expect.values())
    assert [f.rank for f in ranked] == [1, 2, 3, 4]
    assert all(f.gain >= 0 for f in ranked) and ranked[0].final_after < ranked[0].final_before
    assert sorted((f.added for f in ranked), reverse=True) == [f.added for f in ranked]


@pytest.mark.parametrize(("defect", "scheme", "first"), [(None, "w8a16", None), ("act_clip", "w8a8", 0)])
def test_summary_first_token_follows_the_quantized_verdict(
    tmp_path_factory: pytest.TempPathFactory, defect: str | None, scheme: str, first: int | None
) -> None:
    """A clean quantized run said `first token with an error born: 0` above `token 0: no quantized op adds more
    than its int8 rounding predicts` (the float thresholds' verdict, which the quantized summary does not use)."""
    from workbench.analysis.reporting.report import format_summary

    catalog, _ = _built(tmp_path_factory, defect, scheme)
    res = run_compare(catalog.parent / "golden", catalog.parent / "test", catalog, workers=1)  # computed already
    lines = format_summary(res, "golden", "test", None)
    said = [ln for ln in lines if ln.startswith("first token with an error born")]
    if first is None:
        assert said == [] and sum("no quantized op adds more" in ln for ln in lines) == 4, lines
    else:
        assert said == [f"first token with an error born: {first}"], lines
        assert any(ln.startswith(f"most likely origin: {CASES[(defect, scheme)][0]} (token {first})") for ln in lines)


def test_cli_demo_names_the_defect_and_measures_the_fallback(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = run_wb("demo", "--stack", "quant", "--defect", "act_clip", "--no-tui", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    origins = [ln for ln in r.stdout.splitlines() if ln.startswith("most likely origin:")]
    assert len(origins) == 4 and all("layers.2.mlp.down_proj" in ln and "clipping" in ln for ln in origins)
    assert "error born at" not in r.stdout  # not the first quantized linear's noise
    measured = [ln for ln in r.stdout.splitlines() if ln.startswith("measured gain")]
    assert len(measured) == 1 and "logits KL" in measured[0] and "top-1 agreement" in measured[0]
    r2 = run_wb("advise", "--catalog", str(out / "catalog.duckdb"), "--fallback", "1", timeout=300)
    assert r2.returncode == 0, r2.stderr
    assert "root.model.layers.2.mlp.down_proj" in r2.stdout and "measured gain" in r2.stdout


def test_cli_refuses_what_the_stack_cannot_plant(tmp_path: Path) -> None:
    r = invoke_wb(
        "demo", "--stack", "quant", "--defect", "act_clip", "--scheme", "w8a16", "--no-tui", "-o", str(tmp_path)
    )
    assert r.returncode == 2 and "--scheme w8a8" in r.stderr + r.stdout and "Traceback" not in r.stderr
    r = invoke_wb("demo", "--stack", "atb", "--scheme", "w8a8", "--no-tui", "-o", str(tmp_path))
    assert r.returncode == 2 and "--stack quant" in r.stderr + r.stdout
    assert not any(tmp_path.iterdir())  # refused before anything was built


def test_advise_fallback_on_a_float_run_says_why(tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    built, _ = _built(tmp_path_factory, None, "w8a8")
    catalog = tmp_path / "float.duckdb"
    shutil.copyfile(built, catalog)
    con = duckdb.connect(str(catalog))
    con.execute("UPDATE runs SET meta = ?", [json.dumps({"dtype": "float32"})])
    con.close()
    r = invoke_wb("advise", "--catalog", str(catalog), "--fallback", "2")
    assert r.returncode == 2 and "declares no quantized linear" in r.stderr + r.stdout
    assert "Traceback" not in r.stderr


def test_int_tensor_without_a_scale_compared_as_integers_and_said_why(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    built, cmp_id = _built(tmp_path_factory, None, "w8a8")
    con = duckdb.connect(str(built), read_only=True)
    paths = con.execute(
        "SELECT g.path, t.path FROM comparisons c JOIN runs g ON g.run_id = c.golden_run "
        "JOIN runs t ON t.run_id = c.test_run WHERE c.cmp_id = ?",
        [cmp_id],
    ).fetchone()
    con.close()
    assert paths is not None
    test = tmp_path / "test"
    shutil.copytree(paths[1], test)
    manifest = test / "wb_manifest.json"
    meta = json.loads(manifest.read_text())
    act = "root.model.layers.0.self_attn.q_proj.quant_input"
    for link in meta["quant"]["tensors"]:
        if link["node"] == act:
            link["scales"] = []  # a dump that names no scale for this int8 tensor
    manifest.write_text(json.dumps(meta))
    run_compare(paths[0], test, tmp_path / "c.duckdb", workers=1)
    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT m.transform, x.cmp_fail_reason, x.max_absolute_error FROM matches m "
        "JOIN metrics x USING (cmp_id, pair_id) JOIN comparisons c USING (cmp_id) "
        "JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = m.test_node_id WHERE tn.name = ?",
        [act],
    ).fetchall()
    why = con.execute("SELECT evidence FROM node_matches WHERE method = 'quant' AND evidence LIKE '%as integers%'")
    evidence = why.fetchall()
    con.close()
    assert len(rows) == 4  # one per token
    for transform, reason, max_abs in rows:
        assert transform == "t.int"
        assert (
            reason
            == "compared as integers: the dump's quant entry gives it no scale, so no float comparison is possible"
        )
        assert max_abs > 1  # raw int8 values against a golden of magnitude ~1: integers, not dequantized
    assert len(evidence) == 1 and act in evidence[0][0]


def test_advise_fallback_as_csv_and_json(tmp_path_factory: pytest.TempPathFactory) -> None:
    """`--fallback` follows `--format` like the rest of `wb advise`: the rows on stdout, the notes on stderr."""
    catalog, _ = _built(tmp_path_factory, None, "w8a8")
    r = run_wb("advise", "--catalog", str(catalog), "--fallback", "3", "--format", "json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [row["rank"] for row in rows] == [1, 2, 3] and all(row["linear"].startswith("root.") for row in rows)
    assert all(row["final_after"] <= row["final_before"] for row in rows)
    assert r.stderr.startswith("measured gain (the demo re-run with these 3 in float") and "logits KL" in r.stderr
    c = run_wb("advise", "--catalog", str(catalog), "--fallback", "3", "--format", "csv")
    lines = c.stdout.splitlines()
    assert c.returncode == 0 and lines[0] == "rank,linear,added,gain,final_before,final_after,golden_node_id"
    assert [ln.split(",")[1] for ln in lines[1:]] == [row["linear"] for row in rows]
    bad = run_wb("advise", "--catalog", str(catalog), "--fallback", "3", "--format", "xml")
    assert bad.returncode == 2 and "--format 'xml'" in bad.stderr and bad.stdout == ""
