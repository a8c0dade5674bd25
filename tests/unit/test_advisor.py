"""The root-cause advisor (`workbench.analysis.verdicts.advisor`, `wb advise`, the summary's `most likely origin`).

Real tiny Llama / Qwen2 models (bench/advisor_defects.py's shapes and defects), fp32 golden vs bf16 / fp16
test runs with one subtle planted defect each, dumped by our dumper and by msit's own; every op passing,
every op failing; the ATB demo.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import torch

from bench import advisor_defects
from tests.conftest import invoke_wb, run_wb
from tests.fixtures.bench_dumps import bench_dumps
from workbench.analysis.verdicts.advisor import SIGNIFICANT, Advice, advise, compute_advice
from workbench.compare.judging.thresholds import Thresholds


@dataclass
class Run:
    catalog: Path
    stdout: str
    planted: str | None


def _dump(model: torch.nn.Module, base: Path, prompt: torch.Tensor, forced: list[int] | None) -> tuple[Path, list[int]]:
    from workbench.demo import decode
    from workbench.dump import DumpConfig, register_hook

    handle = register_hook(model, DumpConfig(dump_path=str(base), token_range=[0, 1, 2]))
    try:
        tokens = decode(model, prompt, 3, forced)
    finally:
        handle.remove()
    return next(base.glob("msit_dump_*/torch_tensors/*")), tokens


def _compare(golden: Path, test: Path, out: Path, planted: str | None) -> Run:
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(out), "--workers", "1")
    assert res.returncode == 0, res.stderr
    return Run(out / "catalog.duckdb", res.stdout, planted)


# (model, case name, test dtype); the case names are bench/advisor_defects.py's
CASES = [
    ("llama5", "down2", torch.bfloat16),
    ("llama5", "k1", torch.float16),
    ("qwen4", "gelu1", torch.float16),
    ("qwen4", "eps3", torch.bfloat16),
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    bench = advisor_defects
    base = tmp_path_factory.mktemp("advisor")
    out: dict[str, Run] = {}
    goldens: dict[str, tuple[torch.nn.Module, Path, list[int]]] = {}
    for model_name in ("llama5", "qwen4"):
        model = bench.build_model(model_name)
        golden, tokens = _dump(model, base / f"golden_{model_name}", bench.prompt_ids(model_name), None)
        goldens[model_name] = (model, golden, tokens)
    for model_name, case_name, dtype in CASES:
        model, golden, tokens = goldens[model_name]
        case = next(c for c in bench.CASES if c.name == case_name)
        test_model = copy.deepcopy(model)
        bench.plant(test_model, case)
        test, _ = _dump(test_model.to(dtype), base / case_name, bench.prompt_ids(model_name), tokens)
        out[case_name] = _compare(golden, test, base / f"out_{case_name}", "root." + case.module)
    model, golden, tokens = goldens["llama5"]
    prompt = bench.prompt_ids("llama5")
    clean, _ = _dump(copy.deepcopy(model).to(torch.bfloat16), base / "clean_bf16", prompt, tokens)
    out["clean_bf16"] = _compare(golden, clean, base / "out_clean_bf16", None)
    same, _ = _dump(copy.deepcopy(model), base / "same_fp32", prompt, tokens)
    out["same_fp32"] = _compare(golden, same, base / "out_same_fp32", None)
    broken = copy.deepcopy(model)
    with torch.no_grad():  # 30 % noise on the embeddings: every op after them fails
        w: torch.Tensor = broken.get_submodule("model.embed_tokens").weight  # type: ignore[assignment]
        w.add_(0.3 * float(w.std()) * torch.randn(w.shape, generator=torch.Generator().manual_seed(5)))
    bad, _ = _dump(broken, base / "embed_noise", prompt, tokens)
    out["all_fail"] = _compare(golden, bad, base / "out_all_fail", "root.model.embed_tokens")
    return out


def _advice(run: Run, **kw: object) -> list[Advice]:
    con = duckdb.connect(str(run.catalog), read_only=True)
    try:
        return advise(con, 1, **kw)  # type: ignore[arg-type]
    finally:
        con.close()


@pytest.mark.parametrize("case", [c[1] for c in CASES])
def test_planted_defect_ranked_first_at_every_token(runs: dict[str, Run], case: str) -> None:
    run = runs[case]
    items = _advice(run, top=1)
    assert sorted(a.token_id for a in items) == [0, 1, 2]
    for a in items:
        assert a.golden_node == run.planted, (a, run.stdout)
        assert a.score >= SIGNIFICANT and a.rank == 1
        assert "output rel. error" in a.reason and "x what" in a.reason and "lower bounds" not in a.reason
    # the summary: the op is either born (it fails with passing inputs) or the most likely origin
    for tok in (0, 1, 2):
        assert f"error born at: {run.planted} (token {tok})" in run.stdout or (
            f"most likely origin: {run.planted} (token {tok}): output rel. error" in run.stdout
        ), run.stdout


def test_subtle_scale_is_named_by_the_advisor_not_by_pass_fail(runs: dict[str, Run]) -> None:
    # down_proj x1.02 in bf16 passes every bound: only the advisor can name it
    out = runs["down2"].stdout
    assert "error born at" not in out
    assert "most likely origin: root.model.layers.2.mlp.down_proj (token 0): output rel. error" in out
    assert "LlamaMLP.down_proj adds in the other 4 layers" in out


def test_clean_run_stays_quiet(runs: dict[str, Run]) -> None:
    run = runs["clean_bf16"]
    top = _advice(run, top=1)
    assert len(top) == 3 and all(a.score < SIGNIFICANT for a in top), top
    assert "most likely origin" not in run.stdout and "error born at" not in run.stdout
    assert run.stdout.count("nothing stands out of the noise") == 3


def test_every_op_passes(runs: dict[str, Run]) -> None:
    run = runs["same_fp32"]
    items = _advice(run)
    con = duckdb.connect(str(run.catalog), read_only=True)
    try:
        ranked = con.execute(
            "SELECT token_id, count(*) FROM node_results WHERE cmp_id = 1 AND out_pairs > 0 GROUP BY 1 ORDER BY 1"
        ).fetchall()
        failed = con.execute("SELECT count(*) FROM metrics WHERE passed = false").fetchone()
    finally:
        con.close()
    assert failed == (0,)
    assert [(t, sum(1 for a in items if a.token_id == t)) for t, _ in ranked] == ranked
    assert all(a.score == 0 for a in items)
    assert all("adds nothing measurable" in a.reason for a in items)
    assert [a.rank for a in items if a.token_id == 0] == list(range(1, ranked[0][1] + 1))
    assert run.stdout.count("no error born") == 3 and "most likely origin" not in run.stdout


def test_every_op_fails(runs: dict[str, Run]) -> None:
    run = runs["all_fail"]
    con = duckdb.connect(str(run.catalog), read_only=True)
    try:
        passing = con.execute(
            "SELECT DISTINCT n.name FROM node_results r JOIN nodes n ON n.run_id = 1 AND n.node_id = r.golden_node_id "
            "WHERE r.cmp_id = 1 AND r.passed"
        ).fetchall()
        failing = con.execute("SELECT count(*) FROM node_results WHERE cmp_id = 1 AND NOT passed").fetchone()
    finally:
        con.close()
    assert passing == [("root.model.rotary_emb",)] and failing is not None and failing[0] > 100  # only cos/sin pass
    for a in _advice(run, top=1):
        assert a.golden_node == "root.model.embed_tokens", a
        assert a.score >= SIGNIFICANT


def test_advice_table_matches_the_computation(runs: dict[str, Run]) -> None:
    run = runs["k1"]
    con = duckdb.connect(str(run.catalog), read_only=True)
    try:
        stored = advise(con, 1)
        fresh = [a for tok, items in sorted(compute_advice(con, 1).items()) for a in items]
        ranked = con.execute("SELECT count(*) FROM advice WHERE cmp_id = 1").fetchone()
    finally:
        con.close()
    assert stored == fresh and ranked == (len(stored),)
    one = _advice(run, token=1, top=2)
    assert [(a.token_id, a.rank) for a in one] == [(1, 1), (1, 2)]


def test_parent_never_before_the_child_that_explains_it(runs: dict[str, Run]) -> None:
    for a in _advice(runs["k1"]):
        if a.rank == 1:
            assert a.golden_node.endswith("k_proj")
        # the attention and the layer carry k_proj's error: they rank after it
        if a.golden_node in ("root.model.layers.1.self_attn", "root.model.layers.1"):
            assert a.rank > 1


# ------------------------------------------------------------------------------------------------ wb advise
def test_cli_table_csv_json(runs: dict[str, Run]) -> None:
    cat = str(runs["down2"].catalog)
    res = run_wb("advise", "--catalog", cat, "--top", "2")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[1].startswith("order: score, highest first")  # the order rule (docs/guide.md)
    assert lines[2].split()[:6] == ["rank", "token_id", "golden_node", "test_node", "score", "reason"]
    assert lines[3].split()[:3] == ["1", "0", "root.model.layers.2.mlp.down_proj"]
    assert len(lines) == 3 + 3 * 2

    res = run_wb("advise", "-c", cat, "--token", "1", "--top", "3", "--format", "csv")
    assert res.returncode == 0, res.stderr
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert [r["rank"] for r in rows] == ["1", "2", "3"] and {r["token_id"] for r in rows} == {"1"}
    assert rows[0]["golden_node"] == "root.model.layers.2.mlp.down_proj" and float(rows[0]["score"]) >= SIGNIFICANT
    assert {"test_node", "reason"} <= rows[0].keys()

    res = run_wb("advise", "-c", cat, "--cmp", "1", "--top", "0", "--format", "json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert len(data) > 100 and data[0]["rank"] == 1 and data[0]["golden_node"].endswith("layers.2.mlp.down_proj")
    assert set(data[0]) >= {"rank", "token_id", "golden_node", "test_node", "score", "reason"}


def test_cli_errors_are_one_line(runs: dict[str, Run], tmp_path: Path) -> None:
    cat = str(runs["down2"].catalog)
    for args, needle in (
        (("--catalog", str(tmp_path / "nope.duckdb")), "no such catalog"),
        (("-c", cat, "--format", "xml"), "--format 'xml'"),
        (("-c", cat, "--token", "99"), "has no token 99"),
        (("-c", cat, "--cmp", "7"), "no comparison 7"),
        (("-c", cat, "--top", "-1"), "--top -1"),
    ):
        res = invoke_wb("advise", *args)
        assert res.returncode == 2, (args, res.stdout)
        assert len(res.stderr.strip().splitlines()) == 1 and needle in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


# ------------------------------------------------------------------------------------------------ msit's dumper
@pytest.mark.parametrize(
    ("dumper", "module", "case", "dtype", "prompt"),
    [
        ("msit", "msit_llm", "q2", "bfloat16", 16),
        # a fused gate_up projection: SwiGLU's product of its two halves doubles its error inside the MLP's own code;
        # the MLP came first until a standing-out child could explain a third of a parent's error
        ("msit", "msit_llm", "gu3p", "bfloat16", 16),
        ("msprobe", "msprobe.pytorch", "o0", "float16", 16),
        # msprobe names hold the module's class (`act_fn.SiLUActivation.forward` against `act_fn.GELU.forward`): the
        # swapped activation is still paired with the golden one, and ranked first
        ("msprobe", "msprobe.pytorch", "gelu1", "bfloat16", 16),
        # fp16 overflows in the op: its whole output is NaN/Inf, no error is measured there, and it is still first
        ("msit", "msit_llm", "inf1", "float16", 16),
        # the token embedding has no peers: a lookup is held to one rounding, and its reason says so with its score
        ("msprobe", "msprobe.pytorch", "emb", "bfloat16", 16),
        # a whole decoder layer adds 2 % of its input, every child op clean: the layer is the finding
        ("msit", "msit_llm", "res2", "float16", 16),
        ("msprobe", "msprobe.pytorch", "res1m", "float16", 16),
        # msprobe dumps the rotary tables (8 % off from a rounded inv_freq at 512 positions) as the layer's inputs:
        # counted as carried in, they hid what the layer adds
        ("msprobe", "msprobe.pytorch", "res1m", "bfloat16", 512),
    ],
)
def test_peer_dumper_defect_ranked_first(
    tmp_path: Path, dumper: str, module: str, case: str, dtype: str, prompt: int
) -> None:
    # msit's own register_hook / msprobe's own PrecisionDebugger (L0), each in a subprocess (process-wide state)
    pytest.importorskip(module, reason=f"{module} not installed")
    bench = advisor_defects
    golden_dir, test_dir = tmp_path / "golden", tmp_path / "test"
    golden_dir.mkdir()
    test_dir.mkdir()
    spec = next(c for c in bench.CASES if c.name == case)
    job = {"model": spec.model, "dumper": dumper, "prompt": prompt}
    golden = bench.run_dump({**job, "out": str(golden_dir)})
    tokens = json.loads((golden_dir / "tokens.json").read_text())
    test = bench.run_dump({**job, "out": str(test_dir), "case": case, "dtype": dtype, "tokens": tokens})
    planted = spec.module
    run = _compare(golden, test, tmp_path / "out", planted)
    firsts = _advice(run, top=1)
    assert len(firsts) == 3, firsts
    for a in firsts:
        assert bench._same_module(a.golden_node, planted), firsts
        assert a.score >= SIGNIFICANT
        # a swapped class is said where the error is born, and only there
        assert ("the test run has a " in a.reason and "the golden run a SiLU" in a.reason) == case.startswith("gelu")
        if case == "inf1":
            assert a.reason.startswith("NaN/Inf appear in its output and not in its inputs (output with no position"), a
        if case == "emb":  # the score is the error over the rounding the reason names (a leaf: all of it its own)
            said = re.fullmatch(
                r"output rel\. error ([0-9.e-]+) from inputs at 0: ([0-9.]+)x one bfloat16 rounding \(2\^-8\), "
                r"all a lookup adds",
                a.reason,
            )
            assert said is not None, a.reason
            assert float(said[2]) == pytest.approx(float(said[1]) / 2**-8, rel=0.02), a.reason
    assert run.stdout.count("most likely origin: ") + run.stdout.count("error born at: ") == 3, run.stdout


@pytest.mark.parametrize(("dumper", "case"), [("msit", "inf1"), ("atbprobe", "inf3a")])
def test_statistics_only_dump_of_an_fp16_overflow_names_the_op(tmp_path: Path, dumper: str, case: str) -> None:
    """msit's statistics-only dump writes `nan` for every statistic of a tensor holding NaN, msprobe's ATB probe
    its reductions' starting values (max -FLT_MAX, min FLT_MAX) and `nan`. They are NaN in the catalog (NULL would
    read as "not recorded"): the op whose output turns NaN is where the error is born and the advisor's first op
    (on ATB the Inf is in the Linear's weight input, its own), and the logits' statistics fail (they said "pass")."""
    if dumper == "msit":
        pytest.importorskip("msit_llm", reason="msit_llm not installed")
    else:
        from tests.fixtures.msprobe_atb import skip_reason

        if (why := skip_reason()) is not None:
            pytest.skip(why)
    bench = advisor_defects
    spec = next(c for c in bench.CASES if c.name == case)
    job = {"model": spec.model, "dumper": dumper, "prompt": 16, "stats": True}
    (tmp_path / "golden").mkdir()
    (tmp_path / "test").mkdir()
    golden = bench.run_dump({**job, "out": str(tmp_path / "golden")})
    tokens = json.loads((tmp_path / "golden" / "tokens.json").read_text())
    test = bench.run_dump({**job, "out": str(tmp_path / "test"), "case": case, "dtype": "float16", "tokens": tokens})
    run = _compare(golden, test, tmp_path / "out", spec.module)
    firsts = _advice(run, top=1)
    assert len(firsts) == 3, firsts
    con = duckdb.connect(str(run.catalog), read_only=True)
    try:
        layers = dict(con.execute("SELECT node_id, layer FROM nodes WHERE run_id = 1").fetchall())
        nan_max = con.execute("SELECT count(*) FROM tensors WHERE isnan(max)").fetchone()
    finally:
        con.close()
    for a in firsts:
        planted = bench._same_module(a.golden_node, spec.module)
        assert planted or bench._same_atb_op(a.golden_node, layers[a.golden_node_id], spec.module), firsts
    if dumper == "msit":
        for tok in range(3):
            assert f"error born at: root.{spec.module} (token {tok})" in run.stdout, run.stdout
    # (ATB: the prefill graph's LM head holds token 0's logits, the decode graph's the others: the first was missed)
    assert "their max/min/mean/norm first fail at token 0" in run.stdout, run.stdout
    assert all(a.reason.startswith("NaN/Inf appear in its output and not in its inputs") for a in firsts), firsts
    assert nan_max is not None and nan_max[0] > 0


def test_rotary_table_from_a_rounded_inv_freq_is_explained_and_gives_way(tmp_path: Path) -> None:
    """`model.to(bfloat16)` rounds the rotary embedding's inv_freq buffer: at a 256-token prompt the rotary table's
    own error stands out. wb says why (`likely cause`), and a planted defect standing out at the same token still
    comes first; with inv_freq kept in float32 the rotary table is quiet."""
    bench = advisor_defects
    _dumper, dump = bench_dumps(tmp_path, "llama5", 256)

    golden = dump("golden")
    tokens = json.loads((tmp_path / "golden" / "tokens.json").read_text())
    cause = "likely cause: the rotary embedding's inv_freq held in bfloat16"
    rounded = _compare(golden, dump("rounded", dtype="bfloat16", tokens=tokens), tmp_path / "o_rounded", None)
    named = [line for line in rounded.stdout.splitlines() if "rotary_emb (token" in line]
    assert named and cause in rounded.stdout, rounded.stdout
    assert all(a.golden_node.endswith("rotary_emb") and a.cause for a in _advice(rounded, top=1) if a.score >= 3)

    kept = dump("kept", dtype="bfloat16", tokens=tokens, fp32_inv_freq=True)
    quiet = _compare(golden, kept, tmp_path / "o_kept", None)
    assert "likely cause" not in quiet.stdout and "rotary_emb (token" not in quiet.stdout, quiet.stdout

    planted = next(c for c in bench.CASES if c.name == "down2").module
    both = _compare(golden, dump("down2", dtype="bfloat16", tokens=tokens, case="down2"), tmp_path / "o_both", planted)
    first = _advice(both, top=1)
    assert bench._same_module(first[0].golden_node, planted) and first[0].score >= SIGNIFICANT, first
    assert f"{planted} (token 0)" in both.stdout, both.stdout  # named by the summary too
    explained = sorted({a.token_id for a in _advice(both) if a.cause and a.score >= SIGNIFICANT})
    if explained:  # the rotary table stood out too: said once, with its cause, below the defect's lines
        assert "also standing out, explained: root.model.rotary_emb (token" in both.stdout, both.stdout
    for tok in {a.token_id for a in _advice(both)}:
        ranked = _advice(both, token=tok)
        unexplained = [a for a in ranked if a.cause is None and a.score >= SIGNIFICANT]
        if unexplained:  # an op standing out unexplained is never ranked after an explained one
            assert ranked[0].cause is None, ranked[:3]


# ------------------------------------------------------------------------------------------------ ATB demo
def test_atb_demo_catalog(demo_catalog: Path) -> None:
    con = duckdb.connect(str(demo_catalog), read_only=True)
    try:
        top = advise(con, 1, top=1)
    finally:
        con.close()
    assert [a.token_id for a in top] == [0, 1, 2, 3]
    for a in top:
        assert a.golden_node == "root.model.layers.1.post_attention_layernorm", a
        assert "the test run has a " not in a.reason, a  # a torch module and an ATB op: types of two kinds
        assert a.test_node is not None and a.test_node.endswith("3_RmsNormOperation")


def test_atb_demo_rope_named_at_every_token_with_precheck(tmp_path: Path) -> None:
    # rope_base: the golden side has no RoPE module, so the error shows in the attention or the MLP;
    # the precheck of the rest of the layer finds the op
    res = run_wb("demo", "--no-tui", "--defect", "rope_base", "--out", str(tmp_path / "demo"), timeout=600)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    for tok in range(4):
        line = next(i for i, s in enumerate(lines) if f"(token {tok})" in s and ("error born at" in s or "origin" in s))
        assert "1_Attention/1_RopeOperation]" in lines[line], lines[line]
        assert "RopeOperation" in lines[line + 1] and "disagrees with its own re-run" in lines[line + 1]


# ------------------------------------------------------------------------------------------------ logits rule
def test_logits_rule_judges_outputs_not_lm_head_input() -> None:
    th = Thresholds.load()
    vals: dict[str, float | None] = {
        "cosine_similarity": 0.99999,
        "relative_euclidean_distance": 0.01,
        "kl_divergence": 0.5,
    }
    assert th.judge(vals, "bfloat16", node_name="root.lm_head", node_type="Linear", io="in") == (True, [])
    assert th.judge(vals, "bfloat16", node_name="root.lm_head", node_type="Linear", io="out") == (
        False,
        ["kl_divergence"],
    )
    # the model's own output (the root module) is judged as logits too
    assert th.judge(vals, "bfloat16", node_name="root", node_type="LlamaForCausalLM", is_model=True)[0] is False
    assert th.judge(vals, "bfloat16", node_name="root", node_type="LlamaForCausalLM")[0] is True
    assert "kl_divergence" not in th.verdict_metrics("bfloat16", node_name="root.lm_head", io="in")


def test_layer_zero_attention_carrying_the_rotary_error_is_explained_and_a_defect_there_is_not(tmp_path: Path) -> None:
    """A 1024-wide Llama at a 512-token prompt in float16: transformers hands the rotary tables (from an inv_freq
    rounded by `model.to(float16)`) to every attention as keyword arguments the dump does not hold. Layer 0's
    attention, the only one with a clean input, shows their error: wb names the tables as its cause and ranks it
    right after them, and no op stands out unexplained. A wrong softmax scale in that attention adds more than the
    tables hold: it stays first, unexplained."""
    bench = advisor_defects
    dumper, dump = bench_dumps(tmp_path, "llama_mid", 512)

    golden = dump("golden")
    tokens = json.loads((tmp_path / "golden" / "tokens.json").read_text())
    clean = _compare(golden, dump("clean", dtype="float16", tokens=tokens), tmp_path / "o_clean", None)
    ranked = _advice(clean)
    assert not [a for a in ranked if a.score >= SIGNIFICANT and a.cause is None], ranked[:6]
    carried = [a for a in ranked if a.golden_node == "root.model.layers.0.self_attn" and a.cause]
    assert carried, [a for a in ranked if a.golden_node == "root.model.layers.0.self_attn"]
    for a in carried:
        assert "rotary_emb's error" in a.cause and a.cause in a.reason, a  # type: ignore[operator]
        above = _advice(clean, token=a.token_id)[a.rank - 2]
        assert above.golden_node == "root.model.rotary_emb" and above.cause, above
    assert "most likely origin: root.model.layers.0.self_attn" not in clean.stdout, clean.stdout
    # an op the thresholds catch (outputs fail, inputs pass) that adds no more than its peers: the summary says so
    lines = clean.stdout.splitlines()
    if dumper == "msit":  # this model's msit dump: layers.1.mlp fails at tokens 1-2, adding 1.0-1.3x its peers
        assert "  the advisor scores it " in clean.stdout, clean.stdout
    for i, line in enumerate(lines):
        if line.startswith("error born at: ") and not any(s in line for s in ("rotary_emb", "layers.0.self_attn")):
            assert lines[i + 1].startswith("  the advisor scores it ") and "inside its peers' noise" in lines[i + 1]
    html = tmp_path / "clean.html"
    assert run_wb("report", str(clean.catalog), "-o", str(html)).returncode == 0
    in_noise = "inside its peers&#x27; noise" in html.read_text(encoding="utf-8")
    assert in_noise == ("  the advisor scores it " in clean.stdout), (
        clean.stdout
    )  # the report says what wb compare does

    planted = next(c for c in bench.CASES if c.name == "scale0d").module
    wrong = _compare(golden, dump("scale0d", dtype="float16", tokens=tokens, case="scale0d"), tmp_path / "o_s", planted)
    for a in _advice(wrong, top=1):
        assert bench._same_module(a.golden_node, planted) and a.cause is None and a.score >= SIGNIFICANT, a
