"""Call-stream alignment and layout rules: an extra op never shifts the pairing, shapes are never flattened silently.

Real dumps: msprobe's PrecisionDebugger (an extra `Tensor.__mul__` in the test run), msit's own
`register_hook` and ours (an extra module inserted into `model.layers`), fp32 golden vs bf16 test.
"""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import duckdb
import pytest
import torch

from tests.conftest import run_wb
from tests.fixtures.align_dumps import EXTRA_AT, ours_pair
from tests.fixtures.peers import PeerDumps
from workbench.compare.execution.tasks import PairTask
from workbench.compare.execution.worker import run_pair
from workbench.compare.pairing.align import StreamSide, _refine_runs, lcs_pairs
from workbench.compare.pairing.layout import MERGE_DIMS, SQUEEZE, layout_rule, shape_after
from workbench.compare.pairing.matching import MATCHERS, _by_classless, _without_class

# ---------------------------------------------------------------------------------------------- units


def test_registry_order() -> None:
    assert list(MATCHERS) == ["mapping-file", "mapping-rule", "type-map", "torchair", "quant", "aligned", "auto"]


def test_a_module_whose_class_was_swapped_keeps_its_name_only_where_one_node_has_it() -> None:
    """msprobe's names hold the module's class: a swapped activation is paired by its name without it, but two calls
    that share that name (functional ops: `Functional.linear`, `Functional.gelu`) pair nothing that way."""
    assert _without_class("Module.model.layers.2.mlp.act_fn.SiLUActivation.forward", "SiLUActivation") == (
        "Module.model.layers.2.mlp.act_fn.forward"
    )
    assert _without_class("root.model.layers.2.mlp.act_fn", "SiLUActivation") == "root.model.layers.2.mlp.act_fn"
    names = {1: "Module.mlp.act_fn.GELU.forward", 2: "Functional.linear.forward", 3: "Functional.gelu.forward"}
    side = StreamSide("msprobe", {None: [1, 2, 3]}, names, {1: "GELU", 2: "linear", 3: "gelu"}, {}, {})
    assert _by_classless(side, [1, 2, 3]) == {"Module.mlp.act_fn.forward": 1, "Functional.forward": None}


