"""Mappings that stay true: a mapping saved with the fingerprint of its dumps, then compared against changed dumps
(a layer dropped, an intermediate size changed, a module inserted by msit's own dumper): the pairs that no longer
fit are reported stale, stored in `mapping_stale` and not used; the app's editor marks them, drops or keeps them,
and its save makes the mapping clean again."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import torch

from tests.conftest import dump_run, run_wb
from workbench.analysis.explorer.explore import Explorer
from workbench.compare.pairing.mapping import MappingFile, PairSpec, RuleSpec, TensorSel

DOWN = "root.model.layers.0.mlp.down_proj"
MLP1 = "root.model.layers.1.mlp"
NORM = "root.model.norm"


def _llama(layers: int, intermediate: int):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(11)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=128,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


def _mapping() -> MappingFile:
    mf = MappingFile()
    mf.pairs = [
        PairSpec(DOWN, DOWN),
        PairSpec(MLP1, MLP1, TensorSel("out", 0), TensorSel("out", 0)),
        PairSpec(NORM, NORM),
    ]
    mf.rules = [
        RuleSpec("root.model.layers.*.self_attn.o_proj", "root.model.layers.*.self_attn.o_proj"),
        RuleSpec("root.model.layers.*.fused_qkv", "root.model.layers.*.fused_qkv"),  # matches nothing
    ]
    return mf


def _stamped(catalog: Path, mapping: MappingFile, path: Path) -> Path:
    """Save `mapping` as the editor does: with the fingerprint of the comparison's dumps."""
    ex = Explorer(catalog)
    try:
        ex.stamp_mapping(mapping, set())
    finally:
        ex.close()
    return mapping.save(path)


def _compare(golden: Path, test: Path, out: Path, *extra: str) -> str:
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(out), "--workers", "1", *extra)
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def _methods(catalog: Path, golden_node: str) -> set[str]:
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        rows = con.execute(
            "SELECT m.method FROM node_matches m JOIN comparisons c USING (cmp_id) JOIN nodes g "
            "ON g.run_id = c.golden_run AND g.node_id = m.golden_node_id WHERE g.name = ? "
            "AND c.cmp_id = (SELECT max(cmp_id) FROM comparisons)",
            [golden_node],
        ).fetchall()
    finally:
        con.close()
    return {str(r[0]) for r in rows}


