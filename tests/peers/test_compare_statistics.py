"""Statistics-only dumps compared on max/min/mean/L2 norm: msit `statistics.csv`, msprobe summary mode, ATB
statistics `.bin` headers, and mixed pairs (one side full, one side statistics), on real dumps."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch

from tests.conftest import run_wb
from tests.fixtures import stats_dumps
from workbench.compare.judging.metrics import compare_tensors
from workbench.compare.judging.stat_metrics import stat_metrics
from workbench.core.metrics import STAT_BOUND, STAT_METRIC_NAMES

HAS_MSIT = importlib.util.find_spec("msit_llm") is not None
HAS_MSPROBE = importlib.util.find_spec("msprobe") is not None
needs_msit = pytest.mark.skipif(not HAS_MSIT, reason="msit_llm not installed (pip install msit && msit install llm)")
needs_msprobe = pytest.mark.skipif(not HAS_MSPROBE, reason="msprobe not installed (pip install mindstudio-probe)")
SCALE = 1.05  # layer 1's down_proj output scaled by 5 %


def _summary(x: np.ndarray) -> dict[str, float]:
    return {"max": float(x.max()), "min": float(x.min()), "mean": float(x.mean()), "norm": float(np.linalg.norm(x))}


def test_stat_metrics_definitions_and_bound() -> None:
    """msit's formulas, and the bound never exceeds the relative euclidean distance (random and adversarial)."""
    g = {"max": 2.0, "min": -1.0, "mean": 0.5, "norm": 10.0}
    t = {"max": 2.5, "min": -1.0, "mean": 0.25, "norm": 9.0}
    v = stat_metrics(g, t, 16)
    assert set(v) == set(STAT_METRIC_NAMES)
    assert v["max_stat_absolute_error"] == 0.5 and v["max_stat_relative_error"] == 0.25
    assert v["min_stat_absolute_error"] == 0.0
    assert v["l2norm_stat_relative_error"] == pytest.approx(0.1)
    assert v[STAT_BOUND] == pytest.approx(max(1.0, 0.25 * 4, 0.5) / 10.0)
    rng = np.random.default_rng(0)
    for i in range(200):
        a = rng.standard_normal(rng.integers(1, 4000)).astype(np.float32)
        noise = rng.standard_normal(a.shape).astype(np.float32) * 10.0 ** rng.uniform(-4, 0)
        b = (a * rng.uniform(0.9, 1.1) + noise + (rng.uniform(-0.1, 0.1) if i % 2 else 0.0)).astype(np.float32)
        red = compare_tensors(a, b).values["relative_euclidean_distance"]
        bound = stat_metrics(_summary(a), _summary(b), a.size)[STAT_BOUND]
        assert bound is not None and red is not None and bound <= red * (1 + 1e-5) + 1e-7
    assert math.isnan(stat_metrics(g, {**t, "max": math.nan}, 16)[STAT_BOUND] or 0.0)
    # the golden run overflowed too: the same NaN (or Inf) on both sides is no difference, one NaN more is
    both_nan = {"max": math.nan, "min": math.nan, "mean": math.nan, "norm": math.nan}
    assert stat_metrics(both_nan, dict(both_nan), 16)[STAT_BOUND] == 0.0
    assert stat_metrics({**g, "max": math.inf}, {**g, "max": math.inf}, 16)[STAT_BOUND] == 0.0
    assert stat_metrics({**g, "max": math.nan}, {**t, "max": math.nan}, 16)[STAT_BOUND] == pytest.approx(0.1)
    assert math.isnan(stat_metrics(g, both_nan, 16)[STAT_BOUND] or 0.0)
    assert stat_metrics({"max": 3.0}, {"max": 3.0}, 4)[STAT_BOUND] == 0.0  # no norm recorded, equal statistics
    assert stat_metrics({}, {}, 4)[STAT_BOUND] is None


