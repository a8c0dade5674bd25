"""Pairs read and passed block by block (`compare/execution/streamed.py`): the numbers of the whole-tensor pass to the
last bit, twins checked byte for byte across every block, and anything it does not take left to the whole path."""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.compare.execution.streamed import BLOCK_ELEMENTS, stream_pair, streamable
from workbench.compare.execution.tasks import PairTask, Twin
from workbench.compare.execution.worker import run_batch, run_pair
from workbench.compare.judging.metrics import PairMetrics, compare_tensors, summarize
from workbench.formats import atb_bin
from workbench.formats.arrays import RawTensor, payload_place, read_array, read_payload
from workbench.formats.scan import pth_header


def _save(path: Path, tensor: torch.Tensor) -> str:
    torch.save(tensor.contiguous(), str(path))
    return str(path)


def _task(
    pair_id: int, golden: str, test: str, test_dtype: str, transform: str | None = None, twins: tuple[Twin, ...] = ()
) -> PairTask:
    g_at, t_at = pth_header(golden)[2], pth_header(test)[2]
    return PairTask(
        pair_id, golden, test, test_dtype, -1, -1, transform=transform, twins=twins, golden_at=g_at, test_at=t_at
    )


def _same_numbers(a: PairMetrics, b: PairMetrics) -> None:
    def bits(x: float | None) -> object:
        return None if x is None else ("nan" if math.isnan(x) else x)

    assert {k: bits(v) for k, v in a.values.items()} == {k: bits(v) for k, v in b.values.items()}
    assert (a.golden, a.test, a.finite_only, a.reason) == (b.golden, b.test, b.finite_only, b.reason)


def _whole(golden: str, test: str, test_dtype: str) -> PairMetrics:
    return compare_tensors(read_array(golden), read_array(test), test_dtype=test_dtype)


@pytest.mark.parametrize(
    ("golden_dtype", "test_dtype"),
    [
        (torch.float32, torch.bfloat16),
        (torch.float32, torch.float16),
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float16, torch.float32),
    ],
)
@pytest.mark.parametrize("numel", [1000, 2 * BLOCK_ELEMENTS + 12_345])
def test_streamed_numbers_are_the_whole_passs_to_the_last_bit(
    tmp_path: Path, golden_dtype: torch.dtype, test_dtype: torch.dtype, numel: int
) -> None:
    gen = torch.Generator().manual_seed(numel)
    x = torch.randn(numel, generator=gen) * 3 + 1
    y = x * (1 + 1e-3 * torch.randn(numel, generator=gen))
    golden = _save(tmp_path / "g.pth", x.to(golden_dtype))
    test = _save(tmp_path / "t.pth", y.to(test_dtype))
    name = str(test_dtype).removeprefix("torch.")
    got = stream_pair(_task(0, golden, test, name))
    assert got is not None and got[1] == []
    _same_numbers(got[0], _whole(golden, test, name))


def test_not_finite_chunks_and_a_large_shift_follow_the_whole_pass(tmp_path: Path) -> None:
    """A chunk holding NaN and Inf in a later block is added by its finite parts; sides far apart take the KL's
    float64 two-pass form, which reads the pair in full."""
    gen = torch.Generator().manual_seed(7)
    numel = 3 * BLOCK_ELEMENTS + 77
    x = torch.randn(numel, generator=gen)
    y = x.clone()
    y[BLOCK_ELEMENTS + 5] = float("nan")
    y[2 * BLOCK_ELEMENTS + 9] = float("inf")
    x[2 * BLOCK_ELEMENTS + 100] = float("-inf")
    golden = _save(tmp_path / "g.pth", x)
    test = _save(tmp_path / "t.pth", y.bfloat16())
    got = stream_pair(_task(0, golden, test, "bfloat16"))
    assert got is not None and got[0].finite_only and got[0].test.nan_count == 1
    _same_numbers(got[0], _whole(golden, test, "bfloat16"))
    far = _save(tmp_path / "far.pth", (x * 40 + 30).bfloat16())
    shifted = stream_pair(_task(1, golden, far, "bfloat16"))
    assert shifted is not None and shifted[0].values["kl_divergence"] is not None
    _same_numbers(shifted[0], _whole(golden, far, "bfloat16"))


def test_twins_are_checked_across_every_block(tmp_path: Path) -> None:
    """A twin that differs only in its last block gets its own numbers; one of another shape is never streamed
    beside the pair; an equal one reuses the pair's result."""
    numel = 2 * BLOCK_ELEMENTS + 500
    x = torch.randn(numel, generator=torch.Generator().manual_seed(8))
    late = x.clone()
    late[-1] += 1.0
    files = {
        "g": _save(tmp_path / "g.pth", x),
        "t": _save(tmp_path / "t.pth", x.bfloat16()),
        "g_same": _save(tmp_path / "g_same.pth", x.clone()),
        "t_same": _save(tmp_path / "t_same.pth", x.bfloat16()),
        "g_late": _save(tmp_path / "g_late.pth", late),
        "g_shape": _save(tmp_path / "g_shape.pth", x.reshape(2, -1)),
        "t_shape": _save(tmp_path / "t_shape.pth", x.reshape(2, -1).bfloat16()),
    }
    at = {name: pth_header(path)[2] for name, path in files.items()}
    twins = (
        Twin(1, files["g_same"], files["t_same"], at["g_same"], at["t_same"]),
        Twin(2, files["g_late"], files["t"], at["g_late"], at["t"]),
        Twin(3, files["g_shape"], files["t_shape"], at["g_shape"], at["t_shape"]),
    )
    task = _task(0, files["g"], files["t"], "bfloat16", twins=twins)
    got = stream_pair(task)
    assert got is not None and got[1] == [True, False, False]
    first, same, late_result, shaped = run_batch([task])
    assert [r["pair_id"] for r in (first, same, late_result, shaped)] == [0, 1, 2, 3]
    assert same["values"] == first["values"]
    alone = run_pair(PairTask(2, files["g_late"], files["t"], "bfloat16", -1, -1))
    assert late_result["values"] == alone["values"] != first["values"]
    assert shaped["values"] == first["values"]  # the same values, read as a pair of their own


