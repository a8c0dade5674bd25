"""The advisor on msprobe's API-level dumps (`level: mix`: modules and the torch calls inside them), bf16 test vs
fp32 golden, real dumps by msprobe's `PrecisionDebugger`. Two things of such dumps misled it: the rotary module's
`Tensor.sin`/`Tensor.cos`, computed in float32 from the `inv_freq` that `model.to(bfloat16)` rounded, stood out at
every decode token (named `error born at` there, above the planted op); and an RMSNorm's `x.pow(2)`, which doubles
the relative error it is fed, stood out of its peers in a clean run."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import duckdb
import pytest

from tests.conftest import run_wb
from tests.fixtures import stats_dumps
from workbench.analysis.explorer.explore import Explorer
from workbench.compare.judging.judge import JUDGE_RULES
from workbench.compare.pairing.mapping import PairSpec
from workbench.jobs.compare import add_node_pairs

pytestmark = pytest.mark.skipif(importlib.util.find_spec("msprobe") is None, reason="msprobe not installed")
CAUSE = "likely cause: the rotary embedding's inv_freq held in bfloat16"
LAST_LINEAR = "the last linear call onto the vocabulary, Functional.linear.14.forward"  # the tiny Llama's lm_head


def _firsts(catalog: Path) -> dict[int, dict[str, object]]:
    proc = run_wb("advise", "-c", str(catalog), "-k", "1", "-f", "json")
    assert proc.returncode == 0, proc.stderr
    return {int(r["token_id"]): r for r in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    base = tmp_path_factory.mktemp("msprobe_mix")
    tokens = stats_dumps.dump("msprobe", "full", base / "golden")
    return base, tokens


@pytest.mark.parametrize(
    ("weight", "inside"),
    [
        ("model.layers.1.mlp.down_proj", "layers.1.mlp.down_proj"),
        ("model.layers.1.post_attention_layernorm", "layers.1.post_attention_layernorm"),
    ],
)
def test_a_planted_weight_is_named_at_every_token(dumps: tuple[Path, list[int]], weight: str, inside: str) -> None:
    base, tokens = dumps
    test = base / weight
    stats_dumps.dump("msprobe", "full", test, bf16=True, forced=tokens, weight=f"{weight}=1.03")
    out, con = stats_dumps.compare(base / "golden" / "dump", test / "dump", test / "o")
    born = [
        str(r[0])
        for r in con.execute(
            "SELECT n.name FROM error_born e JOIN nodes n ON n.run_id = 1 AND n.node_id = e.golden_node_id "
            "ORDER BY e.token_id"
        ).fetchall()
    ]
    con.close()
    assert len(born) == len(tokens) and all(inside in b for b in born), (born, out)
    assert f"also standing out, explained: Tensor.sin.0.forward (tokens 0-{len(tokens) - 1}): {CAUSE}" in out, out
    firsts = _firsts(test / "o" / "catalog.duckdb")
    assert len(firsts) == len(tokens)
    for tok, first in firsts.items():  # the planted module's own call (its Functional.linear, its weight's mul)
        assert float(first["score"]) >= 3.0 and "sin" not in str(first["golden_node"]), (tok, first)


def test_a_clean_run_names_only_the_rounded_rotary_tables(dumps: tuple[Path, list[int]]) -> None:
    base, tokens = dumps
    clean = base / "clean"
    stats_dumps.dump("msprobe", "full", clean, bf16=True, forced=tokens)
    out, con = stats_dumps.compare(base / "golden" / "dump", clean / "dump", clean / "o")
    named = {str(b) for b in stats_dumps.born(con) - {None}}
    con.close()
    assert named <= {"Tensor.sin.0.forward", "Tensor.cos.0.forward"}, out
    for tok, first in _firsts(clean / "o" / "catalog.duckdb").items():
        standing = float(first["score"]) >= 3.0
        assert not standing or CAUSE in str(first["reason"]), (tok, first)  # no pow, no norm: only the known cause
    assert "Tensor.pow" not in out, out


@pytest.fixture(scope="module")
def l1_golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    base = tmp_path_factory.mktemp("msprobe_l1")
    return base, stats_dumps.dump("msprobe", "full", base / "golden", level="L1")


def test_level_l1_a_planted_weight_ranks_first_and_the_tables_are_explained(
    l1_golden: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """msprobe's `level: L1` records the torch calls only, no module around them, and one step holds the three
    forward calls: the step is split into tokens at each word-embedding call (it was all "token 0", the same op at
    three tokens three ops), the rotary tables' `Tensor.sin`/`cos` are taken for one by their kind, and the planted
    down_proj's `Functional.linear` (its weight input differs) ranks first at every token, where `Tensor.sin` did."""
    golden, tokens = l1_golden
    stats_dumps.dump(
        "msprobe",
        "full",
        tmp_path / "bad",
        bf16=True,
        forced=tokens,
        level="L1",
        weight="model.layers.1.mlp.down_proj=1.03",
    )
    out, con = stats_dumps.compare(golden / "golden" / "dump", tmp_path / "bad" / "dump", tmp_path / "o")
    compared = [int(t) for (t,) in con.execute("SELECT DISTINCT token_id FROM matches ORDER BY 1").fetchall()]
    rule = con.execute("SELECT meta->>'token_rule' FROM runs ORDER BY run_id").fetchall()
    layers = con.execute(
        "SELECT layer, count(*) FROM nodes WHERE run_id = 1 GROUP BY 1 ORDER BY 1 NULLS FIRST"
    ).fetchall()
    con.close()
    assert compared == list(range(len(tokens))), (compared, out)
    assert rule == [("word-embedding calls",)] * 2, rule
    assert layers == [(None, 15), (0, 30), (1, 30)], layers  # the repeated block of calls: one layer each
    assert f"also standing out, explained: Tensor.sin.0.forward (tokens 0-{len(tokens) - 1}): " + CAUSE in out, out
    # no LM head module: the token's last linear call onto the vocabulary holds the logits (it said "unknown")
    assert f"the logits of all {len(tokens)} judged tokens pass; no LM head in the dumps: {LAST_LINEAR}" in out, out
    firsts = _firsts(tmp_path / "o" / "catalog.duckdb")
    assert sorted(firsts) == compared
    for tok, first in firsts.items():
        assert first["golden_node"] == "Functional.linear.13.forward", (tok, first)  # layer 1's down_proj
        assert "its weight input differs" in str(first["reason"]) and float(first["score"]) >= 3.0, (tok, first)


