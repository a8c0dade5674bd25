"""The ATB-structured Llama: greedy parity with Hugging Face, and the ATB dump it writes."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from tests.fixtures.tiny_models import tiny_llama
from workbench.backends import AtbDumpConfig, AtbLlama
from workbench.formats.atb_bin import read_bin, read_header
from workbench.formats.model import DumpError
from workbench.formats.tensor_io import load_tensor

NEW = 3


@pytest.fixture(scope="module")
def hf() -> LlamaForCausalLM:
    return tiny_llama(0, hidden=128, intermediate=256, vocab=512)


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    return torch.randint(3, 512, (1, 12), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def dump_root(hf: LlamaForCausalLM, prompt: torch.Tensor, tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = AtbLlama.from_hf(hf, dtype=torch.bfloat16)
    run = model.run(prompt, NEW, dump=AtbDumpConfig(tmp_path_factory.mktemp("atb"), seed=0))
    assert run.dump_root is not None
    return run.dump_root


def token_dir(root: Path, token: int) -> Path:
    (dev,) = list((root / "tensors").iterdir())
    return dev / str(token)


def leaf_ops(tok: Path) -> list[str]:
    """Leaf op folders below a token folder, in execution order."""
    found = [
        os.path.relpath(d, tok)
        for d, subs, _ in os.walk(tok)
        if "after" in subs and not any(s[0].isdigit() for s in subs)
    ]
    return sorted(found, key=lambda p: [int(s.split("_")[0]) for s in p.split("/")])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_tokens_match_hf(hf: LlamaForCausalLM, prompt: torch.Tensor, dtype: torch.dtype) -> None:
    ref_model = LlamaForCausalLM(hf.config)
    ref_model.load_state_dict(hf.state_dict())
    ref_model = ref_model.to(dtype).eval()
    ref = ref_model.generate(prompt, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    run = AtbLlama.from_hf(hf, dtype=dtype).run(prompt, 6)
    assert run.tokens.tolist() == ref.tolist()
    with torch.no_grad():
        ref_logits = ref_model(run.tokens[:, :-1]).logits[0, prompt.shape[1] - 1 :].float()
    for step, logits in enumerate(run.logits):
        cos = torch.nn.functional.cosine_similarity(logits, ref_logits[step], dim=0)
        assert cos > 0.999, f"step {step}: cosine {cos}"


def test_dump_layout_and_tensors(dump_root: Path, hf: LlamaForCausalLM, prompt: torch.Tensor) -> None:
    assert re.fullmatch(r"msit_dump_\d{8}_\d{6}", dump_root.name)
    (dev,) = list((dump_root / "tensors").iterdir())
    assert dev.name == f"0_{os.getpid()}"
    assert sorted(p.name for p in dev.iterdir()) == [str(t) for t in range(NEW)]
    tok0 = token_dir(dump_root, 0)
    assert [p.name for p in sorted(tok0.iterdir(), key=lambda p: int(p.name.split("_")[0]))] == [
        "0_WordEmbedding",
        "1_PositionalEmbeddingGather",
        "2_Prefill_layer",
        "3_Prefill_layer",
        "4_RmsNormOperation",
        "5_LmHead",
    ]
    dec = sorted(token_dir(dump_root, 1).iterdir(), key=lambda p: int(p.name.split("_")[0]))
    assert [p.name for p in dec][:3] == ["6_WordEmbedding", "7_PositionalEmbeddingGather", "8_Decoder_layer"]
    leaves = leaf_ops(tok0)
    assert "2_Prefill_layer/1_Attention/0_QKVLinearSplitPack/1_SplitOperation" in leaves
    assert len(leaves) == 5 + 2 * 13  # 3 gathers, final norm, lm head linear; 13 per layer
    for leaf in leaves:
        d = tok0 / leaf
        assert (d / "op_param.json").is_file()
        assert sorted(os.listdir(d / "after")) and all(n.startswith("outtensor") for n in os.listdir(d / "after"))
        assert all(n.startswith("intensor") for n in os.listdir(d / "before"))
    # embedding output = rows of the bf16 table, bit for bit
    emb = tok0 / "0_WordEmbedding/0_GatherOperation/after/outtensor0.bin"
    hdr = read_header(emb)
    assert hdr.dtype == "bfloat16" and hdr.shape == (12, 128) and hdr.layout == "ND"
    raw = np.asarray(read_bin(emb, hdr))
    want = hf.model.embed_tokens.weight.detach().to(torch.bfloat16)[prompt[0]].view(torch.int16).numpy()
    assert np.array_equal(raw.view(np.int16), want)
    # logits: [T, V] at prefill, [1, V] at decode; the argmax of the last row is the next token
    manifest = json.loads((dump_root / "wb_manifest.json").read_text())
    for t in range(NEW):
        base = 0 if t == 0 else 6
        logits = load_tensor(token_dir(dump_root, t) / f"{base + 5}_LmHead/after/outtensor0.bin").float()
        assert logits.shape == ((12, 512) if t == 0 else (1, 512))
        assert int(logits[-1].argmax()) == manifest["generated"][t]
    # token 1: decode input ids = the first generated token
    ids = load_tensor(token_dir(dump_root, 1) / "6_WordEmbedding/before/intensor1.bin")
    assert ids.tolist() == [manifest["generated"][0]]
    # the in-place cache op: its outputs alias its cache inputs, and before != after
    rc = token_dir(dump_root, 1) / "8_Decoder_layer/1_Attention/2_ReshapeAndCacheOperation"
    before = load_tensor(rc / "before/intensor2.bin")
    after = load_tensor(rc / "after/outtensor0.bin")
    assert before.shape == after.shape == (1, 128, 2, 32)
    assert int((before != after).any(dim=(2, 3)).sum()) == 1  # one slot written


def test_manifest(dump_root: Path, prompt: torch.Tensor) -> None:
    m = json.loads((dump_root / "wb_manifest.json").read_text())
    assert m["input_ids"] == prompt[0].tolist()
    assert m["dtype"] == "bfloat16" and m["seed"] == 0 and m["defect"] is None
    assert m["model_config"]["num_hidden_layers"] == 2 and m["cwd"] == os.getcwd()
    assert len(m["generated"]) == NEW and m["graphs"] == {"prefill": "AtbLlama_Prefill", "decode": "AtbLlama_Decoder"}


def _check_node(node: dict, folder: Path, known: set[str]) -> None:
    assert {"opName", "opType", "param", "inTensors", "outTensors"} <= set(node)
    missing = [t for t in node["inTensors"] if t not in known]
    assert not missing, f"{node['opName']} reads {missing} before anything wrote them"
    assert folder.is_dir(), folder
    assert json.loads((folder / "op_param.json").read_text()) == node["param"]
    if "nodes" in node:
        inner = set(known)
        for i, child in enumerate(node["nodes"]):
            assert child["opName"] == f"{child['opType']}_{node['opName'].removeprefix(node['opType'] + '_')}_{i}"
            _check_node(child, folder / f"{i}_{child['opType']}", inner)
            inner.update(child["outTensors"])
    known.update(node["outTensors"])


@pytest.mark.parametrize(("phase", "token"), [("Prefill", 0), ("Decoder", 1)])
def test_topology_agrees_with_folders(dump_root: Path, phase: str, token: int) -> None:
    (pid_dir,) = list((dump_root / "model").iterdir())
    topo = json.loads((pid_dir / f"AtbLlama_{phase}.json").read_text())
    assert topo["modelName"] == f"AtbLlama_{phase}"
    assert len(topo["kCacheTensors"]) == len(topo["vCacheTensors"]) == 2
    assert set(topo["weightTensors"]) < set(topo["inTensors"])
    known = set(topo["inTensors"])
    tok = token_dir(dump_root, token)
    for node in topo["nodes"]:
        op_id = int(node["opName"].rsplit("_", 1)[1])
        _check_node(node, tok / f"{op_id}_{node['opType']}", known)
        if "nodes" in node:
            layer = json.loads((dump_root / "layer" / pid_dir.name / f"{node['opName']}.json").read_text())
            assert layer["opName"] == node["opName"] and len(layer["nodes"]) == len(node["nodes"])
            assert layer["inTensors"][0] == f"{node['opName']}_input_0"
    assert topo["outTensors"][0] in known
    assert topo["nodes"][2]["opType"] == f"{phase}_layer"
    norm = topo["nodes"][2]["nodes"][3]
    assert norm["opType"] == "RmsNormOperation" and norm["param"]["normParam"]["epsilon"] == pytest.approx(1e-6)


def test_options(hf: LlamaForCausalLM, prompt: torch.Tensor, tmp_path: Path) -> None:
    model = AtbLlama.from_hf(hf, dtype=torch.bfloat16)
    full = model.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "full", token_range=[1])).dump_root
    assert full is not None
    assert [p.name for p in token_dir(full, 1).parent.iterdir()] == ["1"]
    stats = model.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "stats", token_range=[1], stats_only=True)).dump_root
    assert stats is not None
    rel = "11_LmHead/0_LinearOperation/after/outtensor0.bin"
    hdr = read_header(token_dir(stats, 1) / rel)
    assert not hdr.has_data and hdr.stats is not None and hdr.shape == (1, 512)
    data = load_tensor(token_dir(full, 1) / rel).double()
    assert hdr.stats.max == pytest.approx(float(data.max())) and hdr.stats.min == pytest.approx(float(data.min()))
    assert hdr.stats.norm == pytest.approx(float(data.norm()), rel=1e-6)
    both = model.run(
        prompt, 1, dump=AtbDumpConfig(tmp_path / "both", save_time=2, save_tensor_part=1, warmup=True)
    ).dump_root
    assert both is not None
    assert sorted(p.name for p in token_dir(both, 0).parent.iterdir()) == ["0", "1"]  # warmup + prefill
    rc = token_dir(both, 1) / "2_Prefill_layer/1_Attention/2_ReshapeAndCacheOperation"
    assert sorted(os.listdir(rc / "before")) == ["outtensor0.bin", "outtensor1.bin"]  # in-place outputs only
    assert sorted(os.listdir(rc / "after")) == ["outtensor0.bin", "outtensor1.bin"]
    warm = load_tensor(token_dir(both, 0) / "5_LmHead/after/outtensor0.bin")
    real = load_tensor(token_dir(both, 1) / "5_LmHead/after/outtensor0.bin")
    assert torch.equal(warm, real)


def test_bad_input(hf: LlamaForCausalLM, prompt: torch.Tensor, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    model = AtbLlama.from_hf(hf, dtype=torch.bfloat16)
    with pytest.raises(DumpError, match="file"):
        model.run(prompt, 1, dump=AtbDumpConfig(blocker))
    with pytest.raises(ValueError, match="save_time"):
        AtbDumpConfig(tmp_path, save_time=7)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model.run(prompt, 500)
    with pytest.raises(ValueError, match="batch 1"):
        model.run(torch.zeros(2, 4, dtype=torch.long), 1)


def test_msit_reads_every_bin(dump_root: Path) -> None:
    tool = pytest.importorskip("msit_llm.common.tool", reason="msit_llm is not installed in this venv")
    files = sorted(dump_root.rglob("*.bin"))
    assert len(files) > 500
    for f in files:
        theirs = tool.read_atb_data(str(f))
        ours = load_tensor(f)
        assert theirs.dtype == ours.dtype and tuple(theirs.shape) == tuple(ours.shape), f
        assert torch.equal(theirs, ours), f
