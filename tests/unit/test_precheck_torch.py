"""Torch precheck: every covered module / API type, a correct and a defective op, on real dumps read back.

Defects are real: forward hooks (registered before the dumper's, so the dump sees what they return) that
change what a module computes by a few percent, or or on what a module hands its child (the attention core's result).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import BertConfig, BertModel

from tests.conftest import ROOT, invoke_wb, run_wb
from tests.fixtures.peers import PeerDumps
from tests.fixtures.tiny_models import tiny_llama
from workbench.analysis.checks.precheck.judge import STANDARDS
from workbench.analysis.checks.precheck.result import NOT_CHECKED, WEIGHTS_NOT_DUMPED
from workbench.analysis.checks.precheck.run_torch import precheck_node, precheck_path
from workbench.analysis.checks.precheck.torch_inputs import TorchDump
from workbench.analysis.checks.precheck.torch_kernels import checker_key
from workbench.dump import DumpConfig, register_hook
from workbench.formats.detect import open_dump

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _scale_output(factor: float):  # type: ignore[no-untyped-def]
    def hook(module, args, output):  # type: ignore[no-untyped-def]
        if isinstance(output, tuple):
            return (output[0] * factor, *output[1:])
        return output * factor

    return hook


def _scale_input(factor: float):  # type: ignore[no-untyped-def]
    def hook(module, args):  # type: ignore[no-untyped-def]
        return (args[0] * factor, *args[1:])

    return hook


def _llama(dtype: torch.dtype, qwen: bool = False) -> nn.Module:
    return tiny_llama(3, vocab=128, max_positions=64, qwen=qwen).to(dtype)


def _dump(model: nn.Module, base: Path, run: object, tokens: int = 3) -> TorchDump:
    handle = register_hook(model, DumpConfig(dump_path=base, token_range=list(range(tokens)), dump_weight=True))
    with torch.no_grad():
        run()  # type: ignore[operator]
    handle.remove()
    assert handle.dump_dir is not None
    return TorchDump.from_dump(open_dump(handle.dump_dir))


def _generate(model: nn.Module, vocab: int = 128, steps: int = 3):  # type: ignore[no-untyped-def]
    prompt = torch.randint(0, vocab, (1, 5), generator=torch.Generator().manual_seed(1))
    return lambda: model.generate(prompt, max_new_tokens=steps, do_sample=False, pad_token_id=0)


# a defect per module of layer 1 (layer 0 stays correct): hooks change the computation by a few percent
LLAMA_DEFECTS = {
    "root.model.layers.1.self_attn.q_proj": "Linear",
    "root.model.layers.1.input_layernorm": "RMSNorm",
    "root.model.layers.1.mlp.act_fn": "Activation",
    "root.model.layers.1.mlp": "MLP",  # act(gate) * up
    "root.model.layers.1.self_attn": "Attention",  # the attention core
    "root.model.embed_tokens": "Embedding",
    "root.model.rotary_emb": "RotaryEmbedding",
}


def _break_llama(model: nn.Module) -> None:
    layer = model.model.layers[1]  # type: ignore[union-attr, index]
    layer.self_attn.q_proj.register_forward_hook(_scale_output(1.03))
    layer.input_layernorm.register_forward_hook(_scale_output(0.97))
    layer.mlp.act_fn.register_forward_hook(_scale_output(1.04))
    layer.mlp.down_proj.register_forward_pre_hook(_scale_input(1.03))
    layer.self_attn.o_proj.register_forward_pre_hook(_scale_input(1.03))
    model.model.embed_tokens.register_forward_hook(_scale_output(1.05))  # type: ignore[union-attr]
    model.model.rotary_emb.register_forward_hook(_scale_output(1.02))  # type: ignore[union-attr]


@pytest.fixture(scope="module", params=DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def llama_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[TorchDump, TorchDump]:
    dtype = request.param
    good = _llama(dtype)
    clean = _dump(good, tmp_path_factory.mktemp("clean"), _generate(good))
    bad = _llama(dtype)
    _break_llama(bad)
    broken = _dump(bad, tmp_path_factory.mktemp("broken"), _generate(bad))
    return clean, broken


def _verdicts(src: TorchDump, token: int) -> dict[str, bool | None]:
    return {
        n: precheck_node(src, n, token).passed for n in src.types if checker_key(src.types[n]) and src.has(n, token)
    }


@pytest.mark.parametrize("token", [0, 2], ids=["prefill", "decode"])
def test_every_llama_op_passes_when_correct(llama_pair: tuple[TorchDump, TorchDump], token: int) -> None:
    clean, _ = llama_pair
    verdicts = _verdicts(clean, token)
    kinds = {checker_key(clean.types[n]) for n in verdicts}
    assert {"Linear", "Embedding", "RMSNorm", "RotaryEmbedding", "Attention", "MLP", "Activation"} <= kinds
    failing = {n: precheck_node(clean, n, token).reason for n, v in verdicts.items() if v is not True}
    assert not failing


@pytest.mark.parametrize("token", [0, 2], ids=["prefill", "decode"])
def test_each_defective_llama_op_fails_and_names_its_stage(llama_pair: tuple[TorchDump, TorchDump], token: int) -> None:
    _, broken = llama_pair
    for node, kind in LLAMA_DEFECTS.items():
        r = precheck_node(broken, node, token)
        assert checker_key(broken.types[node]) == kind
        assert r.passed is False, (node, r.reason)
    attn = precheck_node(broken, "root.model.layers.1.self_attn", token)
    bad = {o.label for o in attn.outputs if o.passed is False}
    assert "attention core" in bad and "o_proj" not in bad and "k_proj" not in bad
    mlp = precheck_node(broken, "root.model.layers.1.mlp", token)
    bad = {o.label for o in mlp.outputs if o.passed is False}
    assert "act(gate) * up" in bad and "gate_proj" not in bad
    # the same modules of layer 0 are untouched
    for node in ("root.model.layers.0.self_attn", "root.model.layers.0.mlp", "root.model.layers.0.input_layernorm"):
        assert precheck_node(broken, node, token).passed is True, node


def test_decode_rebuilds_the_kv_cache(llama_pair: tuple[TorchDump, TorchDump]) -> None:
    clean, _ = llama_pair
    r = precheck_node(clean, "root.model.layers.0.self_attn", 2)
    assert r.passed is True and "KV cache rebuilt from tokens 0-1" in (r.reason or "")


def test_qwen2_biased_projections(tmp_path: Path) -> None:
    model = _llama(torch.bfloat16, qwen=True)
    src = _dump(model, tmp_path, _generate(model), tokens=2)
    for token in (0, 1):
        v = _verdicts(src, token)
        assert v["root.model.layers.0.self_attn"] is True and v["root.model.layers.0.self_attn.q_proj"] is True
        assert "bias" in src.op("root.model.layers.0.self_attn.q_proj", token).params


def _bert(dtype: torch.dtype) -> nn.Module:
    torch.manual_seed(5)
    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, vocab_size=100)
    return BertModel(cfg, add_pooling_layer=False).eval().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_bert_layernorm_gelu_embedding(tmp_path: Path, dtype: torch.dtype) -> None:
    ids = torch.randint(0, 100, (1, 7), generator=torch.Generator().manual_seed(2))
    good = _bert(dtype)
    src = _dump(good, tmp_path / "good", lambda: good(ids), tokens=1)
    names = {
        "root.embeddings.LayerNorm": "LayerNorm",
        "root.encoder.layer.0.intermediate.intermediate_act_fn": "Activation",
        "root.embeddings.word_embeddings": "Embedding",
        "root.encoder.layer.0.output.dense": "Linear",
    }
    for node, kind in names.items():
        assert checker_key(src.types[node]) == kind
        r = precheck_node(src, node, 0)
        assert r.passed is True, (node, r.reason)
    bad = _bert(dtype)
    bad.embeddings.LayerNorm.register_forward_hook(_scale_output(1.03))
    bad.encoder.layer[0].intermediate.intermediate_act_fn.register_forward_hook(_scale_output(0.96))
    bad.embeddings.word_embeddings.register_forward_hook(_scale_output(1.04))
    bad.encoder.layer[0].output.dense.register_forward_hook(_scale_output(1.03))
    broken = _dump(bad, tmp_path / "bad", lambda: bad(ids), tokens=1)
    for node in names:
        assert precheck_node(broken, node, 0).passed is False, node


class _Head(nn.Module):
    """Softmax as a module and API calls (linear, matmul, mul, silu, softmax) for api-mode dumps."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 48)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        g = torch.mul(h, torch.nn.functional.silu(h))
        s = torch.matmul(g, g.transpose(-1, -2))
        return self.softmax(torch.softmax(s, dim=-1) * 4.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_api_entries_and_softmax(tmp_path: Path, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = _Head().eval().to(dtype)
    x = torch.randn(2, 6, 32).to(dtype)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path, mode=["module", "api"], dump_weight=True))
    with torch.no_grad():
        model(x)
    handle.remove()
    assert handle.dump_dir is not None
    src = TorchDump.from_dump(open_dump(handle.dump_dir))
    wanted = {"linear", "mul", "silu", "matmul", "softmax", "Softmax"}
    checked = {}
    for n, t in src.types.items():
        if t in wanted and src.has(n, 0):
            checked[t] = precheck_node(src, n, 0)
    assert set(checked) == wanted
    assert all(r.passed is True for r in checked.values()), {t: r.reason for t, r in checked.items()}
    # tamper with each dumped output by 3%: every call fails
    for r in checked.values():
        node = r.name
        out = next(e for e in src._by[(node, 0, "out")])
        t = torch.load(out.path, weights_only=True)
        os.unlink(out.path)  # the dumper hard-links a tensor seen twice: change this name only
        torch.save((t.double() * 1.03).to(t.dtype), out.path)
    for r in checked.values():
        assert precheck_node(src, r.name, 0).passed is False, r.name


