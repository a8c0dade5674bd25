"""Session fixtures: dumps written by the peers' own dumpers (msprobe, msit), each in its own process, in parallel.

Registered as a plugin by tests/conftest.py. See `tests/align_dumps.py` for what each run holds.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAS_MSPROBE = importlib.util.find_spec("msprobe") is not None
HAS_MSIT = importlib.util.find_spec("msit_llm") is not None
MSPROBE_MISSING = "mindstudio-probe (msprobe) is not installed: the msprobe dumper variant needs it"
MSIT_MISSING = "msit_llm is not installed (pip install msit && msit install llm)"


@dataclass
class PeerDumps:
    """Folders of the peers' dumps (None where the peer is not installed)."""

    msprobe: Path | None  # golden/, test/ (one extra Tensor.__mul__), planted/ (an Inf in layers.1 down_proj)
    msit: dict[str, Path]  # golden, test (one extra module), planted: device folders

    def need_msprobe(self) -> Path:
        if self.msprobe is None:
            pytest.skip(MSPROBE_MISSING)
        return self.msprobe

    def need_msit(self) -> dict[str, Path]:
        if not self.msit:
            pytest.skip(MSIT_MISSING)
        return self.msit


def _start(which: str, out: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tests.align_dumps", which, str(out)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str], what: str) -> str:
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"{what} dumper failed ({proc.returncode}): {err[-2000:]}")
    return out


@pytest.fixture(scope="session")
def peer_dumps(tmp_path_factory: pytest.TempPathFactory) -> PeerDumps:
    base = tmp_path_factory.mktemp("peer_dumps")
    procs: dict[str, subprocess.Popen[str]] = {}
    if HAS_MSPROBE:
        procs["msprobe"] = _start("msprobe", base / "msprobe")
    if HAS_MSIT:
        for which in ("golden", "test", "planted"):
            procs[which] = _start(which, base / "msit")
    outs = {k: _finish(p, k) for k, p in procs.items()}
    msit = {k: Path(outs[k].strip().splitlines()[-1]) for k in ("golden", "test", "planted") if k in outs}
    return PeerDumps(base / "msprobe" if HAS_MSPROBE else None, msit)
