"""Judging a reference against a dumped output: the two rules of the precheck, named, and what they judge.

ATB ops are judged as the compare judges a pair (`judge_by_thresholds`: `compare_tensors` metrics against the
thresholds of the output's dtype, the compare's NaN/Inf rule), so a precheck and a compare agree on an op. Torch
modules and API calls are judged with msit opcheck's standard (`judge_by_opcheck`: the share of elements whose
relative error is within the dtype's `etol` must exceed its pass rate, `STANDARDS`), as msit's own opcheck does.
Both name a failure with the failed-metric names below and refuse a reference the dumped tensor cannot hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.analysis.checks.precheck.result import OutputCheck
from workbench.compare.judging.judge import judge_pair, nan_inf_mismatch
from workbench.compare.judging.metrics import compare_tensors
from workbench.compare.judging.thresholds import Thresholds
from workbench.formats.model import dtype_name

Tensor = torch.Tensor

# failed-metric names beside the compare's metrics
SHAPE = "shape"  # the dumped output cannot hold the reference
STRAY_WRITES = "stray_writes"  # an in-place op changed what it must not touch
REL_PASS_RATE = "rel_pass_rate"  # too few elements within the dtype's relative error
NAN_INF = "nan_inf"  # NaN/Inf where the reference is finite

EPS_FP32 = 1.1920929e-07  # opcheck: relative error counts only where |reference| > this
# msit opcheck's precision standard per output dtype: (relative error tolerance, pass rate in %)
STANDARDS: dict[str, tuple[float, float]] = {
    "float64": (1e-4, 99.99),
    "float32": (2**-20, 99.99),
    "float16": (2**-10, 99.9),
    "bfloat16": (2**-8, 99.9),
    "int64": (1e-4, 99.99),
    "int32": (1e-4, 99.99),
    "int16": (1.0, 99.9),
    "int8": (1.0, 99.9),
    "uint8": (1.0, 99.0),
    "bool": (1e-4, 100.0),
}


@dataclass(slots=True)
class Ref:
    """One ATB output to judge: the reference and the dumped values it must match."""

    index: int
    reference: Tensor
    test: Tensor
    stray: str | None = None  # a failure found outside the metrics (in-place writes where none belong)
    note: str | None = None


@dataclass(slots=True)
class Check:
    """One torch tensor to judge: the float64 reference and the dumped tensor it must match."""

    label: str
    reference: Tensor
    test: Tensor
    note: str | None = None
    floor: Tensor | None = None  # absolute error a correct kernel may add beyond one rounding (reductions)


def _shape_mismatch(reference: Tensor, test: Tensor, what: str) -> str | None:
    """The reason a dumped tensor cannot hold the reference, None when it can."""
    if reference.numel() == test.numel():
        return None
    return f"the reference has shape {list(reference.shape)}, the dumped {what} {list(test.shape)}"


# ---------------------------------------------------------------------------- ATB: the compare's thresholds


def judge_by_thresholds(ref: Ref, th: Thresholds, name: str, op_type: str) -> OutputCheck:
    """The compare's judgement of one pair (`judge_pair`), with the reference as golden; an in-place op's stray
    writes fail the output whatever its metrics."""
    test = ref.test
    dtype = dtype_name(test.dtype)
    notes = [n for n in (ref.note, ref.stray) if n]
    stray = [STRAY_WRITES] if ref.stray else []
    mismatch_text = _shape_mismatch(ref.reference, test, "output")
    if mismatch_text is not None:
        return OutputCheck(ref.index, {}, False, [SHAPE, *stray], "; ".join([mismatch_text, *notes]))
    # compare_tensors works in float32 chunks; an in-memory copy of the dumped output (no bigger than the
    # reference) is several times faster to scan than the memory map
    reference = ref.reference.reshape(test.shape).float()
    test = test.clone()
    pm = compare_tensors(reference, test, dtype)
    g_counts = {"nan_count": pm.golden.nan_count, "inf_count": pm.golden.inf_count}
    t_counts = {"nan_count": pm.test.nan_count, "inf_count": pm.test.inf_count}
    mismatch = nan_inf_mismatch(g_counts, t_counts)
    if pm.reason:
        notes.insert(0, pm.reason)
    if (
        all(v is None for v in pm.values.values())
        and not mismatch
        and test.numel()
        and _same_nonfinite(reference, test)
    ):
        passed: bool | None = not stray
        failed = list(stray)
        notes.append("every element is NaN/Inf, exactly where the reference has them")
    else:
        passed, failed = judge_pair(th, pm.values, g_counts, t_counts, dtype, node_name=name, node_type=op_type)
        if stray:
            passed, failed = False, [*failed, *stray]
    return OutputCheck(ref.index, pm.values, passed, failed, "; ".join(notes) or None)


def _same_nonfinite(a: Tensor, b: Tensor) -> bool:
    a32, b32 = a.float(), b.float()
    return bool(
        torch.equal(a32.isnan(), b32.isnan())
        and torch.equal(a32.isposinf(), b32.isposinf())
        and torch.equal(a32.isneginf(), b32.isneginf())
    )


def overall(outputs: list[OutputCheck]) -> bool | None:
    """False when an output fails; None when there is none or one was not judged; else True."""
    if any(o.passed is False for o in outputs):
        return False
    if not outputs or any(o.passed is None for o in outputs):
        return None
    return True


def describe_threshold_failures(outputs: list[OutputCheck]) -> str:
    """`out0 cosine 0.981234, rel. distance 0.0312; out1 shape`: the failing outputs' worst metrics."""
    worst = []
    for o in outputs:
        cos, red = o.values.get("cosine_similarity"), o.values.get("relative_euclidean_distance")
        if cos is not None and red is not None:
            worst.append(f"out{o.index} cosine {cos:.6f}, rel. distance {red:.3g}")
        elif o.failed_metrics:
            worst.append(f"out{o.index} {', '.join(o.failed_metrics)}")
        if STRAY_WRITES in o.failed_metrics and o.reason:
            worst.append(f"out{o.index}: {o.reason}")
    return "; ".join(worst)


