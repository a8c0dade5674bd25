"""`wb dump --exec` on an unmodified transformers script, and `wb redump` of one op from its recorded command."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pytest

from tests.conftest import invoke_wb, run_wb

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = getattr(torch, sys.argv[1])
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(dtype)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    print("generated", out.tolist())
    """
)
NODE = "root.model.layers.1.mlp"
MODULES = "LlamaMLP,Linear,SiLUActivation,LlamaRMSNorm,LlamaAttention,Embedding"  # not the decoder layers


def _exec_dump(tmp: Path, name: str, dtype: str, *extra: str) -> Path:
    out = tmp / name
    proc = run_wb("dump", "--exec", f"{sys.executable} run.py {dtype}", "-o", str(out), *extra, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "generated" in proc.stdout  # the script's own output passes through
    dumps = sorted(out.glob("msit_dump_*/torch_tensors/*"))
    assert len(dumps) == 1, dumps
    return dumps[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("exec")
    (tmp / "run.py").write_text(SCRIPT)
    golden = _exec_dump(tmp, "golden", "float32", "--tokens", "0-2")
    test = _exec_dump(tmp, "test", "bfloat16", "--tokens", "0-2", "--stats-only", "--modules", MODULES)
    return tmp, golden, test


def test_exec_dump_writes_msit_layout_and_records_the_command(runs: tuple[Path, Path, Path]) -> None:
    tmp, golden, test = runs
    assert (golden / "model_tree.json").is_file() and sorted(p.name for p in golden.iterdir() if p.name.isdigit()) == [
        "0",
        "1",
        "2",
    ]
    assert (golden / "1" / "root.model.layers.0.self_attn.q_proj" / "output.pth").is_file()
    manifest = json.loads((test / "wb_manifest.json").read_text())
    assert manifest["exec"]["command"] == f"{sys.executable} run.py bfloat16"
    assert manifest["exec"]["cwd"] == str(tmp)
    assert not list((test / "1" / NODE).glob("*.pth"))  # statistics only
    assert (test / "1" / NODE / "statistics.csv").is_file()
    assert not (test / "1" / "root.model.layers.1").exists()  # --modules left the decoder layers out


def test_exec_dump_bad_command_is_one_line(tmp_path: Path) -> None:
    proc = invoke_wb("dump", "--exec", "no-such-program-xyz", "-o", str(tmp_path / "d"))
    assert proc.returncode == 2 and proc.stderr.startswith("wb: error:") and "Traceback" not in proc.stderr
    (tmp_path / "fail.py").write_text("raise SystemExit(3)\n")
    proc = run_wb("dump", "--exec", f"{sys.executable} fail.py", "-o", str(tmp_path / "d"), cwd=tmp_path)
    assert proc.returncode == 3 and "exited with code 3" in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("msit_llm") is None, reason="msit_llm not installed")
def test_msit_compare_reads_an_exec_dump(runs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, golden, _ = runs
    msit = shutil.which("msit", path=os.path.dirname(sys.executable))
    if msit is None:
        pytest.skip("the msit command is not installed next to this Python")
    proc = subprocess.run(
        [msit, "llm", "compare", "-gp", str(golden / "0"), "-mp", str(golden / "0"), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    reports = list(tmp_path.glob("msit_cmp_report_*.xlsx"))
    assert proc.returncode == 0 and reports, proc.stdout[-2000:] + proc.stderr[-2000:]
    import pandas as pd

    rows = pd.concat(pd.read_excel(reports[0], sheet_name=None).values())
    assert len(rows) > 10 and (rows["cosine_similarity"] == 1).all()
    assert rows["golden_data_path"].str.contains("root.model.layers.1.mlp").any()


@pytest.fixture(scope="module")
def compared(runs: tuple[Path, Path, Path]) -> Path:
    tmp, golden, test = runs
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp / "out"))
    assert proc.returncode in (0, 1), proc.stderr
    return tmp / "out" / "catalog.duckdb"


def _pairs(catalog: Path, node: str, token: int) -> list[tuple[str | None, object]]:
    from workbench.catalog.readonly import connect_read_only

    # the app holds its own confined read-only connection: DuckDB wants the same configuration in one process
    con = connect_read_only(catalog)
    rows = con.execute(
        "SELECT tt.path, x.cosine_similarity FROM matches m JOIN comparisons c USING (cmp_id) "
        "JOIN nodes gn ON gn.run_id = c.golden_run AND gn.node_id = m.golden_node_id "
        "JOIN tensors tt ON tt.run_id = c.test_run AND tt.tensor_id = m.test_tensor_id "
        "LEFT JOIN metrics x ON x.cmp_id = m.cmp_id AND x.pair_id = m.pair_id "
        "WHERE gn.name = ? AND m.token_id = ? AND m.io = 'out'",
        [node, token],
    ).fetchall()
    con.close()
    return rows


def test_redump_brings_full_tensors_into_the_catalog(compared: Path) -> None:
    before = _pairs(compared, NODE, 1)
    assert before and all(path is None for path, _ in before)  # statistics only
    # without --yes and no terminal to ask: the command is shown, nothing runs, exit 4
    args = ["redump", NODE, "--token", "1", "--catalog", str(compared)]
    shown = invoke_wb(*args)
    assert shown.returncode == 4, shown.stdout + shown.stderr
    assert f"  command: {sys.executable} run.py bfloat16" in shown.stdout.splitlines()
    assert "warning:" not in shown.stdout  # recorded here by this user: signed, verified
    assert shown.stderr.strip().splitlines() == [
        "wb: error: not run: a recorded command needs your yes (--yes, or y on a terminal)"
    ]
    assert _pairs(compared, NODE, 1) == before and not (compared.parent / "wb_redump").exists()
    proc = run_wb(*args, "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tensors now full" in proc.stdout
    after = _pairs(compared, NODE, 1)
    assert after and all(path is not None and Path(path).is_file() for path, _ in after)
    assert all(cos is not None and float(cos) > 0.99 for _, cos in after)  # type: ignore[arg-type]
    assert _pairs(compared, NODE, 2)[0][0] is None  # other tokens untouched
    proc = run_wb("precheck", "--catalog", str(compared), "--node", NODE, "--token", "1")
    assert proc.returncode == 0 and proc.stdout.startswith(f"ok    {NODE}"), proc.stdout + proc.stderr


def test_redump_without_a_recorded_command(tmp_path: Path) -> None:
    from workbench.jobs.redump import RedumpError, _recorded_command

    with pytest.raises(RedumpError, match="the run has no recorded command"):
        _recorded_command({"cwd": "/"})  # msit's own dumper records none
    with pytest.raises(RedumpError, match="test runner or notebook"):
        _recorded_command({"command": ["/venv/bin/pytest", "-q"], "cwd": "/"})
    argv, cwd, zero = _recorded_command({"command": ["run.py", "x"], "executable": "/py", "cwd": str(tmp_path)})
    assert (argv, cwd, zero) == (["/py", "run.py", "x"], str(tmp_path), False)
    proc = invoke_wb("redump", NODE, "--catalog", str(tmp_path / "none.duckdb"))
    assert proc.returncode == 2 and "no such catalog" in proc.stderr


PILOT_NODE = "root.model.layers.0.mlp"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_pilot_precheck_then_redump_then_precheck(compared: Path, anyio_backend: str) -> None:
    """End to end: select an op, `p` (statistics only: cannot run), `d` shows the command, `y` re-dumps it, the
    detail pane refreshes with full tensors, `p` again gives the verdict."""
    from tests.app.test_app_pilot import _text, ready, wait_for
    from workbench.app.launch import make_app
    from workbench.app.opcause import ConfirmRedumpScreen, PrecheckPanel
    from workbench.app.screens import ProgressScreen
    from workbench.app.trees import TopologyTree

    con = duckdb.connect(str(compared), read_only=True)
    row = con.execute(
        "SELECT n.node_id FROM nodes n JOIN comparisons c ON n.run_id = c.golden_run WHERE n.name = ?", [PILOT_NODE]
    ).fetchone()
    con.close()
    assert row is not None
    gid = int(row[0])
    app = make_app(catalog=compared)
    async with app.run_test(size=(160, 48)) as pilot:
        screen = await ready(pilot, app)
        screen.set_token(2)
        screen.select_node(gid)
        await pilot.pause(0.2)
        panel = screen.query_one(PrecheckPanel)
        await pilot.press("p")
        await wait_for(pilot, lambda: "statistics only" in _text(panel), timeout=60)
        assert _pairs(compared, PILOT_NODE, 2)[0][0] is None
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmRedumpScreen), timeout=30)
        assert f"command: {sys.executable} run.py bfloat16" in _text(app.screen.query_one("#confirm-command"))
        await pilot.press("y")
        await wait_for(pilot, lambda: isinstance(app.screen, ProgressScreen), timeout=10)
        # no catalog access from here while the job writes it (one process: a read-only connection would clash)
        await wait_for(pilot, lambda: app.screen is screen, timeout=300)
        await wait_for(pilot, lambda: app.explorer is not None and screen.explorer is app.explorer, timeout=60)
        notes = [n.message for n in app._notifications]  # (a notification may have expired already)
        assert _pairs(compared, PILOT_NODE, 2)[0][0] is not None, notes
        detail = screen.query_one("#detail")
        await wait_for(pilot, lambda: PILOT_NODE in _text(detail) and "cosine" in _text(detail), timeout=30)
        await pilot.press("p")
        await wait_for(pilot, lambda: "precheck ok" in _text(panel), timeout=60)
        golden_tree = screen.query_one("#golden-tree", TopologyTree)
        assert golden_tree.badges[(gid, 2)][0] == "P✓"
