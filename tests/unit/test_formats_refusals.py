"""Names and statistics a dump cannot be trusted with (issue 21, items 6-9): each is refused with one line naming
the file, and the rest of the dump is read as before."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_wb
from tests.fixtures.hostile_files import atb_dump, nested_folders, torch_dump
from tests.fixtures.peers import HAS_MSIT, MSIT_MISSING
from workbench.analysis.checks.precheck.run_atb import precheck_group
from workbench.core.text import ascii_int, has_foreign_digit
from workbench.formats import atb_bin, atb_csv, open_dump
from workbench.formats.atb import TOO_DEEP, leaf_op_folders
from workbench.formats.detect import find_ranks, pair_ranks
from workbench.formats.layers import layer_from_name
from workbench.formats.model import TensorStats, stats_problem

MODULES = ["root.a", "root.b"]
NAN, INF = math.nan, math.inf
ONE, TWO, FOUR = "\u0661", "\u0662", "\u0664"  # Arabic-Indic digits: str.isdigit() and int() take them
REFUSED = "folder name holds a digit that is not ASCII: not read"

# ---------------------------------------------------------------------------------------------- 6 non-ASCII digits


def test_ascii_int_reads_ascii_digits_only() -> None:
    assert [ascii_int(x) for x in ("12", "-3", "0")] == [12, -3, 0]
    assert [ascii_int(x) for x in ("\u0661", "\u00b2", "\uff13", " 3", "1_0", "", "3\n")] == [None] * 7
    assert has_foreign_digit(f"npu{ONE}_2") and not has_foreign_digit("npu1_2")
    assert layer_from_name(f"root.model.layers.{ONE}.mlp") is None
    assert layer_from_name("root.model.layers.1.mlp") == 1


def test_non_ascii_rank_folder_is_no_rank(tmp_path: Path) -> None:
    tt = tmp_path / "msit_dump_1" / "torch_tensors"
    for name in ("npu0_1", f"npu{ONE}_2", "npu1_3"):  # npu١_2 once passed for rank 1, and npu1_3 was never read
        torch_dump(tt / name, MODULES, [0])
    problems: list[str] = []
    ranks = find_ranks(tmp_path / "msit_dump_1", problems)
    assert [(r.rank, r.label) for r in ranks] == [(0, "npu0_1"), (1, "npu1_3")]
    assert problems == [f"{tt / ('npu' + ONE + '_2')}: {REFUSED}"]
    golden = tmp_path / "g" / "torch_tensors"
    for name in ("npu0_7", "npu1_8"):
        torch_dump(golden / name, MODULES, [0])
    pairs = pair_ranks(find_ranks(golden), ranks)
    assert [(g.label, t.label) for g, t in pairs] == [("npu0_7", "npu0_1"), ("npu1_8", "npu1_3")]
    # one rank left: the dump is read as one, and says what it refused
    shutil.rmtree(tt / "npu1_3")
    assert find_ranks(tmp_path / "msit_dump_1", problems) == [] and len(problems) == 1
    d = open_dump(tmp_path / "msit_dump_1")
    assert d.root.name == "npu0_1" and [p for p in d.problems if "not ASCII" in p] == problems


def test_non_ascii_msprobe_rank_and_step_folders(tmp_path: Path) -> None:
    for step, rank in (("step0", "rank0"), ("step0", "rank1"), ("step0", f"rank{TWO}"), (f"step{ONE}", "rank0")):
        (tmp_path / step / rank).mkdir(parents=True)
        (tmp_path / step / rank / "dump.json").write_text(json.dumps({"task": "tensor", "level": "L1", "data": {}}))
    problems: list[str] = []
    ranks = find_ranks(tmp_path, problems)
    assert [(r.rank, r.label) for r in ranks] == [(0, "rank0"), (1, "rank1")]
    assert problems == [f"{tmp_path / 'step0' / ('rank' + TWO)}: {REFUSED}"]
    d = open_dump(tmp_path)
    lines = [p for p in d.problems if "not ASCII" in p]
    assert sorted(lines) == sorted(
        f"{x}: {REFUSED}" for x in (tmp_path / "step0" / f"rank{TWO}", tmp_path / f"step{ONE}")
    )


def test_non_ascii_atb_device_op_and_tensor_names(tmp_path: Path) -> None:
    root = atb_dump(tmp_path / "msit_dump_1")
    atb_dump(tmp_path / "msit_dump_1", pid="78")
    (root / "tensors" / "0_78").rename(root / "tensors" / "1_78")
    shutil.copytree(root / "tensors" / "1_78", root / "tensors" / f"{TWO}_79")
    layer = root / "tensors" / "0_77" / "0" / "0_Prefill_layer"
    shutil.copytree(layer / "0_RmsNormOperation", layer / f"{ONE}_RmsNormOperation")
    after = layer / "0_RmsNormOperation" / "after"
    shutil.copy(after / "outtensor0.bin", after / f"outtensor{ONE}.bin")
    problems: list[str] = []
    assert [r.label for r in find_ranks(root, problems)] == ["0_77", "1_78"]
    assert problems == [f"{root / 'tensors' / (TWO + '_79')}: {REFUSED}"]
    d = open_dump(root / "tensors" / "0_77")
    assert sorted(p for p in d.problems if "not ASCII" in p) == [
        f"{after / ('outtensor' + ONE + '.bin')}: file name holds a digit that is not ASCII: not read as a tensor",
        f"{layer / (ONE + '_RmsNormOperation')}: {REFUSED} as an op",
    ]
    assert [(t.node, t.role, t.index) for t in d.tensors] == [
        ("0_Prefill_layer/0_RmsNormOperation", "in", 0),
        ("0_Prefill_layer/0_RmsNormOperation", "out", 0),
    ]


def test_non_ascii_digits_in_a_bin_header(tmp_path: Path) -> None:
    path = tmp_path / "outtensor0.bin"
    atb_bin.write_bin(path, np.ones((2, 4), np.float32), "float32")
    good = path.read_bytes()
    path.write_bytes(good.replace(b"dims=2,4", b"dims=2,0_4"))  # int() reads '0_4' as 4
    with pytest.raises(atb_bin.DumpError, match=r"header dims .* are not integers"):
        atb_bin.read_header(path)
    path.write_bytes(good.replace(b"dims=2,4", f"dims=2,{FOUR}".encode()))
    with pytest.raises(atb_bin.DumpError, match="header is not ASCII text"):
        atb_bin.read_header(path)


# ---------------------------------------------------------------------------------------------- 7 deep op folders


def _deep_atb_pair(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A golden and a test ATB dump; the test's RmsNorm output is wrong (the error is born there, so compare
    prechecks its layer) and its layer holds a chain of 70 nested op folders."""
    g = atb_dump(tmp_path / "g" / "msit_dump_1")
    t = atb_dump(tmp_path / "t" / "msit_dump_1")
    layer = t / "tensors" / "0_77" / "0" / "0_Prefill_layer"
    atb_bin.write_bin(
        layer / "0_RmsNormOperation" / "after" / "outtensor0.bin", np.full((2, 4), 3, np.float32), "float32"
    )
    nested_folders(layer, 70, "1_A")
    return g, t, layer