@needs_msit
def test_msit_statistics_dumps(tmp_path: Path) -> None:
    tokens = stats_dumps.dump("msit", "stats", tmp_path / "golden")
    stats_dumps.dump("msit", "stats", tmp_path / "clean", bf16=True, forced=tokens)
    stats_dumps.dump("msit", "stats", tmp_path / "bad", bf16=True, scale=SCALE, forced=tokens)
    golden, clean, bad = (next((tmp_path / n).glob("msit_dump_*/torch_tensors/*")) for n in ("golden", "clean", "bad"))
    out, con = stats_dumps.compare(golden, clean, tmp_path / "o_clean")
    n, on_stats, undecided, failed = stats_dumps.verdict_counts(con)
    assert n > 100 and on_stats == n and undecided == 0 and failed == 0, out
    assert stats_dumps.born(con) == {None}
    assert f"on statistics only: {n} of {n} pairs judged on max/min/mean/norm" in out, out
    # `wb logits` said "no logits ... dump lm_head", which these dumps did, as statistics
    res = run_wb("logits", "-gp", str(golden), "-mp", str(clean))
    assert res.returncode == 2 and "the logits (root.lm_head) were dumped as statistics only" in res.stderr, res.stderr
    # the logits were dumped as statistics only: said so, with what their statistics say
    assert "first divergent token: unknown (the logits (root.lm_head) were dumped as statistics only" in out, out
    assert "their max/min/mean/norm pass at all" in out
    # msit's statistics comparison report: every pair, named, with its statistics' differences
    (report,) = (tmp_path / "o_clean").glob("statstics_cmp_report_*.csv")
    import csv

    with open(report, encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == n and list(rows[0])[:6] == [
        "token_id",
        "data_id",
        "golden_data_path",
        "golden_op_type",
        "my_data_path",
        "my_op_type",
    ]
    assert all(r["golden_data_path"] and r["my_data_path"] and r["max_stat_absolute_error"] != "" for r in rows)
    norm = next(r for r in rows if r["golden_data_path"] == "root.model.norm:out0")
    db = con.execute(
        "SELECT max_stat_absolute_error, l2norm_stat_relative_error FROM comparison "
        "WHERE golden_node = 'root.model.norm' AND io = 'out' AND token_id = ?",
        [int(norm["token_id"])],
    ).fetchone()
    assert db is not None and float(norm["max_stat_absolute_error"]) == pytest.approx(db[0], rel=1e-9)
    assert float(norm["l2norm_stat_relative_error"]) == pytest.approx(db[1], rel=1e-9)
    assert "statistics report (msit's statistics comparison columns): " in out
    # every statistics metric is stored, matching msit's formula on the catalog's recorded statistics
    row = con.execute(
        "SELECT golden_max_value, my_max_value, max_stat_absolute_error, max_stat_relative_error FROM comparison "
        "WHERE golden_node = 'root.model.norm' AND io = 'out'"
    ).fetchone()
    assert row is not None and row[2] == pytest.approx(abs(row[1] - row[0]))
    assert row[3] == pytest.approx(abs(row[1] - row[0]) / abs(row[0]))
    out, con = stats_dumps.compare(golden, bad, tmp_path / "o_bad")
    assert stats_dumps.born(con) == {"root.model.layers.1.mlp.down_proj"}, out
    assert "error born at: root.model.layers.1.mlp.down_proj (token 0)" in out
    assert "no lm_head" not in out and "were dumped as statistics only" in out, out


@needs_msit
def test_msit_statistics_dump_is_ordered_by_its_data_flow(tmp_path: Path) -> None:
    """msit's dumper records no order; with tensors wb orders modules by their data flow (an output's content found
    in a later module's input). A statistics-only dump kept the modules' definition order: a Llama layer's
    `self_attn` and `mlp` before its `input_layernorm` (their order in `__init__`), so an input_layernorm defect
    was born at `self_attn` (its hidden state is a keyword argument msit does not dump). msit prints statistics in
    full: the same dtype, shape, max, min, mean and norm find the same tensor, as the content does."""
    from workbench.formats.msit_torch import read_msit_torch

    tokens = stats_dumps.dump("msit", "full", tmp_path / "full")
    stats_dumps.dump("msit", "stats", tmp_path / "stats", forced=tokens)
    weight = "model.layers.1.input_layernorm=1.1"
    stats_dumps.dump("msit", "stats", tmp_path / "bad", bf16=True, forced=tokens, weight=weight)
    full, stats, bad = (next((tmp_path / n).glob("msit_dump_*/torch_tensors/*")) for n in ("full", "stats", "bad"))
    orders = []
    for dump in (read_msit_torch(full), read_msit_torch(stats)):
        assert dump.order_source == "data-flow"
        orders.append([n.name for n in sorted(dump.nodes, key=lambda n: (n.exec_order is None, n.exec_order or 0))])
    assert orders[0] == orders[1]
    layer = [n for n in orders[1] if n.startswith("root.model.layers.1.") and n.count(".") == 4]
    assert layer.index("root.model.layers.1.input_layernorm") < layer.index("root.model.layers.1.self_attn"), layer
    out, con = stats_dumps.compare(stats, bad, tmp_path / "o_bad")
    assert stats_dumps.born(con) == {"root.model.layers.1.input_layernorm"}, out


@needs_msprobe
def test_msprobe_summary_dumps(tmp_path: Path) -> None:
    tokens = stats_dumps.dump("msprobe", "stats", tmp_path / "golden")
    stats_dumps.dump("msprobe", "stats", tmp_path / "clean", bf16=True, forced=tokens)
    stats_dumps.dump("msprobe", "stats", tmp_path / "bad", bf16=True, scale=SCALE, forced=tokens)
    out, con = stats_dumps.compare(tmp_path / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o_clean")
    n, on_stats, undecided, failed = stats_dumps.verdict_counts(con)
    assert n > 300 and on_stats == n and undecided == 0 and failed == 0, out
    assert "nothing could be compared" not in out
    out, con = stats_dumps.compare(tmp_path / "golden" / "dump", tmp_path / "bad" / "dump", tmp_path / "o_bad")
    born = stats_dumps.born(con)
    assert born and all(b is not None and "layers.1.mlp" in b for b in born), (born, out)


def test_atb_statistics_bins(tmp_path: Path) -> None:
    """Our ATB stack's statistics-only `.bin` headers: statistics on both sides, and full golden vs statistics."""
    from tests.conftest import atb_test_llama
    from workbench.backends import AtbDumpConfig, AtbLlama
    from workbench.backends.defects import Defect

    hf = atb_test_llama()
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(1))
    golden = AtbLlama.from_hf(hf, dtype=torch.float32)
    g_full = golden.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "g_full", seed=0)).dump_root
    g_stats = golden.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "g_stats", seed=0, stats_only=True)).dump_root
    test = AtbLlama.from_hf(hf, dtype=torch.bfloat16)
    t_stats = test.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "t_stats", seed=0, stats_only=True)).dump_root
    bad = AtbLlama.from_hf(hf, dtype=torch.bfloat16, defect=Defect("rmsnorm_eps"))
    b_stats = bad.run(prompt, 2, dump=AtbDumpConfig(tmp_path / "b_stats", seed=0, stats_only=True)).dump_root
    assert g_full and g_stats and t_stats and b_stats
    # mixed (full golden, statistics test) on a clean run; statistics on both sides on a planted defect
    out, con = stats_dumps.compare(g_full, t_stats, tmp_path / "o_mixed")
    n, on_stats, undecided, failed = stats_dumps.verdict_counts(con)
    assert n > 20 and on_stats == n and undecided == 0 and failed == 0, out
    out, con = stats_dumps.compare(g_stats, b_stats, tmp_path / "o_bad")
    born = stats_dumps.born(con, "n.type || ' layer ' || n.layer")
    assert born == {"RmsNormOperation layer 1"}, (born, out)


