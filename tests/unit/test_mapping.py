"""Mapping files: ours round-trips, msit's is read as msit means it (minus its defects)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.compare.pairing.frames import NodeTable, RunFrames, TensorTable
from workbench.compare.pairing.mapping import (
    MappingError,
    MappingFile,
    PairSpec,
    RuleSpec,
    TensorSel,
    expand_rule,
    rule_across_layers,
)
from workbench.compare.pairing.matching import match_nodes, pair_tensors


def test_tensor_selector_parsing() -> None:
    assert TensorSel.parse("out:0") == TensorSel("out", 0)
    assert TensorSel.parse("input:2") == TensorSel("in", 2)
    assert TensorSel.parse("out") == TensorSel("out", None)
    assert TensorSel.parse(None) == TensorSel()
    assert str(TensorSel("in", 3)) == "in:3"
    with pytest.raises(ValueError, match="selector"):
        TensorSel.parse("weights:1")


def test_wb_mapping_round_trip(tmp_path: Path) -> None:
    mf = MappingFile()
    mf.add_pair(PairSpec("root.model.layers.0.mlp", "2_Prefill_layer/5_Mlp", TensorSel("out", 0), TensorSel("out", 0)))
    mf.rules.append(RuleSpec("root.model.layers.*.mlp.down_proj", "*_Prefill_layer/9_LinearOperation"))
    mf.remove_pair("root.model.norm", "7_RmsNormOperation")
    saved = mf.save(tmp_path)
    assert saved.name == "wb_mapping.json"
    data = json.loads(saved.read_text())
    assert data["format"] == "wb-mapping" and data["version"] == 1
    back = MappingFile.load(tmp_path)
    assert back.pairs == mf.pairs
    assert back.rules == mf.rules
    assert back.unpaired == [("root.model.norm", "7_RmsNormOperation")]
    assert back.digest() == mf.digest()
    # re-pairing a rejected pair lifts the rejection
    back.add_pair(PairSpec("root.model.norm", "7_RmsNormOperation"))
    assert back.unpaired == []


def test_msit_mapping_file_string_value_is_one_type(tmp_path: Path) -> None:
    (tmp_path / "op_mapping_file.json").write_text(
        json.dumps(
            {"RmsNormOperation": "LlamaRMSNorm", "SelfAttentionOperation_outtensor0": ["CoreAttention_output_0"]}
        )
    )
    mf = MappingFile.load(tmp_path)
    types = {t.test_type: t for t in mf.types}
    assert types["RmsNormOperation"].golden_types == ["LlamaRMSNorm"]  # msit would iterate characters
    sa = types["SelfAttentionOperation"]
    assert sa.test_tensor == TensorSel("out", 0)
    assert sa.golden_types == ["CoreAttention"] and sa.golden_tensors == [TensorSel("out", 0)]


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "not valid JSON"),
        ('["a"]', "expected a JSON object"),
        ('{"Rms-Norm": "X"}', "letters, digits"),
        ('{"format": "wb-mapping", "version": 99}', "newer"),
    ],
)
def test_bad_mapping_files_name_the_file(tmp_path: Path, content: str, reason: str) -> None:
    f = tmp_path / "m.json"
    f.write_text(content)
    with pytest.raises(MappingError, match=reason) as err:
        MappingFile.load(f)
    assert str(f) in str(err.value)


def _frames(run_id: int, kind: str, nodes: list[tuple[str, str, int | None]], tokens: int = 2) -> RunFrames:
    node_rows = [(i, name, typ, None, i, layer, None, None) for i, (name, typ, layer) in enumerate(nodes)]
    rows = []
    for tok in range(tokens):
        for nid in range(len(nodes)):
            rows.append((len(rows), tok, nid, "in", 0))
            rows.append((len(rows), tok, nid, "out", 0))
            rows.append((len(rows), tok, nid, "out", 1))
    return RunFrames(run_id, kind, NodeTable.of_rows(node_rows), TensorTable.of_rows(rows))


def test_ladder_rules_types_names_and_rejections() -> None:
    golden = _frames(
        1,
        "msit_torch",
        [
            ("root.model.layers.0.mlp.down_proj", "Linear", 0),
            ("root.model.layers.1.mlp.down_proj", "Linear", 1),
            ("root.model.layers.0.input_layernorm", "LlamaRMSNorm", 0),
            ("root.model.layers.1.input_layernorm", "LlamaRMSNorm", 1),
            ("root.lm_head", "Linear", None),
        ],
    )
    test = _frames(
        2,
        "atb",
        [
            ("2_Prefill_layer/9_LinearOperation", "LinearOperation", 0),
            ("3_Prefill_layer/9_LinearOperation", "LinearOperation", 1),
            ("2_Prefill_layer/0_RmsNormOperation", "RmsNormOperation", 0),
            ("3_Prefill_layer/0_RmsNormOperation", "RmsNormOperation", 1),
            ("5_LmHead", "LmHead", None),
        ],
    )
    mf = MappingFile()
    mf.rules.append(RuleSpec("root.model.layers.*.mlp.down_proj", "*_Prefill_layer/9_LinearOperation"))
    mf.types.extend(MappingFile._type_rules({"RmsNormOperation": ["RMSNorm"]}))
    mf.add_pair(PairSpec("root.lm_head", "5_LmHead", TensorSel("out", 0), TensorSel("out", 0)))
    mf.remove_pair("root.model.layers.1.input_layernorm", "3_Prefill_layer/0_RmsNormOperation")
    matches = match_nodes(golden, test, mf)
    got = {(golden.nodes.name[m.golden_node_id], test.nodes.name[m.test_node_id], m.method) for m in matches}
    assert got == {
        ("root.lm_head", "5_LmHead", "mapping-file"),
        ("root.model.layers.0.mlp.down_proj", "2_Prefill_layer/9_LinearOperation", "mapping-rule"),
        ("root.model.layers.1.mlp.down_proj", "3_Prefill_layer/9_LinearOperation", "mapping-rule"),
        ("root.model.layers.0.input_layernorm", "2_Prefill_layer/0_RmsNormOperation", "type-map"),
    }
    pairs = pair_tensors(matches, golden, test, tokens={1})
    assert set(pairs.token_id.tolist()) == {1}
    lm = pairs.take(pairs.golden_node_id == 4)
    assert len(lm) == 1 and lm.io == ["out"]  # explicit out:0 <-> out:0 only
    down0 = pairs.take(pairs.golden_node_id == 0)
    assert sorted(zip(down0.io, (down0.golden_tensor_id % 3).tolist())) == [("in", 0), ("out", 1), ("out", 2)]
    # type-map defaults to outputs only
    norm0 = pairs.take(pairs.golden_node_id == 2)
    assert set(norm0.io) == {"out"}


def test_identical_names_only_between_same_kinds() -> None:
    nodes = [("root.a", "Linear", None), ("root.b", "Linear", None)]
    g, t = _frames(1, "msit_torch", nodes), _frames(2, "msit_torch", nodes[:1])
    matches = match_nodes(g, t, None)
    assert [(m.golden_node_id, m.test_node_id, m.method) for m in matches] == [(0, 0, "name")]
    assert match_nodes(g, _frames(3, "atb", nodes), None) == []


def test_rule_across_layers_wildcards_the_layer_number() -> None:
    """The editor's `l`: the number that reaches the same op in other layers becomes `*`, on torch and ATB names;
    the rule pairs each layer's op with the one test op of that layer."""
    torch_nodes = [(f"root.model.layers.{i}.mlp.experts.{e}.act_fn", i) for i in range(3) for e in range(2)]
    atb_nodes = [(f"{i + 2}_Prefill_layer/{k}_ActivationOperation", i) for i in range(3) for k in (4, 9)]
    rule = rule_across_layers(
        "root.model.layers.1.mlp.experts.0.act_fn",
        "3_Prefill_layer/9_ActivationOperation",
        torch_nodes,
        atb_nodes,
        TensorSel("out", 0),
        TensorSel("out", 0),
    )
    assert rule == RuleSpec(
        "root.model.layers.*.mlp.experts.0.act_fn",
        "*_Prefill_layer/9_ActivationOperation",
        TensorSel("out", 0),
        TensorSel("out", 0),
    )
    assert expand_rule(rule, torch_nodes, atb_nodes) == [
        (f"root.model.layers.{i}.mlp.experts.0.act_fn", f"{i + 2}_Prefill_layer/9_ActivationOperation")
        for i in range(3)
    ]
    # a taken golden node is skipped; a layer with two candidates pairs nothing
    twice = [*atb_nodes, ("12_Prefill_layer/9_ActivationOperation", 2)]
    assert [g for g, _ in expand_rule(rule, torch_nodes, twice, taken={torch_nodes[0][0]})] == [
        "root.model.layers.1.mlp.experts.0.act_fn"
    ]
    # one layer only: no number reaches another layer, no rule
    assert rule_across_layers("root.lm_head", "5_LmHead", [("root.lm_head", None)], [("5_LmHead", None)]) is None