# ---------------------------------------------------------------------------- torch: msit opcheck's standard


def standard(dtype: str) -> tuple[float, float]:
    """opcheck's (relative error tolerance, pass rate in %) for a dtype name; float32's for one it does not list."""
    return STANDARDS.get(dtype, STANDARDS["float32"])


def standard_text(dtype: str) -> str:
    """opcheck's wording: `99.9%(error<0.00390625)`."""
    etol, rate = standard(dtype)
    return f"{rate:g}%(error<{etol:g})"


def judge_by_opcheck(check: Check, index: int) -> OutputCheck:
    """msit opcheck's rule for the test tensor's dtype, plus NaN/Inf where the reference is finite."""
    ref, test = check.reference, check.test
    dtype = dtype_name(test.dtype)
    etol, rate_min = standard(dtype)
    notes = [n for n in (check.note,) if n]
    mismatch_text = _shape_mismatch(ref, test, "tensor")
    if mismatch_text is not None:
        reason = f"{check.label}: {mismatch_text}"
        return OutputCheck(index, {}, False, [SHAPE], "; ".join([reason, *notes]), label=check.label)
    r = ref.reshape(-1).to(torch.float64)
    t = test.reshape(-1).to(torch.float64)
    n = r.numel()
    if n == 0:
        return OutputCheck(index, {}, None, [], f"{check.label}: empty tensor", label=check.label)
    err = (t - r).abs()
    big = r.abs() > EPS_FP32
    rel = torch.where(big, err / r.abs().clamp_min(EPS_FP32), err)  # where the reference is ~0: absolute
    tol = etol * r.abs()
    if test.dtype.is_floating_point:  # subnormal outputs: their spacing is absolute
        fi = torch.finfo(test.dtype)
        tol = tol + fi.smallest_normal * fi.eps
    if check.floor is not None:
        tol = tol + check.floor.reshape(-1).to(torch.float64)
    both_nan = r.isnan() & t.isnan()
    same_inf = r.isinf() & (t == r)
    within = (err <= tol) | (~big & (err <= etol)) | both_nan | same_inf
    rate = 100.0 * float(within.sum()) / n
    passed = rate >= 100.0 if dtype == "bool" else rate > rate_min
    finite = r.isfinite() & t.isfinite()
    rel_f = rel[finite & big]
    rf, tf = r[finite], t[finite]
    denom = float(rf.norm() * tf.norm())
    both_zero = denom == 0 and not bool(rf.any()) and not bool(tf.any())
    cos = 1.0 if both_zero else (float(rf @ tf) / denom if denom else 0.0)
    values: dict[str, float | None] = {
        REL_PASS_RATE: rate,
        "max_relative_error": float(rel_f.max()) if rel_f.numel() else 0.0,
        "max_absolute_error": float(err[finite].max()) if finite.any() else None,
        "cosine_similarity": cos,
    }
    failed = [] if passed else [REL_PASS_RATE]
    nonfinite = int((r.isfinite() & ~t.isfinite()).sum())
    if nonfinite:
        failed.append(NAN_INF)
        passed = False
        notes.append(f"{nonfinite} NaN/Inf where the reference is finite")
    return OutputCheck(index, values, passed, failed, "; ".join(notes) or None, label=check.label)


def describe_opcheck_failures(outputs: list[OutputCheck], dtypes: list[str]) -> str:
    """`down_proj: 97.12% within 99.9%(error<0.00390625)`: each failing output's pass rate against its standard
    (`dtypes[o.index]`: the dumped tensor's dtype name)."""
    return "; ".join(
        f"{o.label}: {o.values.get(REL_PASS_RATE, 0) or 0:.2f}% within {standard_text(dtypes[o.index])}"
        for o in outputs
        if o.passed is False
    )
