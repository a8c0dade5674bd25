"""msprobe's ATB dumps (`atb_dump_data/data/{dev}_{pid}/{n}/statistic.csv`), written by msprobe's own ATB probe
library (driven on CPU by `tests/fixtures/msprobe_atb.py` with the tensors of our ATB-structured stack), read back and
compared: ATB vs ATB by name (as `msprobe compare -m atb`), against our ATB `.bin` dumps, and against a torch
golden through the ATB<->torch auto-mapping; the verdict and the advisor on them; bad files."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import torch

from tests.conftest import atb_test_llama, dump_run, run_wb
from tests.fixtures import msprobe_atb, stats_dumps
from workbench.formats import atb_csv, open_dump

pytestmark = pytest.mark.skipif(msprobe_atb.skip_reason() is not None, reason=str(msprobe_atb.skip_reason()))
STEPS = 2
PROMPT = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))


@dataclass
class Dumps:
    base: Path
    torch_golden: Path
    atb_golden_full: Path  # our ATB stack's own dump (tensors/ .bin files)
    golden: Path  # msprobe ATB statistics dumps (atb_dump_data)
    golden_all: Path  # msprobe ATB task `all`: statistic.csv and .bin files
    clean: Path
    eps: Path  # wrong RMSNorm epsilon in layer 1
    down: Path  # layer 1's down_proj weight x1.03


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> Dumps:
    from workbench.backends import AtbDumpConfig, AtbLlama
    from workbench.backends.defects import Defect

    base = tmp_path_factory.mktemp("atb_csv")
    hf = atb_test_llama()
    torch_golden, tokens = dump_run(hf, base / "torch", PROMPT, None, steps=STEPS)
    scaled = copy.deepcopy(hf)
    with torch.no_grad():
        scaled.model.layers[1].mlp.down_proj.weight.mul_(1.03)

    def atb(name: str, model: object, dtype: torch.dtype, defect: Defect | None = None) -> Path:
        stack = AtbLlama.from_hf(model, dtype=dtype, defect=defect)
        run = stack.run(PROMPT, STEPS, dump=AtbDumpConfig(base / name, seed=0), forced=tokens)
        assert run.dump_root is not None
        return run.dump_root

    g_full = atb("g_full", hf, torch.float32)
    return Dumps(
        base,
        torch_golden,
        g_full,
        msprobe_atb.probe_dump(g_full, base / "golden"),
        msprobe_atb.probe_dump(g_full, base / "golden_all", task="all"),
        msprobe_atb.probe_dump(atb("t_full", hf, torch.bfloat16), base / "clean"),
        msprobe_atb.probe_dump(atb("e_full", hf, torch.bfloat16, Defect("rmsnorm_eps")), base / "eps"),
        msprobe_atb.probe_dump(atb("d_full", scaled, torch.bfloat16), base / "down"),
    )


def test_the_probe_writes_the_layout_the_reader_expects(dumps: Dumps) -> None:
    """The header is the probe's own (its two string literals are in the library), rows rebuild our node names."""
    lib = msprobe_atb.probe_library()
    assert lib is not None
    blob = lib.read_bytes()
    header = ",".join(atb_csv.HEADER)
    cut = header.index("Input/Output")
    assert header[:cut].encode() in blob and header[cut:].encode() in blob
    csvs = sorted((dumps.golden / "data").glob("*/*/statistic.csv"))
    assert len(csvs) == STEPS
    assert csvs[0].read_text().splitlines()[0] == header
    d = open_dump(dumps.golden)
    ours = open_dump(dumps.atb_golden_full)
    assert d.kind == "atb" and not d.problems
    assert {n.name for n in d.nodes} == {n.name for n in ours.nodes}
    assert {(t.token, t.node, t.role, t.index) for t in d.tensors} == {
        (t.token, t.node, t.role, t.index) for t in ours.tensors
    }
    by_name = {n.name: n for n in ours.nodes}
    for n in d.nodes:
        assert (n.type, n.phase, n.layer, n.parent, n.params) == (
            by_name[n.name].type,
            by_name[n.name].phase,
            by_name[n.name].layer,
            by_name[n.name].parent,
            by_name[n.name].params,  # the probe's op_param.json files
        ), n.name
    assert any(n.params for n in d.nodes)
    assert all(t.path is None and t.stats is not None for t in d.tensors)
    # every level a user may pass: --output, atb_dump_data, data, {dev}_{pid}, one execution count, the csv
    dev = next((dumps.golden / "data").iterdir())
    for level in (dumps.golden.parent, dumps.golden / "data", dev, csvs[0]):
        assert {n.name for n in open_dump(level).nodes} <= {n.name for n in d.nodes}
    one = open_dump(csvs[0].parent)
    assert one.tokens == [0]
    # task `all`: the same rows, and the probe's .bin files beside them are read as tensors
    full = open_dump(dumps.golden_all)
    assert full.tensors and all(t.path is not None and Path(t.path).is_file() for t in full.tensors)


