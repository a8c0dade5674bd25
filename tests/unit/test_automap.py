"""Torch (fp32) vs the ATB-structured stack (bf16/fp16): automatic mapping, coverage, defect localisation.

Real runs of both stacks, dumps written by both dumpers and read back, compared by the real pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.conftest import atb_test_llama, dump_run
from workbench.analysis.reporting.summary import CompareResult
from workbench.backends import AtbDumpConfig, AtbLlama, Defect
from workbench.catalog.store import open_catalog
from workbench.jobs.compare import run_compare

STEPS = 3
LAYERS = 2
PROMPT = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(4))
# a missing attention scale only shows when attention is not near-uniform (sharper random weights)
INIT = {"attn_scale": 0.1, "rope_base": 0.1, "rope_halves": 0.1, "kv_slot": 0.1}


def _model(init: float) -> LlamaForCausalLM:
    return atb_test_llama(init, LAYERS)


class Stacks:
    """Golden torch dumps (per init) and ATB dumps (per defect), made once for the module."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.golden: dict[float, tuple[LlamaForCausalLM, Path, list[int]]] = {}

    def golden_run(self, init: float) -> tuple[LlamaForCausalLM, Path, list[int]]:
        if init not in self.golden:
            model = _model(init)
            root, tokens = dump_run(model, self.base / f"golden_{init}", PROMPT, None, steps=STEPS)
            self.golden[init] = (model, root, tokens)
        return self.golden[init]

    def compare(self, kind: str) -> tuple[CompareResult, Defect, torch.dtype, Path]:
        init = INIT.get(kind, 0.02)
        model, golden, tokens = self.golden_run(init)
        dtype = torch.float16 if kind == "fp16_overflow" else torch.bfloat16
        defect = None if kind == "none" else Defect(kind)
        atb = AtbLlama.from_hf(model, dtype=dtype, defect=defect)
        run = atb.run(PROMPT, STEPS, dump=AtbDumpConfig(dump_path=self.base / f"atb_{kind}"), forced=tokens)
        assert run.dump_root is not None
        catalog = self.base / f"{kind}.duckdb"
        res = run_compare(golden, run.dump_root, catalog, workers=1)
        return res, defect or Defect("none"), dtype, catalog


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Stacks:
    return Stacks(tmp_path_factory.mktemp("automap"))


TARGET_TYPES = ("Linear", "RMSNorm", "Attention", "MLP")


def _coverage(catalog: Path, cmp_id: int) -> tuple[int, int, list[str]]:
    con = open_catalog(catalog, read_only=True)
    rows = con.execute(
        "SELECT n.name, n.type, "
        "EXISTS (SELECT 1 FROM node_matches m WHERE m.cmp_id = ? AND m.golden_node_id = n.node_id)"
        " FROM nodes n JOIN comparisons c ON c.golden_run = n.run_id WHERE c.cmp_id = ?",
        [cmp_id, cmp_id],
    ).fetchall()
    con.close()
    targets = [(name, matched) for name, typ, matched in rows if any(t in (typ or "") for t in TARGET_TYPES)]
    return sum(m for _, m in targets), len(targets), [n for n, m in targets if not m]


def test_clean_run_all_pairs_pass_and_coverage(stacks: Stacks) -> None:
    res, _defect, _dtype, catalog = stacks.compare("none")
    matched, total, missing = _coverage(catalog, res.cmp_id)
    assert total >= 2 * 9 + 2  # per layer: 7 Linear, 2 norms, attention, MLP; plus final norm and lm_head
    assert matched / total >= 0.9 and not missing, missing
    # a wrong pair would show as a failure on a clean run: there is none, on every token
    assert res.pairs > 150
    assert res.failed == 0, res
    assert all(v is None for v in res.born.values())
    assert set(res.born) == set(range(STEPS))
    assert res.coverage["by_method"].get("auto-fused-qkv", 0) > 0


@pytest.mark.parametrize("kind", ["rmsnorm_eps", "rope_base", "rope_halves", "fp16_overflow", "kv_slot", "attn_scale"])
def test_each_planted_defect_is_localised(stacks: Stacks, kind: str) -> None:
    res, defect, dtype, catalog = stacks.compare(kind)
    start = defect.start
    expected = defect.expected_op(start, LAYERS, dtype=dtype)
    assert expected
    assert res.born_test.get(start) == expected, (kind, res.born, res.born_test)
    # tokens before the defect starts are clean
    for tok in range(start):
        assert res.born.get(tok) is None, (kind, tok, res.born)
    matched, total, missing = _coverage(catalog, res.cmp_id)
    assert matched / total >= 0.9, missing


def test_precheck_cli_names_the_defective_op(stacks: Stacks) -> None:
    from tests.conftest import run_wb

    _res, defect, dtype, _catalog = stacks.compare("rope_halves")
    expected = defect.expected_op(defect.start, LAYERS, dtype=dtype)
    assert expected
    token_dir = next((stacks.base / "atb_rope_halves").glob(f"msit_dump_*/tensors/*/{defect.start}"))
    layer = expected.split("/")[0]
    out = run_wb("precheck", str(token_dir / layer))
    assert out.returncode == 1, out.stderr
    fails = [line for line in out.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1 and fails[0].split()[1] == expected, out.stdout
    clean = run_wb("precheck", str(token_dir / layer.replace(layer.split("_")[0], str(int(layer.split("_")[0]) - 1))))
    assert clean.returncode == 0, clean.stdout + clean.stderr