def msprobe_head_dump(out: str) -> None:
    """Dump `_Head` in bf16 with msprobe's debugger; run in its own process (msprobe patches torch for good)."""
    from msprobe.pytorch import PrecisionDebugger

    config = Path(out) / "config.json"
    config.write_text(
        json.dumps({"task": "tensor", "level": "mix", "tensor": {"scope": [], "list": [], "data_mode": ["all"]}})
    )
    torch.manual_seed(0)
    model = _Head().eval().to(torch.bfloat16)
    x = torch.randn(2, 6, 32).to(torch.bfloat16)
    dbg = PrecisionDebugger(config_path=str(config), dump_path=str(Path(out) / "dump"))
    dbg.start(model=model)
    with torch.no_grad():
        model(x)
    dbg.stop()
    dbg.step()


@pytest.mark.skipif(importlib.util.find_spec("msprobe") is None, reason="msprobe (mindstudio-probe) not installed")
def test_msprobe_api_and_module_entries(tmp_path: Path) -> None:
    code = f"from tests.unit.test_precheck_torch import msprobe_head_dump; msprobe_head_dump({str(tmp_path)!r})"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    dump = open_dump(tmp_path / "dump")
    src = TorchDump.from_dump(dump)
    results = {src.types[n]: precheck_node(src, n, 0) for n in src.types if checker_key(src.types[n]) and src.has(n, 0)}
    for kind in ("Functional.linear", "Torch.matmul", "Torch.mul", "Functional.silu", "Linear", "Softmax"):
        assert kind in results and results[kind].passed is True, (kind, results.get(kind), sorted(results))
    assert "weight" in src.op(next(n for n in src.types if src.types[n] == "Linear"), 0).params
    for t, r in results.items():
        assert r.passed is not False, (t, r.reason)