def test_a_mapping_pair_for_one_token_leaves_the_other_tokens_verdicts(tmp_path: Path) -> None:
    """Golden: msit's own dumper; test: the ATB-structured stack (prefill and decoder graphs name their ops apart),
    a wrong RMSNorm epsilon. An explicit pair for the prefill op where the error is born leaves the decode tokens'
    verdicts where they were (the decode ops are still paired by the automatic mapping)."""
    pytest.importorskip("msit_llm", reason="msit_llm not installed")
    import duckdb
    import torch

    from tests.conftest import run_wb
    from tests.fixtures.peer_dumps import STEPS, _prompt, dump
    from tests.fixtures.tiny_models import tiny_llama
    from workbench.backends.atb_dump import AtbDumpConfig
    from workbench.backends.atb_llama import AtbLlama
    from workbench.backends.defects import Defect

    ids = dump("msit", tmp_path / "golden")
    golden = next((tmp_path / "golden").glob("msit_dump_*/torch_tensors/*"))
    atb = AtbLlama.from_hf(tiny_llama(), dtype=torch.bfloat16, defect=Defect("rmsnorm_eps"))
    run = atb.run(_prompt(), STEPS, dump=AtbDumpConfig(dump_path=tmp_path / "test"), forced=ids)
    assert run.dump_root is not None

    def verdicts(out: Path, *extra: str) -> dict[int, tuple[str | None, str | None]]:
        res = run_wb("compare", "-gp", str(golden), "-mp", str(run.dump_root), "-o", str(out), *extra)
        assert res.returncode in (0, 1), res.stderr
        con = duckdb.connect(str(out / "catalog.duckdb"), read_only=True)
        try:
            rows = con.execute(
                "SELECT b.token_id, gn.name, tn.name FROM error_born b JOIN comparisons c USING (cmp_id) "
                "LEFT JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = b.golden_node_id "
                "LEFT JOIN nodes tn ON tn.run_id = c.test_run AND tn.node_id = b.test_node_id ORDER BY 1"
            ).fetchall()
        finally:
            con.close()
        return {int(t): (g, n) for t, g, n in rows}

    before = verdicts(tmp_path / "o1")
    g0, t0 = before[0]
    assert g0 is not None and t0 is not None and "Prefill" in t0, before
    assert all(t is not None and "Prefill" not in t for _g, t in list(before.values())[1:]), before
    mapping = tmp_path / "map.json"
    mapping.write_text(json.dumps({"format": "wb-mapping", "version": 1, "pairs": [{"golden": g0, "test": t0}]}))
    after = verdicts(tmp_path / "o2", "-mf", str(mapping))
    assert after == before, (before, after)
