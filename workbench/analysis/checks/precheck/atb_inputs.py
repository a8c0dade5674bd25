"""An ATB op's dumped inputs, outputs and params, read for its precheck.

A leaf op folder of one token (`{index}_{OpType}/`) holds `before/intensor*.bin` (or `after/intensor*.bin`),
`after/outtensor*.bin` and `op_param.json`. This module reads dump files only; it never imports the stack that
wrote them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.core.capped import OP_PARAM, FileRefused, read_text
from workbench.formats import atb_bin
from workbench.formats.atb import OP_PARAM_FILE, op_tensor_files
from workbench.formats.model import DumpError
from workbench.formats.tensor_io import bin_to_tensor

Tensor = torch.Tensor

_PLAIN_LAYOUTS = {"ND", "NCHW", "NHWC", "NCDHW", "NDHWC", "HWCN", "UNDEFINED"}


class UnsupportedLayout(Exception):
    """A dumped tensor's layout has no reference here (only ND tensors)."""


@dataclass(slots=True)
class AtbOp:
    """One ATB op's dumped tensors and params."""

    param: dict[str, Any]
    ins: list[Tensor]
    outs: list[Tensor]
    inputs_before: bool  # inputs were dumped before the op ran (in-place inputs not yet overwritten)


def read_op(op_dir: Path) -> AtbOp:
    """The params, inputs and outputs of an op folder; raises `DumpError` (one line naming the file) when one is
    missing or unreadable and `UnsupportedLayout` for a tensor that is not ND."""
    param = read_param(op_dir)
    files = op_tensor_files(op_dir)
    if not files.inputs:
        raise DumpError(op_dir, "no intensor*.bin in before/ or after/ (outputs-only dump?)")
    if not files.outputs:
        raise DumpError(op_dir / "after", "no outtensor*.bin (inputs-only dump?)")
    ins = [load_op_tensor(p) for p in files.inputs]
    outs = [load_op_tensor(p) for p in files.outputs]
    return AtbOp(param, ins, outs, files.inputs_before)


def read_param(op_dir: Path) -> dict[str, Any]:
    """An op folder's `op_param.json` as a dict; raises `DumpError` when it is missing, too big or not an object."""
    path = op_dir / OP_PARAM_FILE
    try:
        text = read_text(path, OP_PARAM)
    except FileRefused as exc:
        raise DumpError(path, exc.reason) from None
    except FileNotFoundError:
        raise DumpError(path, "missing file: the op's params are unknown") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DumpError(path, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        param = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise DumpError(path, f"not valid JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise DumpError(path, "JSON nested too deeply to read") from None
    if not isinstance(param, dict):
        raise DumpError(path, f"holds a JSON {type(param).__name__}, not an object")
    return param


def load_op_tensor(path: Path) -> Tensor:
    """One `.bin` tensor of an op folder."""
    hdr = atb_bin.read_header(path)
    if hdr.layout not in _PLAIN_LAYOUTS:
        raise UnsupportedLayout(f"{path}: {hdr.layout} layout is not supported (only ND tensors)")
    return bin_to_tensor(atb_bin.read_bin(path, hdr), hdr.dtype)
