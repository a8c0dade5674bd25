"""Bad files inside dumps: each one is a one-line problem naming the file; every good file is still listed."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.formats import DumpError, atb_bin, open_dump

MARKER_NAME = "pwned_marker"


class _Evil:
    """Unpickling this would run a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _torch_dump(tmp_path: Path) -> tuple[Path, Path]:
    dev = tmp_path / "cpu_1"
    mods = ["root.good", "root.bad"]
    tree = {"name": "root", "type": "M", "children": [{"name": m, "type": "Linear", "children": []} for m in mods]}
    dev.mkdir()
    (dev / "model_tree.json").write_text(json.dumps(tree))
    for m in mods:
        (dev / "0" / m).mkdir(parents=True)
        torch.save(torch.arange(6.0).reshape(2, 3), dev / "0" / m / "input_0.pth")
    torch.save(torch.ones(2, 3), dev / "0" / "root.good" / "output.pth")
    return dev, dev / "0" / "root.bad"


def _check(d, bad_files: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    """Each bad file has exactly one one-line problem naming it and an error entry; good files are listed."""
    for path, reason in bad_files.items():
        lines = [p for p in d.problems if p.startswith(path + ":")]
        assert len(lines) == 1, (path, d.problems)
        assert "\n" not in lines[0] and reason in lines[0], lines[0]
    good = [t for t in d.tensors if t.error is None]
    assert good and all(t.path not in bad_files for t in good)


def test_bad_pth_files(tmp_path: Path) -> None:
    dev, bad = _torch_dump(tmp_path)
    good = bad.parent / "root.good" / "output.pth"
    (bad / "output_0.pth").write_bytes(good.read_bytes()[: good.stat().st_size // 2])  # truncated
    (bad / "output_1.pth").write_bytes(b"")  # empty
    torch.save({"not": "a tensor"}, bad / "output_2.pth")  # non-tensor
    (bad / "output_3.pth").write_bytes(b"plain text, not a torch file\n")
    marker = tmp_path / MARKER_NAME
    torch.save(_Evil(marker), bad / "output_4.pth")  # zip pickle that would run code
    with open(bad / "output_5.pth", "wb") as fh:  # legacy raw pickle that would run code
        pickle.dump(_Evil(marker), fh, protocol=2)
    os.symlink(tmp_path / "nowhere.pth", bad / "output_6.pth")  # dangling link: missing file
    d = open_dump(dev)
    assert not marker.exists(), "a pickle ran code"
    _check(
        d,
        {
            str(bad / "output_0.pth"): "not a readable torch file",
            str(bad / "output_1.pth"): "empty file",
            str(bad / "output_2.pth"): "holds a dict, not a tensor",
            str(bad / "output_3.pth"): "refused: not a tensor file torch can load safely",
            str(bad / "output_4.pth"): "refused: the pickle would run code",
            str(bad / "output_5.pth"): "refused: the pickle would run code",
            str(bad / "output_6.pth"): "No such file",
        },
    )
    errs = {t.index: t.error for t in d.tensors if t.node == "root.bad" and t.role == "out"}
    assert sorted(errs) == list(range(7)) and all(errs.values())
    assert {(t.node, t.role) for t in d.tensors if t.error is None} == {
        ("root.good", "in"),
        ("root.good", "out"),
        ("root.bad", "in"),
    }


def test_bad_bin_files(tmp_path: Path) -> None:
    dev = tmp_path / "tensors" / "0_1"
    op = dev / "0" / "0_LinearOperation"
    (op / "before").mkdir(parents=True)
    (op / "after").mkdir()
    atb_bin.write_bin(op / "before" / "intensor0.bin", np.ones((2, 4), np.float16), "float16")
    hdr = b"$Version=1.0\n$Object.Count=1\n$Object.Length=16\nformat=2\ndtype=1\n"
    # dims claim 4x4 fp16 (32 bytes), the payload has 16
    (op / "before" / "intensor1.bin").write_bytes(hdr + b"dims=4,4\n$Object.data=0,16\n$End=1\n" + bytes(16))
    # $Object.data claims more bytes than the file holds
    (op / "before" / "intensor2.bin").write_bytes(hdr + b"dims=2,4\n$Object.data=0,1000\n$End=1\n" + bytes(16))
    (op / "after" / "outtensor0.bin").write_bytes(b"\x00\x01garbage without header")
    (op / "after" / "outtensor1.bin").write_bytes(b"")
    (op / "after" / "outtensor2.bin").write_bytes(
        hdr.replace(b"dtype=1", b"dtype=999") + b"dims=2,4\n$End=1\n" + bytes(16)
    )
    d = open_dump(dev)
    _check(
        d,
        {
            str(op / "before" / "intensor1.bin"): "need 32 bytes but the payload has 16",
            str(op / "before" / "intensor2.bin"): "truncated file or lying header",
            str(op / "after" / "outtensor0.bin"): "not an ATB tensor file",
            str(op / "after" / "outtensor1.bin"): "empty file",
            str(op / "after" / "outtensor2.bin"): "unsupported ATB dtype code 999",
        },
    )
    (good,) = [t for t in d.tensors if t.error is None]
    assert good.role == "in" and good.index == 0 and good.shape == (2, 4)


def test_bad_json_files(tmp_path: Path) -> None:
    dev, _bad = _torch_dump(tmp_path)
    (dev / "model_tree.json").write_text("{not json")
    (dev / "wb_manifest.json").write_text(json.dumps({"format": "wb-dump"}))
    d = open_dump(dev)
    assert any(p.startswith(str(dev / "model_tree.json") + ": not valid JSON") for p in d.problems)
    assert any(p.startswith(str(dev / "wb_manifest.json") + ": no 'exec_order'") for p in d.problems)
    assert d.order_source == "data-flow"
    assert {n.name for n in d.nodes} >= {"root.good", "root.bad"}
    assert sum(t.error is None for t in d.tensors) == 3


def test_unreadable_folder(tmp_path: Path) -> None:
    dev, bad = _torch_dump(tmp_path)
    bad.chmod(0)
    try:
        if os.access(bad, os.R_OK):
            pytest.skip("running as a user (root) who can read a chmod 000 folder")
        d = open_dump(dev)
        lines = [p for p in d.problems if p.startswith(f"{bad}:")]
        assert len(lines) == 1 and "cannot list folder" in lines[0]
        assert {t.node for t in d.tensors} == {"root.good"}
        with pytest.raises(DumpError, match="permission denied"):
            open_dump(bad)
    finally:
        bad.chmod(0o755)


def test_not_a_dump_folders(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "numbers" / "0" / "x").mkdir(parents=True)
    for p in (tmp_path / "empty", tmp_path / "numbers", tmp_path / "numbers" / "0"):
        with pytest.raises(DumpError) as exc:
            open_dump(p)
        msg = str(exc.value)
        assert msg.startswith(str(p) + ": not a dump") and "\n" not in msg