def test_deep_op_folder_is_skipped_by_the_precheck(tmp_path: Path) -> None:
    _g, _t, layer = _deep_atb_pair(tmp_path)
    too_deep: list[Path] = []
    leaves = leaf_op_folders(layer, too_deep)
    assert leaves == [layer / "0_RmsNormOperation"]
    assert len(too_deep) == 1 and too_deep[0].relative_to(layer).parts == ("1_A",) * 64
    results = precheck_group(layer)
    assert [Path(r.op_dir) for r in results] == [layer / "0_RmsNormOperation", too_deep[0]]
    assert results[-1].passed is None and results[-1].reason == TOO_DEEP


def test_deep_op_folder_does_not_stop_the_compare(tmp_path: Path) -> None:
    g, t, _layer = _deep_atb_pair(tmp_path)
    r = run_wb("compare", "-gp", str(g), "-mp", str(t), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "pairs compared: 2 " in r.stdout and "failed: 1;" in r.stdout
    assert "error born at: 0_Prefill_layer/0_RmsNormOperation" in r.stdout
    assert len([ln for ln in r.stdout.splitlines() if ln.startswith("problem:") and TOO_DEEP in ln]) == 1


# ---------------------------------------------------------------------------------------------- 8 broken model_tree


def _pairs(out: str) -> int:
    m = re.search(r"^pairs compared: ([0-9]+) ", out, re.M)
    assert m, out
    return int(m.group(1))


@pytest.mark.skipif(not HAS_MSIT, reason=MSIT_MISSING)
def test_broken_model_tree_falls_back_on_folder_names(tmp_path: Path) -> None:
    from tests.fixtures.peer_dumps import dump

    dump("msit", tmp_path / "msit")
    (dev,) = (tmp_path / "msit").glob("msit_dump_*/torch_tensors/*")
    golden = tmp_path / "golden" / dev.name
    shutil.copytree(dev, golden)
    base = run_wb("compare", "-gp", str(golden), "-mp", str(dev), "-o", str(tmp_path / "out-good"))
    assert base.returncode == 0, base.stderr
    good = _pairs(base.stdout)
    assert good > 100
    breakers = {
        "deep": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
        "garbage": lambda p: p.write_bytes(b"\x00\xff not json"),
        "folder": lambda p: (p.unlink(), p.mkdir()),
    }
    for what, brk in breakers.items():
        test = tmp_path / what / dev.name
        shutil.copytree(dev, test)
        brk(test / "model_tree.json")
        r = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / f"out-{what}"))
        assert r.returncode == 0, (what, r.stderr)
        assert _pairs(r.stdout) == good, what  # every module pairs by name, as with the tree
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:") and "model_tree.json" in ln]
        assert len(lines) == 1 and "not used: the module tree is rebuilt from the folder names" in lines[0], lines


