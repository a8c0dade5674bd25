"""Zero-code dumping: hook the model a script builds, without touching the script (`wb dump --exec`).

`wb dump --exec "python run.py ..."` runs the command with `workbench/dump/site/` first on `PYTHONPATH`
and the dump settings in `WB_EXEC_DUMP`. Python imports that folder's `sitecustomize` at start-up, which
calls `install_from_env()`: `nn.Module.__call__` is wrapped until the first call of a model (a module
with parameters and submodules, a Hugging Face `PreTrainedModel` when transformers is loaded); that
module gets `register_hook(model, DumpConfig(...))` before the call runs, and `__call__` is restored at
once, so the script runs at full speed afterwards. The dump is finished at exit (the handle's atexit).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from torch import nn

from workbench.core.files import EXEC_DUMP_ENV
from workbench.dump.config import DumpConfig
from workbench.dump.fx import FxHandle
from workbench.dump.hooks import DumpHandle, register_hook

log = logging.getLogger("workbench.dump")
SITE_DIR = Path(__file__).resolve().parent / "site"
_REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG_KEYS = (
    "dump_path",
    "token_range",
    "module_list",
    "dump_statistics_mode",
    "tensor_part",
    "mode",
    "dump_weight",
    "follow_tokens",
    "follow_ids",
    "fx",
)
handles: list[DumpHandle | FxHandle] = []


def hook_env(config: dict[str, Any], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that makes a Python process dump its model with `config` (DumpConfig arguments, plus
    `exec_command` / `exec_cwd` to record)."""
    env = base if base is not None else os.environ
    path = [str(SITE_DIR), str(_REPO_ROOT)]
    if env.get("PYTHONPATH"):
        path.append(env["PYTHONPATH"])
    return {"PYTHONPATH": os.pathsep.join(path), EXEC_DUMP_ENV: json.dumps(config)}


def _is_model(module: nn.Module) -> bool:
    pretrained = None
    if "transformers" in sys.modules:
        pretrained = getattr(sys.modules["transformers"], "PreTrainedModel", None)
    if pretrained is not None and isinstance(module, pretrained):
        return True
    return next(module.children(), None) is not None and next(module.parameters(), None) is not None


def _config(settings: dict[str, Any]) -> DumpConfig:
    """The `DumpConfig` of recorded settings; `follow_ids` (the golden ids, read by `wb dump`) are followed
    without reading the golden dump again, and `follow_tokens` (its path) is what the manifest records."""
    args = dict(settings)
    ids, source = args.pop("follow_ids", None), args.get("follow_tokens")
    if ids is not None:
        args["follow_tokens"] = ids
    config = DumpConfig(**args)
    if ids is not None and source is not None:
        config.follow_tokens = str(source)
    return config


def install(config: dict[str, Any]) -> None:
    """Wrap `nn.Module.__call__` until the first model call, then hook that model with `config`."""
    original = nn.Module.__call__
    settings = {k: v for k, v in config.items() if k in CONFIG_KEYS}

    hooked = False

    def first_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        nonlocal hooked
        # callers may hold this function as a bound `__call__` (HF generate does): after the first model it
        # only passes through
        if not hooked and _is_model(self):
            hooked = True
            nn.Module.__call__ = original  # type: ignore[method-assign]
            try:
                handle = register_hook(self, _config(settings))
            except Exception as exc:  # the script must run on even when the dump cannot be set up
                sys.stderr.write(f"wb dump: cannot hook {type(self).__name__}: {exc}\n")
            else:
                handles.append(handle)
                if handle.manifest is not None:
                    handle.manifest.meta["exec"] = {
                        "command": config.get("exec_command"),
                        "cwd": config.get("exec_cwd"),
                        "config": json.dumps(settings),
                    }
                    handle.manifest.write(handle.manifest.snapshot(None))
                sys.stderr.write(f"wb dump: hooked {type(self).__name__}, writing {handle.dump_dir}\n")
        return original(self, *args, **kwargs)

    nn.Module.__call__ = first_call  # type: ignore[method-assign]


def install_from_env() -> None:
    """Install from `WB_EXEC_DUMP` (set by `wb dump --exec`); a bad value is reported, never raised."""
    text = os.environ.get(EXEC_DUMP_ENV)
    if not text:
        return
    try:
        config = json.loads(text)
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        sys.stderr.write(f"wb dump: {EXEC_DUMP_ENV} ignored: {exc}\n")
        return
    install(config)
