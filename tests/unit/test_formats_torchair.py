"""TorchAir dumps: GE dump files (one built byte by byte from the public DumpData schema), the GE graph text,
FX `.npy` dumps in msit's three layouts, bad files, and GE ops matched to FX nodes through `_fx_tensor_name`."""

from __future__ import annotations

import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_wb
from workbench.formats import ge_dump, open_dump
from workbench.formats.arrays import read_array
from workbench.formats.ge_graph import graph_text, parse_graph, read_graph
from workbench.formats.model import DumpError

# ------------------------------------------------------------------ protobuf wire format, by hand


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _int(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def _len(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _shape(dims: list[int]) -> bytes:
    return b"".join(_int(1, d) for d in dims)  # Shape.dim = 1, unpacked (parsers accept both)


def _tensor_msg(dtype: int, fmt: int, dims: list[int], size: int, size_field: int) -> bytes:
    # OpInput: data_type 1, format 2, shape 3, size 5; OpOutput: ..., size 6
    return _int(1, dtype) + _int(2, fmt) + _len(3, _shape(dims)) + _int(size_field, size)


def _ge_file_by_hand(
    inputs: list[tuple[int, int, list[int], bytes]], outputs: list[tuple[int, int, list[int], bytes]], op: str
) -> bytes:
    """DumpData: output 3, input 4, op_name 6; then the payloads, inputs first."""
    header = b"".join(_len(3, _tensor_msg(d, f, s, len(p), 6)) for d, f, s, p in outputs)
    header += b"".join(_len(4, _tensor_msg(d, f, s, len(p), 5)) for d, f, s, p in inputs)
    header += _len(6, op.encode())
    return (
        struct.pack("<Q", len(header)) + header + b"".join(p for *_x, p in inputs) + b"".join(p for *_x, p in outputs)
    )


def _graph(ops: list[tuple[str, str, list[str], list[str]]]) -> str:
    return graph_text("graph_1", ops)


def test_ge_file_built_byte_by_byte_reads_back(tmp_path: Path) -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.full((3,), 2, dtype=np.float16)
    y = (x * 2).astype(np.float32)
    f = tmp_path / "Mul.Mul_3.12.6.1706596912161941"
    f.write_bytes(
        _ge_file_by_hand(
            [(1, 2, [2, 3], x.tobytes()), (2, 2, [3], w.tobytes())], [(1, 2, [2, 3], y.tobytes())], "Mul_3"
        )
    )
    hdr = ge_dump.read_header(f)
    assert hdr.op_name == "Mul_3"
    assert [(t.role, t.index, t.dtype, t.shape, t.layout) for t in hdr.tensors] == [
        ("in", 0, "float32", (2, 3), "ND"),
        ("in", 1, "float16", (3,), "ND"),
        ("out", 0, "float32", (2, 3), "ND"),
    ]
    assert np.array_equal(read_array(ge_dump.tensor_path(f, "in", 0)).array, x)
    assert np.array_equal(read_array(ge_dump.tensor_path(f, "in", 1)).array, w)
    assert np.array_equal(read_array(ge_dump.tensor_path(f, "out", 0)).array, y)
    parsed = ge_dump.parse_file_name(f.name)
    assert parsed is not None and (parsed.op_type, parsed.op_name, parsed.timestamp) == (
        "Mul",
        "Mul_3",
        1706596912161941,
    )


def test_ge_writer_matches_the_schema_and_keeps_bfloat16(tmp_path: Path) -> None:
    t = torch.randn(4, 5).to(torch.bfloat16)
    words = t.view(torch.int16).numpy().view(np.uint16)
    f = tmp_path / "Add.Add.1.2.3"
    f.write_bytes(ge_dump.encode("Add", [(words, "bfloat16")], [(words, "bfloat16")]))
    raw = read_array(ge_dump.tensor_path(f, "out", 0))
    assert raw.dtype == "bfloat16" and np.array_equal(raw.array, words)
    # what our writer wrote is what the hand encoder writes for the same tensors
    by_hand = _ge_file_by_hand([(27, 2, [4, 5], words.tobytes())], [(27, 2, [4, 5], words.tobytes())], "Add")
    hand = _write(tmp_path / "Add.Add.1.2.4", by_hand)

    def described(path: Path) -> list[tuple[object, ...]]:
        return [(t.role, t.index, t.dtype, t.shape, t.layout, t.size) for t in ge_dump.read_header(path).tensors]

    assert described(f) == described(hand)
    assert np.array_equal(read_array(ge_dump.tensor_path(hand, "in", 0)).array, words)


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _ge_tree(root: Path, files: dict[str, bytes], graph: str, token: str = "0") -> Path:
    ge = root / "msit_ge_dump"
    ge.mkdir(parents=True)
    (ge / "dynamo_original_graph_1_rank_0_pid_9_ts_1.txt").write_text(graph)
    for name, data in files.items():
        _write(ge / "20250101000000" / "0" / "graph_1" / "1" / token / name, data)
    return ge


def test_bad_ge_files_give_one_line_each(tmp_path: Path) -> None:
    x = np.ones((2, 2), dtype=np.float32).tobytes()
    good = _ge_file_by_hand([(1, 2, [2, 2], x)], [(1, 2, [2, 2], x)], "Relu")
    lying = _ge_file_by_hand([(1, 2, [2, 3], x)], [(1, 2, [2, 2], x)], "Abs")  # 6 floats declared, 4 stored
    header_len = struct.pack("<Q", 10**6) + b"\x00" * 20
    not_proto = struct.pack("<Q", 4) + b"\xff\xff\xff\xff"
    unknown_fmt = _ge_file_by_hand([(1, 99, [2, 2], x)], [(1, 2, [2, 2], x)], "Neg")
    files = {
        "Relu.Relu.1.7.100": good,
        "Abs.Abs.2.7.101": lying,
        "Exp.Exp.3.7.102": header_len,
        "Log.Log.4.7.103": not_proto,
        "Sqrt.Sqrt.5.7.104": good[:-3],  # truncated payload
        "Neg.Neg.6.7.105": unknown_fmt,
    }
    graph = _graph([(n.split(".")[1], n.split(".")[0], [], []) for n in files])
    d = open_dump(_ge_tree(tmp_path, files, graph))
    assert d.kind == "torchair_ge"
    lines = {ln.split(": ", 1)[0].rsplit("/", 1)[-1]: ln for ln in d.problems}
    assert len(d.problems) == 5 and set(lines) == set(files) - {"Relu.Relu.1.7.100"}, d.problems
    assert "lying sizes" in lines["Abs.Abs.2.7.101"]
    assert "bad header" in lines["Exp.Exp.3.7.102"] and "runs past the end" in lines["Exp.Exp.3.7.102"]
    assert "bad header" in lines["Log.Log.4.7.103"]
    assert "truncated payload" in lines["Sqrt.Sqrt.5.7.104"]
    assert "unknown data format code 99" in lines["Neg.Neg.6.7.105"]
    usable = [t for t in d.tensors if t.error is None]
    assert {t.node for t in usable} == {"Relu", "Neg"}  # Neg's output is still fine: only its input is refused
    neg_in = next(t for t in d.tensors if t.node == "Neg" and t.role == "in")
    assert neg_in.error is not None and "unknown data format" in neg_in.error


def test_device_layout_is_named_not_compared(tmp_path: Path) -> None:
    x = np.ones(16, dtype=np.float16).tobytes()
    f = _write(tmp_path / "MatMul.MatMul.1.1.1", _ge_file_by_hand([(2, 29, [1, 1, 16, 16], x)], [], "MatMul"))
    t = ge_dump.read_header(f).tensors[0]
    assert t.layout == "FRACTAL_NZ" and t.error is not None and "FRACTAL_NZ" in t.error
    with pytest.raises(DumpError, match="FRACTAL_NZ"):
        read_array(ge_dump.tensor_path(f, "in", 0))


def test_ge_tensors_read_again_after_the_file_changed(tmp_path: Path) -> None:
    """A file's header is parsed once for all its tensors: a rewritten file is parsed again, a file cut short
    since its header was read gives one line, and a payload over 64 KiB (mapped, not read) reads the same."""
    big = np.arange(40_000, dtype=np.float32).reshape(200, 200)  # 160 KB: memory-mapped
    small = np.arange(6, dtype=np.float32)
    f = tmp_path / "Mul.Mul.1.1.1"
    f.write_bytes(_ge_file_by_hand([(1, 2, [6], small.tobytes())], [(1, 2, [200, 200], big.tobytes())], "Mul"))
    assert np.array_equal(read_array(ge_dump.tensor_path(f, "in", 0)).array, small)
    assert np.array_equal(read_array(ge_dump.tensor_path(f, "out", 0)).array, big)
    other = np.full(3, 7, dtype=np.float16)
    f.write_bytes(_ge_file_by_hand([(2, 2, [3], other.tobytes())], [(2, 2, [3], other.tobytes())], "Mul"))
    raw = read_array(ge_dump.tensor_path(f, "out", 0))
    assert raw.dtype == "float16" and np.array_equal(raw.array, other)
    data = _ge_file_by_hand([(1, 2, [6], small.tobytes())], [(1, 2, [200, 200], big.tobytes())], "Mul")
    f.write_bytes(data)
    read_array(ge_dump.tensor_path(f, "in", 0))
    with open(f, "r+b") as fh:  # cut short after its header was read and kept: the size differs, read again
        fh.truncate(len(data) - 100)
    with pytest.raises(DumpError, match="truncated payload") as err:
        read_array(ge_dump.tensor_path(f, "out", 0))
    assert "\n" not in str(err.value)


def test_ge_fifo_is_one_line_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "Abs.Abs.1.1.1"
    os.mkfifo(fifo)
    with pytest.raises(DumpError, match="cannot read"):
        ge_dump.read_header(fifo)


MSIT_GRAPH = """
name: "graph_1"
op {
  name: "Add_2"
  type: "Add"
  input: "x:0"
  input: "y:0"
  attr { key: "_unknown_to_us" value { i: 3 } }
  output_desc {
    name: "y"
    dtype: DT_BF16
    layout: "ND"
    shape { dim: 2 dim: 4 }
    attr { key: "_fx_tensor_name" value { s: "add_1-aten.add.Tensor.OUTPUT.0" } }
    some_future_field: 7
  }
}
op { name: "Cast_9" type: "Cast" input: "Add_2:0" }
"""


def test_graph_text_parsed_with_the_schema() -> None:
    g = parse_graph(MSIT_GRAPH)
    assert [(o.name, o.type, o.position, o.inputs, o.fx_nodes) for o in g.ops] == [
        ("Add_2", "Add", 0, ("x", "y"), ("add_1-aten.add.Tensor",)),
        ("Cast_9", "Cast", 1, ("Add_2",), ()),
    ]
    assert parse_graph(f"graph {{ {MSIT_GRAPH} }}").by_name().keys() == {"Add_2", "Cast_9"}  # a ModelDef


def test_broken_graph_text_is_one_line(tmp_path: Path) -> None:
    f = tmp_path / "dynamo_original_graph_1_rank_0_pid_1_ts_1.txt"
    f.write_text('op { name: "Add_2" type: \n')
    with pytest.raises(DumpError) as exc:
        read_graph(f)
    assert str(f) in str(exc.value) and "\n" not in str(exc.value)


# ------------------------------------------------------------------ FX layouts


def _fx_files(folder: Path, node: str, arrays: dict[str, np.ndarray], ts: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for key, arr in arrays.items():
        role, idx = key.split(".")
        np.save(folder / f"{node}.{role}.{idx}.{ts}.npy", arr)


@pytest.mark.parametrize(
    ("layout", "first_folder", "token0"),
    [
        ("msit_fx_dump/worldsize2_global_rank0/model/{t}", 0, 0),  # PTA > 7.1: the folder name is the token
        ("msit_fx_dump/data_dump/{t}/gm_20240125_dump", 1, 0),  # PTA 7.1: token + 1
        ("data_dump/{t}/gm_1706_dump", 1, 0),  # older PTA
    ],
)
def test_fx_layouts(tmp_path: Path, layout: str, first_folder: int, token0: int) -> None:
    a = np.arange(4, dtype=np.float32)
    for k in range(2):
        folder = tmp_path / layout.format(t=first_folder + k)
        _fx_files(folder, "mm-aten.mm.default", {"INPUT.0": a, "INPUT.1": a, "OUTPUT.0": a + k}, 20240125031118787351)
        _fx_files(folder, "add_1-aten.add.Tensor", {"INPUT.0": a, "OUTPUT.0": a}, 20240125031118787352)
    d = open_dump(tmp_path)
    assert d.kind == "torchair_fx" and d.problems == []
    assert d.tokens == [token0, token0 + 1]
    assert [(n.name, n.type, n.parent) for n in d.nodes] == [
        ("graph", "GraphModule", None),  # the root: msit's layout names no module
        ("mm-aten.mm.default", "aten.mm.default", "graph"),
        ("add_1-aten.add.Tensor", "aten.add.Tensor", "graph"),
    ]
    out1 = next(t for t in d.tensors if t.token == token0 + 1 and t.node == "mm-aten.mm.default" and t.role == "out")
    assert out1.path is not None and np.array_equal(np.load(out1.path), a + 1)


def test_fx_bad_file_is_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "msit_fx_dump" / "worldsize1_global_rank0" / "model" / "0"
    _fx_files(folder, "mm-aten.mm.default", {"INPUT.0": np.ones(2, np.float32)}, 1)
    (folder / "mm-aten.mm.default.OUTPUT.0.1.npy").write_bytes(b"not numpy")
    d = open_dump(tmp_path)
    assert len(d.problems) == 1 and "OUTPUT.0.1.npy" in d.problems[0] and "\n" not in d.problems[0]


# ------------------------------------------------------------------ GE <-> FX through _fx_tensor_name, end to end


def _torchair_pair(tmp_path: Path, scale: float) -> tuple[Path, Path]:
    """An FX golden of three nodes (mm, silu, mul) and a GE test: MatMulV2 plus silu+mul fused."""
    rng = np.random.default_rng(0)
    x, w, up = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(3))
    w = rng.standard_normal((8, 8)).astype(np.float32)
    mm = x @ w
    silu = mm / (1 + np.exp(-mm))
    mul = silu * up
    golden = tmp_path / "golden" / "msit_fx_dump" / "worldsize1_global_rank0" / "model" / "0"
    _fx_files(golden, "mm-aten.mm.default", {"INPUT.0": x, "INPUT.1": w, "OUTPUT.0": mm}, 1)
    _fx_files(golden, "silu-aten.silu.default", {"INPUT.0": mm, "OUTPUT.0": silu}, 2)
    _fx_files(golden, "mul-aten.mul.Tensor", {"INPUT.0": silu, "INPUT.1": up, "OUTPUT.0": mul}, 3)
    f32 = 1
    files = {
        "MatMulV2.MatMulV2.1.7.10": _ge_file_by_hand(
            [(f32, 2, [4, 8], x.tobytes()), (f32, 2, [8, 8], w.tobytes())], [(f32, 2, [4, 8], mm.tobytes())], "MatMulV2"
        ),
        "TransData.TransData_1.3.7.12": _ge_file_by_hand(  # GE inserted it: no FX node of its own
            [(f32, 2, [4, 8], mm.tobytes())], [(f32, 2, [4, 8], mm.tobytes())], "TransData_1"
        ),
        "AutomaticBufferFusionOp.SwishMul.2.7.11": _ge_file_by_hand(
            [(f32, 2, [4, 8], mm.tobytes()), (f32, 2, [4, 8], up.tobytes())],
            [(f32, 2, [4, 8], (mul * scale).astype(np.float32).tobytes())],
            "SwishMul",
        ),
    }
    graph = _graph(
        [
            ("MatMulV2", "MatMulV2", ["x:0", "w:0"], ["mm-aten.mm.default.OUTPUT.0"]),
            ("TransData_1", "TransData", ["MatMulV2:0"], []),
            ("Swish", "Swish", ["MatMulV2:0"], ["silu-aten.silu.default.OUTPUT.0"]),
            ("Mul", "Mul", ["Swish:0", "up:0"], ["mul-aten.mul.Tensor.OUTPUT.0"]),
        ]
    )
    test = _ge_tree(tmp_path / "test", files, graph)
    return tmp_path / "golden", test


def test_ge_ops_matched_to_fx_nodes_and_the_fused_op_judged(tmp_path: Path) -> None:
    golden, test = _torchair_pair(tmp_path, scale=1.5)
    d = open_dump(test)
    assert d.node_map()["TransData_1"].params == {"fx_input": ["mm-aten.mm.default"]}
    fused = d.node_map()["SwishMul"]
    assert fused.type == "AutomaticBufferFusionOp" and fused.params is not None
    assert fused.params["fused"] == ["Swish", "Mul"]
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"))
    assert res.returncode in (0, 1), res.stderr
    assert "node pairs matched by: cast 1, fused 2, fx-name 1" in res.stdout, res.stdout
    assert "pairs compared: 7 " in res.stdout  # mm 3, TransData in and out 2, the fused op 1 + 1
    # silu's inputs are the fused op's, mul's outputs its output: every node has a pair
    assert "unmatched: golden 0 of 3 nodes with tensors, test 0 of 3" in res.stdout
    assert "error born at: mul-aten.mul.Tensor" in res.stdout and "SwishMul" in res.stdout, res.stdout


# ------------------------------------------------------------------ our dumpers (real torch.compile)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(8, 16, bias=False)
        self.up = torch.nn.Linear(8, 16, bias=False)
        self.down = torch.nn.Linear(16, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.gate(x)) * self.up(x))


def _dump_both(tmp_path: Path, defect: object = None) -> tuple[Path, Path, object, list[torch.Tensor]]:
    from workbench.backends.torchair import GeDumper
    from workbench.dump.fx import FxDumper

    torch.manual_seed(0)
    model = _Mlp().eval()
    xs = [torch.randn(3, 8), torch.randn(5, 8)]
    fx = FxDumper(tmp_path / "golden")
    compiled = torch.compile(model, backend=fx, dynamic=False)
    eager = []
    with torch.no_grad():
        for x in xs:
            fx.step([1, 2])
            eager.append(compiled(x))
    torch._dynamo.reset()
    ge = GeDumper(tmp_path / "test", dtype=torch.bfloat16, defect=defect)  # type: ignore[arg-type]
    compiled = torch.compile(model, backend=ge, dynamic=False)
    with torch.no_grad():
        for x in xs:
            ge.step([1, 2])
            compiled(x)
    torch._dynamo.reset()
    return tmp_path / "golden", tmp_path / "test", ge, eager


def test_fx_dumper_and_ge_writer_on_a_compiled_model(tmp_path: Path) -> None:
    from workbench.backends.torchair import GeDefect

    golden, test, ge, eager = _dump_both(tmp_path, GeDefect("down", "mm", scale=2.0))
    g = open_dump(golden)
    assert g.kind == "torchair_fx" and g.problems == [] and g.tokens == [0, 1]
    names = [n.name for n in g.nodes]
    assert {"mm-aten.mm.default", "silu-aten.silu.default", "mul-aten.mul.Tensor"} <= set(names)
    last_mm = [n for n in g.nodes if n.type == "aten.mm.default"][-1]
    assert last_mm.params == {"module": "down"}
    out = next(t for t in g.tensors if t.node == last_mm.name and t.role == "out" and t.token == 1)
    assert out.path is not None and np.allclose(np.load(out.path), eager[1].numpy(), atol=1e-6)
    t = open_dump(test)
    assert t.kind == "torchair_ge" and t.problems == [] and t.tokens == [0, 1]
    fused = [n for n in t.nodes if n.type == "AutomaticBufferFusionOp"]
    assert len(fused) == 1 and fused[0].params is not None and fused[0].params["fx_first"] == ["silu-aten.silu.default"]
    assert {x.dtype for x in t.tensors if x.role == "out"} == {"bfloat16"}
    assert ge.planted == "MatMulV2_2"  # type: ignore[attr-defined]
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"))
    assert res.returncode in (0, 1), res.stderr
    assert "error born at: mm_2-aten.mm.default (token 0)  [test op: MatMulV2_2]" in res.stdout, res.stdout


def test_fx_dumper_links_unchanged_weights_across_tokens(tmp_path: Path) -> None:
    """A weight saved at every token is one file, hard-linked into each token folder (msit's layout kept, msit's
    FX reader sees plain files); a weight changed in place is written again; activations are never linked."""
    from msit_llm.compare.torchair_acc_cmp import init_fx_dump_data_from_path

    from workbench.dump.fx import FxDumper

    torch.manual_seed(0)
    model = _Mlp().eval()
    fx = FxDumper(tmp_path / "golden")
    compiled = torch.compile(model, backend=fx, dynamic=False)
    with torch.no_grad():
        for step in range(4):
            if step == 2:
                model.up.weight.mul_(2)  # in place: the same tensor object, a new version
            if step == 3:
                model.gate.weight.data.add_(1)  # through `.data`: the version counter does not move
            fx.step()
            compiled(torch.randn(3, 8, generator=torch.Generator().manual_seed(step)))
    torch._dynamo.reset()
    d = open_dump(tmp_path / "golden")
    assert d.problems == [] and d.tokens == [0, 1, 2, 3]
    by_place = {(t.token, t.node, t.role, t.index): Path(str(t.path)) for t in d.tensors if t.node != "graph"}
    ups = [n.name for n in d.nodes if n.params == {"module": "up"} and n.type == "aten.t.default"]
    assert len(ups) == 1
    w0, w1, w2, w3 = (by_place[(k, ups[0], "in", 0)] for k in range(4))
    assert w0.stat().st_ino == w1.stat().st_ino != w2.stat().st_ino == w3.stat().st_ino  # written again once changed
    assert np.array_equal(np.load(w2), model.up.weight.detach().numpy())
    assert np.array_equal(np.load(w0) * 2, np.load(w2))
    gates = [n.name for n in d.nodes if n.params == {"module": "gate"} and n.type == "aten.t.default"]
    g2, g3 = (by_place[(k, gates[0], "in", 0)] for k in (2, 3))
    assert g2.stat().st_ino != g3.stat().st_ino and np.array_equal(np.load(g3), model.gate.weight.detach().numpy())
    linked = {p for p in by_place.values() if p.stat().st_nlink > 1}
    assert linked and all(by_place[k] not in linked for k in by_place if k[1].startswith("silu"))  # activations
    gathered = init_fx_dump_data_from_path(str(tmp_path / "golden" / "msit_fx_dump"), rank_info_existed=True)
    msit_files = {f for tok in gathered[0].values() for op in tok.values() for files in op.values() for f in files}
    assert {str(p) for p in by_place.values()} <= msit_files  # msit's reader takes every token's files, links too


def test_a_weight_linked_at_every_token_is_compared_once_per_content(tmp_path: Path) -> None:
    """Pairs reading one hard-linked golden weight file (our FX dumper's) go to a worker with the first of them:
    where the test bytes match, that pair's result is copied under each pair's own tensors; where they do not (the
    test side's `up` weight scaled at token 2), the pair is computed."""
    import duckdb

    from workbench.backends.torchair import GeDumper
    from workbench.cli.compare_cmd import compare_request
    from workbench.core.metrics import ALL_METRICS
    from workbench.dump.fx import FxDumper
    from workbench.jobs.compare_dumps import compare_dumps

    torch.manual_seed(0)
    model = _Mlp().eval()
    xs = [torch.randn(3, 8, generator=torch.Generator().manual_seed(k)) for k in range(3)]
    for side, dumper in (("golden", FxDumper(tmp_path / "golden")), ("test", GeDumper(tmp_path / "test"))):
        compiled = torch.compile(model, backend=dumper, dynamic=False)
        with torch.no_grad():
            for k, x in enumerate(xs):
                if side == "test" and k == 2:
                    model.up.weight.mul_(1.5)
                dumper.step()
                compiled(x)
        torch._dynamo.reset()
    stages: list[str] = []
    request = compare_request(tmp_path / "golden", tmp_path / "test", tmp_path / "o", workers=1)
    compare_dumps(request, progress=lambda p: stages.append(p.stage), emit=lambda _line: None)
    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    try:
        cols = ", ".join(f"x.{m}" for m in ALL_METRICS)
        rows = con.execute(
            f"SELECT m.token_id, n.name, m.io, g.idx, g.path, t.tensor_id, t.min, t.max, {cols} FROM matches m "
            "JOIN comparisons c USING (cmp_id) JOIN metrics x USING (cmp_id, pair_id) "
            "JOIN tensors g ON g.run_id = c.golden_run AND g.tensor_id = m.golden_tensor_id "
            "JOIN tensors t ON t.run_id = c.test_run AND t.tensor_id = m.test_tensor_id "
            "JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = m.golden_node_id "
            "WHERE n.params->>'module' = 'up' AND n.type = 'aten.t.default' AND m.io = 'in' ORDER BY m.token_id"
        ).fetchall()
        n_pairs, n_metrics = con.execute(
            "SELECT (SELECT count(*) FROM matches), (SELECT count(*) FROM metrics)"
        ).fetchone() or (0, 0)
    finally:
        con.close()
    assert n_pairs == n_metrics > 0
    planned = [x for x in stages if x.startswith("compare (")]
    assert planned and f"({n_pairs} pairs in " in planned[0], planned  # the weights' repeats ride with the first
    assert [r[0] for r in rows] == [0, 1, 2]
    inodes = {Path(r[4]).stat().st_ino for r in rows}
    assert len(inodes) == 1  # one golden file for the three tokens
    first, same, scaled = rows
    assert len({first[5], same[5], scaled[5]}) == 3  # each pair under its own test tensor
    assert same[6:] == first[6:]  # copied: the test bytes are the same, statistics included
    assert scaled[7] != first[7] and scaled[8:] != first[8:]  # computed: the test weight changed


def test_fused_ge_against_unfused_ge_by_name(tmp_path: Path) -> None:
    from workbench.backends.torchair import GeDumper

    torch.manual_seed(0)
    model = _Mlp().eval()
    for sub, fuse in (("unfused", False), ("fused", True)):
        ge = GeDumper(tmp_path / sub, dtype=torch.float32, fuse=fuse)
        compiled = torch.compile(model, backend=ge, dynamic=False)
        with torch.no_grad():
            ge.step()
            compiled(torch.randn(3, 8, generator=torch.Generator().manual_seed(1)))
        torch._dynamo.reset()
    res = run_wb("compare", "-gp", str(tmp_path / "unfused"), "-mp", str(tmp_path / "fused"), "-o", str(tmp_path / "o"))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fused 2" in res.stdout and "unmatched: golden 0" in res.stdout, res.stdout


SCRIPT = """
import torch
class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)
    def forward(self, x):
        return self.down(torch.relu(self.up(x)))
torch.manual_seed(0)
m = Mlp().eval()
with torch.no_grad():
    for n in (2, 3):
        m(torch.randn(n, 8))
print("ran")
"""


def test_wb_dump_fx_on_a_script(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "dump"
    res = run_wb("dump", "--fx", "--tokens", "0-1", "-o", str(out), "--exec", f"{sys.executable} {script}", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ran" in res.stdout and "msit_fx_dump/worldsize1_global_rank0" in res.stdout
    d = open_dump(out)
    assert d.kind == "torchair_fx" and d.problems == [] and d.tokens == [0, 1]
    assert {"relu-aten.relu.default", "addmm-aten.addmm.default"} <= {n.name for n in d.nodes}
    relu_out = [t for t in d.tensors if t.node == "relu-aten.relu.default" and t.role == "out"]
    assert sorted(t.shape for t in relu_out if t.shape) == [(2, 16), (3, 16)]


def test_rank_folders_compared_rank_with_rank(tmp_path: Path) -> None:
    """Two ranks on each side (`worldsize2_global_rank{R}`): GE graphs per rank beside them; rank 1 planted."""
    for rank in (0, 1):
        golden, test = _torchair_pair(tmp_path / f"r{rank}", scale=1.5 if rank else 1.0)
        fx_rank = tmp_path / "golden" / "msit_fx_dump" / f"worldsize2_global_rank{rank}"
        (golden / "msit_fx_dump" / "worldsize1_global_rank0").rename(_mkparent(fx_rank))
        ge = _mkparent(tmp_path / "test" / "msit_ge_dump" / f"worldsize2_global_rank{rank}")
        graph = next(test.glob("dynamo_original_graph_*.txt"))
        graph.rename(ge.parent / f"dynamo_original_graph_1_rank_{rank}_pid_9_ts_1.txt")
        (test / "20250101000000").rename(ge)
    res = run_wb("compare", "-gp", str(tmp_path / "golden"), "-mp", str(tmp_path / "test"), "-o", str(tmp_path / "o"))
    assert res.returncode in (0, 1), res.stdout + res.stderr
    lines = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("rank ")]
    assert len(lines) == 2, res.stdout
    assert "0 failed" in lines[0] and "mul-aten.mul.Tensor" in lines[1] and "SwishMul" in lines[1], res.stdout


def _mkparent(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def test_precheck_of_aten_nodes_and_linked_ge_ops(tmp_path: Path) -> None:
    from workbench.backends.torchair import GeDefect

    golden, test, _ge, _eager = _dump_both(tmp_path, GeDefect("down", "mm", scale=2.0))
    res = run_wb("precheck", str(golden), "--all")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok    mm_2-aten.mm.default" in res.stdout and "ok    silu-aten.silu.default" in res.stdout
    res = run_wb("precheck", str(test), "--all")
    assert res.returncode == 1, res.stdout + res.stderr  # the planted op disagrees with its own re-run
    assert "ok    MatMulV2_1" in res.stdout and "FAIL  MatMulV2_2" in res.stdout
    assert "skip  SwishMul  (no reference for AutomaticBufferFusionOp" in res.stdout


def test_mapping_editor_pairs_a_ge_op_with_an_fx_node(tmp_path: Path) -> None:
    """What the app's mapping editor does (`jobs.compare.add_node_pairs`), on a GE/FX comparison."""
    import duckdb

    from workbench.compare.pairing.mapping import PairSpec, TensorSel
    from workbench.jobs.compare import add_node_pairs

    golden, test = _torchair_pair(tmp_path, scale=1.0)
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"))
    assert res.returncode == 0, res.stdout + res.stderr
    catalog = tmp_path / "out" / "catalog.duckdb"
    pair = ("mm-aten.mm.default", "TransData_1")
    assert add_node_pairs(catalog, 1, [], remove=[pair]) == 0
    out = TensorSel("out", 0)
    assert add_node_pairs(catalog, 1, [PairSpec(*pair, out, out)]) == 1
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        methods = con.execute(
            "SELECT m.method FROM node_matches m JOIN nodes t ON t.run_id = 2 AND t.node_id = m.test_node_id "
            "WHERE t.name = 'TransData_1'"
        ).fetchall()
    finally:
        con.close()
    assert methods == [("editor",)]


def test_graphs_paired_with_dump_folders_by_the_ops_they_name(tmp_path: Path) -> None:
    """Two graphs, two model-id folders; the first graph (msit's order) names the second folder's ops."""
    x = np.ones((2, 2), dtype=np.float32).tobytes()
    ge = tmp_path / "msit_ge_dump"
    ge.mkdir()
    (ge / "dynamo_original_graph_1_rank_0_pid_9_ts_1.txt").write_text(
        _graph([("Relu_7", "Relu", [], ["relu-aten.relu.default.OUTPUT.0"])])
    )
    (ge / "dynamo_original_graph_2_rank_0_pid_9_ts_2.txt").write_text(
        _graph([("Abs_3", "Abs", [], ["abs-aten.abs.default.OUTPUT.0"])])
    )
    model = ge / "20250101000000" / "0" / "graph_1"
    _write(model / "1" / "0" / "Abs.Abs_3.1.7.100", _ge_file_by_hand([(1, 2, [2, 2], x)], [(1, 2, [2, 2], x)], "Abs_3"))
    _write(
        model / "2" / "0" / "Relu.Relu_7.2.7.101", _ge_file_by_hand([(1, 2, [2, 2], x)], [(1, 2, [2, 2], x)], "Relu_7")
    )
    d = open_dump(tmp_path)
    assert d.problems == []
    nodes = d.node_map()
    assert nodes["1/Abs_3"].params == {"fx": ["abs-aten.abs.default"]}
    assert nodes["2/Relu_7"].params == {"fx": ["relu-aten.relu.default"]}
    assert [p.rsplit("/", 1)[-1] for p in d.meta["pairing"]] == [
        "dynamo_original_graph_2_rank_0_pid_9_ts_2.txt",
        "dynamo_original_graph_1_rank_0_pid_9_ts_1.txt",
    ]


def test_dump_config_fx_compiles_and_remove_restores(tmp_path: Path) -> None:
    from workbench.dump import DumpConfig, register_hook
    from workbench.dump.config import DumpConfigError

    with pytest.raises(DumpConfigError, match="fx must be True or False"):
        DumpConfig(dump_path=str(tmp_path), fx="yes")  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = _Mlp().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        expected = model(x)
        handle = register_hook(model, DumpConfig(dump_path=str(tmp_path / "d"), token_range=[1], fx=True))
        first, second = model(x), model(x)
        handle.remove()
    torch._dynamo.reset()
    assert "forward" not in vars(model)  # the class's forward again
    assert torch.allclose(first, expected) and torch.allclose(second, expected)
    d = open_dump(tmp_path / "d")
    assert d.kind == "torchair_fx" and d.tokens == [1]  # token_range honoured: the second call only
