"""Single-op precheck on real ATB dumps written by our ATB-structured Llama, clean and with planted defects."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from tests.conftest import atb_test_llama
from workbench.analysis.checks.precheck.atb_kernels import SUPPORTED_OPS
from workbench.analysis.checks.precheck.result import PrecheckResult
from workbench.analysis.checks.precheck.run_atb import precheck_group, precheck_op
from workbench.backends import AtbDumpConfig, AtbLlama, Defect
from workbench.formats import atb_bin
from workbench.formats.model import DumpError

NEW = 3
LAYERS = 2
PROMPT = torch.randint(3, 300, (1, 10), generator=torch.Generator().manual_seed(4))
INIT = {"attn_scale": 0.1}  # a missing attention scale shows only with sharper attention weights


def _model(init: float) -> LlamaForCausalLM:
    return atb_test_llama(init, LAYERS)


class Dumps:
    """Device folders (`tensors/{dev}_{pid}`) of dumps, cached per (init, dtype, defect, save_time)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.models: dict[float, LlamaForCausalLM] = {}
        self.devs: dict[tuple[float, torch.dtype, str, int], Path] = {}

    def get(self, init: float, dtype: torch.dtype, defect: Defect | None, save_time: int = 3) -> Path:
        key = (init, dtype, defect.kind if defect else "clean", save_time)
        if key not in self.devs:
            hf = self.models.setdefault(init, _model(init))
            run = AtbLlama.from_hf(hf, dtype=dtype, defect=defect).run(
                PROMPT, NEW, dump=AtbDumpConfig(self.base / "_".join(map(str, key)), save_time=save_time)
            )
            assert run.dump_root is not None
            (dev,) = list((run.dump_root / "tensors").iterdir())
            self.devs[key] = dev
        return self.devs[key]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Dumps:
    return Dumps(tmp_path_factory.mktemp("precheck"))


def _by_name(results: list[PrecheckResult]) -> dict[str, PrecheckResult]:
    return {r.name: r for r in results}


def test_clean_bf16_dump_passes_every_op_on_every_token(dumps: Dumps) -> None:
    dev = dumps.get(0.02, torch.bfloat16, None)
    seen: set[str] = set()
    for token in range(NEW):
        results = precheck_group(dev / str(token))
        assert len(results) == 1 + 2 + LAYERS * 13 + 1 + 1  # every leaf op of the token
        names = [r.name for r in results]
        assert names[0].endswith("WordEmbedding/0_GatherOperation")
        assert names[-1].endswith("LmHead/0_LinearOperation")  # execution order, depth first
        for r in results:
            assert r.supported and r.passed is True, (token, r.name, r.reason, r.outputs)
            assert r.outputs and all(o.passed for o in r.outputs)
            assert not r.param_issues
            seen.add(r.op_type)
    assert seen == set(SUPPORTED_OPS)  # the stack exercises every reference
    # a clean bf16 kernel is close to, not equal to, the fp32 reference
    rope = precheck_op(dev / "1/8_Decoder_layer/1_Attention/1_RopeOperation")
    assert rope.passed and 0.999 < rope.outputs[0].values["cosine_similarity"] <= 1.0


@pytest.mark.parametrize("kind", ["rmsnorm_eps", "rope_base", "rope_halves", "kv_slot", "attn_scale", "fp16_overflow"])
def test_defect_op_fails_and_its_layer_neighbours_pass(dumps: Dumps, kind: str) -> None:
    dtype = torch.float16 if kind == "fp16_overflow" else torch.bfloat16
    defect = Defect(kind)
    dev = dumps.get(INIT.get(kind, 0.02), dtype, defect)
    start = defect.start
    expected = defect.expected_op(start, LAYERS, dtype=dtype)
    assert expected is not None
    layer_dir = expected.split("/")[0]
    results = _by_name(precheck_group(dev / str(start) / layer_dir))
    bad = results.pop(expected)
    assert bad.supported and bad.passed is False, bad
    assert bad.reason
    for name, r in results.items():
        assert r.passed is True, (kind, name, r.reason, r.outputs)
    if kind in ("rmsnorm_eps", "attn_scale"):
        # the kernel does what its param says; the param disagrees with every peer
        assert bad.param_issues and "the param is wrong" in bad.reason
    if kind == "kv_slot":
        assert all("stray_writes" in o.failed_metrics for o in bad.outputs)
        # before its start token the same op is clean
        assert precheck_op(dev / "0/3_Prefill_layer/1_Attention/2_ReshapeAndCacheOperation").passed is True
    if kind == "fp16_overflow":
        assert bad.outputs[0].failed_metrics == ["nan_inf"]
    if kind in ("rope_base", "rope_halves"):
        assert all(o.values["cosine_similarity"] < 0.9 for o in bad.outputs)


def test_outputs_only_after_the_op(dumps: Dumps) -> None:
    """save_time 1: inputs come from after/; in-place caches are already written, stray writes unknowable."""
    dev = dumps.get(0.02, torch.bfloat16, None, save_time=1)
    assert not (dev / "0/2_Prefill_layer/0_RmsNormOperation/before").exists()
    results = precheck_group(dev / "0/3_Prefill_layer")
    assert all(r.passed is True for r in results), [(r.name, r.reason) for r in results if not r.passed]
    cache = _by_name(results)["3_Prefill_layer/1_Attention/2_ReshapeAndCacheOperation"]
    assert "not checked" in (cache.outputs[0].reason or "")


# ------------------------------------------------------------------------------- hostile and hand-made folders


def _copy_op(dumps: Dumps, tmp_path: Path, rel: str = "0/2_Prefill_layer/0_RmsNormOperation") -> Path:
    src = dumps.get(0.02, torch.bfloat16, None) / rel
    dst = tmp_path / "0" / src.name
    shutil.copytree(src, dst)
    return dst