@pytest.fixture(scope="module")
def changed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Golden (2 layers, intermediate 128, fp32), test as saved (bf16), and the test re-dumped from a changed
    model (1 layer, intermediate 96); the mapping saved on golden vs the first test."""
    base = tmp_path_factory.mktemp("stale")
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(5))
    model = _llama(2, 128)
    golden, tokens = dump_run(model, base / "golden", prompt, None, steps=2)
    test, _ = dump_run(_llama(2, 128).to(torch.bfloat16), base / "test", prompt, tokens, steps=2)
    redumped, _ = dump_run(_llama(1, 96).to(torch.bfloat16), base / "redumped", prompt, tokens, steps=2)
    _compare(golden, test, base / "out0")
    mapping = _stamped(base / "out0" / "catalog.duckdb", _mapping(), base / "wb_mapping.json")
    return {"base": base, "golden": golden, "test": test, "redumped": redumped, "mapping": mapping}


def test_saved_mapping_carries_a_fingerprint_and_fits_its_own_dumps(changed: dict[str, Path]) -> None:
    data = json.loads(changed["mapping"].read_text())
    assert data["fingerprint"]["golden"]["nodes"] > 10 and len(data["fingerprint"]["test"]["digest"]) == 32
    down = next(p for p in data["pairs"] if p["golden"] == DOWN)
    assert down["fingerprint"]["golden"]["tensors"]["in:0"] == "float32[1,6,128]"
    assert down["fingerprint"]["test"]["tensors"]["out:0"] == "bfloat16[1,6,64]"
    out = _compare(changed["golden"], changed["test"], changed["base"] / "out1", "-mf", str(changed["mapping"]))
    assert "mapping: 3 pairs checked against its fingerprint, none stale" in out
    assert "mapping: 1 rule matches nothing here (root.model.layers.*.fused_qkv <-> " in out
    assert _methods(changed["base"] / "out1" / "catalog.duckdb", DOWN) == {"mapping-file"}


def test_changed_dumps_make_pairs_stale_reported_stored_and_not_used(changed: dict[str, Path]) -> None:
    out_dir = changed["base"] / "out2"
    out = _compare(changed["golden"], changed["redumped"], out_dir, "-mf", str(changed["mapping"]), "--show-stale")
    line = next(x for x in out.splitlines() if x.startswith("mapping: 2 of 3 pairs stale ("))
    assert "shape of root.model.layers.0.mlp.down_proj in:0 changed 128 -> 96" in line
    assert f"node {MLP1} not in the test dump" in line
    assert line.endswith("(wb compare --show-stale, table mapping_stale, the app's mapping editor)")
    assert "test topology changed since it was saved" in line
    assert f"  stale pair: {MLP1} ⇄ {MLP1} [out:0 / out:0]: node {MLP1} not in the test dump" in out
    assert "  stale rule: root.model.layers.*.fused_qkv <-> root.model.layers.*.fused_qkv: the rule matches no" in out
    catalog = out_dir / "catalog.duckdb"
    con = duckdb.connect(str(catalog), read_only=True)
    rows = con.execute("SELECT kind, golden, reason, mapping FROM mapping_stale ORDER BY kind, golden").fetchall()
    con.close()
    assert [(r[0], r[1]) for r in rows] == [
        ("pair", DOWN),
        ("pair", MLP1),
        ("rule", "root.model.layers.*.fused_qkv"),
    ]
    assert all(r[3] == str(changed["mapping"]) for r in rows)
    assert "mapping-file" not in _methods(catalog, DOWN)  # never used silently: matched on its own, if at all
    assert _methods(catalog, NORM) == {"mapping-file"}  # the pair that still fits is used


def test_mapping_without_fingerprint_and_msit_type_map(changed: dict[str, Path], tmp_path: Path) -> None:
    data = json.loads(changed["mapping"].read_text())
    data.pop("fingerprint")
    for p in data["pairs"]:
        p.pop("fingerprint")
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    out = _compare(changed["golden"], changed["redumped"], tmp_path / "out", "-mf", str(old))
    lines = [x for x in out.splitlines() if x.startswith("mapping:")]
    assert lines[0] == (
        "mapping: no fingerprint: pairs not checked (re-save it in the app's mapping editor); "
        "1 name a node not in these dumps: not used"
    )
    assert sum("no fingerprint" in x for x in lines) == 1
    assert _methods(tmp_path / "out" / "catalog.duckdb", DOWN) == {"mapping-file"}  # unchecked: used as before
    msit = tmp_path / "op_mapping_file.json"
    msit.write_text(json.dumps({"LinearOperation": "Linear"}))
    out = _compare(changed["golden"], changed["redumped"], tmp_path / "out_msit", "-mf", str(msit))
    assert "mapping:" not in out


def test_msit_dump_with_an_inserted_module_makes_a_pair_stale(peer_dumps, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """msit's own dumper: a mapping saved on golden vs golden, then used on a test run whose `model.layers`
    gained a module at index 1 (every later layer renamed)."""
    msit = peer_dumps.need_msit()
    golden, test = msit["golden"], msit["test"]
    _compare(golden, golden, tmp_path / "out0")
    mf = MappingFile()
    mf.pairs = [PairSpec("root.model.layers.0.mlp", "root.model.layers.0.mlp"), PairSpec(MLP1, MLP1)]
    mapping = _stamped(tmp_path / "out0" / "catalog.duckdb", mf, tmp_path / "m.json")
    out = _compare(golden, test, tmp_path / "out", "-mf", str(mapping))
    line = next(x for x in out.splitlines() if x.startswith("mapping:"))
    assert line.startswith(f"mapping: 1 of 2 pairs stale (node {MLP1} not in the test dump); not used"), line
    assert _methods(tmp_path / "out" / "catalog.duckdb", "root.model.layers.0.mlp") == {"mapping-file"}


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_editor_marks_drops_keeps_and_saves_stale_pairs(changed: dict[str, Path], anyio_backend: str) -> None:
    from textual.widgets import OptionList

    from tests.app.test_app_pilot import ready, wait_for
    from workbench.app.launch import make_app
    from workbench.app.mapping_screen import MappingScreen

    base = changed["base"]
    work = base / "editor"
    work.mkdir()
    mapping = work / "wb_mapping.json"
    mapping.write_text(changed["mapping"].read_text())
    _compare(changed["golden"], changed["redumped"], work / "out", "-mf", str(mapping))
    app = make_app(catalog=work / "out" / "catalog.duckdb", mapping=mapping)
    async with app.run_test(size=(200, 50)) as pilot:
        await ready(pilot, app)
        await wait_for(pilot, lambda: any("2 stale pairs" in n.message for n in app._notifications), timeout=30)
        await pilot.press("e")
        await wait_for(pilot, lambda: isinstance(app.screen, MappingScreen), timeout=10)
        editor = app.screen
        assert isinstance(editor, MappingScreen)
        await wait_for(pilot, lambda: len(editor.stale) == 2, timeout=60)
        plist = editor.query_one("#pairs-list", OptionList)
        prompts = [str(plist.get_option_at_index(i).prompt) for i in range(plist.option_count)]
        stale_rows = [p for p in prompts if p.startswith("STALE ")]
        assert len(stale_rows) == 2 and any("changed 128 -> 96" in p for p in stale_rows)
        assert "2 STALE (not used" in str(editor.query_one("#map-status").render())
        plist.focus()
        # drop the pair whose test node is gone
        plist.highlighted = next(i for i, p in enumerate(prompts) if p.startswith(f"STALE {MLP1}"))
        await pilot.press("x")
        await wait_for(pilot, lambda: len(editor.stale) == 1, timeout=10)
        assert all(p.golden != MLP1 for p in editor.mapping.pairs)
        # keep down_proj as it is now: compared from now on
        plist.highlighted = 0
        assert str(plist.get_option_at_index(0).prompt).startswith(f"STALE {DOWN}")
        await pilot.press("p")
        await wait_for(pilot, lambda: not editor.stale, timeout=10)
        await wait_for(pilot, lambda: any(p.golden == DOWN and p.method == "editor" for p in editor.pairs), timeout=120)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: not editor.dirty, timeout=10)
    saved = json.loads(mapping.read_text())
    assert [p["golden"] for p in saved["pairs"]] == [DOWN, NORM]
    down = saved["pairs"][0]["fingerprint"]
    assert down["golden"]["tensors"]["in:0"] == "float32[1,6,128]" and down["test"]["tensors"]["in:0"] == (
        "bfloat16[1,6,96]"
    )
    out = _compare(changed["golden"], changed["redumped"], work / "out2", "-mf", str(mapping))
    assert "mapping: 2 pairs checked against its fingerprint, none stale" in out
    assert _methods(work / "out2" / "catalog.duckdb", DOWN) == {"mapping-file"}


def test_fingerprint_round_trip_and_bad_fingerprints(tmp_path: Path) -> None:
    from workbench.compare.pairing.fingerprint import NodePrint, node_changes
    from workbench.compare.pairing.mapping import MappingError

    mf = _mapping()
    mf.pair_prints[(NORM, NORM)] = {"golden": {"type": "LlamaRMSNorm", "token": 0, "tensors": {"out:0": "x[1]"}}}
    mf.fingerprint = {"version": 1, "saved_at": "then", "golden": {"digest": "a"}, "test": {"digest": "b"}}
    back = MappingFile.load(mf.save(tmp_path / "m.json"))
    assert back.pair_prints == mf.pair_prints and back.fingerprint == mf.fingerprint
    assert back.digest() == mf.digest()
    back.fingerprint = {**mf.fingerprint, "saved_at": "now"}
    assert back.digest() == mf.digest()  # when it was saved does not make another comparison
    back.drop_pair(NORM, NORM)
    assert (NORM, NORM) not in back.pair_prints and all(p.golden != NORM for p in back.pairs)
    assert (NORM, NORM) not in back.unpaired  # dropping is not rejecting
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "wb-mapping", "pairs": [], "fingerprint": [1]}))
    with pytest.raises(MappingError, match=r"bad.json: 'fingerprint' must be an object"):
        MappingFile.load(bad)
    assert NodePrint.from_json(5) is None and NodePrint.from_json({"tensors": 3}) == NodePrint(None, None, {})
    # integer <-> float is a change of meaning; a float precision change is what a comparison compares
    from workbench.compare.pairing.fingerprint import CurrentNode

    saved = NodePrint("Embedding", 0, {"in:0": "int64[1,6]", "out:0": "float32[1,6,64]"})
    now = CurrentNode("Embedding", [0], {0: {"in:0": "float32[1,6]", "out:0": "bfloat16[1,6,64]"}})
    assert node_changes("emb", saved, now, TensorSel()) == ["dtype of emb in:0 changed int64 -> float32"]
    assert node_changes("emb", saved, now, TensorSel("out", 0)) == []
    later = CurrentNode("Embedding", [2], {2: {"in:0": "int64[1,1]", "out:0": "float32[1,1,64]"}})
    assert node_changes("emb", saved, later, TensorSel()) == []  # at another token only the rank counts
    flat = CurrentNode("Embedding", [2], {2: {"in:0": "int64[6]", "out:0": "float32[1,1,64]"}})
    assert node_changes("emb", saved, flat, TensorSel()) == ["shape of emb in:0 changed [1, 6] -> [6]"]
