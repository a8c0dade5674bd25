"""Loaded by Python at start-up when `wb dump --exec` puts this folder first on PYTHONPATH."""

import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    """Run the sitecustomize this one shadows (a distribution's or a virtualenv's), if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_chain()
if os.environ.get("WB_EXEC_DUMP"):
    try:
        from workbench.dump.autohook import install_from_env
    except Exception as exc:  # never break the user's script
        sys.stderr.write(f"wb dump: cannot load the dump hook: {exc}\n")
    else:
        install_from_env()