def test_tree_from_folder_names_has_the_trees_hierarchy(tmp_path: Path) -> None:
    mods = ["root.model.layers.0.mlp.up_proj", "root.model.layers.1.mlp.up_proj", "root.lm_head"]
    dev = torch_dump(tmp_path / "cpu_1", mods, [0])
    (dev / "model_tree.json").write_text("[" * 5000 + "]" * 5000)
    d = open_dump(dev)
    parent = {n.name: n.parent for n in d.nodes}
    assert parent["root.model.layers.1.mlp.up_proj"] == "root.model.layers.1.mlp"
    assert parent["root.model.layers.1"] == "root.model.layers"
    assert parent["root.model.layers"] == "root.model" and parent["root.model"] == "root"
    assert parent["root.lm_head"] == "root" and parent["root"] is None
    assert {n.name: n.layer for n in d.nodes}["root.model.layers.1.mlp.up_proj"] == 1


# ---------------------------------------------------------------------------------------------- 9 impossible statistics


@pytest.mark.parametrize(
    ("stats", "shape", "why"),
    [
        (TensorStats(1, 0, 0.5, -1), (4,), "negative norm"),
        (TensorStats(1, 0, 0.5, -INF), (4,), "negative norm"),
        (TensorStats(0, 1, 0.5, 1), (4,), "min 1 above max 0"),
        (TensorStats(1, 0, 5, 3), (4,), "mean 5 outside"),
        (TensorStats(10, 0, 1, 0.5), (4,), "below the largest magnitude"),
        (TensorStats(1, 1, 1, 100), (4,), "above sqrt(4)"),
        (TensorStats(1, -1, 0.9, 1), (4,), "above norm / sqrt(4)"),
        (TensorStats(0, 0, 0, 1), (0, 4), "empty tensor"),
        (TensorStats(5, 1, 2, INF - INF), (4,), None),  # a NaN in the tensor
        (TensorStats(INF, -INF, NAN, NAN), (4,), None),  # inf and -inf and NaN inside: all legitimate
        (TensorStats(INF, -INF, NAN, INF), (4,), None),
        (TensorStats(-INF, -INF, -INF, INF), (3,), None),  # all -inf
        (TensorStats(NAN, NAN, NAN, NAN), (3,), None),
        (TensorStats(60000, 1, INF, INF), (4096,), None),  # a float16 sum that overflowed
        (TensorStats(1, 1, 1, 2.0), (4,), None),  # at the bound
        (TensorStats(0.1, 0.1, 0.1003, 0.2), (4,), None),  # rounded print
        (TensorStats(None, None, None, None), (4,), None),
        (TensorStats(0, 0, 0, 0), (0,), None),
    ],
)
def test_stats_problem(stats: TensorStats, shape: tuple[int, ...], why: str | None) -> None:
    got = stats_problem(stats, shape)
    assert (got is None) if why is None else (got is not None and why in got), got


FLT_MAX_PRINTED = "340282346638528859811704183484516925440.000000"  # std::to_string(FLT_MAX)


def _csv_row(op: str, io: str, index: int, dims: str, mx: str, mn: str, mean: str, norm: str) -> str:
    return f"0_77,0,Prefill_layer/{op},{op},0_0,{io},{index},float,nd,{dims},{mx},{mn},{mean},{norm},N/A"


