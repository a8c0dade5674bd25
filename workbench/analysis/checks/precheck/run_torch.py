"""The torch precheck's entry points: one module or API call at one token (`precheck_node`), every node of a
token (`precheck_nodes`) and a dump by path (`precheck_path`), each recomputed by its `torch_kernels` checker
and every dumped output (and stage) judged with msit opcheck's standard for its dtype."""

from __future__ import annotations

from pathlib import Path

from workbench.analysis.checks.precheck.judge import describe_opcheck_failures, judge_by_opcheck
from workbench.analysis.checks.precheck.result import CANNOT_RUN, NO_REFERENCE, OutputCheck, PrecheckResult
from workbench.analysis.checks.precheck.torch_inputs import CannotRun, TorchDump, target_of
from workbench.analysis.checks.precheck.torch_kernels import CHECKERS, SUPPORTED_TYPES, checker_key
from workbench.formats.model import dtype_name


def precheck_node(source: TorchDump, node: str, token: int) -> PrecheckResult:
    """Re-run one torch module or API call at one token and judge each dumped output (and stage)."""
    type_name = source.types.get(node, "")

    def result(
        supported: bool, passed: bool | None, reason: str | None, outs: list[OutputCheck] | None = None
    ) -> PrecheckResult:
        return PrecheckResult(f"{source.root}::{node}@{token}", type_name, supported, passed, outs or [], reason, node)

    key = checker_key(type_name)
    if key is None:
        return result(
            False, None, f"{NO_REFERENCE} for {type_name or 'an untyped node'} (supported: {SUPPORTED_TYPES})"
        )
    try:
        op = source.op(node, token)
        checks = CHECKERS[key](op)
    except CannotRun as exc:
        return result(True, None, f"{CANNOT_RUN}: {exc}")
    except (RuntimeError, ValueError, IndexError) as exc:
        return result(
            True, None, f"{CANNOT_RUN}: the dumped tensors do not fit a {key} ({str(exc).splitlines()[0][:120]})"
        )
    outputs = [judge_by_opcheck(c, i) for i, c in enumerate(checks)]
    skipped = dict(op.skipped)
    for o in outputs:
        if o.passed is None:
            skipped.setdefault(o.label, o.reason or "nothing to judge")
    if any(o.passed is False for o in outputs):
        passed: bool | None = False
    elif outputs and not skipped:
        passed = True
    else:
        passed = None
    reason = describe_opcheck_failures(outputs, [dtype_name(c.test.dtype) for c in checks]) or None
    notes = sorted({c.note for c in checks if c.note})
    if notes:
        reason = "; ".join([*(r for r in (reason,) if r), *notes])
    res = result(True, passed, reason, outputs)
    res.not_checked = list(skipped)
    res.why = "; ".join(dict.fromkeys(skipped.values())) or None
    return res


def precheck_nodes(source: TorchDump, token: int, nodes: list[str] | None = None) -> list[PrecheckResult]:
    """Precheck every node (or the given ones) that has outputs at `token`, in the dump's node order."""
    names = nodes if nodes is not None else [n for n in source.types if source.has(n, token)]
    return [precheck_node(source, n, token) for n in names]


def precheck_path(path: Path, token: int | None = None, node: str | None = None) -> list[PrecheckResult]:
    """Precheck a torch dump by path: a module folder (that module), a token folder, or any level `open_dump`
    accepts (every node of `token`, default the first token); `node` picks one node by name."""
    from workbench.formats.detect import open_dump

    target = target_of(path)
    dump = open_dump(target.dump_path)
    if dump.kind == "atb":
        raise CannotRun(f"{path}: an ATB dump (its op folders are checked by the ATB precheck)")
    source = TorchDump.from_dump(dump)
    tok = token if token is not None else target.token
    if tok is None:
        tok = dump.tokens[0] if dump.tokens else 0
    name = node or target.node
    if name is not None:
        if name not in source.types and not source.tokens(name):
            raise CannotRun(f"{path}: no node {name!r} in this dump")
        if checker_key(source.types.get(name, "")) is None:  # a container: its modules
            below = [n for n in source.descendants(name) if source.has(n, tok)]
            if below:
                return precheck_nodes(source, tok, below)
        return [precheck_node(source, name, tok)]
    return precheck_nodes(source, tok)