def test_hostile_op_folders_give_one_line_reasons(dumps: Dumps, tmp_path: Path) -> None:
    op = _copy_op(dumps, tmp_path)
    assert precheck_op(op).passed is True
    data = (op / "before/intensor0.bin").read_bytes()
    (op / "before/intensor0.bin").write_bytes(data[: len(data) - 100])  # truncated
    r = precheck_op(op)
    assert r.supported and r.passed is None
    assert "intensor0.bin" in (r.reason or "") and "truncated" in (r.reason or "") and "\n" not in (r.reason or "")

    op2 = _copy_op(dumps, tmp_path / "b")
    (op2 / "op_param.json").unlink()
    r = precheck_op(op2)
    assert r.passed is None and "op_param.json: missing file" in (r.reason or "")
    (op2 / "op_param.json").write_text("{not json")
    assert "not valid JSON" in (precheck_op(op2).reason or "")

    op3 = _copy_op(dumps, tmp_path / "c")
    (op3 / "before/intensor1.bin").rename(op3 / "before/intensor2.bin")
    assert "intensor1.bin: missing file" in (precheck_op(op3).reason or "")

    unknown = op.parent / "7_TransposeOperation"
    shutil.copytree(op, unknown)
    r = precheck_op(unknown)
    assert r.supported is False and r.passed is None and "TransposeOperation" in (r.reason or "")
    assert precheck_op(tmp_path / "not_an_op").supported is False
    with pytest.raises(DumpError, match="missing folder"):
        precheck_group(tmp_path / "nowhere")


def test_nz_layout_and_stats_only_are_refused(dumps: Dumps, tmp_path: Path) -> None:
    op = _copy_op(dumps, tmp_path)
    path = op / "before/intensor1.bin"
    path.write_bytes(path.read_bytes().replace(b"format=2\n", b"format=29\n", 1))
    r = precheck_op(op)
    assert r.supported is False and "FRACTAL_NZ" in (r.reason or "")
    stats = _copy_op(dumps, tmp_path / "s")
    hdr = atb_bin.read_header(stats / "after/outtensor0.bin")
    atb_bin.write_bin_stats(stats / "after/outtensor0.bin", hdr.dtype, hdr.shape, atb_bin.TensorStats(1.0))
    r = precheck_op(stats)
    assert r.passed is None and "statistics-only" in (r.reason or "")


def _write(folder: Path, name: str, t: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if t.dtype == torch.bfloat16:
        atb_bin.write_bin(folder / name, t.contiguous().view(torch.int16).numpy().view(np.uint16), "bfloat16")
    else:
        atb_bin.write_bin(folder / name, t.contiguous().numpy(), str(t.dtype).removeprefix("torch."))


def _op(root: Path, name: str, param: dict, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> Path:
    op = root / "0" / name
    op.mkdir(parents=True)
    (op / "op_param.json").write_text(json.dumps(param))
    for k, t in enumerate(ins):
        _write(op / "before", f"intensor{k}.bin", t)
    for k, t in enumerate(outs):
        _write(op / "after", f"outtensor{k}.bin", t)
    return op


def test_params_beyond_our_stack(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g)
    w = torch.randn(16, 8, generator=g)  # [in, out]: transposeB false
    b = torch.randn(8, generator=g)
    lin = {"transposeA": True, "transposeB": False, "hasBias": True}
    ok = _op(tmp_path, "0_LinearOperation", lin, [x.T.contiguous(), w, b], [(x @ w + b).bfloat16()])
    assert precheck_op(ok).passed is True
    wrong = _op(tmp_path, "1_LinearOperation", lin, [x.T.contiguous(), w, b], [(x @ w).bfloat16()])
    assert precheck_op(wrong).passed is False

    gelu_tanh = torch.nn.functional.gelu(x, approximate="tanh")
    assert (
        precheck_op(
            _op(tmp_path, "2_ActivationOperation", {"activationType": 2, "geluMode": 0}, [x], [gelu_tanh])
        ).passed
        is True
    )
    swish = x * torch.sigmoid(0.5 * x)
    assert (
        precheck_op(_op(tmp_path, "3_ActivationOperation", {"activationType": 4, "scale": 0.5}, [x], [swish])).passed
        is True
    )
    assert (
        precheck_op(_op(tmp_path, "4_ActivationOperation", {"activationType": 4, "scale": 1.0}, [x], [swish])).passed
        is False
    )
    muls = {"elewiseType": 2, "mulsParam": {"varAttr": 0.125}}
    assert precheck_op(_op(tmp_path, "5_ElewiseOperation", muls, [x], [x * 0.125])).passed is True
    assert (
        precheck_op(_op(tmp_path, "6_ElewiseOperation", {"elewiseType": 15}, [x, x.flip(0)], [x - x.flip(0)])).passed
        is True
    )
    parts = list(x.chunk(2, dim=1))
    split = _op(tmp_path, "7_SplitOperation", {"splitDim": 1, "splitNum": 2}, [x], parts)
    assert [o.passed for o in precheck_op(split).outputs] == [True, True]
    res = torch.randn(6, 16, generator=g)
    h = x + res
    y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5) * w[:, 0]
    pre = {"layerType": 2, "normParam": {"epsilon": 1e-5}, "preNormParam": {"epsilon": 1e-5}}
    r = precheck_op(_op(tmp_path, "8_RmsNormOperation", pre, [x, res, w[:, 0].contiguous()], [y, h]))
    assert r.passed is True and len(r.outputs) == 2
    unsupported = precheck_op(_op(tmp_path, "9_ElewiseOperation", {"elewiseType": 17}, [x], [x]))
    assert unsupported.supported is False and "elewiseType 17" in (unsupported.reason or "")
