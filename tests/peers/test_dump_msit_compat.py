"""msit's own readers on our dump: its model_tree.json parser and its `msit llm compare` (if installed)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.tiny_models import tiny_llama
from workbench.dump import DumpConfig, register_hook

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("msit_llm") is None, reason="msit_llm not installed (pip install msit && msit install llm)"
)


@pytest.fixture(scope="module")
def dump_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tiny_llama(0, kv_heads=4, max_positions=64)
    handle = register_hook(model, DumpConfig(dump_path=tmp_path_factory.mktemp("msit"), token_range=[0, 1]))
    model.generate(torch.randint(0, 256, (1, 6)), max_new_tokens=2, do_sample=False, pad_token_id=0)
    handle.remove()
    assert handle.dump_dir is not None
    return handle.dump_dir


def test_msit_parses_our_model_tree(dump_dir: Path) -> None:
    from msit_llm.dump.torch_dump.topo import ModelTree

    root = ModelTree.json_to_tree(str(dump_dir / "model_tree.json"))
    assert (root.node_name, root.op_type) == ("root", "LlamaForCausalLM")
    assert [c.node_name for c in root.children] == ["root.model", "root.lm_head"]


def test_msit_compare_reads_our_dump(dump_dir: Path, tmp_path: Path) -> None:
    msit = shutil.which("msit", path=os.path.dirname(sys.executable))
    if msit is None:
        pytest.skip("the msit command is not installed next to this Python")
    proc = subprocess.run(
        [msit, "llm", "compare", "-gp", str(dump_dir / "0"), "-mp", str(dump_dir / "0"), "-o", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    reports = list(tmp_path.glob("msit_cmp_report_*.xlsx"))
    assert proc.returncode == 0 and reports, proc.stdout[-2000:] + proc.stderr[-2000:]
    import pandas as pd

    sheets = pd.read_excel(reports[0], sheet_name=None)
    rows = pd.concat(sheets.values())
    assert len(rows) > 10
    assert rows["golden_data_path"].str.startswith(str(dump_dir / "0")).all()
    assert (rows["cosine_similarity"] == 1).all()
