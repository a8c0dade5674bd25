"""The import contract of docs/architecture.md.

Statically, `lint-imports` (import-linter, contracts in pyproject.toml's `[tool.importlinter]`: layers, only the
app imports Textual, no cycle inside a package, ...; lazy imports count). At run time, in a fresh interpreter:
the headless layers load no Textual module and `wb` starts without torch.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "workbench"
HEADLESS = ("core", "formats", "dump", "backends", "catalog", "compare", "analysis", "jobs")
GUI_LIBRARIES = ("textual",)


def _modules() -> list[str]:
    out = []
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


MODULES = _modules()


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return [name.strip() for layer in layers for name in layer.split("|")]


def test_every_package_has_a_layer() -> None:
    """Each top-level module of `workbench` sits in the layers contract (a new package must be placed)."""
    tops = {".".join(m.split(".")[:2]) for m in MODULES if m != "workbench"}
    unknown = tops - set(_layers())
    assert not unknown, f"packages without a layer (add them to pyproject.toml and docs/architecture.md): {unknown}"


def test_every_module_is_named_in_the_architecture_doc() -> None:
    """docs/architecture.md names every module of `workbench` (its "Who owns what" is true of the tree)."""
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    owners = doc[doc.index("## Who owns what") :]
    unnamed = [
        path.relative_to(ROOT).as_posix()
        for path in sorted(PKG.rglob("*.py"))
        if path.name not in ("__init__.py", "__main__.py")
        and "data" not in path.relative_to(PKG).parts
        and f"`{path.name}`" not in owners
        and f"/{path.name}`" not in owners
    ]
    assert not unnamed, f"modules docs/architecture.md does not name: {unnamed}"


def _lint_imports() -> str:
    found = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))
    if not Path(found).exists():
        pytest.fail("lint-imports not installed: pip install -e '.[test]' (import-linter)")
    return found


def test_the_import_contracts_hold() -> None:
    """`lint-imports` keeps every contract of pyproject.toml."""
    out = subprocess.run(
        [_lint_imports(), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and "kept" in out.stdout


def test_headless_layers_load_no_textual() -> None:
    """Importing every module of the layers below the app, in a fresh interpreter, loads no Textual module."""
    names = sorted(m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in HEADLESS)
    code = (
        "import importlib, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {GUI_LIBRARIES!r})\n"
        "print(bad[:5]); sys.exit(1 if bad else 0)\n"
    )
    out = run_python(code, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


def test_wb_start_up_imports_no_torch() -> None:
    """`wb` registers every command without importing torch (1.5 s): only the commands that run a model or
    re-run an op import it, when they run."""
    code = "import sys, workbench.cli; sys.exit(1 if 'torch' in sys.modules else 0)"
    out = run_python(code)
    assert out.returncode == 0, "importing workbench.cli imported torch" + out.stderr


def test_app_imports_no_torch() -> None:
    """The app process never imports torch: importing the app, its main screen and the `p` key's module (with
    the precheck result types it shows) in a fresh interpreter loads no torch module."""
    code = (
        "import sys, workbench.app.app, workbench.app.main_screen, workbench.app.opcause\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch')\n"
        "print(bad[:5]); sys.exit(1 if bad else 0)\n"
    )
    out = run_python(code, timeout=300)
    assert out.returncode == 0, "importing the app imported torch: " + out.stdout + out.stderr
