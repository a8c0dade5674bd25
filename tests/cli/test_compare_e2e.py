"""`wb compare` end to end, as a subprocess, on real dumps of a real (tiny) Llama (its refusals in process,
through typer's CliRunner)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import duckdb
import torch

from tests.conftest import ROOT, WB, TinyDumps, invoke_wb, run_wb
from workbench.analysis.queries import run_query
from workbench.catalog.schema import MSIT_CSV_COLUMNS
from workbench.catalog.store import first_row


def _born_lines(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("error born at:")]


def test_planted_defect_is_named_not_downstream(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    res = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect), "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    born = _born_lines(res.stdout)
    assert born, res.stdout
    for tok in range(3):
        assert f"error born at: root.model.layers.1.mlp.down_proj (token {tok})" in born, res.stdout
    assert "first divergent token: 0" in res.stdout
    # the CSV: msit's columns by msit's names, token then execution order
    reports = list(tmp_path.glob("msit_cmp_report_*.csv"))
    assert len(reports) == 1
    with reports[0].open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0].keys())[: len(MSIT_CSV_COLUMNS)] == MSIT_CSV_COLUMNS
    assert [int(r["data_id"]) for r in rows] == list(range(len(rows)))
    assert [int(r["token_id"]) for r in rows] == sorted(int(r["token_id"]) for r in rows)
    down = [r for r in rows if r["golden_data_path"].endswith("root.model.layers.1.mlp.down_proj/output.pth")]
    assert down and all(float(r["relative_euclidean_distance"]) > 0.4 for r in down)
    assert {r["golden_dtype"] for r in rows} == {"torch.float32", "torch.int64"}  # position ids are int64
    # the catalog: the stable view with the verdict's columns
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    failed = first_row(con.execute("SELECT count(*) FROM comparison WHERE passed = false"))
    assert failed is not None and failed[0] > 0
    first_fail = first_row(
        con.execute("SELECT golden_node FROM comparison WHERE passed = false AND token_id = 0 ORDER BY data_id LIMIT 1")
    )
    con.close()
    # the first failing row in execution order belongs to the defective module (or its parents' outputs)
    assert first_fail is not None and "layers.1" in first_fail[0]


def test_compare_loads_no_pandas(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    """pandas' import alone was ~0.13 s of a ~0.8 s `wb compare`: the whole command (read, ingest, match, compute,
    verdicts, summary, msit CSV) runs without it, and still names the planted defect."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONPROFILEIMPORTTIME": "1"}
    args = ["compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect), "-o", str(tmp_path)]
    res = subprocess.run([*WB, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if line.startswith("import time:")}
    assert "duckdb" in imported and "workbench.analysis.verdicts.born" in imported  # the log covers the compare
    assert not {m for m in imported if m == "pandas" or m.startswith("pandas.")}
    assert "error born at: root.model.layers.1.mlp.down_proj (token 0)" in _born_lines(res.stdout), res.stdout
    assert len(list(tmp_path.glob("msit_cmp_report_*.csv"))) == 1


def test_defect_inside_a_leaf_norm(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    res = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect_norm), "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert "error born at: root.model.layers.0.post_attention_layernorm (token 0)" in res.stdout, res.stdout


def test_identical_runs_pass_and_rerun_is_incremental(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    first = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.clean), "-o", str(tmp_path))
    assert first.returncode == 0, first.stderr
    assert "failed: 0;" in first.stdout
    assert not _born_lines(first.stdout)
    assert "no error born" in first.stdout
    second = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.clean), "-o", str(tmp_path))
    assert second.returncode == 0, second.stderr
    assert "(0 computed now," in second.stdout
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"), read_only=True)
    assert first_row(con.execute("SELECT count(*) FROM runs")) == (2,)
    assert first_row(con.execute("SELECT count(*) FROM comparisons")) == (1,)
    con.close()


def test_bf16_noise_passes_default_thresholds(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    res = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.bf16), "-o", str(tmp_path))
    assert res.returncode == 0, res.stderr
    assert not _born_lines(res.stdout), res.stdout


