"""The import contract of docs/architecture.md, checked on the source (every import, lazy ones included).

Layers, lowest first: core < formats < dump < backends < catalog < compare < analysis < jobs < app < cli < launch.
A module imports only from its own package or a lower layer; only launch (the `wb` script) imports cli; only app
imports Textual; the packages form no cycle; and the headless layers load no Textual module when imported.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_python

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "workbench"

# rank of each layer; formats < dump < backends and app < cli are the allowed orders inside a layer of the brief
LAYERS: dict[str, int] = {
    "core": 0,
    "formats": 1,
    "dump": 2,
    "backends": 3,
    "catalog": 4,
    "compare": 5,
    "analysis": 6,
    "jobs": 7,
    "demo": 7,  # workbench/demo.py: builds and dumps the demo model, a job of `wb demo`
    "app": 8,
    "cli": 9,
    "launch": 10,  # workbench/launch.py: the `wb` console script, loads cli under its own signal handling
}
HEADLESS = ("core", "formats", "dump", "backends", "catalog", "compare", "analysis", "jobs")
GUI_LIBRARIES = ("textual",)


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path) -> list[tuple[str, int]]:
    """Every module this one imports (absolute names; relative imports resolved), with the line."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((base, node.lineno))
            # `from workbench import demo` imports the module workbench.demo
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names if base == "workbench"]
    return found


def _layer(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "workbench" or len(parts) < 2:
        return None
    return parts[1]


MODULES = _modules()


def test_every_package_has_a_layer() -> None:
    unknown = {_layer(m) for m in MODULES} - set(LAYERS) - {None}
    assert not unknown, f"packages without a layer (add them to LAYERS and docs/architecture.md): {unknown}"


def test_imports_follow_the_layers() -> None:
    bad = []
    for name, path in MODULES.items():
        own = _layer(name)
        if own is None:
            continue
        for target, line in _imports(name, path):
            layer = _layer(target)
            if layer is None or layer == own or layer not in LAYERS:
                continue
            if (layer == "cli" and own != "launch") or LAYERS[layer] > LAYERS[own]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {own} imports {target} ({layer} is above {own})")
    assert not bad, "imports against the layers (docs/architecture.md):\n" + "\n".join(bad)


def test_only_the_app_imports_textual() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {target}"
        for name, path in MODULES.items()
        if _layer(name) != "app"
        for target, line in _imports(name, path)
        if target.split(".")[0] in GUI_LIBRARIES
    ]
    assert not bad, "Textual below workbench/app:\n" + "\n".join(bad)


def test_no_package_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        own = _layer(name)
        for target, _ in _imports(name, path):
            layer = _layer(target)
            if own and layer and layer != own and layer in LAYERS:
                graph[own].add(layer)
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                pytest.fail("package cycle: " + " -> ".join([*trail[trail.index(nxt) :], nxt]))
            if nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for pkg in sorted(graph):
        if pkg not in state:
            visit(pkg, [pkg])


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The import walker finds lazy, relative and `from workbench import x` imports (a check that sees nothing
    passes vacuously)."""
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from workbench.app import app\n    from ..cli import common\n    from workbench import demo\n"
    )
    found = {t for t, _ in _imports("workbench.compare.m", src)}
    assert {"workbench.app", "workbench.cli", "workbench.demo"} <= found


def test_headless_layers_load_no_textual() -> None:
    """Importing every module of the layers below the app, in a fresh interpreter, loads no Textual module."""
    names = sorted(m for m in MODULES if _layer(m) in HEADLESS)
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
