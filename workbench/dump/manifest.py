"""`model_tree.json` (msit's module tree) and `wb_manifest.json` (what msit does not record).

The manifest is rewritten atomically (temporary file + rename) at the end of every dumped token, so
an interrupted run still leaves a valid manifest that describes the tokens finished so far.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.core.files import MANIFEST_NAME as MANIFEST_NAME
from workbench.core.files import MODEL_TREE_NAME as MODEL_TREE_NAME
from workbench.core.trust import SIGNATURE_KEY, sign
from workbench.formats.tensor_io import dtype_name

__all__ = ["MANIFEST_NAME", "MODEL_TREE_NAME"]
FORMAT = "wb-dump"
VERSION = 1


def model_tree(model: nn.Module, name: str = "root") -> dict[str, Any]:
    """msit's tree: `{"name", "type", "children"}`, children in definition order, dotted names."""
    return {
        "name": name,
        "type": type(model).__name__,
        "children": [model_tree(child, f"{name}.{child_name}") for child_name, child in model.named_children()],
    }


def write_model_tree(model: nn.Module, dump_dir: Path) -> Path:
    """Write `model_tree.json` exactly as msit does (`json.dump` with default separators)."""
    path = dump_dir / MODEL_TREE_NAME
    atomic_write_text(path, json.dumps(model_tree(model)))
    return path


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file and a rename (readers never see half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def _model_dtype_device(model: nn.Module) -> tuple[str | None, str]:
    dtype: str | None = None
    device = "cpu"
    for param in model.parameters():
        dtype = dtype if dtype is not None else dtype_name(param.dtype)
        device = str(param.device)  # msit takes the last parameter's device
    return dtype, device


class Manifest:
    """Run-time facts of one dump: call order per token, kwargs and ModelOutput field names, metadata.

    Filled on the model's thread; `snapshot()` returns a JSON-ready copy that a writer thread can
    serialise while the model goes on.
    """

    def __init__(self, model: nn.Module, config: dict[str, Any], dump_dir: Path) -> None:
        dtype, device = _model_dtype_device(model)
        self.path = dump_dir / MANIFEST_NAME
        self.meta: dict[str, Any] = {
            "command": list(sys.argv),
            "executable": sys.executable,  # with `command` and `cwd`: what `wb redump` re-runs (signed on write)
            "cwd": os.getcwd(),
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
            "dtype": dtype,
            "device": device,
            "pid": os.getpid(),
            "config": config,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        self.exec_order: dict[str, list[str]] = {}
        self.kwargs_inputs: dict[str, dict[str, dict[str, str]]] = {}
        self.output_fields: dict[str, dict[str, dict[str, str]]] = {}
        self.tokens_done: list[int] = []
        self.errors: list[str] = []
        # every root call, dumped or not: the ids it was fed and the top-1 of its last position's logits
        self.token_ids: dict[str, list[int]] = {}
        self.top1: dict[str, int] = {}
        self.follow_ids: list[int] | None = None

    def start_token(self, token: int) -> list[str]:
        """Begin a token; returns the list that collects its call order."""
        order: list[str] = []
        self.exec_order[str(token)] = order
        return order

    def note_kwargs(self, token: int, module: str, names: dict[str, str]) -> None:
        """Record which `input_{i}` came from which keyword argument."""
        self.kwargs_inputs.setdefault(str(token), {})[module] = names

    def note_fields(self, token: int, module: str, names: dict[str, str]) -> None:
        """Record which `output_{i}` came from which ModelOutput / dict field."""
        self.output_fields.setdefault(str(token), {})[module] = names

    def generated(self) -> list[int]:
        """The id chosen at each root call: the next call's last input id, else the followed id, else top-1."""
        calls = sorted(int(t) for t in {*self.token_ids, *self.top1})
        out: list[int] = []
        for t in calls:
            nxt = self.token_ids.get(str(t + 1))
            if nxt:
                out.append(nxt[-1])
            elif self.follow_ids is not None and t < len(self.follow_ids):
                out.append(self.follow_ids[t])
            elif str(t) in self.top1:
                out.append(self.top1[str(t)])
            else:
                break
        return out

    def snapshot(self, token: int | None) -> dict[str, Any]:
        """A JSON-ready copy of the manifest after `token` finished (None: nothing new finished)."""
        if token is not None and token not in self.tokens_done:
            self.tokens_done.append(token)
        done = {str(t) for t in self.tokens_done}
        return {
            "format": FORMAT,
            "version": VERSION,
            "tokens": list(self.tokens_done),
            "exec_order": {t: list(v) for t, v in self.exec_order.items() if t in done},
            "kwargs_inputs": {t: dict(v) for t, v in self.kwargs_inputs.items() if t in done},
            "output_fields": {t: dict(v) for t, v in self.output_fields.items() if t in done},
            "token_ids": {t: list(v) for t, v in self.token_ids.items()},
            "top1": dict(self.top1),
            "generated": self.generated(),
            **self.meta,
            "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "errors": list(self.errors),
        }

    def write(self, snapshot: dict[str, Any]) -> None:
        """Write a snapshot atomically to `wb_manifest.json`, its recorded command signed (`core.trust`)."""
        snapshot["errors"] = list(self.errors)
        snapshot.pop(SIGNATURE_KEY, None)
        signature = sign(snapshot)
        if signature is not None:
            snapshot[SIGNATURE_KEY] = signature
        atomic_write_text(self.path, json.dumps(snapshot, indent=1))
