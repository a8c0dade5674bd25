"""The ATB stack's tensor-parallel mode: ranks equal the single-rank stack, dump one folder per device as
ATB does, and a planted all-reduce defect is named (op, token, culprit rank) by the all-reduce check and
by `wb compare` of an fp32 torch golden run against the ranks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import duckdb
import pytest
import torch

from tests.conftest import invoke_wb, run_wb
from tests.fixtures import tp_atb
from workbench.analysis.checks.allreduce import check_allreduce
from workbench.backends import AtbLlama, Defect
from workbench.backends.atb_tp import run_tp, shard_ranks
from workbench.formats.detect import find_ranks


@pytest.mark.parametrize(("shape", "size"), [("gqa", 2), ("mha", 4)])
def test_tp_ranks_equal_the_single_rank_stack(shape: str, size: int) -> None:
    model = tp_atb.hf_model(shape)
    ids = tp_atb.prompt(model.config.vocab_size)
    single = AtbLlama.from_hf(model, dtype=torch.float32)
    one = single.run(ids, 3)
    ranks = shard_ranks(single, size)
    assert ranks[0].vocab_parallel is (model.config.vocab_size % size == 0)  # 300 split, 257 replicated
    tp = run_tp(ranks, ids, 3)
    assert tp.tokens.tolist() == one.tokens.tolist()
    for a, b in zip(one.logits, tp.logits, strict=True):
        assert a.shape == b.shape == (model.config.vocab_size,)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)  # float rounding of the split sums only


def test_tp_refuses_what_does_not_split() -> None:
    model = tp_atb.hf_model("gqa")  # 2 kv heads
    with pytest.raises(ValueError, match=r"kv heads \(2\) do not divide by the ranks"):
        shard_ranks(AtbLlama.from_hf(model, dtype=torch.float32), 4)
    with pytest.raises(ValueError, match="needs tensor parallelism"):
        AtbLlama.from_hf(model, defect=Defect("allreduce_scale"))


def test_tp_dump_is_one_atb_folder_per_device(tmp_path: Path) -> None:
    model = tp_atb.hf_model("gqa")
    root = tp_atb.tp_dump(model, tmp_path, dtype=torch.bfloat16)
    devs = sorted((root / "tensors").iterdir())
    pid = int(devs[0].name.split("_")[1])
    assert [d.name for d in devs] == [f"0_{pid}", f"1_{pid + 1}"]  # device = rank, one pid per rank
    for r, dev in enumerate(devs):
        p = str(pid + r)
        assert (root / "model" / p / "AtbLlama_Prefill.json").is_file() and (root / "layer" / p).is_dir()
        ar = dev / "0" / "2_Prefill_layer" / "1_Attention" / "5_AllReduceOperation"
        param = json.loads((ar / "op_param.json").read_text())
        assert (param["rank"], param["rankSize"], param["allReduceType"]) == (r, 2, "sum")
        assert (dev / "0" / "2_Prefill_layer" / "4_Mlp" / "3_AllReduceOperation" / "after").is_dir()
        assert sorted(os.listdir(dev / "0" / "6_LmHead")) == [
            "0_LinearOperation",
            "1_AllGatherOperation",
            "2_TransposeOperation",
            "after",
            "before",
            "op_param.json",
        ]
    manifest = json.loads((root / "wb_manifest.json").read_text())
    assert manifest["tensor_parallel"] == {"size": 2, "vocab_parallel": True}
    ranks = find_ranks(root)
    assert [(r.rank, r.label) for r in ranks] == [(0, devs[0].name), (1, devs[1].name)]
    dumps = [r.open() for r in ranks]
    qkv = [
        t
        for t in dumps[0].tensors
        if t.token == 0 and t.node.endswith("0_QKVLinearSplitPack/0_LinearOperation") and t.role == "out"
    ]
    assert qkv[0].shape[-1] == (4 + 2 + 2) * 32 // 2  # this rank's heads of q, k and v
    results = check_allreduce(dumps)
    # 2 all-reduce ops x 3 layers x 3 tokens, on each rank; a correct bf16 sum passes
    assert len(results) == 2 * 3 * 3 * 2 and all(x.passed for x in results)


@pytest.mark.parametrize(
    ("shape", "dtype", "defect", "factor"),
    [
        ("gqa", torch.bfloat16, Defect("allreduce_scale"), 0.97),
        ("mha", torch.float16, Defect("allreduce_scale", layer=0, value=0.95, rank=0), 0.95),
        ("mha", torch.bfloat16, Defect("allreduce_drop"), 0.0),
    ],
)
def test_allreduce_check_names_op_token_and_rank(
    tmp_path: Path, shape: str, dtype: torch.dtype, defect: Defect, factor: float
) -> None:
    model = tp_atb.hf_model(shape)
    root = tp_atb.tp_dump(model, tmp_path, dtype=dtype, defect=defect)
    results = check_allreduce([r.open() for r in find_ranks(root)])
    layer = 1 if defect.layer is None else defect.layer
    culprit = 1 if defect.rank is None else defect.rank
    bad = [x for x in results if not x.passed]
    n = model.config.num_hidden_layers
    expected = {(0, f"{2 + layer}_Prefill_layer/1_Attention/5_AllReduceOperation")} | {
        (t, f"{n + 6 + layer}_Decoder_layer/1_Attention/5_AllReduceOperation") for t in range(1, tp_atb.NEW)
    }
    assert {(x.token, x.node) for x in bad} == expected  # every token, that op only, on both ranks
    assert sorted({x.rank_index for x in bad}) == [0, 1]
    for x in bad:
        assert x.culprit == culprit and x.factor == pytest.approx(factor, abs=0.01), x


@pytest.mark.parametrize(("shape", "dtype"), [("gqa", torch.bfloat16), ("mha", torch.float16)])
def test_compare_golden_with_tp_ranks(tmp_path: Path, shape: str, dtype: torch.dtype) -> None:
    model = tp_atb.hf_model(shape)
    golden = tp_atb.golden_dump(model, tmp_path / "golden")
    test = tp_atb.tp_dump(model, tmp_path / "test", dtype=dtype, defect=Defect("allreduce_scale"), follow=golden)
    out = tmp_path / "out"
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(out))
    text = res.stdout
    assert res.returncode == 0, text[-3000:] + res.stderr[-2000:]
    assert "ranks: golden 1, test 2; paired 2 by the single-rank golden with each rank" in text
    assert "rank 1's contribution scaled by 0.97" in text
    assert "all-reduce check (test): " in text and "all-reduce check (golden)" not in text
    per_rank = text.split("per rank:\n", 1)[1].splitlines()[:2]
    for rank, line in enumerate(per_rank):
        assert line.startswith(f"  rank {rank}: ")
        assert "root.model.layers.1.self_attn.o_proj (token 0)" in line  # the op the all-reduce stands for
        assert "[test op: 3_Prefill_layer/1_Attention/5_AllReduceOperation]" in line
        assert "all-reduce failing: 3 (test 3_Prefill_layer/1_Attention/5_AllReduceOperation (token 0)" in line
    assert "first divergent token: unknown" not in text  # the gathered vocabulary is the logits
    con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
    ranks = con.execute(
        "SELECT t.rank, count(*) FROM comparisons c JOIN runs t ON t.run_id = c.test_run GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert ranks == [(0, 1), (1, 1)]
    assert con.execute("SELECT count(*) FROM runs WHERE rank IS NULL").fetchone() == (1,)  # the one golden run
    summary = con.execute(
        "SELECT rank, pairs > 0, origin_node, allreduce_failed, culprit_rank FROM rank_summary ORDER BY rank"
    ).fetchall()
    assert summary == [(r, True, "root.model.layers.1.self_attn.o_proj", 3, 1) for r in (0, 1)]
    culprits = con.execute(
        "SELECT DISTINCT culprit_rank, round(factor, 2) FROM allreduce_checks WHERE NOT passed"
    ).fetchall()
    assert culprits == [(1, 0.97)]
    # the sharded ops compare with this rank's slice of the golden tensor
    sliced = con.execute("SELECT count(*) FROM matches WHERE transform LIKE 'g.chunk:-1:1:2%'").fetchone()
    assert sliced is not None and sliced[0] > 0


def test_demo_tp_refusals_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    res = invoke_wb("demo", "--tp", "2", "--stack", "torch", "--out", str(out), "--no-tui")
    assert res.returncode == 2 and "tensor parallelism is a mode of the ATB stack" in res.stderr
    res = invoke_wb("demo", "--defect", "allreduce_scale", "--out", str(out), "--no-tui")
    assert res.returncode == 2 and "lives in an all-reduce; give --tp 2" in res.stderr
    res = invoke_wb("demo", "--tp", "3", "--out", str(out), "--no-tui")
    assert res.returncode == 2 and "8 attention heads do not divide by 3 ranks" in res.stderr
    assert not out.exists()
    assert "allreduce_scale" in invoke_wb("demo", "--list-defects").stdout
