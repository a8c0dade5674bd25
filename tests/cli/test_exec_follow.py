"""`wb dump --exec ... --follow-tokens GOLDEN`: an unmodified generate script whose test run would diverge is fed
the golden run's tokens, the manifest records it, and `wb redump` re-runs it the same way."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import invoke_wb, run_wb

# the same script for both runs; "defect" scales one projection, which changes the greedy tokens
SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval().to(getattr(torch, sys.argv[1]))
    if "defect" in sys.argv:
        with torch.no_grad():
            model.model.layers[0].mlp.down_proj.weight.mul_(40.0)
    ids = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(1))
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    print("generated", out[0, 5:].tolist())
    """
)
MODULES = "Linear,LlamaRMSNorm,Embedding,LlamaMLP"


def _dump(tmp: Path, name: str, args: str, *extra: str) -> Path:
    proc = run_wb(
        "dump", "--exec", f"{sys.executable} run.py {args}", "-o", str(tmp / name), "--tokens", "0-3", *extra, cwd=tmp
    )
    assert proc.returncode == 0, proc.stdout[-1000:] + proc.stderr[-2000:]
    (dump,) = sorted((tmp / name).glob("msit_dump_*/torch_tensors/*"))
    return dump


def _generated(dump: Path) -> list[int]:
    return list(json.loads((dump / "wb_manifest.json").read_text())["generated"])


@pytest.fixture(scope="module")
def follow_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("follow")
    (tmp / "run.py").write_text(SCRIPT)
    golden = _dump(tmp, "golden", "float32", "--modules", MODULES)
    free = _dump(tmp, "free", "bfloat16 defect", "--modules", MODULES)
    followed = _dump(tmp, "test", "bfloat16 defect", "--modules", MODULES, "--follow-tokens", str(golden))
    return tmp, golden, free, followed


def test_follow_tokens_feeds_the_golden_tokens(follow_runs: tuple[Path, Path, Path, Path]) -> None:
    tmp, golden, free, followed = follow_runs
    assert _generated(free) != _generated(golden)  # the defect alone makes the tokens diverge
    assert _generated(followed) == _generated(golden)
    manifest = json.loads((followed / "wb_manifest.json").read_text())
    assert manifest["follow_tokens"] == str(golden.resolve())
    assert json.loads(manifest["exec"]["config"])["follow_ids"] == _generated(golden)  # what wb redump re-runs
    for t in range(1, 4):  # the ids fed at each step are the golden ones
        assert (
            manifest["token_ids"][str(t)] == json.loads((golden / "wb_manifest.json").read_text())["token_ids"][str(t)]
        )

    diverged = run_wb("compare", "-gp", str(golden), "-mp", str(free), "-o", str(tmp / "out_free"))
    assert diverged.returncode in (0, 1), diverged.stderr
    assert "inputs differ" in diverged.stdout  # the check that --follow-tokens makes unnecessary
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(followed), "-o", str(tmp / "out"))
    assert proc.returncode in (0, 1), proc.stderr
    assert "inputs differ" not in proc.stdout
    assert "error born at: root.model.layers.0.mlp.down_proj (token 0)" in proc.stdout, proc.stdout


def test_redump_of_a_followed_run_follows_again(follow_runs: tuple[Path, Path, Path, Path]) -> None:
    tmp, _golden, _free, _followed = follow_runs
    catalog = tmp / "out" / "catalog.duckdb"
    if not catalog.exists():
        pytest.skip("the compare of the followed run did not run")
    node = "root.model.layers.1.mlp.down_proj"
    proc = run_wb("redump", node, "--token", "2", "--catalog", str(catalog), "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (redump,) = [p.parent for p in (tmp / "out" / "wb_redump").rglob("wb_manifest.json")]
    manifest = json.loads((redump / "wb_manifest.json").read_text())
    assert (
        manifest["follow_tokens"]
        and manifest["token_ids"]["2"] == json.loads((_golden / "wb_manifest.json").read_text())["token_ids"]["2"]
    )


def test_follow_tokens_of_a_dump_without_ids_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "run.py").write_text("print('never run')\n")
    proc = invoke_wb(
        "dump", "--exec", f"{sys.executable} run.py", "-o", str(tmp_path / "d"), "--follow-tokens", str(tmp_path)
    )
    assert proc.returncode == 2 and proc.stderr.startswith("wb: error: --follow-tokens:"), proc.stderr
    assert "Traceback" not in proc.stderr and "never run" not in proc.stdout
