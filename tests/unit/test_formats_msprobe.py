"""msprobe dumps: the tiny Llama dumped at mix level (modules + one API) with real .pt files, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.fixtures.formats_helpers import dump_msprobe_llama
from workbench.formats import load_tensor, open_dump

MLP0 = "Module.model.layers.0.mlp.LlamaMLP.forward"


@pytest.fixture(scope="module")
def two_forwards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("msprobe")
    dump_msprobe_llama(root, steps=1, forwards_per_step=2)
    return root


def test_nodes_tokens_and_order(two_forwards: Path) -> None:
    d = open_dump(two_forwards)
    assert d.kind == "msprobe" and d.problems == [] and d.order_source == "recorded"
    assert d.tokens == [0, 1]
    assert d.meta["token_rule"] == "call counter of the outermost module"
    nodes = d.node_map()
    # the k-th forward's calls (counter k) become one node per module
    assert MLP0 in nodes and f"{MLP0}.0" not in nodes
    assert nodes[MLP0].type == "LlamaMLP" and nodes[MLP0].layer == 0
    assert nodes[MLP0].parent == "Module.model.layers.0.LlamaDecoderLayer.forward"
    silu = nodes["Functional.silu.1.forward"]  # the second silu within a forward: layer 1's
    assert silu.parent == "Module.model.layers.1.mlp.act_fn.SiLUActivation.forward" and silu.layer == 1
    assert {t.token for t in d.tensors if t.node == "Functional.silu.1.forward"} == {0, 1}
    # dump.json lists a module after its children (written at completion); parents still come first
    order = [n.name for n in sorted(d.nodes, key=lambda n: n.exec_order)]
    assert order[0] == "Module.model.LlamaModel.forward" and order[-1] == "Module.lm_head.Linear.forward"
    pos = {n: i for i, n in enumerate(order)}
    for n in d.nodes:
        if n.parent is not None:
            assert pos[n.parent] < pos[n.name]
    rotary = "Module.model.rotary_emb.LlamaRotaryEmbedding.forward"
    assert pos["Module.model.embed_tokens.Embedding.forward"] < pos[rotary]
    assert (
        pos[f"{MLP0[: -len('LlamaMLP.forward')]}act_fn.SiLUActivation.forward"]
        < pos["Module.model.layers.0.mlp.up_proj.Linear.forward"]
    )


def test_tensor_files_and_stats(two_forwards: Path) -> None:
    d = open_dump(two_forwards / "step0" / "rank0")
    entries = {(t.token, t.role, t.index): t for t in d.tensors if t.node == MLP0}
    assert set(entries) == {(0, "in", 0), (0, "out", 0), (1, "in", 0), (1, "out", 0)}
    out1 = entries[(1, "out", 0)]
    assert out1.path is not None and out1.path.endswith(f"{MLP0}.1.output.0.pt")
    assert out1.dtype == "float32" and out1.shape == (1, 5, 64)
    t = load_tensor(out1.path)
    assert out1.stats is not None and out1.stats.max == pytest.approx(float(t.max()))
    silu_in = [t for t in d.tensors if t.node == "Functional.silu.0.forward" and t.role == "in"]
    assert len(silu_in) == 2  # the kwarg `inplace` is not a tensor: one input per token


def test_statistics_only_steps_are_tokens(tmp_path: Path) -> None:
    dump_msprobe_llama(tmp_path, steps=3, forwards_per_step=1, save_tensors=False)
    d = open_dump(tmp_path)
    assert d.meta["token_rule"] == "step number (one forward per step)"
    assert d.tokens == [0, 1, 2] and d.meta["steps"] == [0, 1, 2]
    assert all(t.path is None and t.stats is not None and t.stats.norm is not None for t in d.tensors)
    lm = [t for t in d.tensors if t.node == "Module.lm_head.Linear.forward" and t.role == "out"]
    assert [t.shape for t in sorted(lm, key=lambda t: t.token)] == [(1, 4, 256), (1, 5, 256), (1, 6, 256)]
    one_step = open_dump(tmp_path / "step2")
    assert one_step.tokens == [2]


def test_repeated_module_and_api_outside_modules(tmp_path: Path) -> None:
    rank = tmp_path / "step0" / "rank"
    rank.mkdir(parents=True)

    def desc(v: float) -> dict[str, object]:
        return {
            "type": "torch.Tensor",
            "dtype": "torch.float16",
            "shape": [2],
            "Max": v,
            "Min": v,
            "Mean": v,
            "Norm": v,
        }

    data = {
        "Tensor.__add__.0.forward": {"input_args": [desc(1.0)], "input_kwargs": {}, "output": [desc(2.0)]},
        "Module.act.GELU.forward.0": {"input_args": [desc(2.0)], "input_kwargs": {}, "output": [desc(3.0)]},
        "Module.act.GELU.forward.1": {"input_args": [desc(3.0)], "input_kwargs": {}, "output": [desc(4.0)]},
        "Module.act.GELU.backward.0": {"input": [desc(0.1)], "output": [desc(0.2)]},
        "Module.act.GELU.parameters_grad.0": {"weight": [desc(0.3)]},
    }
    (rank / "dump.json").write_text(json.dumps({"task": "statistics", "level": "mix", "data": data}))
    (rank / "construct.json").write_text(
        json.dumps({"Module.act.GELU.forward.0": None, "Module.act.GELU.forward.1": None})
    )
    d = open_dump(tmp_path)
    assert d.meta["skipped_entries"] == 2
    # a module called twice in one forward would look like two forwards: two top-level counters -> tokens 0, 1
    assert sorted((t.token, t.node) for t in d.tensors if t.role == "out") == [
        (0, "Module.act.GELU.forward"),
        (0, "Tensor.__add__.0.forward"),
        (1, "Module.act.GELU.forward"),
    ]


def test_missing_pt_is_a_problem(tmp_path: Path) -> None:
    dump_msprobe_llama(tmp_path, steps=1, forwards_per_step=1)
    data_dir = tmp_path / "step0" / "rank0" / "dump_tensor_data"
    victim = data_dir / f"{MLP0}.0.output.0.pt"
    victim.unlink()
    d = open_dump(data_dir)  # the dump_tensor_data level works too
    assert d.problems == [f"{victim}: missing file"]
    (bad,) = [t for t in d.tensors if t.node == MLP0 and t.role == "out"]
    assert bad.error == "missing file" and bad.stats is not None  # stats from dump.json still there
    assert sum(t.error is None for t in d.tensors) == len(d.tensors) - 1
    assert torch.is_tensor(load_tensor(next(t.path for t in d.tensors if t.error is None)))


def test_parameters_pair_by_name_when_a_bias_is_dropped(tmp_path: Path) -> None:
    """msprobe's own dumper (level mix): the test port forgot layer 0's q_proj bias. Its weight pairs with the golden
    weight (not with the golden bias), and the golden bias stays unpaired."""
    pytest.importorskip("msprobe.pytorch", reason="msprobe not installed")
    from tests.conftest import run_wb
    from tests.fixtures.peer_dumps import dump

    ids = dump("msprobe", tmp_path / "g", qwen=True)
    dump("msprobe", tmp_path / "t", qwen=True, drop_bias=True, forced=ids)
    res = run_wb(
        "compare", "-gp", str(tmp_path / "g" / "dump"), "-mp", str(tmp_path / "t" / "dump"), "-o", str(tmp_path / "o")
    )
    assert res.returncode in (0, 1), res.stderr
    import duckdb

    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT golden_node, golden_index, test_index, cosine_similarity, cmp_fail_reason FROM comparison "
        "WHERE io = 'param' AND golden_node LIKE '%layers.0.self_attn.q_proj.%'"
    ).fetchall()
    con.close()
    assert rows, res.stdout
    assert all(r[4] is None or "shape" not in str(r[4]) for r in rows), rows
    assert {(r[1], r[2]) for r in rows} == {(0, 0)}, rows  # weight with weight; the bias has no partner
    assert all(r[3] is not None and r[3] > 0.9999 for r in rows), rows
