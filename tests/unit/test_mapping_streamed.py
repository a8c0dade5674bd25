"""Issue 21 item 11: a mapping file's pairs are decoded one at a time into shared, compact objects; the
decoder reads exactly what `json.loads` reads and names the same line on an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.compare.pairing.mapping import MappingError, MappingFile, TensorSel


def _pair(i: int, shape: int) -> dict[str, object]:
    prints = {"type": "Linear", "token": 0, "tensors": {"out:0": f"float32[1,{shape}]"}}
    return {
        "golden": f"root.layers.{i}.mlp",
        "test": f"{i}_Prefill_layer/9_LinearOperation",
        "golden_tensor": "out:0",
        "test_tensor": "out:0",
        "fingerprint": {"golden": prints, "test": prints},
    }


def test_pairs_load_as_json_says_with_shared_selectors_and_prints(tmp_path: Path) -> None:
    data = {
        "format": "wb-mapping",
        "version": 1,
        "pairs": [_pair(i, 64 if i % 2 else 128) for i in range(200)],
        "rules": [{"golden": "root.layers.*.attn", "test": "*_Prefill_layer/3_SelfAttention"}],
        "unpaired": [{"golden": "a", "test": "b"}],
    }
    f = tmp_path / "m.json"
    f.write_text(json.dumps(data, indent=1))
    m = MappingFile.load(f)
    assert [(p.golden, p.test) for p in m.pairs] == [(d["golden"], d["test"]) for d in data["pairs"]]  # type: ignore[index]
    assert all(p.golden_tensor == TensorSel("out", 0) for p in m.pairs)
    assert m.pairs[0].golden_tensor is m.pairs[1].test_tensor  # one object for a selector that repeats
    keys = [(p.golden, p.test) for p in m.pairs]
    assert m.pair_prints[keys[1]] == data["pairs"][1]["fingerprint"]  # type: ignore[index]
    assert m.pair_prints[keys[1]] is m.pair_prints[keys[3]]  # equal fingerprints: one dict
    assert m.pair_prints[keys[0]] is not m.pair_prints[keys[1]]
    assert len(m.rules) == 1 and m.unpaired == [("a", "b")]
    assert MappingFile.load(f).to_json()["pairs"] == m.to_json()["pairs"]


@pytest.mark.parametrize(
    "text",
    [
        '{"format": "wb-mapping", "pairs": [{"golden": "a", "test": "b"},\n {"golden": "c" "test": "d"}]}',
        '{"format": "wb-mapping", "pairs": [{"golden": "a", "test": "b"}\n\n {"golden": "c"}]}',
        '{"format": "wb-mapping",\n "pairs": []\n "rules": []}',
        '{"format": "wb-mapping", "pairs": [{"golden": "a", "test": "b"}]}\n\nextra',
        '{"format": "wb-mapping", \n\n\n"pairs": [',
    ],
)
def test_broken_files_name_the_line_json_names(tmp_path: Path, text: str) -> None:
    f = tmp_path / "m.json"
    f.write_text(text)
    with pytest.raises(json.JSONDecodeError) as ref:
        json.loads(text)
    with pytest.raises(MappingError) as err:
        MappingFile.load(f)
    assert str(err.value) == f"{f}: not valid JSON (line {ref.value.lineno}: {ref.value.msg})"


def test_a_pair_that_is_not_an_object(tmp_path: Path) -> None:
    f = tmp_path / "m.json"
    f.write_text('{"format": "wb-mapping", "pairs": ["a"]}')
    with pytest.raises(MappingError, match="'pairs' entries must be objects"):
        MappingFile.load(f)
    f.write_text('{"pairs": ["LlamaRMSNorm"]}')  # msit's format: a type called "pairs" is still a type
    assert [t.golden_types for t in MappingFile.load(f).types] == [["LlamaRMSNorm"]]


def test_json_text_and_digest_are_those_of_the_whole_dict(tmp_path: Path) -> None:
    import hashlib

    data = {
        "format": "wb-mapping",
        "version": 1,
        "pairs": [_pair(i, 64) for i in range(5)] + [{"golden": "x", "test": "y"}],
        "rules": [{"golden": "root.layers.*.attn", "test": "*_Prefill_layer/3_SelfAttention"}],
        "types": {"RmsNormOperation": ["LlamaRMSNorm"]},
        "unpaired": [{"golden": "a", "test": "b"}],
        "fingerprint": {"version": 1, "saved_at": "2026-01-01", "golden": {"nodes": 3}},
    }
    f = tmp_path / "m.json"
    f.write_text(json.dumps(data))
    m = MappingFile.load(f)
    whole = m.to_json()
    assert "".join(m.json_chunks()) == json.dumps(whole)
    assert "".join(m.json_chunks(sort_keys=True)) == json.dumps(whole, sort_keys=True)
    whole["fingerprint"] = {k: v for k, v in whole["fingerprint"].items() if k != "saved_at"}
    # the digest a catalog already holds for this mapping (how it was computed before pairs were streamed)
    assert m.digest() == hashlib.sha256(json.dumps(whole, sort_keys=True).encode()).hexdigest()[:16]
    assert m.fingerprint is not None and m.fingerprint["saved_at"] == "2026-01-01"  # digest() restored it