def test_what_is_not_streamed_goes_the_whole_way(tmp_path: Path) -> None:
    x = torch.randn(40, 33, generator=torch.Generator().manual_seed(9))
    golden = _save(tmp_path / "g.pth", x)
    test = _save(tmp_path / "t.pth", x.bfloat16())
    ints = _save(tmp_path / "i.pth", torch.arange(40 * 33).reshape(40, 33))
    short = _save(tmp_path / "s.pth", x[:20].bfloat16())
    assert streamable(_task(0, golden, test, "bfloat16"))
    not_taken = {
        "a transform": _task(0, golden, test, "bfloat16", transform="t.flat"),
        "no payload place": PairTask(0, golden, test, "bfloat16", -1, -1),
        "an int tensor": _task(0, golden, ints, "int64"),
        "another element count": _task(0, golden, short, "bfloat16"),
    }
    for why, task in not_taken.items():
        assert not streamable(task) and stream_pair(task) is None, why
    # the test file replaced after the dump was read: not trusted, the whole path reads what is there now
    stale = _task(0, golden, test, "bfloat16")
    os.replace(_save(tmp_path / "new.pth", (x * 2).bfloat16()), test)
    assert streamable(stale) and stream_pair(stale) is None
    result = run_pair(stale)
    assert result["values"] == run_pair(PairTask(0, golden, test, "bfloat16", -1, -1))["values"]
    assert result["test"]["max"] == pytest.approx(float((x * 2).bfloat16().max()))


def test_a_merged_heads_layout_is_streamed(tmp_path: Path) -> None:
    """Shapes a layout rule relates (heads merged on one side) compare element by element, streamed too."""
    x = torch.randn(1, 6, 8, 64, generator=torch.Generator().manual_seed(10))
    golden = _save(tmp_path / "g.pth", x)
    test = _save(tmp_path / "t.pth", x.reshape(1, 6, 512).bfloat16())
    got = stream_pair(_task(0, golden, test, "bfloat16"))
    assert got is not None
    _same_numbers(got[0], _whole(golden, test, "bfloat16"))
    assert np.isclose(got[0].values["cosine_similarity"] or 0.0, 1.0, atol=1e-4)


def test_payload_place_reads_the_headers_users_files_have(tmp_path: Path) -> None:
    """`.pth`, ATB `.bin` and C-ordered `.npy` files say where their values lie; anything else says nothing."""
    arr = (np.arange(3 * 4096, dtype=np.float32) / 7).reshape(3, 4096)
    torch_file = _save(tmp_path / "x.pth", torch.from_numpy(arr))
    atb_bin.write_bin(tmp_path / "x.bin", arr, "float32")
    np.save(tmp_path / "x.npy", arr)
    for name in (torch_file, str(tmp_path / "x.bin"), str(tmp_path / "x.npy")):
        at = payload_place(name)
        assert at is not None and (at.dtype, at.shape) == ("float32", (3, 4096)), name
        got = read_payload(name, at)
        assert got is not None and np.array_equal(got.array, arr), name
    np.save(tmp_path / "f.npy", np.asfortranarray(arr))
    np.save(tmp_path / "big_endian.npy", arr.astype(">f4"))
    (tmp_path / "notes.txt").write_text("not a tensor")
    for name in ("f.npy", "big_endian.npy", "notes.txt", "missing.pth"):
        assert payload_place(str(tmp_path / name)) is None, name
    torch.save(torch.randn(5, 7).t(), tmp_path / "t.pth")  # a view whose elements are not contiguous
    assert payload_place(str(tmp_path / "t.pth")) is None


def test_pairs_planned_from_the_catalog_are_streamed_with_their_layout_view(tmp_path: Path) -> None:
    """A pair with no reader's places (planned from the catalog: a torch golden against an ATB test run, the batch
    squeezed on one side) gets its places from the headers and is streamed: the whole-tensor numbers, and the
    statistics of both whole files."""
    x = torch.randn(1, 6, 3 * BLOCK_ELEMENTS // 6 + 5, generator=torch.Generator().manual_seed(11))
    golden = _save(tmp_path / "g.pth", x)
    atb_bin.write_bin(tmp_path / "t.bin", x[0].bfloat16().view(torch.int16).numpy().view(np.uint16), "bfloat16")
    test = str(tmp_path / "t.bin")
    task = PairTask(0, golden, test, "bfloat16", 4, 5, transform="layout:squeeze")
    placed = replace(task, golden_at=payload_place(golden), test_at=payload_place(test))
    assert streamable(placed) and not streamable(replace(placed, transform="t.flat"))
    got = run_pair(task)
    g_raw, t_raw = read_array(golden), read_array(test)
    whole = compare_tensors(g_raw, RawTensor(t_raw.array.reshape(g_raw.shape), t_raw.dtype), test_dtype="bfloat16")
    assert got["values"] == whole.values and (got["golden_tensor_id"], got["test_tensor_id"]) == (4, 5)
    assert got["golden"] == {f: getattr(summarize(g_raw), f) for f in got["golden"]}
    assert got["test"] == {f: getattr(summarize(t_raw), f) for f in got["test"]}
