"""Payloads read into a reused buffer (`formats/staging.py`) and at the place the dump's reader found them
(`arrays.read_payload`): the same values as a memory map, never stale, never clobbering a tensor still held."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.compare.execution.tasks import PairTask, Twin
from workbench.compare.execution.worker import release_staging, run_batch, run_pair
from workbench.formats import atb_bin
from workbench.formats.arrays import read_array, read_payload
from workbench.formats.model import DumpError
from workbench.formats.scan import pth_header
from workbench.formats.staging import Staging


def _save(path: Path, tensor: torch.Tensor) -> str:
    torch.save(tensor, str(path))
    return str(path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64])
def test_staged_read_equals_the_memory_map(tmp_path: Path, dtype: torch.dtype) -> None:
    x = (torch.randn(3, 50, 129, generator=torch.Generator().manual_seed(1)) * 40).to(dtype)
    path = _save(tmp_path / "x.pth", x)
    mapped = read_array(path)
    staged = read_array(path, Staging())
    assert staged.dtype == mapped.dtype and staged.shape == mapped.shape == (3, 50, 129)
    assert np.array_equal(staged.array, mapped.array)
    assert not isinstance(staged.array, np.memmap) and staged.array.base is not None


def test_npy_and_bin_payloads_staged(tmp_path: Path) -> None:
    arr = np.arange(4096 * 3, dtype=np.float32).reshape(3, 4096) / 7
    np.save(tmp_path / "x.npy", arr)
    np.save(tmp_path / "f.npy", np.asfortranarray(arr))  # Fortran order: mapped by numpy, same values
    atb_bin.write_bin(tmp_path / "x.bin", arr, "float32")
    staging = Staging()
    for name in ("x.npy", "f.npy", "x.bin"):
        got = read_array(tmp_path / name, staging)
        assert np.array_equal(got.array, arr), name


def test_payload_above_the_cap_is_mapped_and_a_short_file_is_one_line(tmp_path: Path) -> None:
    x = torch.randn(1024, 64, generator=torch.Generator().manual_seed(2))
    path = _save(tmp_path / "big.pth", x)
    small = Staging(cap=1024)
    assert small.fill(path, 0, 4096) is None  # above the cap: the caller maps it
    assert np.array_equal(read_array(path, small).array, x.numpy())
    with pytest.raises(DumpError) as err:
        Staging().fill(path, os.path.getsize(path) - 10, 100)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)


def test_read_payload_uses_the_readers_place_only_for_the_same_file(tmp_path: Path) -> None:
    x = torch.randn(40, 33, generator=torch.Generator().manual_seed(3))
    path = _save(tmp_path / "x.pth", x)
    dtype, shape, at = pth_header(path)
    assert at is not None and (dtype, shape) == ("float32", (40, 33))
    for staging in (None, Staging(), Staging(cap=16)):
        got = read_payload(path, at, staging)
        assert got is not None and np.array_equal(got.array, x.numpy())
    # the file replaced after the dump was read (another inode, size and time): not trusted
    os.replace(_save(tmp_path / "y.pth", x[:20] * 2), path)
    assert read_payload(path, at, Staging()) is None
    assert np.array_equal(read_array(path).array, (x[:20] * 2).numpy())
    # a view saved with its storage: only the view's elements, where they lie
    base = torch.arange(100, dtype=torch.float32)
    view_path = _save(tmp_path / "v.pth", base[10:30])
    _d, _s, view_at = pth_header(view_path)
    assert view_at is not None
    view = read_payload(view_path, view_at, Staging())
    assert view is not None and np.array_equal(view.array, base[10:30].numpy())
    transposed = _save(tmp_path / "t.pth", torch.randn(5, 7).t())
    assert pth_header(transposed)[2] is None  # not contiguous: no place to trust, the file is read as it is


def test_worker_reads_at_the_payload_and_twins_keep_the_pairs_tensors(tmp_path: Path) -> None:
    """A twin loaded while the pair's tensors are held goes to buffers of its own: a twin whose bytes differ gets
    its own numbers, the next twin is still checked against the pair's bytes; a stale payload is re-read."""
    x = torch.randn(64, 257, generator=torch.Generator().manual_seed(4))
    files = {
        "g": _save(tmp_path / "g.pth", x),
        "t": _save(tmp_path / "t.pth", x.bfloat16()),
        "g2": _save(tmp_path / "g2.pth", x * 3),
        "t2": _save(tmp_path / "t2.pth", (x * 3.1).bfloat16()),
        "g3": _save(tmp_path / "g3.pth", x.clone()),
        "t3": _save(tmp_path / "t3.pth", x.bfloat16()),
    }
    at = {name: pth_header(path)[2] for name, path in files.items()}
    task = PairTask(
        0,
        files["g"],
        files["t"],
        "bfloat16",
        -1,
        -1,
        twins=(
            Twin(1, files["g2"], files["t2"], at["g2"], at["t2"]),
            Twin(2, files["g3"], files["t3"], at["g3"], at["t3"]),
        ),
        golden_at=at["g"],
        test_at=at["t"],
    )
    first, differs, same = run_batch([task])
    assert [r["pair_id"] for r in (first, differs, same)] == [0, 1, 2]
    assert differs["values"] == run_pair(PairTask(1, files["g2"], files["t2"], "bfloat16", -1, -1))["values"]
    assert (
        same["values"] == first["values"] == run_pair(PairTask(0, files["g"], files["t"], "bfloat16", -1, -1))["values"]
    )
    # the test file rewritten after the dump was read: the worker parses it again and compares what is there now
    os.replace(_save(tmp_path / "new.pth", (x * 1.5).bfloat16()), files["t"])
    stale = run_batch([PairTask(0, files["g"], files["t"], "bfloat16", -1, -1, golden_at=at["g"], test_at=at["t"])])
    fresh = run_pair(PairTask(0, files["g"], files["t"], "bfloat16", -1, -1))
    assert stale[0]["values"] == fresh["values"] != first["values"]
    release_staging()
