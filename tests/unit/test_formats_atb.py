"""ATB dumps: real `.bin` trees generated from topologies (msit's Bloom fixture and a two-graph model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import shared_fixtures
from tests.fixtures.formats_helpers import write_atb_op, write_atb_tree
from workbench.formats import atb_bin, load_tensor, open_dump
from workbench.formats.model import TensorStats

FIXTURES = shared_fixtures()
TS = "msit_dump_20250102_080000"


def _bloom_dump(root: Path) -> Path:
    dump = root / TS
    (dump / "model" / "2222").mkdir(parents=True)
    shutil.copy(FIXTURES / "atb_model_topology_bloom7b.json", dump / "model" / "2222" / "BloomModel.json")
    topo = json.loads((FIXTURES / "atb_model_topology_bloom7b.json").read_text())
    write_atb_tree(dump / "tensors" / "1_2222", 0, topo)
    return dump


def test_bloom_fixture_topology(tmp_path: Path) -> None:
    dump = _bloom_dump(tmp_path)
    d = open_dump(dump)
    assert d.kind == "atb" and d.problems == []
    assert d.model_name == "Bloom7BFlashAttentionModel"
    assert d.order_source == "topology" and d.tokens == [0]
    nodes = d.node_map()
    layer = nodes["3_BloomLayer"]
    assert layer.type == "BloomLayer" and layer.layer == 0 and layer.parent is None
    assert layer.in_names is not None and len(layer.in_names) == 24 and layer.out_names is not None
    attn = nodes["3_BloomLayer/3_SelfAttentionOperation"]
    assert attn.type == "SelfAttentionOperation" and attn.params is not None
    assert attn.params["headNum"] == 32 and attn.layer == 0 and attn.depth == 1
    assert attn.in_names is not None
    assert attn.in_names[:3] == [
        "Bloom7bCommonLayer_3_internal_2",
        "Bloom7bCommonLayer_3_internal_3",
        "Bloom7bCommonLayer_3_internal_4",
    ]
    deep = nodes["3_BloomLayer/7_MlpGateLayerV2/0_ParallelLinearBaseV2/1_ElewiseOperation"]
    assert deep.parent == "3_BloomLayer/7_MlpGateLayerV2/0_ParallelLinearBaseV2" and deep.depth == 3
    assert deep.out_names == ["MlpGateLayerV2_3_7_internal_0"]
    # pre-order of folder indices, numerically (10 after 9, children after their parent)
    order = [n.name for n in sorted(d.nodes, key=lambda n: n.exec_order)]
    assert order[:3] == ["3_BloomLayer", "3_BloomLayer/0_LayerNormOperation", "3_BloomLayer/1_LinearOperation"]
    assert order.index("3_BloomLayer/10_ElewiseOperation") == len(order) - 1
    assert order.index("3_BloomLayer/4_ParallelLinearBaseV2/1_ElewiseOperation") < order.index(
        "3_BloomLayer/5_ElewiseOperation"
    )
    # tensors: one per topology in/out tensor, readable
    split = [t for t in d.tensors if t.node == "3_BloomLayer/2_SplitOperation"]
    assert sorted((t.role, t.index) for t in split) == [("in", 0), ("out", 0), ("out", 1), ("out", 2)]
    t = split[0]
    assert t.dtype == "float16" and t.shape == (2, 4) and t.layout == "ND"
    assert load_tensor(t.path).shape == (2, 4)


def test_bloom_levels(tmp_path: Path) -> None:
    dump = _bloom_dump(tmp_path)
    full = open_dump(tmp_path)
    dev = dump / "tensors" / "1_2222"
    for level in (dump, dump / "tensors", dev, dev / "0"):
        d = open_dump(level)
        assert d.kind == "atb" and len(d.tensors) == len(full.tensors) and d.nodes[0].type == "BloomLayer"
    op = open_dump(dev / "0" / "3_BloomLayer" / "7_MlpGateLayerV2")
    assert {t.node for t in op.tensors} == {n.name for n in full.nodes if n.name.startswith("3_BloomLayer/7_")}
    before = open_dump(dev / "0" / "3_BloomLayer" / "1_LinearOperation" / "before")
    assert {t.node for t in before.tensors} == {"3_BloomLayer/1_LinearOperation"}
    assert before.nodes[1].type == "LayerNormOperation"  # topology still applied


def _layer(name: str, n: int) -> dict[str, Any]:
    return {
        "opName": name,
        "opType": "LlamaLayer",
        "param": {"rmsNormEps": 1e-6},
        "inTensors": [f"M_input_{n}", f"M_weight_{n}"],
        "outTensors": [f"M_internal_{n}"],
        "nodes": [
            {
                "opName": f"RmsNormOperation_{n}_0",
                "opType": "RmsNormOperation",
                "param": {"epsilon": 1e-6},
                "inTensors": [f"M_input_{n}", f"M_weight_{n}"],
                "outTensors": [f"L_{n}_internal_0"],
            },
            {
                "opName": f"LinearOperation_{n}_1",
                "opType": "LinearOperation",
                "param": {"hasBias": False},
                "inTensors": [f"L_{n}_internal_0"],
                "outTensors": [f"M_internal_{n}"],
            },
        ],
    }


def _graph(start: int) -> dict[str, Any]:
    emb = {
        "opName": f"WordEmbedding_{start}",
        "opType": "WordEmbedding",
        "param": {},
        "inTensors": ["M_input_0", "M_weight_0"],
        "outTensors": ["M_internal_0"],
        "nodes": [
            {
                "opName": f"GatherOperation_{start}_0",
                "opType": "GatherOperation",
                "param": {"axis": 0},
                "inTensors": ["M_weight_0", "M_input_0"],
                "outTensors": ["M_internal_0"],
            }
        ],
    }
    norm = {
        "opName": f"RmsNormOperation_{start + 3}",
        "opType": "RmsNormOperation",
        "param": {"epsilon": 1e-6},
        "inTensors": ["M_internal_2", "M_weight_9"],
        "outTensors": ["M_output_0"],
    }
    return {
        "modelName": "LlamaModel",
        "nodes": [emb, _layer(f"Layer_{start + 1}", start + 1), _layer(f"Layer_{start + 2}", start + 2), norm],
    }


def _two_graph_dump(root: Path, counts: dict[int, tuple[str, ...]]) -> Path:
    dump = root / TS
    model = dump / "model" / "77"
    model.mkdir(parents=True)
    graphs = {"prefill": _graph(0), "decode": _graph(4)}
    (model / "LlamaModel_Decoder.json").write_text(json.dumps(graphs["decode"]))  # sorts before Prefill
    (model / "LlamaModel_Prefill.json").write_text(json.dumps(graphs["prefill"]))
    names = {
        "prefill": ["WordEmbedding", "Prefill_layer", "Prefill_layer", "RmsNormOperation"],
        "decode": ["WordEmbedding", "Decoder_layer", "Decoder_layer", "RmsNormOperation"],
    }
    for count, phases in counts.items():
        for ph in phases:
            write_atb_tree(dump / "tensors" / "0_77", count, graphs[ph], folder_names=names[ph])
    return dump


def test_two_graphs_warmup_and_phases(tmp_path: Path) -> None:
    # folder 0 = warmup (a prefill), folder 1 = prefill + first decode, folder 2 = second decode
    dump = _two_graph_dump(tmp_path, {0: ("prefill",), 1: ("prefill", "decode"), 2: ("decode",)})
    d = open_dump(dump)
    assert d.problems == []
    assert d.meta["atb_graphs"] == {"prefill": "LlamaModel_Prefill.json", "decode": "LlamaModel_Decoder.json"}
    assert d.meta["atb_warmup_folder"] == "0"
    assert d.tokens == [0, 1, 2]
    nodes = d.node_map()
    assert nodes["1_Prefill_layer"].phase == "prefill" and nodes["5_Decoder_layer"].phase == "decode"
    assert nodes["5_Decoder_layer/1_LinearOperation"].phase == "decode"
    assert nodes["1_Prefill_layer"].type == "LlamaLayer"
    assert [
        nodes[n].layer
        for n in (
            "0_WordEmbedding",
            "1_Prefill_layer",
            "2_Prefill_layer",
            "3_RmsNormOperation",
            "5_Decoder_layer",
            "6_Decoder_layer/0_RmsNormOperation",
        )
    ] == [None, 0, 1, None, 0, 1]
    by_token: dict[int, set[str | None]] = {}
    for t in d.tensors:
        by_token.setdefault(t.token, set()).add(nodes[t.node].phase)
        assert "/0/" not in t.path  # warmup tensors left out
    assert by_token == {0: {"prefill"}, 1: {"decode"}, 2: {"decode"}}
    assert nodes["6_Decoder_layer/1_LinearOperation"].params == {"hasBias": False}


def test_two_graphs_without_warmup(tmp_path: Path) -> None:
    dump = _two_graph_dump(tmp_path, {0: ("prefill",), 1: ("decode",), 2: ("decode",)})
    d = open_dump(dump)
    assert "atb_warmup_folder" not in d.meta
    assert d.tokens == [0, 1, 2]
    assert {t.token for t in d.tensors if t.node.startswith("1_Prefill")} == {0}


def test_layouts_stats_and_descriptor_only(tmp_path: Path) -> None:
    dev = tmp_path / TS / "tensors" / "0_5"
    op = {"opType": "LinearOperation", "param": {"hasBias": False}, "inTensors": ["a", "b"], "outTensors": ["c"]}
    write_atb_op(dev / "0" / "0_LinearOperation", op, layout_code=29)
    folder = dev / "0" / "1_RmsNormOperation"
    (folder / "before").mkdir(parents=True)
    (folder / "after").mkdir()
    atb_bin.write_bin_stats(
        folder / "before" / "intensor0.bin", "bfloat16", (1, 8), TensorStats(max=2.5, min=None, mean=0.125, norm=3.0)
    )
    with open(folder / "after" / "outtensor0.bin", "wb") as fh:  # -sd: header only, no stats
        fh.write(b"$Version=1.0\n$Object.Count=0\n$Object.Length=0\nformat=2\ndtype=27\ndims=1,8\n$End=1\n")
    # -time 1: the input only exists after the op ran
    atb_bin.write_bin(folder / "after" / "intensor1.bin", np.ones((8,), np.float32), "float32")
    d = open_dump(dev)
    nz = [t for t in d.tensors if t.node == "0_LinearOperation"]
    assert len(nz) == 3 and all(t.layout == "FRACTAL_NZ" for t in nz)
    rms = {(t.role, t.index): t for t in d.tensors if t.node == "1_RmsNormOperation"}
    st = rms[("in", 0)]
    assert st.path is None and st.dtype == "bfloat16" and st.shape == (1, 8)
    assert st.stats == TensorStats(max=2.5, min=None, mean=0.125, norm=3.0)
    assert rms[("out", 0)].error is not None and "descriptor only" in rms[("out", 0)].error
    assert rms[("in", 1)].path.endswith("after/intensor1.bin")
    assert d.node_map()["1_RmsNormOperation"].type == "RmsNormOperation"  # no topology: folder suffix
    assert d.node_map()["0_LinearOperation"].params == {"hasBias": False}  # from op_param.json


def test_layer_json_expands_graph_op(tmp_path: Path) -> None:
    dump = tmp_path / TS
    (dump / "layer" / "9").mkdir(parents=True)
    layer = _layer("CommonLayerFa_10", 10)
    (dump / "layer" / "9" / "CommonLayerFa_10.json").write_text(json.dumps(layer))
    write_atb_op(dump / "tensors" / "0_9" / "0" / "10_CommonLayerFa", layer)
    d = open_dump(dump)
    nodes = d.node_map()
    assert nodes["10_CommonLayerFa"].type == "LlamaLayer" and nodes["10_CommonLayerFa"].layer == 0
    assert nodes["10_CommonLayerFa/1_LinearOperation"].in_names == ["L_10_internal_0"]


def test_pick_device_and_note_others(tmp_path: Path) -> None:
    dump = _bloom_dump(tmp_path)
    shutil.copytree(dump / "tensors" / "1_2222", dump / "tensors" / "2_2222")
    d = open_dump(dump)
    assert d.meta["device_folder"] == "1_2222"
    assert d.meta["other_candidates"] == [str((dump / "tensors" / "2_2222").resolve())]


@pytest.mark.parametrize("shape", [(3, 5)])
def test_bf16_bin_roundtrip(tmp_path: Path, shape: tuple[int, int]) -> None:
    import torch

    dev = tmp_path / "tensors" / "0_1"
    (dev / "0" / "0_Op" / "after").mkdir(parents=True)
    ref = torch.randn(shape).to(torch.bfloat16)
    atb_bin.write_bin(
        dev / "0" / "0_Op" / "after" / "outtensor0.bin", ref.view(torch.int16).numpy().view(np.uint16), "bfloat16"
    )
    d = open_dump(tmp_path)
    (t,) = d.tensors
    assert t.dtype == "bfloat16" and t.shape == shape
    assert torch.equal(load_tensor(t.path), ref)