def _inside(con: duckdb.DuckDBPyConnection, name: str, module: str) -> bool:
    """Whether golden node `name` is `module` or lies inside it (msprobe's API calls sit below their module)."""
    row = con.execute(
        "WITH RECURSIVE up(node_id, parent_id, name) AS ("
        " SELECT node_id, parent_id, name FROM nodes WHERE run_id = 1 AND name = ?"
        " UNION ALL SELECT n.node_id, n.parent_id, n.name FROM nodes n JOIN up ON n.node_id = up.parent_id"
        " AND n.run_id = 1) SELECT count(*) FROM up WHERE name LIKE ?",
        [name, f"%{module}%"],
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize(
    ("tool", "weight"),
    [
        pytest.param("msit", "model.layers.1.mlp.down_proj", marks=needs_msit),
        pytest.param("msprobe", "model.layers.1.mlp.down_proj", marks=needs_msprobe),
        pytest.param("msprobe", "model.layers.1.post_attention_layernorm", marks=needs_msprobe),
    ],
)
def test_advisor_on_statistics_dumps(tmp_path: Path, tool: str, weight: str) -> None:
    """A 3 % weight scale, bf16 test vs fp32 golden, both statistics-only: below the verdict's bound, yet
    `wb advise` ranks the planted module (or the call inside it that reads the weight) first at every token."""
    tokens = stats_dumps.dump(tool, "stats", tmp_path / "golden")
    stats_dumps.dump(tool, "stats", tmp_path / "bad", bf16=True, forced=tokens, weight=f"{weight}=1.03")
    if tool == "msit":
        golden, bad = (next((tmp_path / n).glob("msit_dump_*/torch_tensors/*")) for n in ("golden", "bad"))
    else:
        golden, bad = tmp_path / "golden" / "dump", tmp_path / "bad" / "dump"
    _out, con = stats_dumps.compare(golden, bad, tmp_path / "o")
    n, on_stats, undecided, _failed = stats_dumps.verdict_counts(con)
    assert n > 100 and on_stats == n and undecided == 0
    proc = run_wb("advise", "-c", str(tmp_path / "o" / "catalog.duckdb"), "-k", "3", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    firsts = {r["token_id"]: r for r in rows if r["rank"] == 1}
    assert len(firsts) == len(tokens)
    for tok, r in firsts.items():
        assert _inside(con, r["golden_node"], weight.removeprefix("model.")), (tok, r, rows)
        assert r["score"] >= 3.0, r  # it stands out of its peers' noise


@pytest.mark.parametrize("tool", [pytest.param("msit", marks=needs_msit), pytest.param("msprobe", marks=needs_msprobe)])
def test_statistics_dumps_whose_tokens_diverge(tmp_path: Path, tool: str) -> None:
    """A bf16 test run with a 40x down_proj weight generates other tokens than its fp32 golden run (it does not
    follow them): the decode tokens' ids are read from the statistics of the embedding's one-element input
    (max = min = the id), so `wb compare` says the inputs differ there and names no op. msprobe's module holding the
    defect is where the error is born (its Functional.linear reads the bad weight as an input): the note under it
    names that call, which scores high, not `inside its peers' noise`."""
    golden_ids = stats_dumps.dump(tool, "stats", tmp_path / "golden")
    test_ids = stats_dumps.dump(tool, "stats", tmp_path / "bad", bf16=True, weight="model.layers.0.mlp.down_proj=40")
    assert golden_ids[0] != test_ids[0], "the planted defect should change the first generated token"
    sub = "" if tool == "msit" else "dump"
    out, con = stats_dumps.compare(tmp_path / "golden" / sub, tmp_path / "bad" / sub, tmp_path / "o")
    said = f"token 1: inputs differ (golden token id {golden_ids[0]}, test token id {test_ids[0]})"
    assert said in out and "[from the embedding input's statistics]" in out, out
    assert "(token 1)" not in out and "(token 2)" not in out, out  # no op is named where the inputs differ
    rows = con.execute("SELECT token_id, inputs_differ, source FROM token_status ORDER BY 1").fetchall()
    assert rows == [(0, None, None), (1, True, "embedding statistics"), (2, True, "embedding statistics")], rows
    assert stats_dumps.born(con) - {None} and all(
        "layers.0.mlp.down_proj" in str(b) for b in stats_dumps.born(con) - {None}
    )
    assert "inside its peers' noise" not in out, out
    if tool == "msprobe":
        assert "most of it is added inside it, by Functional.linear." in out, out
        html = tmp_path / "report.html"
        proc = run_wb("report", str(tmp_path / "o" / "catalog.duckdb"), "-o", str(html))
        assert proc.returncode == 0, proc.stderr
        page = html.read_text(encoding="utf-8")
        assert "most of it is added inside it, by Functional.linear." in page
        assert f"none named: {said.removeprefix('token 1: ')}" in page


@needs_msit
def test_statistics_dumps_of_other_prompts(tmp_path: Path) -> None:
    """Two msit statistics-only runs fed different prompts of the same length: the prefill's ids are not in the
    statistics (max != min), but their statistics differ, so token 0's inputs differ and no op is named."""
    stats_dumps.dump("msit", "stats", tmp_path / "golden")
    stats_dumps.dump("msit", "stats", tmp_path / "other", prompt_seed=4)
    out, con = stats_dumps.compare(tmp_path / "golden", tmp_path / "other", tmp_path / "o")
    assert "token 0: inputs differ (the word embedding's input has " in out, out
    assert "error born at" not in out, out
    row = con.execute("SELECT inputs_differ, source, golden_input_id FROM token_status WHERE token_id = 0").fetchone()
    assert row == (True, "embedding statistics", None), row
