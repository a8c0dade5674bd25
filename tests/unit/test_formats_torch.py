"""msit torch dumps: a real tiny Llama dumped with forward hooks in msit's layout, read back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import shared_fixtures
from tests.fixtures.formats_helpers import dump_tiny_llama
from workbench.formats import DumpError, load_tensor, open_dump
from workbench.formats.layers import layer_from_name

FIXTURES = shared_fixtures()
DEV = "msit_dump_20250101_120000/torch_tensors/cpu_4242"


@pytest.fixture(scope="module")
def llama_dump(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("llama")
    order = dump_tiny_llama(root / DEV, tokens=2)
    return root, order


def _order(dump) -> list[str]:  # type: ignore[no-untyped-def]
    return [n.name for n in sorted(dump.nodes, key=lambda n: n.exec_order)]


def test_llama_dump_read_back(llama_dump: tuple[Path, list[str]]) -> None:
    root, _ = llama_dump
    d = open_dump(root)
    assert d.kind == "msit_torch"
    assert d.problems == []
    assert d.model_name == "LlamaForCausalLM"
    assert d.root == (root / DEV).resolve()
    assert d.tokens == [0, 1]
    nodes = d.node_map()
    assert nodes["root.model.layers.1.mlp.down_proj"].parent == "root.model.layers.1.mlp"
    assert nodes["root.model.layers.1.mlp.down_proj"].depth == 5
    assert nodes["root.model.layers.1.mlp.down_proj"].type == "Linear"
    assert nodes["root.model.layers.0"].layer == 0
    assert nodes["root.model.layers.1.self_attn.q_proj"].layer == 1
    assert nodes["root.lm_head"].layer is None
    # lm_head: one input, a single output -> output.pth is output 0; headers only, no payload read
    lm = [t for t in d.tensors if t.node == "root.lm_head" and t.token == 1]
    assert {(t.role, t.index) for t in lm} == {("in", 0), ("out", 0)}
    out = next(t for t in lm if t.role == "out")
    assert out.dtype == "float32" and out.shape == (1, 6, 256) and out.error is None
    assert torch.equal(load_tensor(out.path), torch.load(out.path, weights_only=True))
    # the decoder layer returns a tensor in transformers 5; its input is the previous layer's output
    l1_in = next(t for t in d.tensors if t.node == "root.model.layers.1" and t.role == "in" and t.token == 0)
    l0_out = next(t for t in d.tensors if t.node == "root.model.layers.0" and t.role == "out" and t.token == 0)
    assert torch.equal(load_tensor(l1_in.path), load_tensor(l0_out.path))


def test_llama_data_flow_order(llama_dump: tuple[Path, list[str]]) -> None:
    root, true_order = llama_dump
    d = open_dump(root)
    assert d.order_source == "data-flow" and not d.order_known
    order = _order(d)
    pos = {n: i for i, n in enumerate(order)}
    # a parent starts before its children; exec_order is a permutation
    assert sorted(pos.values()) == list(range(len(d.nodes)))
    for n in d.nodes:
        if n.parent is not None:
            assert pos[n.parent] < pos[n.name]
    # definition order would put rotary_emb and the norms after the blocks they precede
    assert pos["root.model.embed_tokens"] < pos["root.model.rotary_emb"]
    assert pos["root.model.embed_tokens"] < pos["root.model.layers.0"]
    for i in (0, 1):
        p = f"root.model.layers.{i}"
        assert pos[f"{p}.input_layernorm"] < pos[f"{p}.self_attn"] < pos[f"{p}.post_attention_layernorm"]
        assert pos[f"{p}.post_attention_layernorm"] < pos[f"{p}.mlp"]
        assert pos[f"{p}.mlp.gate_proj"] < pos[f"{p}.mlp.act_fn"] < pos[f"{p}.mlp.down_proj"]
        assert pos[f"{p}.mlp.up_proj"] < pos[f"{p}.mlp.down_proj"]
    assert pos["root.model.layers.0.mlp.down_proj"] < pos["root.model.layers.1"]
    assert pos["root.model.layers.1"] < pos["root.model.norm"] < pos["root.lm_head"]
    # every other called module sits where it ran; not recoverable from positional inputs: rotary_emb
    # (its cos/sin reach the layers as kwargs) and act_fn vs up_proj (independent of each other)
    called = [n for n in true_order if n != "root.model.rotary_emb" and not n.endswith("act_fn")]
    assert [n for n in order if n in set(called)] == called


def test_manifest_gives_recorded_order(llama_dump: tuple[Path, list[str]], tmp_path: Path) -> None:
    src, true_order = llama_dump
    dev = tmp_path / "cpu_1"
    shutil.copytree(src / DEV, dev)
    manifest = {
        "format": "wb-dump",
        "version": 1,
        "exec_order": {"0": true_order, "1": true_order},
        "command": ["python", "run.py"],
        "cwd": "/x",
        "model_class": "LlamaForCausalLM",
    }
    (dev / "wb_manifest.json").write_text(json.dumps(manifest))
    d = open_dump(dev)
    assert d.order_source == "recorded" and d.order_known
    assert d.meta["command"] == ["python", "run.py"]
    order = _order(d)
    # ModuleList `layers` is never called: it sits just before its first child
    assert [n for n in order if n != "root.model.layers"] == true_order
    assert order.index("root.model.layers") == order.index("root.model.layers.0") - 1


def test_levels_token_and_module(llama_dump: tuple[Path, list[str]]) -> None:
    root, _ = llama_dump
    dev = root / DEV
    full = open_dump(root)
    for level in (root / "msit_dump_20250101_120000", dev.parent, dev, dev / "model_tree.json"):
        d = open_dump(level)
        assert d.kind == "msit_torch" and len(d.tensors) == len(full.tensors)
    tok = open_dump(dev / "1")
    assert tok.tokens == [1] and tok.root == (dev / "1").resolve()
    assert len(tok.tensors) == sum(1 for t in full.tensors if t.token == 1)
    mod = open_dump(dev / "0" / "root.model.layers.1.mlp")
    assert mod.tokens == [0]
    assert {t.node for t in mod.tensors} == {
        f"root.model.layers.1.mlp{s}" for s in ("", ".gate_proj", ".up_proj", ".act_fn", ".down_proj")
    }


def test_outputs_only_falls_back_to_definition(tmp_path: Path) -> None:
    dump_tiny_llama(tmp_path / "cpu_7", tokens=1, tensor_part=1)
    d = open_dump(tmp_path / "cpu_7")
    assert d.order_source == "definition"
    assert all(t.role == "out" for t in d.tensors)
    order = _order(d)
    assert order.index("root.model.rotary_emb") > order.index("root.model.norm")  # definition order


def test_nested_inputs_and_tuple_outputs(tmp_path: Path) -> None:
    dev = tmp_path / "npu0_99"
    tree = {"name": "root", "type": "M", "children": [{"name": "root.a", "type": "A", "children": []}]}
    (dev / "0" / "root.a").mkdir(parents=True)
    (dev / "model_tree.json").write_text(json.dumps(tree))
    folder = dev / "0" / "root.a"
    for stem, value in (
        ("input_0_0", 1.0),
        ("input_0_1", 2.0),
        ("input_1", 3.0),
        ("input_10", 4.0),
        ("output_0", 5.0),
        ("output_1", 6.0),
    ):
        torch.save(torch.full((2,), value), folder / f"{stem}.pth")
    d = open_dump(dev)
    got = {(t.role, t.index): float(load_tensor(t.path)[0]) for t in d.tensors}
    assert got == {("in", 0): 1.0, ("in", 1): 2.0, ("in", 2): 3.0, ("in", 3): 4.0, ("out", 0): 5.0, ("out", 1): 6.0}


def test_statistics_only_dump(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_5"
    tree = {"name": "root", "type": "M", "children": [{"name": "root.fc", "type": "Linear", "children": []}]}
    (dev / "0" / "root.fc").mkdir(parents=True)
    (dev / "model_tree.json").write_text(json.dumps(tree))
    header = "NodeName,NodeType,InputOutput,Index,DataType,Shape,Max,Min,Mean,L2Norm\n"
    call = (
        'root.fc,Linear,Input,0,torch.float16,"(1, 4, 8)",1.5,-2.0,0.25,3.0\n'
        'root.fc,Linear,Output,0,torch.float16,"(1, 4, 16)",{mx},-1.0,0.5,9.0\n'
    )
    # the module ran twice in this token: the last call's rows win
    (dev / "0" / "root.fc" / "statistics.csv").write_text(header + call.format(mx=9.0) + call.format(mx=7.0))
    d = open_dump(dev)
    assert d.problems == []
    by_role = {t.role: t for t in d.tensors}
    assert set(by_role) == {"in", "out"}
    out = by_role["out"]
    assert out.path is None and out.dtype == "float16" and out.shape == (1, 4, 16)
    assert out.stats is not None and out.stats.max == 7.0 and out.stats.norm == 9.0
    assert by_role["in"].stats.min == -2.0


def test_bloom_model_tree_fixture_old_layout(tmp_path: Path) -> None:
    # msit's own UT layout: {pid}_npu0/model_tree.json (a sub-tree) with an empty token folder
    dev = tmp_path / "ait_dump_x" / "torch_tensors" / "1111_npu0"
    (dev / "0").mkdir(parents=True)
    shutil.copy(FIXTURES / "torch_model_tree_bloom_layer.json", dev / "model_tree.json")
    d = open_dump(tmp_path)
    assert d.kind == "msit_torch" and d.tensors == [] and d.problems == []
    assert d.model_name == "BloomLayer"
    nodes = d.node_map()
    assert len(nodes) == 11
    assert nodes["root.transformer.h.2"].parent is None and nodes["root.transformer.h.2"].depth == 0
    assert nodes["root.transformer.h.2.mlp.gelu_impl"].parent == "root.transformer.h.2.mlp"
    assert all(n.layer == 2 for n in d.nodes)
    assert d.order_source == "definition"
    assert _order(d)[:3] == [
        "root.transformer.h.2",
        "root.transformer.h.2.input_layernorm",
        "root.transformer.h.2.self_attention",
    ]


def test_missing_model_tree_rebuilt_from_folders(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_3"
    for mod in ("root.model.layers.0.mlp", "root.model.layers.0.mlp.softmax"):
        (dev / "0" / mod).mkdir(parents=True)
        torch.save(torch.ones(3), dev / "0" / mod / "output.pth")
    d = open_dump(dev)
    assert any("model_tree.json: missing" in p for p in d.problems)
    nodes = d.node_map()
    assert nodes["root.model.layers.0.mlp.softmax"].parent == "root.model.layers.0.mlp"
    assert nodes["root.model.layers.0.mlp.softmax"].layer == 0


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("root.model.layers.12.mlp", 12),
        ("root.transformer.h.2.self_attention", 2),
        ("encoder.layer.5", 5),
        ("blocks.7.attn", 7),
        ("Module.model.layers.3.mlp.LlamaMLP.forward", 3),
        ("root.model.norm", None),
        ("root.hidden.3", None),
        ("root.model.layers", None),
        ("root.h", None),
    ],
)
def test_layer_from_name(name: str, layer: int | None) -> None:
    assert layer_from_name(name) == layer


def test_not_a_dump(tmp_path: Path) -> None:
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "notes.txt").write_text("hello")
    with pytest.raises(DumpError, match="not a dump") as exc:
        open_dump(tmp_path / "stuff")
    assert str(tmp_path / "stuff") in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(DumpError, match="no such file"):
        open_dump(tmp_path / "nope")
    with pytest.raises(DumpError, match="is a file"):
        open_dump(tmp_path / "stuff" / "notes.txt")


def test_content_digest_is_the_same_read_by_runs_or_by_map(tmp_path: Path) -> None:
    """A large contiguous payload is hashed by reading its sampled runs; a strided view of the same values goes
    through the memory map: both give one digest (data-flow order and twins rely on it), other values another,
    and a payload cut short is one line naming the file."""
    from workbench.formats.scan import SMALL_HASH_BYTES, content_key

    torch.manual_seed(0)
    values = torch.randn(256, 300)  # 300 KiB of float32: above SMALL_HASH_BYTES
    assert values.numel() * 4 > SMALL_HASH_BYTES
    torch.save(values.clone(), tmp_path / "flat.pth")
    torch.save(values.t().contiguous().t(), tmp_path / "strided.pth")
    other = values.clone()
    other[0, 5] += 1.0  # in the first sampled run
    torch.save(other, tmp_path / "other.pth")
    flat, strided, changed = (content_key(str(tmp_path / f"{n}.pth")) for n in ("flat", "strided", "other"))
    assert flat[:2] == ("float32", (256, 300)) and strided[:2] == flat[:2]
    assert flat[2] == strided[2]
    assert changed[2] != flat[2]
    data = (tmp_path / "flat.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2] + data[-4096:])  # the zip's directory kept
    with pytest.raises(DumpError) as err:
        content_key(str(tmp_path / "cut.pth"))
    assert "cut.pth" in str(err.value)