def _lcs_len(a: list[int], b: list[int]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_lcs_is_a_longest_common_subsequence() -> None:
    rng = random.Random(5)
    for _ in range(400):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 25))]
        b = list(a)
        for _ in range(rng.randint(0, 4)):
            if b and rng.random() < 0.5:
                b.pop(rng.randrange(len(b)))
            else:
                b.insert(rng.randint(0, len(b)), rng.randint(0, 5))
        pairs = lcs_pairs(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(p[0] < q[0] and p[1] < q[1] for p, q in itertools.pairwise(pairs))
        assert len(pairs) == _lcs_len(a, b)


def test_long_stream_with_one_insertion_and_one_deletion() -> None:
    a = [i % 97 for i in range(60_000)]
    b = [*a[:1000], -1, *a[1000:40000], *a[40001:]]
    pairs = lcs_pairs(a, b)
    expect = [(i, i) for i in range(1000)] + [(i, i + 1) for i in range(1000, 40_000)]
    expect += [(i, i) for i in range(40_001, 60_000)]
    assert pairs == expect


def test_statistics_pick_the_extra_op_among_equal_keys() -> None:
    # golden: A(1) A(2); test: A(1) A(5) A(2): keys cannot tell which A is extra, the statistics can
    gk, tk = [0, 1, 1, 2], [0, 1, 1, 1, 2]
    gs = [None, {("out", 0): 1.0}, {("out", 0): 2.0}, None]
    for extra_at in (1, 2, 3):
        vals = [1.0, 2.0]
        vals.insert(extra_at - 1, 5.0)
        ts = [None, *({("out", 0): v} for v in vals), None]
        pairs = _refine_runs(lcs_pairs(gk, tk), gk, tk, gs, ts)
        assert [j for _, j in pairs] == [0, *(j for j in (1, 2, 3) if j != extra_at), 4]


@pytest.mark.parametrize(
    "golden, test, rule",
    [
        ([1, 24, 256], [24, 256], SQUEEZE),
        ([1, 24, 256], [24, 8, 32], MERGE_DIMS),
        ([2, 12, 256], [24, 256], MERGE_DIMS),
        ([4, 5], [4, 5], ""),
        ([1, 8, 16, 32], [1, 16, 256], None),
        ([2, 3], [3, 2], None),
    ],
)
def test_layout_rules(golden: list[int], test: list[int], rule: str | None) -> None:
    assert layout_rule(golden, test) == rule


def test_shape_after_a_fused_chunk() -> None:
    assert shape_after([24, 1376], "t.chunk:-1:0:2", "t") == [24, 688]
    assert shape_after([24, 1376], "t.chunk:-1:0:2", "g") == [24, 1376]


def test_worker_compares_under_a_layout_rule_and_refuses_otherwise(tmp_path: Path) -> None:
    x = torch.arange(24.0)
    files = {}
    for name, shape in (("g", (1, 4, 6)), ("squeezed", (4, 6)), ("heads", (4, 2, 3)), ("swapped", (6, 4))):
        files[name] = tmp_path / f"{name}.pth"
        torch.save(x.reshape(shape).clone(), files[name])
    for name, transform in (("squeezed", "layout:squeeze"), ("heads", "layout:merge-dims"), ("squeezed", None)):
        res = run_pair(PairTask(0, str(files["g"]), str(files[name]), "float32", 1, 2, transform))
        assert res["reason"] is None and res["values"]["cosine_similarity"] == 1.0
    bad = run_pair(PairTask(0, str(files["g"]), str(files["swapped"]), "float32", 1, 2, None))
    assert bad["values"] == {} or all(v is None for v in bad["values"].values())
    assert bad["reason"] == "not comparable: shape [1, 4, 6] vs [6, 4] (no layout rule maps one onto the other)"
    forced = run_pair(PairTask(0, str(files["g"]), str(files["swapped"]), "float32", 1, 2, "layout:squeeze"))
    assert forced["reason"].startswith("not comparable: shape [1, 4, 6] vs [6, 4]")


# ---------------------------------------------------------------------------------------------- catalog helpers


def _node_pairs(catalog: Path) -> tuple[dict[str, str], set[str], set[str]]:
    """golden name -> test name of every node match, unmatched golden and test names."""
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        pairs = con.execute(
            "SELECT DISTINCT g.name, t.name FROM node_matches m "
            "JOIN comparisons c USING (cmp_id) "
            "JOIN nodes g ON g.run_id = c.golden_run AND g.node_id = m.golden_node_id "
            "JOIN nodes t ON t.run_id = c.test_run AND t.node_id = m.test_node_id"
        ).fetchall()
        g_all = {r[0] for r in con.execute("SELECT name FROM nodes WHERE run_id = 1").fetchall()}
        t_all = {r[0] for r in con.execute("SELECT name FROM nodes WHERE run_id = 2").fetchall()}
        reasons = con.execute("SELECT count(*) FROM metrics WHERE cmp_fail_reason IS NOT NULL").fetchone()
    finally:
        con.close()
    assert reasons == (0,), "pairs compared normally keep cmp_fail_reason empty"
    mapping: dict[str, str] = {}
    for g, t in pairs:
        assert mapping.setdefault(g, t) == t, f"{g} paired with two test nodes"
    return mapping, g_all - mapping.keys(), t_all - set(mapping.values())


# ---------------------------------------------------------------------------------------------- msprobe


def _msprobe_calls(dump: Path) -> list[str]:
    (dump_json,) = dump.glob("step0/*/dump.json")
    return [k for k in json.loads(dump_json.read_text())["data"] if ".forward" in k]


def test_msprobe_extra_mul_is_unmatched_and_later_calls_pair_right(peer_dumps: PeerDumps, tmp_path: Path) -> None:
    root = peer_dumps.need_msprobe()
    golden, test = root / "golden", root / "test"
    g_calls, t_calls = _msprobe_calls(golden), _msprobe_calls(test)
    assert len(t_calls) == len(g_calls) + 1
    # the truth, from the dumps themselves: the test call missing from the golden stream at its position
    # is the extra multiply; every other call keeps its order
    extra = next(i for i, (g, t) in enumerate(zip(g_calls, t_calls)) if g != t)
    assert t_calls[extra].startswith("Tensor.__mul__.")
    kept = t_calls[:extra] + t_calls[extra + 1 :]

    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stdout + res.stderr
    mapping, g_left, t_left = _node_pairs(tmp_path / "o" / "catalog.duckdb")

    def node(call: str) -> str:  # the reader's node name of a call of the single forward of step 0
        if call.startswith("Module."):
            return call.rsplit(".", 1)[0]
        return call

    truth = {node(g): node(t) for g, t in zip(g_calls, kept)}
    assert {g: mapping.get(g) for g in truth} == truth
    assert g_left == set()
    assert t_left == {node(t_calls[extra])}
    shifted = [g for g, t in truth.items() if g != t]
    assert len(shifted) >= 5  # later multiplies really were renamed by the extra call
    assert "aligned" in res.stdout and "not comparable: 0" in res.stdout


# ---------------------------------------------------------------------------------------------- msit-style modules


def _shifted(name: str) -> str:
    """The test module path of a golden module path: layers at or after the insertion move up by one."""
    parts = name.split(".")
    if len(parts) > 3 and parts[:3] == ["root", "model", "layers"] and int(parts[3]) >= EXTRA_AT:
        parts[3] = str(int(parts[3]) + 1)
    return ".".join(parts)


def _check_extra_module(golden: Path, test: Path, out: Path) -> None:
    res = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(out))
    assert res.returncode == 0, res.stderr
    mapping, g_left, t_left = _node_pairs(out / "catalog.duckdb")
    assert g_left == set()
    assert t_left == {f"root.model.layers.{EXTRA_AT}"}
    assert mapping == {g: _shifted(g) for g in mapping}
    assert mapping["root.model.layers.2.mlp.down_proj"] == "root.model.layers.3.mlp.down_proj"
    assert mapping["root.model.layers.0.mlp.down_proj"] == "root.model.layers.0.mlp.down_proj"
    assert mapping["root.lm_head"] == "root.lm_head"


