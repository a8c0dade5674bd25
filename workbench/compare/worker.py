"""What one compare worker process does: load a pair (memory-mapped), compute every metric, return numbers.

Kept free of DuckDB and of the catalog so it can run in a process pool; one pair is in
memory at a time, so a worker's peak is bounded by the largest tensor pair.
"""

from __future__ import annotations

from typing import Any

import torch

from workbench.compare.metrics import compare_tensors, summarize
from workbench.compare.tasks import SUMMARY_FIELDS, PairTask, StatsTask
from workbench.formats.model import DumpError
from workbench.formats.tensor_io import load_tensor


def apply_transform(golden: torch.Tensor, test: torch.Tensor, spec: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Layout fixes recorded on a pair, `;`-separated, each for one side (`g.` golden, `t.` test):

    `t.chunk:DIM:I:N` keeps chunk I of N along DIM (a fused gate-up output holds gate then up);
    `t.slice:DIM:START:STOP` keeps a slice; `g.flat` / `t.flat` flattens.
    """
    if not spec:
        return golden, test
    for step in spec.split(";"):
        side, _, op = step.strip().partition(".")
        parts = op.split(":")
        target = golden if side == "g" else test
        if parts[0] == "chunk":
            dim, idx, n = (int(x) for x in parts[1:4])
            target = torch.chunk(target, n, dim=dim)[idx]
        elif parts[0] == "slice":
            dim, start, stop = (int(x) for x in parts[1:4])
            target = target.narrow(dim, start, stop - start)
        elif parts[0] == "flat":
            target = target.reshape(-1)
        else:
            raise ValueError(f"unknown pair transform {step!r}")
        if side == "g":
            golden = target
        else:
            test = target
    return golden, test


def _summary_dict(s: Any) -> dict[str, Any]:
    return {f: getattr(s, f) for f in SUMMARY_FIELDS}


def _load(path: str | None, side: str) -> tuple[torch.Tensor | None, str | None]:
    if path is None:
        return None, f"{side}: no tensor data (statistics-only dump)"
    try:
        return load_tensor(path), None
    except DumpError as exc:
        return None, str(exc)


def run_pair(task: PairTask) -> dict[str, Any]:
    """Metrics and both sides' statistics for one pair; problems become `cmp_fail_reason`."""
    golden, g_err = _load(task.golden_path, "golden_data_path")
    test, t_err = _load(task.test_path, "my_data_path")
    out: dict[str, Any] = {"pair_id": task.pair_id, "golden_tensor_id": task.golden_tensor_id,
                           "test_tensor_id": task.test_tensor_id}
    if golden is None or test is None:
        # one side unreadable: still describe the other (compare_tensors does it otherwise, in its one pass)
        if golden is not None:
            out["golden"] = _summary_dict(summarize(golden))
        if test is not None:
            out["test"] = _summary_dict(summarize(test))
        out["values"] = {}
        out["finite_only"] = False
        out["reason"] = " ".join(r for r in (g_err, t_err) if r)
        return out
    if task.transform:
        # the catalog describes whole files; the pair compares a part of one
        out["golden"], out["test"] = _summary_dict(summarize(golden)), _summary_dict(summarize(test))
    try:
        golden, test = apply_transform(golden, test, task.transform)
    except (ValueError, RuntimeError, IndexError) as exc:
        out["values"], out["finite_only"] = {}, False
        out["reason"] = f"cannot apply layout transform {task.transform!r}: {exc}"
        return out
    res = compare_tensors(golden, test, test_dtype=task.test_dtype)
    out["values"] = dict(res.values)
    out["finite_only"] = bool(res.finite_only)
    out["reason"] = res.reason
    if not task.transform:
        out["golden"] = _summary_dict(res.golden)
        out["test"] = _summary_dict(res.test)
    return out


def run_stats(task: StatsTask) -> dict[str, Any]:
    """Statistics of one tensor no pair covers (so the catalog describes every tensor)."""
    t, err = _load(task.path, "data_path")
    out: dict[str, Any] = {"run_id": task.run_id, "tensor_id": task.tensor_id, "error": err}
    if t is not None:
        out["summary"] = _summary_dict(summarize(t))
    return out


def run_batch(tasks: list[PairTask | StatsTask]) -> list[dict[str, Any]]:
    """A batch of tasks (batched to keep inter-process traffic low)."""
    torch.set_num_threads(1)
    return [run_pair(t) if isinstance(t, PairTask) else run_stats(t) for t in tasks]