def test_token_selection(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    res = run_wb(
        "compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect), "-o", str(tmp_path), "--tokens", "1-2"
    )
    assert res.returncode == 0, res.stderr
    born = _born_lines(res.stdout)
    assert [b.rsplit("(", 1)[1] for b in born] == ["token 1)", "token 2)"]
    bad = invoke_wb(
        "compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect), "-o", str(tmp_path), "--tokens", "3-1"
    )
    assert bad.returncode == 2 and "backwards" in bad.stderr and "Traceback" not in bad.stderr


def test_damaged_files_are_reported_and_good_pairs_still_compared(
    tiny_dumps: TinyDumps, copy_tree, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    test = copy_tree(tiny_dumps.defect, "damaged")
    victim = test / "0" / "root.model.layers.0.mlp.up_proj" / "output.pth"
    victim.write_bytes(victim.read_bytes()[:100])  # truncated
    (test / "1" / "root.model.layers.0.mlp.gate_proj" / "output.pth").write_bytes(b"")  # empty
    out = tmp_path / "out"
    res = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(test), "-o", str(out))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    assert "error born at: root.model.layers.1.mlp.down_proj (token 0)" in res.stdout
    con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
    reasons = [
        r[0] for r in con.execute("SELECT cmp_fail_reason FROM comparison WHERE cmp_fail_reason IS NOT NULL").fetchall()
    ]
    con.close()
    assert any(str(victim) in r for r in reasons), reasons


def test_nothing_comparable_exits_nonzero(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    not_a_dump = tmp_path / "empty"
    not_a_dump.mkdir()
    res = invoke_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(not_a_dump), "-o", str(tmp_path / "o"))
    assert res.returncode != 0
    assert str(not_a_dump) in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_query_saved_and_read_only(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    assert (
        run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(tiny_dumps.defect), "-o", str(tmp_path)).returncode
        == 0
    )
    cat = str(tmp_path / "catalog.duckdb")
    born = run_wb("query", "error_born_per_token", "-c", cat, "--format", "csv")
    assert born.returncode == 0, born.stderr
    lines = born.stdout.strip().splitlines()
    assert lines[0].startswith("token_id,golden_op")
    assert all("root.model.layers.1.mlp.down_proj" in line for line in lines[1:])
    results = {
        name: json.loads(run_query(Path(cat), name, fmt="json"))
        for name in (
            "first_divergent_token",
            "worst_ops_per_metric",
            "unmatched_nodes",
            "nan_inf_locations",
            "layer_error_growth",
        )
    }
    assert results["first_divergent_token"][0]["token_id"] == 0
    assert results["first_divergent_token"][0]["failed_metrics"]  # never a passing token
    assert results["unmatched_nodes"] == []  # same model on both sides: everything matched by name
    assert results["nan_inf_locations"] == []
    worst_cos = [r for r in results["worst_ops_per_metric"] if r["metric"] == "cosine_similarity"]
    assert len(worst_cos) == 5 and worst_cos[0]["value"] <= worst_cos[-1]["value"]
    growth = {(r["token_id"], r["layer"]): r for r in results["layer_error_growth"]}
    assert growth[(0, 1)]["worst_rel_euclid"] > 10 * growth[(0, 0)]["worst_rel_euclid"]
    write = invoke_wb("query", "DELETE FROM runs", "-c", cat)
    assert write.returncode == 2 and "read-only" in write.stderr.lower()
    assert len(write.stderr.strip().splitlines()) == 1


def test_two_different_models_are_called_out(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.conftest import dump_run

    torch.manual_seed(0)
    other = LlamaForCausalLM(
        LlamaConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            vocab_size=256,
        )
    ).eval()
    other_dump, _ = dump_run(other, tmp_path / "other", torch.randint(3, 256, (1, 8)), None)
    res = run_wb("compare", "-gp", str(tiny_dumps.golden), "-mp", str(other_dump), "-o", str(tmp_path / "o"))
    assert "Traceback" not in res.stdout + res.stderr
    assert "differ in shape: are golden and test dumps of the same model" in res.stdout


def test_ingest_cli_is_incremental(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    cat = str(tmp_path / "c.duckdb")
    first = run_wb("ingest", str(tiny_dumps.golden), "--catalog", cat)
    assert first.returncode == 0, first.stderr
    assert "ingested as run 1" in first.stdout and "msit_torch" in first.stdout
    again = run_wb("ingest", str(tiny_dumps.golden), "--catalog", cat)
    assert "already in the catalog as run 1" in again.stdout
    missing = invoke_wb("ingest", str(tmp_path / "nope"), "--catalog", cat)
    assert missing.returncode == 2 and "nope" in missing.stderr and "Traceback" not in missing.stderr


def test_mapping_files_are_read(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    from workbench.compare.pairing.mapping import MappingFile, PairSpec, TensorSel

    # ours: compare layer 0's down_proj output with layer 1's (a deliberate cross pairing) and reject a name match
    mf = MappingFile()
    mf.add_pair(
        PairSpec(
            "root.model.layers.0.mlp.down_proj",
            "root.model.layers.1.mlp.down_proj",
            TensorSel("out", 0),
            TensorSel("out", 0),
        )
    )
    mf.remove_pair("root.lm_head", "root.lm_head")
    path = mf.save(tmp_path / "wb_mapping.json")
    res = run_wb(
        "compare",
        "-gp",
        str(tiny_dumps.golden),
        "-mp",
        str(tiny_dumps.clean),
        "-o",
        str(tmp_path / "o"),
        "-mf",
        str(path),
    )
    assert res.returncode == 0, res.stderr
    assert "mapping-file 1" in res.stdout
    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT golden_node, test_node, match_method, passed FROM comparison "
        "WHERE golden_node = 'root.model.layers.0.mlp.down_proj' AND io = 'out'"
    ).fetchall()
    lm_head = con.execute("SELECT count(*) FROM comparison WHERE golden_node = 'root.lm_head'").fetchall()
    con.close()
    assert {r[1] for r in rows} == {"root.model.layers.1.mlp.down_proj"}
    assert all(r[2] == "mapping-file" and r[3] is False for r in rows)  # different layers differ
    assert lm_head == [(0,)]
    # msit's op_mapping_file.json in a folder (-mf DIR), string value = one type
    msit_dir = tmp_path / "msit"
    msit_dir.mkdir()
    (msit_dir / "op_mapping_file.json").write_text('{"LlamaRMSNorm": "LlamaRMSNorm"}')
    res2 = run_wb(
        "compare",
        "-gp",
        str(tiny_dumps.golden),
        "-mp",
        str(tiny_dumps.clean),
        "-o",
        str(tmp_path / "o2"),
        "-mf",
        str(msit_dir),
    )
    assert res2.returncode == 0, res2.stderr
    assert "type-map" in res2.stdout
    bad = invoke_wb(
        "compare",
        "-gp",
        str(tiny_dumps.golden),
        "-mp",
        str(tiny_dumps.clean),
        "-o",
        str(tmp_path / "o3"),
        "-mf",
        str(tmp_path / "nothing.json"),
    )
    assert bad.returncode == 2 and "nothing.json: mapping file not found" in bad.stderr
