"""Issue 21 item 4: every file wb reads whole is a regular file within the cap of its kind (`core/capped.py`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.hostile_cases import atb_dump, one_line_error, pair_pair, wb
from workbench.core import capped
from workbench.core.capped import FileRefused, read_bytes, read_text, size_text


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as fh:
        fh.truncate(size)  # no block written: a 6 GB file costs nothing on disk
    return path


def test_reader_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # no writer: an open without O_NONBLOCK would hang
    for path, what in ((Path("/dev/zero"), "a character device"), (fifo, "a FIFO"), (tmp_path, "a folder")):
        with pytest.raises(FileRefused) as err:
            read_bytes(path, capped.MAPPING)
        assert str(err.value) == f"{path}: mapping file is {what}, not a regular file: not read"


def test_reader_refuses_a_file_over_its_cap_without_reading_it(tmp_path: Path) -> None:
    big = _sparse(tmp_path / "op_param.json", 6 << 30)
    with pytest.raises(FileRefused) as err:
        read_bytes(big, capped.OP_PARAM)
    assert str(err.value) == f"{big}: op_param.json of {6 << 30} bytes is over the 16 MiB limit: not read"
    small = tmp_path / "t.toml"
    small.write_text("x = 1\n")
    assert read_text(small, capped.THRESHOLDS) == "x = 1\n"
    exact = _sparse(tmp_path / "exact", capped.THRESHOLDS.limit)
    assert len(read_bytes(exact, capped.THRESHOLDS)) == capped.THRESHOLDS.limit
    assert size_text(capped.RESULTS.limit) == "8 GiB" and size_text(1000) == "1000 bytes"


def test_cli_options_refuse_devices_fifos_and_huge_files(tmp_path: Path) -> None:
    g, t = pair_pair(tmp_path)
    fifo = tmp_path / "map.fifo"
    os.mkfifo(fifo)
    big_toml = _sparse(tmp_path / "th.toml", 2 << 20)
    cases = [
        (("compare", "-gp", g, "-mp", t, "-o", tmp_path / "o1", "-mf", "/dev/zero"), "/dev/zero", "character device"),
        (("compare", "-gp", g, "-mp", t, "-o", tmp_path / "o2", "-mf", fifo), str(fifo), "a FIFO"),
        (("compare", "-gp", g, "-mp", t, "-o", tmp_path / "o3", "--thresholds", "/dev/zero"), "/dev/zero", "device"),
        (("compare", "-gp", g, "-mp", t, "-o", tmp_path / "o4", "--thresholds", big_toml), "th.toml", "1 MiB limit"),
        (("badcase", "-gp", "/dev/zero", "-mp", "/dev/zero"), "/dev/zero", "results file is a character device"),
        (("badcase", "-gp", fifo, "-mp", fifo), str(fifo), "results file is a FIFO"),
    ]
    for args, *needles in cases:
        r = wb(*args, timeout=120)
        out = one_line_error(r, *needles)
        assert out.ok, f"{args}: {out.got}"


def test_precheck_and_reader_on_a_6_gb_sparse_op_param(tmp_path: Path) -> None:
    from workbench.formats import open_dump

    root = atb_dump(tmp_path / "msit_dump_1")
    op = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation"
    _sparse(op / "op_param.json", 6 << 30)
    d = open_dump(root)
    lines = [p for p in d.problems if "op_param.json" in p]
    assert len(lines) == 1 and "over the 256 MiB limit" in lines[0] and d.tensors
    r = wb("precheck", op, "--all", timeout=120)
    out = r.stdout + r.stderr
    assert "Traceback" not in out and "MemoryError" not in out and r.returncode in (0, 1, 2, 4), out
    assert "op_param.json of 6442450944 bytes is over the 16 MiB limit: not read" in out, out


def test_a_fifo_model_tree_is_one_problem_line(tmp_path: Path) -> None:
    from workbench.formats import open_dump

    g, _t = pair_pair(tmp_path)
    (g / "model_tree.json").unlink()
    os.mkfifo(g / "model_tree.json")
    d = open_dump(g)
    lines = [p for p in d.problems if "model_tree.json" in p]
    assert len(lines) == 1 and "a FIFO, not a regular file" in lines[0] and d.tensors


def test_a_fifo_catalog_is_refused_without_blocking(tmp_path: Path) -> None:
    g, _t = pair_pair(tmp_path)
    fifo = tmp_path / "catalog.duckdb"
    os.mkfifo(fifo)
    for args in (("query", "SELECT 1", "-c", fifo), ("ingest", g, "-c", fifo)):
        out = one_line_error(wb(*args, timeout=120), str(fifo), "catalog is a FIFO, not a regular file")
        assert out.ok, f"{args}: {out.got}"
    from workbench.analysis.explorer.explore import ExploreError, Explorer

    with pytest.raises(ExploreError, match="catalog is a FIFO"):
        Explorer(fifo)