def test_our_dumper_extra_module_call(tmp_path: Path) -> None:
    golden, test = ours_pair(tmp_path / "dumps")
    _check_extra_module(golden, test, tmp_path / "o")


def test_msit_dumper_extra_module_call(peer_dumps: PeerDumps, tmp_path: Path) -> None:
    msit = peer_dumps.need_msit()
    _check_extra_module(msit["golden"], msit["test"], tmp_path / "o")


class _Mix(torch.nn.Module):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        self.transposed = transposed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2.0
        return y.transpose(1, 2) if self.transposed else y  # a port that writes the wrong layout


class _Net(torch.nn.Module):
    def __init__(self, transposed: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(6, 6)
        self.b = _Mix(transposed)
        self.c = torch.nn.Linear(24, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(self.b(self.a(x)).reshape(1, -1))


def test_same_count_other_layout_is_not_comparable(tmp_path: Path) -> None:
    """[1, 4, 6] vs [1, 6, 4]: 24 elements each, but no layout rule relates them: no metrics, a clear reason."""
    from workbench.dump import DumpConfig, register_hook

    dev = []
    for name, transposed in (("golden", False), ("test", True)):
        net = _Net(transposed).eval()
        handle = register_hook(net, DumpConfig(dump_path=str(tmp_path / name), token_range=[0]))
        with torch.no_grad():
            net(torch.randn(1, 4, 6, generator=torch.Generator().manual_seed(1)))
        handle.remove()
        dev.append(next((tmp_path / name).glob("msit_dump_*/torch_tensors/*")))
    res = run_wb("compare", "-gp", str(dev[0]), "-mp", str(dev[1]), "-o", str(tmp_path / "o"))
    assert "Traceback" not in res.stdout + res.stderr
    assert "not comparable: 1" in res.stdout
    con = duckdb.connect(str(tmp_path / "o" / "catalog.duckdb"), read_only=True)
    rows = {
        (r[0], r[1]): r[2:]
        for r in con.execute(
            "SELECT golden_node, io, cosine_similarity, cmp_fail_reason, passed FROM comparison WHERE token_id = 0"
        ).fetchall()
    }
    con.close()
    cos, reason, passed = rows[("root.b", "out")]
    assert cos is None and passed is None
    assert reason == "not comparable: shape [1, 4, 6] vs [1, 6, 4] (no layout rule maps one onto the other)"
    assert rows[("root.b", "in")][1] is None and rows[("root.b", "in")][0] == pytest.approx(1.0)
    assert rows[("root.c", "in")][1] is None  # same shape [1, 24], other values: compared, and it fails
    assert rows[("root.c", "in")][2] is False


def test_torch_vs_atb_layouts_leave_cmp_fail_reason_empty(demo_catalog: Path) -> None:
    """The demo (torch golden vs ATB test): batch squeezed, heads split; compared, the rule kept in `transform`."""
    con = duckdb.connect(str(demo_catalog), read_only=True)
    try:
        reasons = con.execute("SELECT count(*) FROM metrics WHERE cmp_fail_reason IS NOT NULL").fetchone()
        rules = dict(
            con.execute(
                "SELECT regexp_extract(transform, 'layout:([a-z-]+)', 1) AS rule, count(*) FROM matches "
                "WHERE transform LIKE '%layout:%' GROUP BY rule"
            ).fetchall()
        )
        differ = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE cosine_similarity IS NOT NULL) FROM comparison "
            "WHERE golden_shape <> my_shape"
        ).fetchone()
    finally:
        con.close()
    assert reasons == (0,)
    assert rules.get("squeeze", 0) > 100 and rules.get("merge-dims", 0) > 0
    assert differ is not None and differ[0] > 100 and differ[0] == differ[1]
