"""The ATB precheck's entry points: one leaf op folder (`precheck_op`) or every leaf op under a group or token
folder (`precheck_group`), each recomputed by its `atb_kernels` checker and judged with the compare's thresholds
of the output's dtype."""

from __future__ import annotations

from pathlib import Path

from workbench.analysis.checks.precheck.atb_inputs import UnsupportedLayout, read_op
from workbench.analysis.checks.precheck.atb_kernels import CHECKERS, SUPPORTED_OPS, Ctx, Misfit, Unsupported
from workbench.analysis.checks.precheck.atb_peers import Peers
from workbench.analysis.checks.precheck.judge import describe_threshold_failures, judge_by_thresholds, overall
from workbench.analysis.checks.precheck.result import NO_REFERENCE, OutputCheck, PrecheckResult
from workbench.compare.judging.thresholds import Thresholds
from workbench.formats.atb import TOO_DEEP, leaf_op_folders, parse_op_folder, token_folder_of
from workbench.formats.model import DumpError


def precheck_op(op_dir: str | Path, *, thresholds: Thresholds | None = None) -> PrecheckResult:
    """Recompute one ATB leaf op from its dumped inputs and params and judge each dumped output."""
    return _check(Path(op_dir), thresholds or Thresholds.load(), Peers())


def precheck_group(group_dir: str | Path, *, thresholds: Thresholds | None = None) -> list[PrecheckResult]:
    """Precheck every leaf op under a group (or token) folder, in execution order (depth first); a folder whose
    op folders nest too deeply comes last, not judged, its line as the reason.

    Raises `DumpError` when `group_dir` is not a folder.
    """
    folder = Path(group_dir)
    if not folder.is_dir():
        raise DumpError(folder, "missing folder" if not folder.exists() else "not a folder")
    th, peers = thresholds or Thresholds.load(), Peers()
    too_deep: list[Path] = []
    results = [_check(leaf, th, peers) for leaf in leaf_op_folders(folder, too_deep)]
    return results + [PrecheckResult(str(d), "", True, None, reason=TOO_DEEP) for d in too_deep]


def _check(op_dir: Path, th: Thresholds, peers: Peers) -> PrecheckResult:
    token_dir = token_folder_of(op_dir)
    name = op_dir.relative_to(token_dir).as_posix() if token_dir is not None else op_dir.name
    parsed = parse_op_folder(op_dir.name)
    op_type = parsed[1] if parsed else ""

    def result(
        supported: bool,
        passed: bool | None,
        reason: str | None,
        outputs: list[OutputCheck] | None = None,
        issues: list[str] | None = None,
    ) -> PrecheckResult:
        return PrecheckResult(str(op_dir), op_type, supported, passed, outputs or [], reason, name, issues or [])

    if parsed is None:
        return result(False, None, f"{op_dir}: not an ATB op folder ({{index}}_{{OpType}})")
    if not op_dir.is_dir():
        return result(op_type in CHECKERS, None, f"{op_dir}: missing folder")
    checker = CHECKERS.get(op_type)
    if checker is None:
        return result(False, None, f"{NO_REFERENCE} for {op_type} (supported: {', '.join(SUPPORTED_OPS)})")
    try:
        op = read_op(op_dir)
        param, ins, outs = op.param, op.ins, op.outs
        ctx = Ctx(inputs_before=op.inputs_before)
        issues: list[str] = []
        used = param
        audited = peers.audit(token_dir, op_type, param, ins)
        if audited is not None:
            issue, used = audited
            issues.append(issue)
        outputs = [judge_by_thresholds(r, th, name, op_type) for r in checker(ins, outs, used, ctx)]
        reasons = []
        if issues:
            own_outputs = [judge_by_thresholds(r, th, name, op_type) for r in checker(ins, outs, param, ctx)]
            follows = overall(own_outputs)
            reasons.append(
                issues[0]
                + (
                    ": the kernel follows its own param, the param is wrong"
                    if follows
                    else ": the kernel matches neither value"
                )
            )
        if len(outputs) < len(outs):
            reasons.append(f"{len(outs) - len(outputs)} of {len(outs)} outputs have no reference")
    except DumpError as exc:
        return result(True, None, str(exc))
    except (Unsupported, UnsupportedLayout) as exc:
        return result(False, None, f"{op_type}: {exc}")
    except Misfit as exc:
        return result(True, None, f"{op_dir}: cannot check: {exc}")
    passed = overall(outputs)
    judged = {o.index for o in outputs if o.passed is not None}
    unchecked = [f"out{i}" for i in range(len(outs)) if i not in judged]
    if issues:
        passed = False
    elif passed and unchecked:
        passed = None
    if passed is False and not issues:
        reasons.insert(0, describe_threshold_failures([o for o in outputs if o.passed is False]))
    res = result(True, passed, "; ".join(r for r in reasons if r) or None, outputs, issues)
    if unchecked and outputs:
        res.not_checked = unchecked
        res.why = f"{NO_REFERENCE} for these outputs"
    return res
