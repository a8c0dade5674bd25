"""Weights in compare (a wrong weight is a failing `param` pair) and the catalog route of `wb precheck`."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
import torch
from transformers import LlamaForCausalLM

from tests.conftest import invoke_wb, run_wb
from tests.fixtures.tiny_models import tiny_llama
from workbench.dump import DumpConfig, register_hook
from workbench.formats.detect import open_dump

BROKEN_WEIGHT = "root.model.layers.1.mlp.up_proj"


def _model(dtype: torch.dtype, broken: bool) -> LlamaForCausalLM:
    model = tiny_llama(11, vocab=128, max_positions=64)
    if broken:
        with torch.no_grad():
            model.model.layers[1].mlp.up_proj.weight.mul_(1.05)  # a checkpoint loaded wrong by 5%
    return model.to(dtype)


def _dump(model: LlamaForCausalLM, base: Path) -> Path:
    prompt = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(4))
    handle = register_hook(model, DumpConfig(dump_path=base, token_range=[0, 1], dump_weight=True))
    with torch.no_grad():
        model.generate(prompt, max_new_tokens=2, do_sample=False, pad_token_id=0)
    handle.remove()
    assert handle.dump_dir is not None
    return handle.dump_dir


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("weights")
    golden = _dump(_model(torch.float32, False), base / "golden")
    test = _dump(_model(torch.bfloat16, True), base / "test")
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(base / "out"))
    assert proc.returncode in (0, 1), proc.stderr
    return base / "out" / "catalog.duckdb", test


def test_reader_files_weights_once_as_param_tensors(compared: tuple[Path, Path]) -> None:
    _, test = compared
    dump = open_dump(test)
    params = [t for t in dump.tensors if t.role == "param"]
    assert {t.token for t in params} == {0}  # once per run, not per token
    assert {t.node for t in params if t.node.endswith("self_attn.q_proj")} == {
        "root.model.layers.0.self_attn.q_proj"
    } | {"root.model.layers.1.self_attn.q_proj"}
    assert all(t.dtype == "bfloat16" and t.shape for t in params)


def test_a_wrong_weight_is_a_failing_weight_pair(compared: tuple[Path, Path]) -> None:
    catalog, _ = compared
    con = duckdb.connect(str(catalog), read_only=True)
    rows = con.execute(
        "SELECT gn.name, x.passed FROM matches m JOIN metrics x USING (cmp_id, pair_id) "
        "JOIN comparisons c USING (cmp_id) JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
        "WHERE m.io = 'param'"
    ).fetchall()
    con.close()
    assert len(rows) >= 20  # every Linear, norm and the embedding
    failing = sorted(name for name, passed in rows if passed is False)
    assert failing == [BROKEN_WEIGHT]


def test_precheck_from_the_catalog(compared: tuple[Path, Path]) -> None:
    catalog, _ = compared
    proc = run_wb("precheck", "--catalog", str(catalog), "--node", "root.model.layers.1.mlp", "--token", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("ok    root.model.layers.1.mlp")  # the op computes right with the weight it has
    proc = invoke_wb("precheck", "--catalog", str(catalog), "--node", "root.nope")
    assert proc.returncode == 2 and "root.nope" in proc.stderr and "Traceback" not in proc.stderr
