"""`wb errcheck DUMP`: where NaN, Inf, fp16 overflow or saturation first appear in one dump."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from workbench.cli.common import ProgressPrinter, app, check_format, guarded, render, say_lines

if TYPE_CHECKING:
    from workbench.analysis.checks.errcheck import ErrcheckResult

EXIT_ANOMALY = 1  # exit status when an anomaly is found (0: none, 2: bad input)
_COLUMNS = ("kind", "token", "op", "op_type", "tensor", "count", "inputs", "ops", "module_chain")


@app.command()
def errcheck(
    dump: Annotated[Path, typer.Argument(help="A dump folder (msit torch, ATB or msprobe; full or statistics-only).")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="table, csv or json.")] = "table",
) -> None:
    """Name the first op producing NaN, +Inf/-Inf, fp16 overflow or saturation; exit 0 clean, 1 found, 2 bad input."""
    from workbench.analysis.checks.errcheck import check_dump
    from workbench.formats import open_dump

    def go() -> int:
        check_format(fmt)
        d = open_dump(dump)
        printer = ProgressPrinter()
        res = check_dump(d, progress=lambda done, total: printer(_Step(done, total)))
        rows = [f.to_row() for f in res.findings]
        payload = {
            "dump": res.root,
            "format": res.kind,
            "tokens": res.tokens,
            "ops": res.ops,
            "tensors_read": res.tensors_read,
            "tensors_from_statistics": res.tensors_from_stats,
            "anomaly": res.anomalous,
            "findings": rows,
            "problems": res.problems,
        }
        text = render(fmt, rows, _COLUMNS, lambda: _table(res), payload)
        if fmt == "json":
            typer.echo(text, nl=False)
        else:  # file and op names in the cells: each line escaped as `say` does
            say_lines(text)
        return EXIT_ANOMALY if res.anomalous else 0

    code = guarded(go)
    if code:
        raise typer.Exit(code)


class _Step:
    def __init__(self, done: int, total: int) -> None:
        self.stage, self.done, self.total, self.rate = "errcheck", done, total, None


def _table(res: ErrcheckResult) -> str:
    tokens = f"tokens {res.tokens[0]}-{res.tokens[-1]}" if res.tokens else "no tokens"
    source = f"{res.tensors_read} tensors read"
    if res.tensors_from_stats:
        source += f", {res.tensors_from_stats} judged from recorded statistics"
    lines = [f"dump: {res.root} ({res.kind}, {tokens}, {res.ops} ops, {source})"]
    for p in res.problems:
        lines.append(f"problem: {p}")
    if not res.findings:
        lines.append("no anomaly: no NaN, no Inf, no fp16 overflow, no saturation")
        return "\n".join(lines)
    cells = [[str(c) for c in _COLUMNS]]
    for f in res.findings:
        count = "n/a (statistics)" if f.count is None else str(f.count)
        cells.append([f.kind, str(f.token), f.op, f.op_type, f.tensor, count, f.inputs, str(f.ops), f.module_chain])
    widths = [max(len(r[i]) for r in cells) for i in range(len(_COLUMNS) - 1)]
    for r in cells:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    if any(f.kind == "nan?" for f in res.findings):
        lines.append(
            "nan?: statistics only: a NaN mean that +inf and -inf in the same tensor explain; whether NaN is there "
            "too is uncertain (re-dump with tensors to know)"
        )
    first = res.findings[0]
    made = "produced by" if first.inputs != "abnormal" else "first seen at (its inputs were already abnormal)"
    lines.append(f"anomaly found: {first.kind} {made} {first.op} (token {first.token})")
    return "\n".join(lines)
