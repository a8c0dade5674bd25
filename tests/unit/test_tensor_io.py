"""The fast .pth path: torch-free headers and memory-mapped loads agree with torch.load on real files."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from workbench.formats.arrays import read_payload
from workbench.formats.model import DumpError
from workbench.formats.scan import pth_header
from workbench.formats.staging import Staging
from workbench.formats.tensor_io import load_pth, load_tensor, to_torch

CASES = {
    "fp32": torch.randn(3, 4),
    "bf16_view": torch.randn(5, 6).to(torch.bfloat16)[1:, ::2],
    "int64": torch.arange(10),
    "empty": torch.zeros(0, 3),
    "scalar": torch.tensor(3.5),
    "bool": torch.tensor([True, False, True]),
    "fp16_transposed": torch.randn(4, 3, dtype=torch.float16).t(),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_fast_path_matches_torch_load(name: str, tmp_path: Path) -> None:
    t = CASES[name]
    path = tmp_path / f"{name}.pth"
    torch.save(t, path)
    ref = torch.load(path, weights_only=True)
    got = load_pth(str(path))
    assert got.dtype == ref.dtype and got.shape == ref.shape and torch.equal(got, ref)
    dtype, shape, at = pth_header(str(path))
    assert (dtype, shape) == (str(ref.dtype).removeprefix("torch."), tuple(ref.shape))
    if not t.is_contiguous():
        assert at is None  # a view whose elements are not contiguous: its file is read as it is, never at a place
    else:  # where the values lie, as a compare worker reads them without parsing the header again
        assert at is not None
        raw = read_payload(str(path), at, Staging())
        assert raw is not None and torch.equal(to_torch(raw), ref)


def test_hard_links_share_one_parse_and_changes_are_seen(tmp_path: Path) -> None:
    a = tmp_path / "a.pth"
    torch.save(torch.ones(2, 2), a)
    os.link(a, tmp_path / "b.pth")
    assert pth_header(str(tmp_path / "b.pth"))[:2] == ("float32", (2, 2))
    torch.save(torch.ones(3, dtype=torch.float16), a)  # rewritten: new size, new mtime
    assert pth_header(str(a))[:2] == ("float16", (3,))


class _Evil:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.system, ("touch /tmp/wb_fast_path_pwned",))


def test_code_running_pickle_is_refused_on_every_path(tmp_path: Path) -> None:
    marker = Path("/tmp/wb_fast_path_pwned")
    marker.unlink(missing_ok=True)
    path = tmp_path / "evil.pth"
    torch.save({"x": _Evil()}, path, pickle_module=pickle)
    for read in (pth_header, load_tensor):
        with pytest.raises(DumpError, match=r"refused|not a readable"):
            read(str(path))
    assert not marker.exists()


def test_truncated_storage_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "t.pth"
    torch.save(torch.randn(1000), path)
    path.write_bytes(path.read_bytes()[:-2000])
    with pytest.raises(DumpError) as err:
        load_tensor(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_view_may_repeat_its_storage_by_a_fixed_budget_not_a_ratio(tmp_path: Path) -> None:
    """Crafted stride-0 views over a 4 MB storage: up to `REPEAT_BUDGET` elements beyond the storage are read;
    one more is refused in one line (the 64x ratio it replaces let this file show 64 Mi elements)."""
    from tests.fixtures.hostile_files import crafted_pth
    from workbench.formats.pth_header import REPEAT_BUDGET

    stored = 1 << 20  # a 4 MB float32 storage
    fits = crafted_pth(tmp_path / "fits.pth", (stored + REPEAT_BUDGET,), (0,), storage_numel=stored)
    assert pth_header(str(fits))[:2] == ("float32", (stored + REPEAT_BUDGET,))
    for name, size, stride in (
        ("one_more.pth", (stored + REPEAT_BUDGET + 1,), (0,)),
        ("x64.pth", (64, stored), (0, 1)),  # allowed by the old 64x ratio
    ):
        path = crafted_pth(tmp_path / name, size, stride, storage_numel=stored)
        for read in (pth_header, load_tensor):
            with pytest.raises(DumpError) as err:
                read(str(path))
            said = str(err.value)
            assert name in said and "refused" in said and "\n" not in said
