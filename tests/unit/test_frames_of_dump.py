"""The run frames a compare makes from the dumps it just ingested are the frames the catalog gives back."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path

import duckdb
import numpy as np
import pytest

from tests.conftest import TinyDumps
from tests.fixtures.formats_helpers import dump_msprobe_llama
from tests.fixtures.hostile_files import atb_dump
from workbench.catalog.store import ingest_dump, open_catalog
from workbench.compare.pair_store import frames_of_dump, load_frames
from workbench.compare.pairing.frames import Coded, RunFrames
from workbench.formats import open_dump


def _same(a: object, b: object, what: str) -> None:
    if isinstance(a, Coded):
        assert isinstance(b, Coded) and a.values == b.values and np.array_equal(a.codes, b.codes), what
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype, what
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), what
    else:
        assert a == b, what


def _frames_equal(made: RunFrames, read: RunFrames) -> None:
    assert (made.run_id, made.kind, made.quant) == (read.run_id, read.kind, read.quant)
    for table in ("nodes", "tensors"):
        for f in fields(getattr(made, table)):
            if f.name == "file_id":  # what the reader saw of each file: not in the catalog (below)
                continue
            _same(getattr(getattr(made, table), f.name), getattr(getattr(read, table), f.name), f"{table}.{f.name}")


def _dumps(tmp: Path, tiny: TinyDumps) -> list[Path]:
    atb_dump(tmp / "atb_topo")
    atb_dump(tmp / "atb_bare", topology=False)  # nodes only the tensors name
    dump_msprobe_llama(tmp / "probe")
    dump_msprobe_llama(tmp / "probe_stats", save_tensors=False)  # statistics only: mean and norm recorded
    return [
        tiny.golden,
        tiny.bf16,
        tmp / "atb_topo",
        tmp / "atb_bare",
        tmp / "probe" / "step0" / "rank0",
        tmp / "probe_stats" / "step0" / "rank0",
    ]


def test_frames_made_from_the_dump_are_those_the_catalog_gives_back(tmp_path: Path, tiny_dumps: TinyDumps) -> None:
    con = open_catalog(tmp_path / "c.duckdb")
    files_seen = 0
    try:
        for root in _dumps(tmp_path / "dumps", tiny_dumps):
            dump = open_dump(root)
            ing = ingest_dump(con, dump)
            assert not ing.skipped and len(dump.tensors) > 0, root
            made, read = frames_of_dump(dump, ing.run_id), load_frames(con, ing.run_id)
            _frames_equal(made, read)
            # each file the reader parsed keeps its (device, inode), which the compare's plan uses instead of a stat
            seen = {
                i: (os.stat(t.path).st_dev, os.stat(t.path).st_ino)
                for i, t in enumerate(dump.tensors)
                if t.payload is not None and t.path is not None
            }
            assert made.tensors.known_files() == seen
            assert read.tensors.file_id is None and read.tensors.known_files() == {}
            files_seen += len(seen)
    finally:
        con.close()
    assert files_seen > 0


@pytest.mark.parametrize("stats", [False, True])
def test_compare_on_made_frames_stores_what_one_on_catalog_frames_does(tmp_path: Path, stats: bool) -> None:
    """One catalog compares freshly read dumps (frames made from them); another holds the runs already (frames read
    back): the same pairs, metrics and verdicts."""
    from workbench.jobs.compare import run_compare

    for side in ("g", "t"):
        dump_msprobe_llama(tmp_path / side, save_tensors=not stats, seed=0 if side == "g" else 1)
    g, t = tmp_path / "g" / "step0" / "rank0", tmp_path / "t" / "step0" / "rank0"
    run_compare(g, t, tmp_path / "made.duckdb", workers=1)
    con = open_catalog(tmp_path / "read.duckdb")
    try:
        for root in (g, t):
            ingest_dump(con, open_dump(root))
    finally:
        con.close()
    run_compare(g, t, tmp_path / "read.duckdb", workers=1)  # both runs found: their frames read back
    con = duckdb.connect(str(tmp_path / "made.duckdb"), read_only=True)  # two catalogs side by side: plain DuckDB
    try:
        con.execute(f"ATTACH '{tmp_path / 'read.duckdb'}' AS r (READ_ONLY)")
        for table in ("matches", "metrics", "stat_metrics", "node_results", "error_born"):
            n = con.execute(f"SELECT count(*) FROM {table}").fetchone()
            diff = con.execute(
                f"SELECT count(*) FROM (SELECT * FROM {table} EXCEPT ALL SELECT * FROM r.{table}) "
                f"UNION ALL SELECT count(*) FROM (SELECT * FROM r.{table} EXCEPT ALL SELECT * FROM {table})"
            ).fetchall()
            assert n is not None and diff == [(0,), (0,)], (table, n, diff)
        assert con.execute("SELECT count(*) FROM metrics").fetchone() != (0,)
    finally:
        con.close()
