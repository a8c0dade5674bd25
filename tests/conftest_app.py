"""Shared helpers for the app tests: a small synthetic catalog with real tensor files, built once.

Registered as a plugin by tests/conftest.py, so its fixtures serve the whole suite. The catalog is made
by `bench/make_big_catalog.py` at a tiny size (3 layers x 12 ops x 5 tokens, real `.npy` tensors),
with a defect planted in `root.model.layers.1.down_proj` from token 1 on, a NaN at the last token,
and `act_fn` renamed `act` on the test side (unmatched on both sides).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench import make_big_catalog

REPO = Path(__file__).resolve().parents[1]
DEFECT = "root.model.layers.1.down_proj"
DEFECT_ID = 27  # node id of DEFECT in the synthetic model
SIZE = (140, 44)


_BUILT: dict[str, Path] = {}  # one build per session even when several test modules alias a fixture


@pytest.fixture(scope="session")
def small_catalog_master(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if "small" in _BUILT:
        return _BUILT["small"]
    root = tmp_path_factory.mktemp("wb_app_catalog")
    make_big_catalog.make_catalog(
        root / "catalog.duckdb",
        layers=3,
        ops=12,
        tokens=5,
        defect_layer=1,
        defect_token=1,
        tensors=root / "tensors",
        seed=7,
    )
    _BUILT["small"] = root / "catalog.duckdb"
    return _BUILT["small"]


@pytest.fixture()
def small_catalog(small_catalog_master: Path, tmp_path: Path) -> Path:
    """A private copy (tests may write to it); tensor paths still point at the shared files."""
    dst = tmp_path / "catalog.duckdb"
    shutil.copyfile(small_catalog_master, dst)
    return dst


# The demo's metrics are shown to 6 digits in snapshots. CPU kernels pick their code by instruction set (AVX-512,
# native bf16 dot products, AMX) and so round differently from machine to machine; capped at AVX2 with a fixed thread
# count, every x86-64 machine with AVX2 runs the same code and gets the same digits.
PINNED_NUMERICS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    "OMP_NUM_THREADS": "2",
    "MKL_NUM_THREADS": "2",
}


def _run_demo(out: Path, *extra: str) -> Path:
    import os
    import subprocess

    env = {**os.environ, **PINNED_NUMERICS, "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-m", "workbench.cli", "demo", "--out", str(out), "--no-tui", *extra],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    catalog = out / "catalog.duckdb"
    if res.returncode != 0 or not catalog.exists():
        pytest.fail(f"wb demo {' '.join(extra)}".rstrip() + f" failed ({res.returncode}): {res.stderr[-2000:]}")
    # with no terminal, the demo ends by saying how to open the app on it
    assert res.stdout.rstrip().splitlines()[-1] == f"open the app on it: wb open {catalog}", res.stdout[-500:]
    return catalog


@pytest.fixture(scope="session")
def tp_demo_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`wb demo --tp 2 --no-tui` once per session: torch golden vs the ATB stack on 2 ranks, all-reduce defect."""
    if "tp" not in _BUILT:
        _BUILT["tp"] = _run_demo(tmp_path_factory.mktemp("wb_app_tp_demo"), "--tp", "2")
    return _BUILT["tp"]


@pytest.fixture(scope="session")
def demo_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`wb demo --out DIR --no-tui` run once per session (real Llama dumps, torch golden vs ATB-structured test)."""
    if "demo" not in _BUILT:
        _BUILT["demo"] = _run_demo(tmp_path_factory.mktemp("wb_app_demo"))
    return _BUILT["demo"]


@pytest.fixture(scope="session")
def rope_demo_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`wb demo --defect rope_base --no-tui` once per session: RoPE angles from a wrong base in layer 1 of the ATB
    stack; at token 0 compare sees the MLP's outputs fail first and the precheck pins the attention's RoPE op."""
    if "rope_base" not in _BUILT:
        _BUILT["rope_base"] = _run_demo(tmp_path_factory.mktemp("wb_app_rope_demo"), "--defect", "rope_base")
    return _BUILT["rope_base"]
