"""Memory of the compare's main process on a dump of many tiny files (issue 15): no Python object per tensor file
in the run frames matching and planning read, and the same catalog contents whatever the frames hold."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import duckdb
import torch

from workbench.compare.pair_store import load_frames
from workbench.compare.pairing.align import shape_tuple
from workbench.compare.pairing.frames import Coded
from workbench.jobs.compare import run_compare


def _dump(dev: Path, tokens: int, modules: int, seed: int) -> None:
    """An msit-layout torch dump; later tokens hard-link the first token's files (as our dumper does)."""
    names = [f"root.layers.{i // 2}.m{i % 2}" for i in range(modules)]
    dev.mkdir(parents=True)
    tree = {"name": "root", "type": "M", "children": [{"name": n, "type": "Linear", "children": []} for n in names]}
    (dev / "model_tree.json").write_text(json.dumps(tree))
    gen = torch.Generator().manual_seed(seed)
    for n in names:
        (dev / "0" / n).mkdir(parents=True)
        for f, shape in (("input_0.pth", (4, 8)), ("output_0.pth", (4, 8)), ("output_1.pth", (32,))):
            torch.save(torch.randn(*shape, generator=gen), dev / "0" / n / f)
    for tok in range(1, tokens):
        for n in names:
            (dev / str(tok) / n).mkdir(parents=True)
            for f in ("input_0.pth", "output_0.pth", "output_1.pth"):
                os.link(dev / "0" / n / f, dev / str(tok) / n / f)


def test_run_frames_hold_no_python_object_per_tensor(tmp_path: Path) -> None:
    tokens, modules = 40, 6
    _dump(tmp_path / "g" / "cpu_1", tokens, modules, 1)
    _dump(tmp_path / "t" / "cpu_1", tokens, modules, 2)
    catalog = tmp_path / "out" / "catalog.duckdb"
    res = run_compare(tmp_path / "g" / "cpu_1", tmp_path / "t" / "cpu_1", catalog, workers=1)
    assert res.pairs == tokens * modules * 3
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        frames = load_frames(con, res.golden_run)
        n_computed = con.execute(
            "SELECT count(*) FROM metrics WHERE cmp_id = ? AND cosine_similarity IS NOT NULL", [res.cmp_id]
        ).fetchall()[0][0]
    finally:
        con.close()
    t = frames.tensors
    assert len(t) == tokens * modules * 3
    # every column is numbers or codes: ~70 bytes a row (a path, dtype and shape object per row were ~480)
    arrays = {f.name: getattr(t, f.name) for f in fields(t) if getattr(t, f.name) is not None}  # no file_id here
    per_row = sum(a.codes.nbytes if isinstance(a, Coded) else a.nbytes for a in arrays.values()) / len(t)
    assert per_row < 100, per_row
    assert "path" not in arrays
    # the text form of a shape reads back as the dump's shapes; every hard-linked pair got its metrics
    assert {shape_tuple(s) for s in t.shape.values} == {(4, 8), (32,)}
    assert n_computed == res.pairs


def test_shape_text_cells() -> None:
    assert shape_tuple("[4, 8]") == (4, 8)
    assert shape_tuple("[]") == ()
    assert shape_tuple([2, 3]) == (2, 3)
    assert shape_tuple(None) is None
    assert shape_tuple(float("nan")) is None
