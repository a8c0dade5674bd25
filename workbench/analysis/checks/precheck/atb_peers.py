"""An ATB op's params against its peers': a param every op of its kind in a token shares (an RMSNorm epsilon, an
attention `qkScale`), where a lone different value is a bug born in that op.

A kernel can only be as right as its params. An op whose audited param disagrees with the value its peers
agree on fails its precheck: the reference then uses the peers' value, and the reason says whether the kernel at
least follows its own param.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import torch

from workbench.analysis.checks.precheck.atb_inputs import read_param
from workbench.analysis.checks.precheck.atb_kernels import int_param
from workbench.formats.atb import leaf_op_folders, parse_op_folder
from workbench.formats.model import DumpError

Tensor = torch.Tensor

# the audited params: op type -> (the group of ops that share it, its path in the params)
_AUDITED: dict[str, tuple[str, tuple[str, ...]]] = {
    "RmsNormOperation": ("RmsNormOperation", ("normParam", "epsilon")),
    "SelfAttentionOperation": ("attention", ("qkScale",)),
    "PagedAttentionOperation": ("attention", ("qkScale",)),
}


def _get_path(param: dict[str, Any], path: tuple[str, ...]) -> float | None:
    """The number at `path` in `param` (`("normParam", "epsilon")`), None when absent or not a number."""
    cur: Any = param
    for key in path:
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
    try:
        return float(cur)
    except (TypeError, ValueError):
        return None


def _with_path(param: dict[str, Any], path: tuple[str, ...], value: float) -> dict[str, Any]:
    """A copy of `param` with `value` at `path`."""
    out = copy.deepcopy(param)
    cur = out
    for key in path[:-1]:
        cur = cur.setdefault(key, {})
    cur[path[-1]] = value
    return out


def _audit_key(op_type: str, param: dict[str, Any]) -> tuple[str, tuple[str, ...]] | None:
    """(peer group, param path) of the param audited for this op, None when none is."""
    spec = _AUDITED.get(op_type)
    if spec is None or (op_type == "RmsNormOperation" and param.get("layerType", 1) != 1):
        return None
    return spec


def _canonical(op_type: str, param: dict[str, Any], ins: list[Tensor]) -> float | None:
    """The textbook value of an audited param, used only to break a tie between peers."""
    if op_type in ("SelfAttentionOperation", "PagedAttentionOperation") and ins:
        q, heads = ins[0], int_param(param, "headNum", 0)
        d = q.shape[-1] if q.dim() == 3 else (q.shape[-1] // heads if heads else 0)
        return 1.0 / math.sqrt(d) if d > 0 else None
    return None


class Peers:
    """Audited params of every leaf op of a token folder, read once per token folder."""

    def __init__(self) -> None:
        self._seen: dict[str, list[tuple[str, dict[str, Any]]]] = {}

    def params(self, token_dir: Path) -> list[tuple[str, dict[str, Any]]]:
        key = str(token_dir)
        if key not in self._seen:
            found = []
            for leaf in leaf_op_folders(token_dir):
                parsed = parse_op_folder(leaf.name)
                op_type = parsed[1] if parsed else ""
                if op_type in _AUDITED:
                    try:
                        found.append((op_type, read_param(leaf)))
                    except DumpError:
                        continue  # that op reports its own problem when it is checked
            self._seen[key] = found
        return self._seen[key]

    def consensus(
        self, token_dir: Path, group: str, path: tuple[str, ...], canonical: float | None
    ) -> tuple[float, int, int, bool] | None:
        """(value, ops holding it, ops of the group, tie broken by the textbook value), if a value prevails."""
        counts: dict[float, int] = {}
        for op_type, param in self.params(token_dir):
            spec = _audit_key(op_type, param)
            value = _get_path(param, path) if spec is not None and spec[0] == group else None
            if value is not None:
                rounded = float(f"{value:.6g}")
                counts[rounded] = counts.get(rounded, 0) + 1
        total = sum(counts.values())
        if total < 2:
            return None
        top = max(counts.values())
        winners = [v for v, n in counts.items() if n == top]
        if len(winners) == 1:
            return winners[0], top, total, False
        if canonical is not None:
            match = [v for v in winners if math.isclose(v, canonical, rel_tol=1e-5)]
            if match:
                return match[0], top, total, True
        return None

    def audit(
        self, token_dir: Path | None, op_type: str, param: dict[str, Any], ins: list[Tensor]
    ) -> tuple[str, dict[str, Any]] | None:
        """(the issue, the params with the peers' value) when the op's audited param differs from the value its
        token's peers agree on; None when it agrees, is not audited or has no peers to agree with."""
        spec = _audit_key(op_type, param)
        own = _get_path(param, spec[1]) if spec else None
        if spec is None or own is None or token_dir is None:
            return None
        agreed = self.consensus(token_dir, spec[0], spec[1], _canonical(op_type, param, ins))
        if agreed is None or math.isclose(own, agreed[0], rel_tol=1e-5):
            return None
        value, n, total, tie = agreed
        issue = (
            f"param {'.'.join(spec[1])} {own:g} differs from the {value:g} of {n} of the "
            f"{total} {spec[0]} ops of this token" + (" (and the textbook value)" if tie else "")
        )
        return issue, _with_path(param, spec[1], value)
