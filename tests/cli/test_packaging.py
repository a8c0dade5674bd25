"""A wheel ships what the package reads at run time: saved queries, themes, default thresholds, the stylesheet.

The wheel is built from a copy of the source (the build writes `build/` and `*.egg-info` next to it),
installed with `pip install --target` and run with only that folder on PYTHONPATH, from another folder.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_wheel_ships_queries_themes_and_thresholds(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    pytest.importorskip("wheel")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("workbench", "queries", "themes"):
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), "."],
        src,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = next(tmp_path.glob("workbench-*.whl"))
    site = tmp_path / "site"
    installed = _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)], src
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    for d in (site / "workbench" / "data" / "queries", site / "workbench" / "data" / "themes"):
        assert d.is_dir() and not d.is_symlink(), f"{d}: not a real folder in the installed wheel"
    assert (site / "workbench" / "app" / "app.tcss").is_file(), "the app's stylesheet is not in the wheel"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site)}
    listed = _run([sys.executable, "-m", "workbench.cli", "queries"], elsewhere, env)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    saved = sorted(p.stem for p in (ROOT / "queries").glob("*.sql"))
    assert saved and all(name in listed.stdout for name in saved), listed.stdout

    code = (
        "import workbench\n"
        "from workbench.app.themes import THEMES_DIR, load_themes\n"
        "from workbench.compare.judging.thresholds import Thresholds\n"
        "themes, problems = load_themes()\n"
        "print(workbench.__file__); print(THEMES_DIR); print(sorted(t.name for t in themes)); print(problems)\n"
        "assert Thresholds.load().dtypes\n"
    )
    loaded = _run([sys.executable, "-c", code], elsewhere, env)
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    lines = loaded.stdout.splitlines()
    assert lines[0].startswith(str(site)) and lines[1].startswith(str(site)), loaded.stdout  # the wheel, not the source
    assert "wb-dark" in lines[2] and lines[3] == "[]", loaded.stdout