def test_impossible_statistics_refused_per_tensor(tmp_path: Path) -> None:
    # msprobe's ATB statistic.csv
    dev = tmp_path / "atb_dump_data" / "data" / "0_77" / "0"
    dev.mkdir(parents=True)
    rows = [
        _csv_row("RmsNormOperation", "output", 0, "2x4", "1", "0", "0.5", "1.5"),
        _csv_row("RmsNormOperation", "output", 1, "2x4", "1", "0", "0.5", "-2"),
        _csv_row("RmsNormOperation", "input", 0, "2x4", "0", "3", "1", "4"),
        _csv_row("RmsNormOperation", "input", 1, "2x4", "inf", "-inf", "nan", "nan"),
        # every element NaN: the probe prints its reductions' starting values, -FLT_MAX and FLT_MAX, as max and min
        _csv_row("RmsNormOperation", "input", 2, "2x4", f"-{FLT_MAX_PRINTED}", FLT_MAX_PRINTED, "nan", "nan"),
    ]
    (dev / atb_csv.STATS_FILE).write_text(",".join(atb_csv.HEADER) + "\n" + "\n".join(rows) + "\n")
    d = open_dump(tmp_path / "atb_dump_data")
    lines = [p for p in d.problems if "impossible statistics" in p]
    assert len(lines) == 2, d.problems
    assert lines[0].startswith(f"{dev / atb_csv.STATS_FILE}:3: 0_Prefill_layer/0_RmsNormOperation output 1:")
    assert "negative norm -2" in lines[0] and "min 3 above max 0" in lines[1]
    assert all(ln.endswith("refused; the tensor is not judged") for ln in lines)
    by = {(t.role, t.index): t for t in d.tensors}
    assert by["out", 0].stats is not None and by["out", 0].error is None
    assert by["out", 1].stats is None and by["out", 1].error and "negative norm" in by["out", 1].error
    assert by["in", 0].stats is None and by["in", 0].error
    assert by["in", 1].stats is not None and by["in", 1].error is None  # inf, -inf, NaN: legitimate
    all_nan = by["in", 2].stats  # read as a tensor of NaN (the pair then fails), not refused as min above max
    assert all_nan is not None and by["in", 2].error is None
    assert all(math.isnan(v) for v in (all_nan.max, all_nan.min, all_nan.mean, all_nan.norm) if v is not None)
    assert None not in (all_nan.max, all_nan.min, all_nan.mean, all_nan.norm)

    # an ATB statistics-only .bin header
    root = atb_dump(tmp_path / "msit_dump_1")
    after = root / "tensors" / "0_77" / "0" / "0_Prefill_layer" / "0_RmsNormOperation" / "after"
    atb_bin.write_bin_stats(after / "outtensor1.bin", "float32", (2, 4), TensorStats(1.0, 2.0, 1.5, 3.0))
    d = open_dump(root)
    (line,) = [p for p in d.problems if "impossible statistics" in p]
    assert line.startswith(f"{after / 'outtensor1.bin'}: impossible statistics (min 2 above max 1)")
    assert sum(t.error is None for t in d.tensors) == 2

    # msit statistics.csv (a tensor file beside it is still judged on its payload)
    dev2 = torch_dump(tmp_path / "cpu_1", MODULES, [0])
    head = "NodeName,NodeType,InputOutput,Index,DataType,Shape,Max,Min,Mean,L2Norm\n"
    (dev2 / "0" / "root.a" / "statistics.csv").write_text(
        head
        + 'root.a,Linear,Input,0,torch.float32,"(4, 8)",1,0,0.5,-3\n'
        + 'root.a,Linear,Output,0,torch.float32,"(4, 8)",2,0,1,8\n'
        + 'root.a,Linear,Output,1,torch.float32,"(4, 8)",2,0,9,4\n'
    )
    d = open_dump(dev2)
    lines = [p for p in d.problems if "impossible statistics" in p]
    stats_csv = dev2 / "0" / "root.a" / "statistics.csv"
    assert lines == [
        f"{stats_csv}: token 0 root.a input 0: impossible statistics (negative norm -3): refused; "
        "the tensor is judged on its file only",
        f"{stats_csv}: token 0 root.a output 1: impossible statistics (mean 9 outside [min 0, max 2]): refused; "
        "the tensor is not judged",
    ]
    by = {(t.role, t.index): t for t in d.tensors if t.node == "root.a"}
    assert by["in", 0].stats is None and by["in", 0].path is not None and by["in", 0].error is None
    assert by["out", 0].stats is not None and by["out", 1].error is not None


def test_impossible_msprobe_statistics(tmp_path: Path) -> None:
    rank = tmp_path / "step0" / "rank0"
    rank.mkdir(parents=True)

    def desc(mx: float, mn: float, mean: float, norm: float) -> dict[str, object]:
        return {
            "type": "torch.Tensor",
            "dtype": "torch.float32",
            "shape": [2],
            "Max": mx,
            "Min": mn,
            "Mean": mean,
            "Norm": norm,
        }

    data = {
        "Tensor.__add__.0.forward": {
            "input_args": [desc(1, 0, 0.5, 1), desc(1, 0, 0.5, -1)],
            "input_kwargs": {},
            "output": [desc(2, 3, 2.5, 3)],
        }
    }
    (rank / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "data": data}))
    d = open_dump(tmp_path)
    lines = [p for p in d.problems if "impossible statistics" in p]
    assert lines == [
        f"{rank / 'dump.json'}: token 0 Tensor.__add__.0.forward input 1: impossible statistics (negative norm -1): "
        "refused; the tensor is not judged",
        f"{rank / 'dump.json'}: token 0 Tensor.__add__.0.forward output 0: impossible statistics "
        "(min 3 above max 2): refused; the tensor is not judged",
    ]
    assert sum(t.stats is not None and t.error is None for t in d.tensors) == 1
