"""Planted defects: each one is born in exactly the op `Defect.expected_op` names, and shows there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.conftest import atb_test_llama
from workbench.backends import AtbDumpConfig, AtbLlama, Defect
from workbench.formats.tensor_io import load_tensor

NEW = 3
LAYERS = 2


def _model(init: float) -> LlamaForCausalLM:
    return atb_test_llama(init, LAYERS)


# attention in a 0.02-initialised random model is almost uniform: the missing scale shows with sharper weights
INIT = {"attn_scale": 0.1}
PROMPT = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(4))


class Runs:
    """Dumps of one model, cached per (init, dtype, defect)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.models: dict[float, LlamaForCausalLM] = {}
        self.roots: dict[tuple[float, torch.dtype, str], Path] = {}

    def dump(self, init: float, dtype: torch.dtype, defect: Defect | None) -> Path:
        key = (init, dtype, defect.kind if defect else "clean")
        if key not in self.roots:
            hf = self.models.setdefault(init, _model(init))
            forced = AtbLlama.from_hf(hf, dtype=torch.float32).run(PROMPT, NEW).tokens[0, -NEW:].tolist()
            run = AtbLlama.from_hf(hf, dtype=dtype, defect=defect).run(
                PROMPT, NEW, dump=AtbDumpConfig(self.base / "_".join(map(str, key))), forced=forced
            )
            assert run.dump_root is not None
            (dev,) = list((run.dump_root / "tensors").iterdir())
            self.roots[key] = dev
        return self.roots[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("defects"))


def leaf_ops(tok: Path) -> list[str]:
    """Leaf op folders of a token folder in execution order (pre-order of the index paths)."""
    leaves = [
        os.path.relpath(d, tok)
        for d, subs, _ in os.walk(tok)
        if "after" in subs and not any(s[0].isdigit() for s in subs)
    ]
    return sorted(leaves, key=lambda p: [int(s.split("_")[0]) for s in p.split("/")])


def first_difference(test: Path, clean: Path) -> tuple[str, torch.Tensor, torch.Tensor] | None:
    """The first leaf op whose outputs differ (bitwise) between two dumps of the same token."""
    for op in leaf_ops(test):
        for name in sorted(os.listdir(test / op / "after")):
            a = load_tensor(test / op / "after" / name)
            b = load_tensor(clean / op / "after" / name)
            if not torch.equal(a, b):
                return op, a.float(), b.float()
    return None


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("kind", ["rmsnorm_eps", "rope_base", "rope_halves", "fp16_overflow", "kv_slot", "attn_scale"])
def test_defect_is_born_in_the_expected_op(runs: Runs, kind: str) -> None:
    init = INIT.get(kind, 0.02)
    dtype = torch.float16 if kind == "fp16_overflow" else torch.bfloat16
    defect = Defect(kind)
    test_dev = runs.dump(init, dtype, defect)
    clean_dev = runs.dump(init, dtype, None)
    for token in range(NEW):
        expected = defect.expected_op(token, LAYERS, dtype=dtype)
        found = first_difference(test_dev / str(token), clean_dev / str(token))
        if expected is None:
            assert found is None, f"token {token}: {kind} changed {found and found[0]} before it acts"
            continue
        assert found is not None, f"token {token}: {kind} changed nothing"
        op, bad, good = found
        assert op == expected
        if kind == "rmsnorm_eps":
            # a per-token scale: cosine is blind to it on one token, the relative distance is not
            assert float((bad - good).norm() / good.norm()) > 0.5
        elif not bool(torch.isfinite(bad).all()):
            assert kind == "fp16_overflow"
        else:
            assert cosine(bad, good) < 0.99, f"{kind} token {token}: cosine {cosine(bad, good)}"


def test_kv_slot_waits_for_its_token(runs: Runs) -> None:
    defect = Defect("kv_slot", from_token=2)
    assert defect.expected_op(1, LAYERS) is None
    assert defect.expected_op(2, LAYERS) == "9_Decoder_layer/1_Attention/2_ReshapeAndCacheOperation"
    assert defect.expected_op(3, LAYERS, warmup=True) == "9_Decoder_layer/1_Attention/2_ReshapeAndCacheOperation"


def test_fp16_overflow_is_harmless_in_bf16(runs: Runs) -> None:
    defect = Defect("fp16_overflow")
    assert defect.expected_op(0, LAYERS, dtype=torch.bfloat16) is None
    test_dev = runs.dump(0.02, torch.bfloat16, defect)
    clean_dev = runs.dump(0.02, torch.bfloat16, None)
    assert first_difference(test_dev / "0", clean_dev / "0") is None


def test_clean_bf16_stays_close_to_fp32(runs: Runs) -> None:
    bf16 = runs.dump(0.02, torch.bfloat16, None)
    fp32 = runs.dump(0.02, torch.float32, None)
    for token in range(NEW):
        ops = leaf_ops(bf16 / str(token))
        cos = [
            cosine(
                load_tensor(bf16 / str(token) / op / "after/outtensor0.bin").float(),
                load_tensor(fp32 / str(token) / op / "after/outtensor0.bin").float(),
            )
            for op in ops
        ]
        assert min(cos) > 0.999, (token, min(cos))


def test_defect_is_recorded(runs: Runs) -> None:
    dev = runs.dump(0.02, torch.bfloat16, Defect("rmsnorm_eps"))
    root = dev.parent.parent
    manifest = json.loads((root / "wb_manifest.json").read_text())
    assert manifest["defect"]["kind"] == "rmsnorm_eps"
    assert manifest["defect_ops"]["0"] == "3_Prefill_layer/3_RmsNormOperation"
    param = json.loads((dev / "0/3_Prefill_layer/3_RmsNormOperation/op_param.json").read_text())
    assert param["normParam"]["epsilon"] == 1.0  # the wrong epsilon is visible in the op's param
    with pytest.raises(ValueError, match="expected one of"):
        Defect("bogus")
    with pytest.raises(ValueError, match="layers"):
        AtbLlama.from_hf(runs.models[0.02], defect=Defect("rope_base", layer=5))