def test_statistics_verdict_clean_and_defect(dumps: Dumps, tmp_path: Path) -> None:
    out, con = stats_dumps.compare(dumps.golden, dumps.clean, tmp_path / "clean")
    n, on_stats, undecided, failed = stats_dumps.verdict_counts(con)
    assert n > 300 and on_stats == n and undecided == 0 and failed == 0, out
    assert stats_dumps.born(con) == {None}
    out, con = stats_dumps.compare(dumps.golden, dumps.eps, tmp_path / "eps")
    assert stats_dumps.born(con, "n.type || ' layer ' || n.layer") == {"RmsNormOperation layer 1"}, out


def test_same_differences_as_msprobe_compare_atb(dumps: Dumps, tmp_path: Path) -> None:
    """msprobe's own `compare -m atb` on one execution count: our statistics differences are its diffs."""
    pd = pytest.importorskip("pandas")
    _out, con = stats_dumps.compare(dumps.golden, dumps.eps, tmp_path / "o")
    count = "0"
    g, t = (next((p / "data").iterdir()) / count for p in (dumps.golden, dumps.eps))
    proc = subprocess.run(
        [sys.executable, "-m", "msprobe.msprobe", "compare", "-m", "atb", "-gp", str(g), "-tp", str(t),
         "-o", str(tmp_path / "ms")],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    sheets = sorted((tmp_path / "ms").glob("atb_stats_compare_result_*.xlsx"))
    assert sheets, proc.stdout[-2000:] + proc.stderr[-2000:]
    theirs = pd.read_excel(sheets[0])
    ours = {
        f"{node}/{'input' if io == 'in' else 'output'}.{idx}": (mx, nm)
        for node, io, idx, mx, nm in con.execute(
            "SELECT n.name, t.io, t.idx, s.max_stat_absolute_error, s.l2norm_stat_absolute_error FROM matches m "
            "JOIN comparisons c USING (cmp_id) JOIN tensors t ON t.run_id = c.golden_run AND t.tensor_id = "
            "m.golden_tensor_id JOIN nodes n ON n.run_id = c.golden_run AND n.node_id = t.node_id "
            "JOIN stat_metrics s ON s.cmp_id = m.cmp_id AND s.pair_id = m.pair_id WHERE m.token_id = 0"
        ).fetchall()
    }
    assert len(theirs) == len(ours) > 100
    for name, max_diff, norm_diff in zip(theirs["Golden Data Name"], theirs["Max Diff"], theirs["Norm Diff"]):
        assert ours[name][0] == pytest.approx(abs(float(max_diff)), abs=1e-9), name
        assert ours[name][1] == pytest.approx(abs(float(norm_diff)), abs=1e-9), name


def test_advisor_ranks_a_scaled_weight_first(dumps: Dumps, tmp_path: Path) -> None:
    """A 3 % down_proj weight scale in layer 1 stays under the verdict's bound; the advisor still names it first."""
    _out, _con = stats_dumps.compare(dumps.golden, dumps.down, tmp_path / "o")
    _con.close()
    proc = run_wb("advise", "-c", str(tmp_path / "o" / "catalog.duckdb"), "-k", "3", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    firsts = {r["token_id"]: r["golden_node"] for r in rows if r["rank"] == 1}
    assert len(firsts) == STEPS
    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    for tok, name in firsts.items():
        node = con.execute(
            "SELECT n.type, n.layer, p.type FROM nodes n JOIN nodes p ON p.run_id = n.run_id AND p.node_id = "
            "n.parent_id WHERE n.name = ? AND n.run_id = 1",
            [name],
        ).fetchone()
        # the MLP's second Linear (down projection) of layer 1
        assert node == ("LinearOperation", 1, "Mlp") and name.endswith("/2_LinearOperation"), (tok, name, rows)


def test_mixed_and_torch_golden(dumps: Dumps, tmp_path: Path) -> None:
    # our ATB .bin dump (full tensors) vs msprobe's statistics: matched by name, compared on statistics
    out, con = stats_dumps.compare(dumps.atb_golden_full, dumps.clean, tmp_path / "mixed")
    n, on_stats, undecided, failed = stats_dumps.verdict_counts(con)
    assert n > 300 and on_stats == n and undecided == 0 and failed == 0, out
    assert "node pairs matched by: name" in out
    # a torch golden through the auto-mapping: the defect is born at the torch module that holds it
    out, con = stats_dumps.compare(dumps.torch_golden, dumps.eps, tmp_path / "torch")
    assert stats_dumps.born(con) == {"root.model.layers.1.post_attention_layernorm"}, out
    # a fused gate-up output kept as statistics cannot be split into gate and up: not comparable, not failed
    rows = con.execute(
        "SELECT DISTINCT passed, cmp_fail_reason FROM comparison WHERE golden_node LIKE '%mlp.gate_proj' AND io = 'out'"
    ).fetchall()
    assert rows and all(p is None and "not comparable on statistics" in (r or "") for p, r in rows), rows
    out, con = stats_dumps.compare(dumps.torch_golden, dumps.clean, tmp_path / "torch_clean")
    _n, _on, _undecided, failed = stats_dumps.verdict_counts(con)
    assert failed == 0 and stats_dumps.born(con) == {None}, out


def _copy_dump(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("header", "not msprobe's ATB statistic.csv"),
        ("short", "14 columns, expected 15: row skipped"),
        ("shape", "Shape '8xZ' is not like 8x128: row skipped"),
        ("binary", "not UTF-8 text: not read"),
        ("names", "do not name one op folder path: row skipped"),
    ],
)
def test_bad_statistic_csv(dumps: Dumps, tmp_path: Path, damage: str, expected: str) -> None:
    """A damaged statistic.csv: one line naming the file (and the row), the rest of the dump compared."""
    bad = _copy_dump(dumps.clean, tmp_path / "bad" / "atb_dump_data")
    csv = sorted((bad / "data").glob("*/1/statistic.csv"))[0]
    lines = csv.read_text().splitlines()
    if damage == "header":
        lines[0] = lines[0].replace("Op Id", "Op Key")
    elif damage == "short":
        lines[3] = lines[3].rsplit(",", 1)[0]
    elif damage == "shape":
        cells = lines[3].split(",")
        cells[9] = "8xZ"
        lines[3] = ",".join(cells)
    elif damage == "names":
        cells = lines[3].split(",")
        cells[4] = "1_2_3_4"
        lines[3] = ",".join(cells)
    if damage == "binary":
        csv.write_bytes(b"\xff\xfe" + csv.read_bytes())
    else:
        csv.write_text("\n".join(lines) + "\n")
    proc = run_wb("compare", "-gp", str(dumps.golden), "-mp", str(bad), "-o", str(tmp_path / "o"))
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in text, text[-3000:]
    line = next((x for x in text.splitlines() if expected in x), None)
    assert line is not None and str(csv) in line, text[-3000:]
    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    assert stats_dumps.verdict_counts(con)[0] >= 150  # token 0 (the other csv) is still compared


def test_two_devices_are_two_ranks(dumps: Dumps, tmp_path: Path) -> None:
    """Tensor parallelism: the probe writes one `data/{dev}_{pid}` per process; each is a rank."""
    from workbench.formats.detect import find_ranks

    root = _copy_dump(dumps.golden, tmp_path / "tp" / "atb_dump_data")
    dev = next((root / "data").iterdir())
    _copy_dump(dev, root / "data" / "1_4242")
    ranks = find_ranks(root)
    assert [(r.rank, r.label) for r in ranks] == [(0, dev.name), (1, "1_4242")]
    assert len(ranks[1].open().tensors) == len(open_dump(dev).tensors)
