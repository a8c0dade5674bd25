"""`wb errcheck`: the op that produces NaN/Inf/fp16 overflow/saturation, in full and statistics-only dumps.

Planted anomaly: layer 1's `mlp.down_proj` writes +Inf into one element of its output (tests/fixtures/align_dumps.py).
Dumps by our dumper, msit's `register_hook` and msprobe's `PrecisionDebugger`; the CLI runs as a subprocess.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import invoke_wb, run_wb
from tests.fixtures.align_dumps import PLANTED, _forwards, llama3, with_planted_inf
from tests.fixtures.peers import PeerDumps
from workbench.analysis.checks.errcheck import BF16_MAX, FP16_MAX, end_order, scan_array
from workbench.formats import Node
from workbench.formats.arrays import RawTensor

OURS_OP = "root." + PLANTED[0]  # root.model.layers.1.mlp.down_proj
MSPROBE_OP = "Module.model.layers.1.mlp.down_proj.Linear.forward"


def _ours(out: Path, model: nn.Module, stats_mode: int = 0, tokens: int = 2) -> Path:
    from workbench.dump import DumpConfig, register_hook

    handle = register_hook(
        model, DumpConfig(dump_path=str(out), token_range=list(range(tokens)), dump_statistics_mode=stats_mode)
    )
    try:
        _forwards(model, tokens)
    finally:
        handle.remove()
    return next(out.glob("msit_dump_*/torch_tensors/*"))


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("errcheck_ours")
    return {
        "clean": _ours(base / "clean", llama3()),
        "planted": _ours(base / "planted", with_planted_inf(llama3())),
        "planted_stats": _ours(base / "planted_stats", with_planted_inf(llama3()), stats_mode=1),
    }


def _errcheck(dump: Path, *fmt: str) -> tuple[int, str]:
    res = run_wb("errcheck", str(dump), *fmt)
    assert "Traceback" not in res.stdout + res.stderr
    return res.returncode, res.stdout


def _first(dump: Path) -> tuple[int, dict[str, dict[str, object]]]:
    code, out = _errcheck(dump, "--format", "json")
    data = json.loads(out)
    assert data["anomaly"] == (code == 1)
    return code, {f["kind"]: f for f in data["findings"]}


# ---------------------------------------------------------------------------------------------- units


def test_scan_counts_every_kind() -> None:
    x = np.array([1.0, np.nan, np.inf, -np.inf, -np.inf, 7e4, -1e5], dtype=np.float32)
    c = scan_array(RawTensor(x, "float32"))
    assert c.counts == {"nan": 1, "+inf": 1, "-inf": 2} and c.over_fp16 == 2
    h = np.array([FP16_MAX, -FP16_MAX, 3.0], dtype=np.float16)
    assert scan_array(RawTensor(h, "float16")).counts == {"saturation": 2}
    bf = torch.tensor([BF16_MAX, 1.0, float("nan")], dtype=torch.bfloat16)
    words = bf.view(torch.int16).numpy().view(np.uint16)
    assert scan_array(RawTensor(words, "bfloat16")).counts == {"nan": 1, "saturation": 1}
    assert scan_array(RawTensor(np.arange(5, dtype=np.int64), "int64")).counts == {}
    big = np.zeros(3_000_000, dtype=np.float32)
    big[2_500_000] = np.nan
    assert scan_array(RawTensor(big, "float32")).counts == {"nan": 1}  # past the first chunk


def test_end_order_puts_an_op_before_its_module() -> None:
    nodes = [
        Node("layer", "L", None, 0, 0),
        Node("layer.a", "A", "layer", 1, 1),
        Node("layer.b", "B", "layer", 1, 2),
        Node("next", "N", None, 0, 3),
    ]
    order = end_order(nodes)
    assert sorted(order, key=order.__getitem__) == ["layer.a", "layer.b", "layer", "next"]


# ---------------------------------------------------------------------------------------------- our dumper


def test_clean_dump_says_no_anomaly(ours: dict[str, Path]) -> None:
    code, out = _errcheck(ours["clean"])
    assert code == 0
    assert "no anomaly: no NaN, no Inf, no fp16 overflow, no saturation" in out


def test_planted_inf_names_the_producing_op(ours: dict[str, Path]) -> None:
    code, found = _first(ours["planted"])
    assert code == 1
    inf = found["+inf"]
    assert (inf["op"], inf["token"], inf["tensor"], inf["count"], inf["inputs"]) == (OURS_OP, 0, "out0", 1, "normal")
    assert inf["module_chain"] == (
        "root > root.model > root.model.layers > root.model.layers.1 > root.model.layers.1.mlp > "
        "root.model.layers.1.mlp.down_proj"
    )
    # the enclosing MLP and layer also output the Inf, and later ops turn it into NaN: none is named for +inf
    assert inf["ops"] > 3
    assert found["nan"]["inputs"] == "abnormal"
    code, table = _errcheck(ours["planted"])
    assert code == 1 and f"anomaly found: +inf produced by {OURS_OP} (token 0)" in table
    code, text = _errcheck(ours["planted"], "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["kind"] == "+inf" and rows[0]["op"] == OURS_OP


def test_statistics_only_dump(ours: dict[str, Path]) -> None:
    assert not list(ours["planted_stats"].rglob("*.pth"))
    code, found = _first(ours["planted_stats"])
    assert code == 1
    inf = found["+inf"]
    assert (inf["op"], inf["token"], inf["count"], inf["inputs"]) == (OURS_OP, 0, None, "normal")
    assert "n/a (statistics)" in _errcheck(ours["planted_stats"])[1]


class _Cast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float16)


class _Saturate(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x.to(torch.float16), -FP16_MAX, FP16_MAX)  # saturation mode: clamp, no Inf


class _Net(nn.Module):
    def __init__(self, head: nn.Module) -> None:
        super().__init__()
        self.scale = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.scale.weight.copy_(torch.eye(4) * 5e4)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.scale(x))


@pytest.mark.parametrize(
    "head, kinds", [(_Cast(), {"fp16_overflow", "-inf"}), (_Saturate(), {"fp16_overflow", "saturation"})]
)
def test_fp16_overflow_and_saturation(tmp_path: Path, head: nn.Module, kinds: set[str]) -> None:
    from workbench.dump import DumpConfig, register_hook

    net = _Net(head).eval()
    handle = register_hook(net, DumpConfig(dump_path=str(tmp_path), token_range=[0]))
    with torch.no_grad():
        net(torch.tensor([[1.0, -2.0, 0.5, 1e-3]]))  # 5e4, -1e5, 2.5e4, 50: -1e5 is beyond float16
    handle.remove()
    code, found = _first(next(tmp_path.glob("msit_dump_*/torch_tensors/*")))
    assert code == 1 and set(found) == kinds
    over = found["fp16_overflow"]
    assert (over["op"], over["tensor"], over["count"]) == ("root.head", "in0", 1)
    for kind in kinds - {"fp16_overflow"}:
        assert found[kind]["op"] == "root.head" and found[kind]["inputs"] == "normal"


class _WriteNan(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        y[0, 1] = float("nan")  # a module that writes NaN into one element
        return y


class _Wrap(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _WriteNan()
        self.after = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.after(self.inner(x))


def test_planted_nan_names_the_inner_module_not_its_parent(tmp_path: Path) -> None:
    from workbench.dump import DumpConfig, register_hook

    net = nn.Sequential(nn.Linear(4, 4), _Wrap()).eval()
    handle = register_hook(net, DumpConfig(dump_path=str(tmp_path), token_range=[0]))
    with torch.no_grad():
        net(torch.ones(1, 4))
    handle.remove()
    code, found = _first(next(tmp_path.glob("msit_dump_*/torch_tensors/*")))
    assert code == 1 and set(found) == {"nan"}
    nan = found["nan"]
    assert (nan["op"], nan["count"], nan["inputs"], nan["module_chain"]) == (
        "root.1.inner",
        1,
        "normal",
        "root > root.1 > root.1.inner",
    )
    assert nan["ops"] == 4  # inner, after (its input and output), the wrapper, the model


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    res = invoke_wb("errcheck", str(tmp_path))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and str(tmp_path) in res.stderr
    bad_fmt = invoke_wb("errcheck", str(tmp_path), "--format", "xml")
    assert bad_fmt.returncode == 2 and "--format" in bad_fmt.stderr


def test_nan_inf_query_is_earliest_first(ours: dict[str, Path], tmp_path: Path) -> None:
    res = run_wb("compare", "-gp", str(ours["clean"]), "-mp", str(ours["planted"]), "-o", str(tmp_path / "o"))
    assert "Traceback" not in res.stdout + res.stderr
    q = run_wb("query", "nan_inf_locations", "-c", str(tmp_path / "o" / "catalog.duckdb"), "--format", "json")
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert (rows[0]["token_id"], rows[0]["golden_node"], rows[0]["io"]) == (0, OURS_OP, "out")
    # the layer that encloses the op comes after it, although it started before
    layer = next(i for i, r in enumerate(rows) if r["golden_node"] == "root.model.layers.1" and r["io"] == "out")
    assert layer > 0


# ---------------------------------------------------------------------------------------------- peers' dumpers


def test_msit_dumper_full_and_statistics(peer_dumps: PeerDumps, tmp_path: Path) -> None:
    planted = peer_dumps.need_msit()["planted"]
    code, found = _first(planted)
    assert code == 1
    assert (found["+inf"]["op"], found["+inf"]["count"], found["+inf"]["inputs"]) == (OURS_OP, 1, "normal")
    # the same run, statistics only: msit's statistics.csv files without the tensors
    stats = tmp_path / "stats"
    shutil.copytree(planted, stats, ignore=shutil.ignore_patterns("*.pth"))
    code, found = _first(stats)
    assert code == 1
    assert (found["+inf"]["op"], found["+inf"]["count"], found["+inf"]["inputs"]) == (OURS_OP, None, "normal")
    code, out = _errcheck(peer_dumps.need_msit()["golden"])
    assert code == 0 and "no anomaly" in out


def test_msprobe_dumper_full_and_statistics(peer_dumps: PeerDumps, tmp_path: Path) -> None:
    root = peer_dumps.need_msprobe()
    code, found = _first(root / "planted")
    assert code == 1
    inf = found["+inf"]
    assert (inf["op"], inf["count"], inf["inputs"]) == (MSPROBE_OP, 1, "normal")
    assert inf["module_chain"].endswith(f"Module.model.layers.1.mlp.LlamaMLP.forward > {MSPROBE_OP}")
    # msprobe's own overflow check names the same op (inputs normal, output abnormal)
    tool = shutil.which("msprobe", path=os.path.dirname(sys.executable))
    if tool is not None:
        res = subprocess.run(
            [tool, "overflow_check", "-i", str(root / "planted" / "step0"), "-o", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        (report,) = tmp_path.glob("anomaly_analyze_*.json")
        ((theirs, *_),) = json.loads(report.read_text()).values()
        assert res.returncode == 0 and theirs["op_name"] == f"{MSPROBE_OP}.0"
    # statistics-only, as msprobe's task "statistics" writes it: no dump_tensor_data, no data_name
    stats = tmp_path / "stats"
    shutil.copytree(root / "planted", stats, ignore=shutil.ignore_patterns("dump_tensor_data"))
    (dump_json,) = stats.glob("step0/*/dump.json")
    data = json.loads(dump_json.read_text())
    data["task"] = "statistics"
    text = json.dumps(data)
    dump_json.write_text(text)

    def strip(obj: object) -> object:
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items() if k != "data_name"}
        if isinstance(obj, list):
            return [strip(v) for v in obj]
        return obj

    dump_json.write_text(json.dumps(strip(data)))
    code, found = _first(stats)
    assert code == 1
    assert (found["+inf"]["op"], found["+inf"]["count"], found["+inf"]["inputs"]) == (MSPROBE_OP, None, "normal")
    code, out = _errcheck(root / "golden")
    assert code == 0 and "no anomaly" in out


def test_atb_dump_with_a_planted_inf(demo_catalog: Path, tmp_path: Path) -> None:
    """The demo's ATB test dump (bf16), one op's output given an Inf: that op is named, not its layer."""
    from workbench.formats import atb_bin
    from workbench.formats.arrays import read_array

    code, out = _errcheck(demo_catalog.parent / "test")
    assert code == 0 and "(atb," in out and "no anomaly" in out
    dump = tmp_path / "test"
    shutil.copytree(demo_catalog.parent / "test", dump)
    (target,) = dump.glob("msit_dump_*/tensors/*/0/3_Prefill_layer/3_RmsNormOperation/after/outtensor0.bin")
    raw = read_array(target)
    data = np.array(raw.array)
    data.reshape(-1)[5] = 0x7F80 if raw.dtype == "bfloat16" else np.inf  # bf16 +Inf is the word 0x7F80
    atb_bin.write_bin(target, data, raw.dtype)
    code, found = _first(dump)
    assert code == 1
    inf = found["+inf"]
    assert (inf["op"], inf["token"], inf["count"], inf["inputs"]) == (
        "3_Prefill_layer/3_RmsNormOperation",
        0,
        1,
        "normal",
    )
    assert inf["module_chain"] == "3_Prefill_layer > 3_Prefill_layer/3_RmsNormOperation"


def test_msprobe_statistics_of_an_fp16_overflow_name_what_they_prove(tmp_path: Path) -> None:
    """msprobe's own statistics of an fp16 linear holding +inf and -inf (Max inf, Min -inf, Mean NaN): +inf and -inf
    are named there, NaN is only possible (`nan?`); the first real NaN is the next op's, as the full dump says."""
    pytest.importorskip("msprobe.pytorch", reason="msprobe not installed")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for task in ("statistics", "tensor"):
        proc = subprocess.run(
            [sys.executable, "-m", "tests.fixtures.overflow_dump", str(tmp_path / task), task],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
    code, stats = _first(tmp_path / "statistics" / "dump")
    assert code == 1
    assert stats["+inf"]["op"] == stats["-inf"]["op"] == stats["nan?"]["op"] == "Functional.linear.0.forward"
    assert stats["nan"]["op"] == "Tensor.__sub__.0.forward", stats
    code, table = _errcheck(tmp_path / "statistics" / "dump")
    assert "anomaly found: +inf produced by Functional.linear.0.forward" in table, table
    assert "nan?: statistics only" in table and "uncertain" in table
    code, full = _first(tmp_path / "tensor" / "dump")
    assert code == 1 and full["nan"]["op"] == "Tensor.__sub__.0.forward" and "nan?" not in full, full
    assert full["+inf"]["op"] == "Functional.linear.0.forward"