def test_cannot_run_says_why_in_one_line(tmp_path: Path) -> None:
    model = _llama(torch.float32)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path, token_range=[1, 2]))  # no weights, no token 0
    with torch.no_grad():
        _generate(model)()
    handle.remove()
    assert handle.dump_dir is not None
    src = TorchDump.from_dump(open_dump(handle.dump_dir))
    lin = precheck_node(src, "root.model.layers.0.self_attn.q_proj", 1)
    assert lin.passed is None and "weight was not dumped" in (lin.reason or "") and "\n" not in (lin.reason or "")
    attn = precheck_node(src, "root.model.layers.0.self_attn", 2)
    assert attn.passed is None and "cannot run" in (attn.reason or "")
    assert precheck_node(src, "root.model.layers.0", 1).supported is False


def test_standards_table() -> None:
    assert STANDARDS["bfloat16"] == (2**-8, 99.9)
    assert STANDARDS["float16"] == (2**-10, 99.9)
    assert STANDARDS["float32"] == (2**-20, 99.99)


def test_cli_precheck_torch_module_folder(tmp_path: Path) -> None:
    model = _llama(torch.bfloat16)
    bad = _llama(torch.bfloat16)
    bad.model.layers[1].mlp.down_proj.register_forward_pre_hook(_scale_input(1.03))  # type: ignore[union-attr, index]
    dumps = []
    for m, name in ((model, "good"), (bad, "bad")):
        handle = register_hook(m, DumpConfig(dump_path=tmp_path / name, token_range=[0, 1], dump_weight=True))
        with torch.no_grad():
            _generate(m, steps=2)()
        handle.remove()
        assert handle.dump_dir is not None
        dumps.append(handle.dump_dir)
    good, broken = dumps
    proc = run_wb("precheck", str(good / "1" / "root.model.layers.1.mlp"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("1 ops ran: 1 ok, 0 disagree, 0 not checked")
    proc = run_wb("precheck", str(broken / "1" / "root.model.layers.1"))
    assert proc.returncode == 1
    assert any(line.startswith("FAIL  root.model.layers.1.mlp  act(gate) * up") for line in proc.stdout.splitlines())
    proc = run_wb("precheck", str(broken), "--token", "0", "--node", "root.model.layers.1.mlp.down_proj")
    assert proc.returncode == 0 and "1 ops ran: 1 ok, 0 disagree" in proc.stdout
    proc = invoke_wb("precheck", str(broken), "--node", "root.nope")
    assert proc.returncode == 2 and proc.stderr.startswith("wb: error:") and "root.nope" in proc.stderr
    assert "Traceback" not in proc.stderr
    results = precheck_path(broken / "0" / "root.model.layers.1.mlp")
    assert [r.passed for r in results] == [False]


def test_msit_dump_without_weights_is_not_checked_never_ok(peer_dumps: PeerDumps) -> None:
    """msit's own dumper saves no weights: the MLP's projections cannot be re-run, so the MLP is `not checked`
    (naming them and why), never `ok`, and the exit code (4) says so; a whole token counts each verdict."""
    planted = peer_dumps.need_msit()["planted"]  # layer 1's down_proj writes +Inf: only down_proj could tell
    src = TorchDump.from_dump(open_dump(planted))
    mlp = precheck_node(src, "root.model.layers.1.mlp", 0)
    assert mlp.passed is None and mlp.verdict == NOT_CHECKED, (mlp.passed, mlp.reason)
    assert mlp.not_checked == ["gate_proj", "up_proj", "down_proj"] and mlp.why == WEIGHTS_NOT_DUMPED
    assert {o.label for o in mlp.outputs if o.passed} >= {"act_fn", "act(gate) * up", "out"}

    proc = run_wb("precheck", str(planted), "--token", "0", "--node", "root.model.layers.1.mlp")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "ok    " not in proc.stdout
    line = next(x for x in proc.stdout.splitlines() if "root.model.layers.1.mlp" in x)
    assert line.startswith("?     root.model.layers.1.mlp  not checked: gate_proj, up_proj, down_proj (weights not")
    assert "re-dump with --weights or press d" in line and "passed: act_fn" in line
    assert proc.stdout.splitlines()[-1].startswith("1 ops ran: 0 ok, 0 disagree, 1 not checked; 0 cannot run")

    # every node of token 0: the Linears cannot run (no weight), nothing re-run is no success
    proc = run_wb("precheck", str(planted), "--token", "0")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    counts = dict(part.strip().split(" ", 1)[::-1] for part in last.split(":", 1)[1].replace(";", ",").split(","))
    assert int(counts["cannot run"]) > 0 and int(counts["disagree"]) == 0 and int(counts["have no reference"]) > 0
    cannot = [x for x in proc.stdout.splitlines() if x.startswith("?     ") and "cannot run: " in x]
    assert len(cannot) == int(counts["cannot run"]) and all("weight was not dumped" in x for x in cannot if "proj" in x)