def _calls_failed(con: duckdb.DuckDBPyConnection, metric: str) -> list[str]:
    return [
        str(n)
        for (n,) in con.execute(
            "SELECT DISTINCT n.name FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
            "JOIN nodes n ON n.run_id = 1 AND n.node_id = m.golden_node_id "
            "WHERE x.failed_metrics LIKE '%' || ? || '%' ORDER BY 1",
            [metric],
        ).fetchall()
    ]


def test_level_l1_a_clean_run_blames_no_call(l1_golden: tuple[Path, list[int]], tmp_path: Path) -> None:
    """At `level: L1` every call is a top-level node; each was judged as the model's own output (the logits rule's
    KL), and a clean bf16 run said `error born at: Torch.rsqrt.0.forward (token 0)`: an RMSNorm's rsqrt, whose
    float32 output failed the KL bound of float32 logits. Only the run's one root is the model."""
    golden, tokens = l1_golden
    stats_dumps.dump("msprobe", "full", tmp_path / "clean", bf16=True, forced=tokens, level="L1")
    out, con = stats_dumps.compare(golden / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")
    named = {str(b) for b in stats_dumps.born(con) - {None}}
    kl_failed = _calls_failed(con, "kl_divergence")
    failing = {
        str(n)
        for (n,) in con.execute(
            "SELECT DISTINCT n.name FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
            "JOIN nodes n ON n.run_id = 1 AND n.node_id = m.golden_node_id WHERE x.passed = false"
        ).fetchall()
    }
    con.close()
    assert kl_failed == [], kl_failed
    # the float32 calls (an RMSNorm's pow, mean, rsqrt and products) carry the bf16 inputs' error and add none of
    # their own: they pass by bf16's bounds (115 of 591 pairs failed float32's); the rounded rotary table fails
    assert failing <= {"Tensor.sin.0.forward", "Tensor.cos.0.forward"}, failing
    explorer = Explorer(tmp_path / "o" / "catalog.duckdb")  # and the app's detail pane says what judged them
    try:
        pow_call = explorer.golden_node_id("Tensor.pow.0.forward")
        assert pow_call is not None
        notes = {p.io: p.judged_note for p in explorer.pair_detail(pow_call, 0).pairs}
    finally:
        explorer.close()
    assert "adds no error of its own" in str(notes["out"]) and "bfloat16's bounds" in str(notes["out"]), notes
    assert "holds the error of what ran before it" in str(notes["in"]), notes
    assert named <= {"Tensor.sin.0.forward", "Tensor.cos.0.forward"}, out
    assert "rsqrt" not in out, out
    for tok, first in _firsts(tmp_path / "o" / "catalog.duckdb").items():
        assert float(first["score"]) < 3.0 or CAUSE in str(first["reason"]), (tok, first)
    logits = run_wb("logits", "-gp", str(golden / "golden" / "dump"), "-mp", str(tmp_path / "clean" / "dump"))
    assert logits.returncode == 0, logits.stderr
    assert f"no token fails (no LM head in the dumps: judged {LAST_LINEAR})" in logits.stdout, logits.stdout


def test_level_l1_float32_calls_paired_again_are_judged_as_the_run_computes(
    l1_golden: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """The mapping editor (`add_node_pairs`) computes the pairs it adds alone: an RMSNorm's float32 `pow` unpaired
    and paired again was judged as if the run computed in float32 (the dtype of the pairs handed), and its outputs
    failed float32's bounds though the whole compare had passed them as bf16 error carried in."""
    golden, tokens = l1_golden
    stats_dumps.dump("msprobe", "full", tmp_path / "clean", bf16=True, forced=tokens, level="L1")
    _out, con = stats_dumps.compare(golden / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")
    con.close()
    catalog = tmp_path / "o" / "catalog.duckdb"

    def pow_verdicts() -> list[tuple[int, str, bool]]:
        with duckdb.connect(str(catalog), read_only=True) as c:
            return [
                (int(t), str(io), bool(p))
                for t, io, p in c.execute(
                    "SELECT m.token_id, m.io, x.passed FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
                    "JOIN nodes n ON n.run_id = 1 AND n.node_id = m.golden_node_id "
                    "WHERE n.name = 'Tensor.pow.0.forward' ORDER BY 1, 2, x.pair_id"
                ).fetchall()
            ]

    whole = pow_verdicts()
    assert whole and all(p for _t, _io, p in whole), whole  # passed as carried bf16 error by the whole compare
    pair = ("Tensor.pow.0.forward", "Tensor.pow.0.forward")
    assert add_node_pairs(catalog, 1, [], remove=[pair]) == 0
    assert pow_verdicts() == []
    assert add_node_pairs(catalog, 1, [PairSpec(*pair)]) == len(whole)
    assert pow_verdicts() == whole


def test_verdicts_of_older_rules_are_judged_again(l1_golden: tuple[Path, list[int]], tmp_path: Path) -> None:
    """A catalog an older wb judged keeps its verdicts when compared again (the metrics are there: nothing is
    computed): a clean L1 run judged before the carried-in rule had its float32 calls' inputs failing float32's
    bounds. The rules' number is stored with each comparison (`meta`, `judge_rules:<cmp_id>`); an older one is judged
    again, a current one is left as it is."""
    golden, tokens = l1_golden
    stats_dumps.dump("msprobe", "full", tmp_path / "clean", bf16=True, forced=tokens, level="L1")
    _out, con = stats_dumps.compare(golden / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")
    con.close()
    catalog = tmp_path / "o" / "catalog.duckdb"
    as_older = (
        "UPDATE metrics SET passed = false, failed_metrics = 'relative_euclidean_distance' WHERE pair_id IN ("
        "SELECT m.pair_id FROM matches m JOIN tensors t ON t.run_id = 2 AND t.tensor_id = m.test_tensor_id "
        "WHERE m.io = 'in' AND t.dtype = 'float32' AND m.token_id = 0)"
    )

    def failing_inputs() -> int:
        with duckdb.connect(str(catalog), read_only=True) as c:
            row = c.execute("SELECT count(*) FROM comparison WHERE io = 'in' AND passed = false").fetchone()
        return int(row[0]) if row else -1

    with duckdb.connect(str(catalog)) as c:
        assert c.execute("SELECT value FROM meta WHERE key = 'judge_rules:1'").fetchone() == (str(JUDGE_RULES),)
        c.execute(as_older)  # what the current rules' number keeps
    older = failing_inputs()
    assert older > 10, older
    stats_dumps.compare(golden / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")[1].close()
    assert failing_inputs() == older  # judged by the current rules: nothing is judged again
    with duckdb.connect(str(catalog)) as c:
        c.execute("DELETE FROM meta WHERE key = 'judge_rules:1'")  # as a wb before the rules were numbered left it
    out, con = stats_dumps.compare(golden / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")
    con.close()
    assert failing_inputs() == 0, out
    assert "(0 computed now, 591 already in the catalog); failed: 2;" in out, out


def test_level_l1_a_wrong_float32_call_is_born_where_planted(l1_golden: tuple[Path, list[int]], tmp_path: Path) -> None:
    """A 2 % error in one float32 call of a bf16 run (the `torch.rsqrt` of layer 1's input norm scaled by 1.02, as a
    wrong kernel would): its output adds 13 times the error its float32 input carries in (which passes by bf16's
    bounds, the run's), so at every token it is where the error is born (at token 0 its input failed float32's bounds
    and it was only the most likely origin), and the advisor's first (its peers: the other norms' rsqrt, by the
    layers the repeated calls give)."""
    golden, tokens = l1_golden
    planted = "Torch.rsqrt.2.forward"  # layer 0's two norms call rsqrt.0 and .1
    test = tmp_path / "rs"
    call = "rsqrt=1.02@model.layers.1.input_layernorm"
    stats_dumps.dump("msprobe", "full", test, bf16=True, forced=tokens, level="L1", call=call)
    out, con = stats_dumps.compare(golden / "golden" / "dump", test / "dump", tmp_path / "o")
    born = {
        int(t): n
        for t, n in con.execute(
            "SELECT e.token_id, n.name FROM error_born e "
            "LEFT JOIN nodes n ON n.run_id = 1 AND n.node_id = e.golden_node_id"
        ).fetchall()
    }
    layer = con.execute("SELECT layer FROM nodes WHERE run_id = 1 AND name = ?", [planted]).fetchone()
    con.close()
    assert layer == (1,), layer
    firsts = _firsts(tmp_path / "o" / "catalog.duckdb")
    assert len(firsts) == 3 and born == {t: planted for t in firsts}, out
    for tok, first in firsts.items():
        assert first["golden_node"] == planted and float(first["score"]) >= 3.0, (tok, first)


@pytest.fixture(scope="module")
def l1_outputs_golden(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    base = tmp_path_factory.mktemp("msprobe_l1_outputs")
    return base, stats_dumps.dump("msprobe", "full", base / "golden", level="L1", outputs_only=True)


def test_level_l1_outputs_only_float32_calls_are_judged_by_what_ran_before(
    l1_outputs_golden: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """msprobe's `data_mode: ["output"]` at `level: L1` dumps no call's inputs: a clean bf16 run's float32 calls (an
    RMSNorm's pow, mean, add, product) failed float32's bounds with nothing carried in to judge them by (51 of 222
    pairs, `error born at: Tensor.pow.0.forward` at token 0). What ran before them stands in for their inputs (the
    outputs back to the last bf16 op, which was upcast): none fails, and a 2 % wrong float32 rsqrt is still born
    where planted, at every token."""
    golden, tokens = l1_outputs_golden
    runs = {}
    for name, call in (("clean", ""), ("rs", "rsqrt=1.02@model.layers.1.input_layernorm")):
        test = tmp_path / name
        stats_dumps.dump("msprobe", "full", test, bf16=True, forced=tokens, level="L1", outputs_only=True, call=call)
        out, con = stats_dumps.compare(golden / "golden" / "dump", test / "dump", tmp_path / f"o_{name}")
        inputs = con.execute("SELECT count(*) FROM matches WHERE io = 'in'").fetchone()
        failing = {str(n) for n in _failing_calls(con)}
        runs[name] = (out, stats_dumps.born(con), failing)
        con.close()
        assert inputs == (0,), inputs
    out, born, failing = runs["clean"]
    assert born == {None} and failing == set(), (failing, out)
    out, born, failing = runs["rs"]
    assert born == {"Torch.rsqrt.2.forward"} and "Torch.rsqrt.2.forward" in failing, (born, out)
    explorer = Explorer(tmp_path / "o_clean" / "catalog.duckdb")  # the detail pane says what stood in
    try:
        pow_call = explorer.golden_node_id("Tensor.pow.1.forward")
        assert pow_call is not None
        (pair,) = explorer.pair_detail(pow_call, 0).pairs
    finally:
        explorer.close()
    # its input is the residual sum's bf16 output, upcast
    assert pair.passed and "no input dumped: the output of Tensor.__add__.4.forward before it" in str(
        pair.judged_note
    ), pair.judged_note


def _failing_calls(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [
        str(n)
        for (n,) in con.execute(
            "SELECT DISTINCT n.name FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
            "JOIN nodes n ON n.run_id = 1 AND n.node_id = m.golden_node_id WHERE x.passed = false ORDER BY 1"
        ).fetchall()
    ]


def test_level_l1_diverging_logits_are_found_without_an_lm_head(
    l1_golden: tuple[Path, list[int]], tmp_path: Path
) -> None:
    """A down_proj weight 3x its value: the logits, read from the last linear call onto the vocabulary (its output's
    last dimension is the word embedding's table rows), fail at token 0, where it said `first divergent token:
    unknown (no logits compared ...)`."""
    golden, tokens = l1_golden
    test = tmp_path / "x3"
    stats_dumps.dump(
        "msprobe", "full", test, bf16=True, forced=tokens, level="L1", weight="model.layers.1.mlp.down_proj=3"
    )
    out, con = stats_dumps.compare(golden / "golden" / "dump", test / "dump", tmp_path / "o")
    judged = con.execute("SELECT count(*), count(*) FILTER (WHERE NOT passed) FROM logits").fetchone()
    con.close()
    assert judged == (len(tokens), len(tokens)), (judged, out)
    assert "first divergent token: 0 (cosine " in out and f"no LM head in the dumps: {LAST_LINEAR})" in out, out


def test_level_l1_a_wrong_kernel_in_every_norm(l1_golden: tuple[Path, list[int]], tmp_path: Path) -> None:
    """Every `torch.rsqrt` 2 % off (one wrong kernel, every norm): the first is where the error is born at every
    token. The products after it (`hidden * rsqrt`, the norm's weight) carry the sum of their factors' errors; taken
    as their largest, they stood out at 4.2x and were named the most likely origin beside it; then the rotary
    tables, explained by their cause, were."""
    golden, tokens = l1_golden
    test = tmp_path / "rs"
    stats_dumps.dump("msprobe", "full", test, bf16=True, forced=tokens, level="L1", call="rsqrt=1.02")
    out, con = stats_dumps.compare(golden / "golden" / "dump", test / "dump", tmp_path / "o")
    born = stats_dumps.born(con)
    con.close()
    assert born == {"Torch.rsqrt.0.forward"}, out
    # its peers are as wrong: the summary says so, and names no explained rotary table as the origin beside it
    assert "or a fault that every op of its kind shares" in out and "most likely origin here is" not in out, out
    for tok, first in _firsts(tmp_path / "o" / "catalog.duckdb").items():
        unexplained = float(first["score"]) >= 3.0 and CAUSE not in str(first["reason"])
        assert not unexplained or first["golden_node"] == "Torch.rsqrt.0.forward", (tok, first)


def test_level_l1_statistics_name_the_logits_they_hold(tmp_path: Path) -> None:
    """msprobe's default task (statistics) at `level: L1`: the logits are the last linear call onto the vocabulary,
    kept as statistics; `first divergent token` said `no lm_head/LmHead output or model output in the dumps`."""
    tokens = stats_dumps.dump("msprobe", "stats", tmp_path / "golden", level="L1")
    stats_dumps.dump("msprobe", "stats", tmp_path / "clean", bf16=True, forced=tokens, level="L1")
    out, con = stats_dumps.compare(tmp_path / "golden" / "dump", tmp_path / "clean" / "dump", tmp_path / "o")
    con.close()
    assert (
        f"first divergent token: unknown (the logits ({LAST_LINEAR}) were dumped as statistics only: no cosine, KL or "
        f"top-1 per token; their max/min/mean/norm pass at all {len(tokens)} pairs" in out
    ), out


def test_level_l1_dense_layers_before_moe_layers(tmp_path: Path) -> None:
    """A DeepSeek-V3 (one dense layer, then MoE) at `level: L1`: the repeated block of calls is the MoE layer's, and
    its run of repeats began with the dense layer's last call: the dense layer had no layer and the MoE layers were
    numbered from 0, each starting one call early. Now layer 0 is the dense one and every layer starts at its input
    norm, as the model numbers them. The clean bf16 run blames neither its float32 calls nor its rotary tables.

    Its experts' `inv_perm = torch.empty_like(perm); inv_perm[perm] = ...` dumps the `__setitem__` target before the
    write: leftover int64 bytes (1e14-1e18) that differ between runs, 9 of the 11 failing pairs. They are compared
    and shown, not judged."""
    golden = tmp_path / "golden"
    tokens = stats_dumps.dump("msprobe", "full", golden, level="L1", model="deepseek")
    stats_dumps.dump("msprobe", "full", tmp_path / "test", bf16=True, forced=tokens, level="L1", model="deepseek")
    out, con = stats_dumps.compare(golden / "dump", tmp_path / "test" / "dump", tmp_path / "o")
    rows = con.execute(
        "SELECT layer, count(*), arg_min(name, exec_order) FROM nodes WHERE run_id = 1 AND layer IS NOT NULL "
        "GROUP BY layer ORDER BY layer"
    ).fetchall()
    heat_rows = con.execute(
        "SELECT DISTINCT n.layer FROM node_results r JOIN nodes n ON n.run_id = 1 AND n.node_id = r.golden_node_id "
        "WHERE n.layer IS NOT NULL ORDER BY 1"
    ).fetchall()
    targets = con.execute(
        "SELECT n.name, m.io, t.idx, x.passed, x.cosine_similarity "
        "FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
        "JOIN nodes n ON n.run_id = 1 AND n.node_id = m.golden_node_id "
        "JOIN tensors t ON t.run_id = 1 AND t.tensor_id = m.golden_tensor_id "
        "WHERE n.type = 'Tensor.__setitem__' ORDER BY n.exec_order, m.io, t.idx"
    ).fetchall()
    ranks = con.execute("SELECT failed, not_comparable, not_judged FROM rank_summary").fetchall()
    con.close()
    overwritten = [r for r in targets if r[1] == "in" and r[2] == 0]
    assert len(overwritten) == 3 * len(tokens), targets  # three writes a MoE layer's token
    assert all(r[3] is None and r[4] is not None for r in overwritten), overwritten  # compared, not judged
    assert all(r[3] is not None for r in targets if r not in overwritten), targets  # indices and values are judged
    assert f"not comparable: 0; not judged: {len(overwritten)} (in-place targets before the write)" in out, out
    failed = int(out.split("failed: ")[1].split(";")[0])
    assert failed <= 2 and ranks == [(failed, 0, len(overwritten))], (ranks, out)
    assert [r[0] for r in rows] == [0, 1, 2, 3], rows
    assert [r[2] for r in rows] == [f"Tensor.pow.{4 * k}.forward" for k in range(4)], rows  # each at its input norm
    assert rows[1][1] == rows[2][1] == rows[3][1] > rows[0][1], rows  # three MoE layers alike, the dense one shorter
    assert heat_rows == [(0,), (1,), (2,), (3,)], heat_rows
    # the run computes in bf16 though most of its calls' outputs are float32 (norms, router, rotary): the rotary
    # table's argument, `positions * inv_freq` (the first product), was the unexplained origin at 1638x its peers
    assert "Tensor.__mul__.0.forward" not in out and CAUSE in out, out
    # a 4-element rotary product at decode fails bf16's bounds (0.045) from factors at 0.028 and 0.002: it said
    # `error born at: Tensor.__mul__.73.forward (token 2)`; it carries their error across the bounds
    assert "error born at" not in out, out
    _assert_blames_nothing(tmp_path / "o" / "catalog.duckdb")


def _assert_blames_nothing(catalog: Path) -> None:
    """No op is born at any token of a clean run, and the advisor's first op either stays in its noise or has a known
    cause; a token whose outputs fail says why none is born there."""
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        born = con.execute("SELECT token_id, golden_node_id, evidence FROM error_born ORDER BY 1").fetchall()
        failing = {
            int(t)
            for (t,) in con.execute(
                "SELECT DISTINCT m.token_id FROM metrics x JOIN matches m USING (cmp_id, pair_id) "
                "WHERE x.passed = false AND m.io = 'out'"
            ).fetchall()
        }
    finally:
        con.close()
    assert all(g is None for _t, g, _e in born), born
    for tok, _g, why in born:  # a failing output with passing inputs says what it carries
        assert why is None or (why.startswith("no op is born: ") and "carrying its inputs' error" in why), (tok, why)
    assert {t for t, _g, why in born if why} <= failing, born
    _assert_blames_nothing_unexplained(catalog)


@pytest.mark.parametrize(("prompt_seed", "dtype"), [(4, "bf16"), (5, "bf16"), (3, "fp16")])
def test_level_l1_a_clean_moe_run_blames_no_call(tmp_path: Path, prompt_seed: int, dtype: str) -> None:
    """A clean DeepSeek-V3 at other prompts and dtypes: its 4-expert router logits (a float32 `linear`) and 4-element
    rotary halves at decode carry their inputs' error at gains up to 3 (a norm ratio over 4 elements spreads that
    much): `error born at: Functional.linear.13.forward (token 1)` and the advisor's `Tensor.__mul__.71.forward` at
    6.0x its peers (bf16), `error born at: Tensor.__mul__.31.forward (token 2)` (fp16: a factor's element off by 2.4 %
    shows 0.1 % in its norm and, scaled up by the rotary table, 0.7 % in the product's), with nothing wrong. Nothing
    is blamed now."""
    golden = tmp_path / "golden"
    tokens = stats_dumps.dump("msprobe", "full", golden, level="L1", model="deepseek", prompt_seed=prompt_seed)
    stats_dumps.dump(
        "msprobe",
        "full",
        tmp_path / "test",
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        forced=tokens,
        level="L1",
        model="deepseek",
        prompt_seed=prompt_seed,
    )
    out, con = stats_dumps.compare(golden / "dump", tmp_path / "test" / "dump", tmp_path / "o")
    con.close()
    assert "error born at" not in out, out
    assert "warning: " not in out, out  # every kind of call as often in both runs at every token: no renaming
    _assert_blames_nothing(tmp_path / "o" / "catalog.duckdb")


@pytest.mark.parametrize(
    ("tool", "level", "line"),
    [
        ("msprobe", "L1", "a near tie flipped: at "),  # the router's topk call, its input beside it
        ("msprobe", "L0", "its output 2 (int64) differs at "),  # the router module: scores not dumped
        ("msit", "mix", "its output 2 (int64) differs at "),  # msit's module dumps
    ],
)
def test_a_router_near_tie_flips_the_experts(tmp_path: Path, tool: str, level: str, line: str) -> None:
    """Two experts of a MoE layer's router near-tied (the same gate row, one 2^-20 larger; in both runs): the bf16
    run's rounding picks the other expert at some tokens, every op after it fails on its inputs and the logits
    diverge. The error is born at the router (its indices differ, what else it outputs and its inputs agree), and the
    line under the verdict says why: from a `topk` call's input, that the golden scores of the two picks are within
    the error they carry in; from a router module (its scores not dumped), how many picks differ."""
    if tool == "msit" and importlib.util.find_spec("msit_llm") is None:
        pytest.skip("msit not installed")
    tie = "model.layers.2.mlp.gate=1,3"
    tokens = stats_dumps.dump(tool, "full", tmp_path / "golden", level=level, model="deepseek", tie=tie)
    stats_dumps.dump(tool, "full", tmp_path / "test", bf16=True, forced=tokens, level=level, model="deepseek", tie=tie)
    golden, test = (
        next((tmp_path / side).glob("msit_dump_*/torch_tensors/*")) if tool == "msit" else tmp_path / side / "dump"
        for side in ("golden", "test")
    )
    out, con = stats_dumps.compare(golden, test, tmp_path / "o")
    evidence = con.execute(
        "SELECT e.token_id, n.name, e.evidence FROM error_born e JOIN nodes n ON n.run_id = 1 "
        "AND n.node_id = e.golden_node_id ORDER BY e.token_id"
    ).fetchall()
    con.close()
    flipped = [(t, name, ev) for t, name, ev in evidence if "topk" in name or "mlp.gate" in name]
    assert flipped and flipped[0][0] == 0, (evidence, out)
    assert all("layers.2" in name or "topk" in name for _t, name, _ev in flipped), flipped
    for _t, name, ev in flipped:
        assert str(ev).startswith(f"{name}: {line}"), ev
        if level == "L1":
            assert "the test run chose position 1 where the golden chose 3" in str(ev), ev  # the tied pair
            assert "it selects correctly from what it was given" in str(ev), ev
    assert "first divergent token: " in out and "first divergent token: none" not in out, out
    assert f"error born at: {flipped[0][1]} (token 0)\n  {flipped[0][1]}: {line}" in out, out
    # a later token's layer-3 attention reads the keys and values its cache holds of the flipped tokens: no input of
    # a module dump, so what it adds stood out unexplained (the most likely origin at token 2, 3.3x its peers)
    for origin in (ln for ln in out.splitlines() if ln.startswith("most likely origin") and "self_attn" in ln):
        assert "likely cause: its KV cache: token " in origin, origin
    if level != "L1":
        assert "likely cause: its KV cache: token 1's keys and values came from an input " in out, out


@pytest.fixture(scope="module")
def mix_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[int]]:
    """The advisor bench's 5-layer Llama (hidden 256; `bench/advisor_defects.py`, held-out weights) dumped by msprobe
    at `level: mix`, fp32: the golden run's base folder, its dump and its tokens."""
    from bench import advisor_defects

    base = tmp_path_factory.mktemp("mix_llama")
    (base / "golden").mkdir()
    job = {"model": "llama5", "dumper": "msprobe_mix", "seed_offset": advisor_defects.HELDOUT_SEED_OFFSET}
    root = advisor_defects.run_dump({**job, "out": str(base / "golden")})
    return base, root, json.loads((base / "golden" / "tokens.json").read_text())


def _mix_run(mix_llama: tuple[Path, Path, list[int]], name: str, **job: object) -> tuple[str, Path]:
    from bench import advisor_defects

    base, golden, tokens = mix_llama
    (base / name).mkdir()
    job = {"model": "llama5", "dumper": "msprobe_mix", "seed_offset": advisor_defects.HELDOUT_SEED_OFFSET, **job}
    test = advisor_defects.run_dump({**job, "out": str(base / name), "tokens": tokens})
    out, con = stats_dumps.compare(golden, test, base / name / "o")
    con.close()
    return out, base / name / "o" / "catalog.duckdb"


def test_level_mix_a_clean_fp16_run_blames_no_rotary_product(mix_llama: tuple[Path, Path, list[int]]) -> None:
    """`q * cos` takes the rotary table as a factor: the table's error (the fp16-rounded inv_freq, a known cause)
    reaches the product whole. Set apart as a decoder layer's keyword argument is (it reaches a layer's output at a
    gain of 0.2-0.4), it was the product's own: `most likely origin: Tensor.__mul__.24.forward (token 1) ... 3.0x`
    in a clean run. A product carries its factors' errors, the table's included."""
    out, catalog = _mix_run(mix_llama, "clean_fp16", dtype="float16")
    assert "Tensor.__mul__" not in out, out
    _assert_blames_nothing_unexplained(catalog)


def test_level_mix_a_wrong_embedding_table_stands_out(mix_llama: tuple[Path, Path, list[int]]) -> None:
    """A lookup adds one rounding at most, and is held to that; msprobe's `Functional.embedding` was not taken for
    one (its type has a namespace) and was held to twice the rounding, for want of peers: a table 2 % off scored 2.5
    in bf16, under the rotary tables' explained error. It is the advisor's first op at every token now."""
    out, catalog = _mix_run(mix_llama, "embed", dtype="bfloat16", case="h_embed")
    firsts = _firsts(catalog)
    assert len(firsts) == 3, out
    for tok, first in firsts.items():
        assert first["golden_node"] == "Functional.embedding.0.forward" and float(first["score"]) >= 3.0, (tok, out)
        assert "one bfloat16 rounding" in str(first["reason"]), first


_DECODE_ONLY_NOTE = (
    "note: Tensor.__mul__ calls, test against golden run, at tokens 1-2: 1 more (at token 0: as many): calls numbered "
    "by their kind are renamed past the difference; at those tokens they are paired by their order there"
)


_Q_PROJ = "Module.model.layers.2.self_attn.q_proj.Linear.forward"


def _names_q_proj_at(out: str, token: int) -> bool:
    """`wb compare` names the planted q_proj at `token`: where the error is born, or, when a product inside its peers'
    noise crosses the thresholds first there (bf16 rounding moves with the CPU's kernels), as the advisor's origin
    standing out under that line."""
    if f"error born at: {_Q_PROJ} (token {token})" in out:
        return True
    block = re.search(rf"^error born at: [^\n]* \(token {token}\)[^\n]*\n((?:  [^\n]*\n)*)", out, re.MULTILINE)
    return block is not None and f"the advisor's most likely origin here is {_Q_PROJ} (score" in block.group(1)


@pytest.fixture(scope="module")
def decode_only(mix_llama: tuple[Path, Path, list[int]]) -> tuple[str, Path]:
    """The test run's q_proj output scaled at decode steps only, by a product of its own (`out * 1.03`): `wb
    compare`'s output and catalog."""
    return _mix_run(mix_llama, "decode_only", dtype="bfloat16", case="h_decq2")


def test_level_mix_a_call_made_at_decode_tokens_only_is_paired_again_there(decode_only: tuple[str, Path]) -> None:
    """msprobe's counters number the decode-only product among the `Tensor.__mul__` calls, so at tokens 1-2 every
    later product of the test run carries the name of another call in the golden run: paired by name (the first
    token's alignment), those pairs compared different calls, and the advisor named a product at 116,412x, the planted
    module 8th. The products are aligned again at tokens 1-2 (their order there, shapes and statistics): `wb compare`
    names the planted q_proj at both (`_names_q_proj_at`), says how the calls were paired, the catalog keeps the line
    (`call_drift`) and `wb report` shows it."""
    out, catalog = decode_only
    assert _DECODE_ONLY_NOTE in out, out
    assert "warning: " not in out and out.count("note: ") == 1, out  # no other kind of call differs
    for tok in (1, 2):
        assert _names_q_proj_at(out, tok), out
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        assert con.execute("SELECT cmp_id, position, line, repaired FROM call_drift").fetchall() == [
            (1, 0, _DECODE_ONLY_NOTE, True)
        ]
        # at tokens 1-2 each golden product past the extra one pairs with the test call numbered one more
        shifted = con.execute(
            "SELECT DISTINCT m.token_id, g.name, t.name FROM matches m "
            "JOIN nodes g ON g.run_id = 1 AND g.node_id = m.golden_node_id "
            "JOIN nodes t ON t.run_id = 2 AND t.node_id = m.test_node_id WHERE m.method = 'aligned at token'"
        ).fetchall()
        assert shifted and {tok for tok, _g, _t in shifted} == {1, 2}, shifted
        for _tok, g, t in shifted:
            assert int(t.split(".")[2]) == int(g.split(".")[2]) + 1, (g, t)
        assert con.execute("SELECT count(*) FROM matches WHERE token_id = 0 AND method <> 'name'").fetchone() == (0,)
    finally:
        con.close()
    html_file = catalog.parent / "report.html"
    done = run_wb("report", str(catalog), "-o", str(html_file))
    assert done.returncode == 0, done.stderr
    assert f"<th>calls made at some tokens</th><td>{_DECODE_ONLY_NOTE}</td>" in html_file.read_text(), done.stdout


def test_level_mix_decode_tokens_compared_alone_are_paired_again_too(decode_only: tuple[str, Path]) -> None:
    """`--tokens 1-2`: the calls are counted against the first token both runs dumped (token 0, not compared), and
    paired again at the tokens compared."""
    catalog = decode_only[1]
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        golden, test = (str(r[0]) for r in con.execute("SELECT path FROM runs ORDER BY run_id").fetchall())
    finally:
        con.close()
    out_dir = catalog.parent.parent / "tokens_1_2"
    done = run_wb("compare", "-gp", golden, "-mp", test, "-o", str(out_dir), "--tokens", "1-2")
    assert done.returncode == 0, done.stderr
    assert _DECODE_ONLY_NOTE in done.stdout, done.stdout
    for tok in (1, 2):
        assert _names_q_proj_at(done.stdout, tok), done.stdout


def test_level_mix_a_call_is_judged_against_the_same_call_of_its_module_in_the_other_layers(
    decode_only: tuple[str, Path],
) -> None:
    """A torch call's name holds a counter, not its layer: its peers were every call of its type (a down_proj's
    `linear` among the q, k, v, o, gate and up projections of every layer). They are the same call of the same module
    in the other layers: the advisor's reason names that module."""
    con = duckdb.connect(str(decode_only[1]), read_only=True)
    try:
        reasons = dict(
            con.execute(
                "SELECT p.name, a.reason FROM advice a JOIN nodes n ON n.run_id = 1 AND n.node_id = a.golden_node_id "
                "JOIN nodes p ON p.run_id = 1 AND p.node_id = n.parent_id "
                "WHERE a.token_id = 0 AND n.type = 'Functional.linear' AND n.layer IS NOT NULL"
            ).fetchall()
        )
    finally:
        con.close()
    assert len(reasons) == 35, reasons  # 7 projections in each of 5 layers
    judged = {m: r for m, r in reasons.items() if "x what" in r}  # the others add nothing measurable
    assert len(judged) >= 20, reasons
    for module, reason in judged.items():
        role = module.split(".")[-3]  # Module.model.layers.N.mlp.down_proj.Linear.forward -> down_proj
        assert f".{role}'s Functional.linear adds" in reason and "in the other 4 layers" in reason, (module, reason)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_level_mix_the_app_tells_of_a_call_made_at_decode_tokens_only(
    decode_only: tuple[str, Path], anyio_backend: str
) -> None:
    """Opening the catalog, the app tells the same line as `wb compare` (how the calls at tokens 1-2 were paired)."""
    from tests.app.test_app_pilot import ready, wait_for
    from workbench.app.launch import make_app

    app = make_app(catalog=decode_only[1])
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot, app)
        await wait_for(pilot, lambda: any(_DECODE_ONLY_NOTE in str(n.message) for n in app._notifications), 30)
        told = [n for n in app._notifications if "Tensor.__mul__ calls" in str(n.message)]
        assert [(str(n.message), n.severity) for n in told] == [(_DECODE_ONLY_NOTE, "information")], told


def _assert_blames_nothing_unexplained(catalog: Path) -> None:
    for tok, first in _firsts(catalog).items():  # the cause names the run's dtype (bfloat16, float16)
        assert float(first["score"]) < 3.0 or CAUSE.removesuffix("bfloat16") in str(first["reason"]), (tok, first)
