"""What `wb compare` tells of calls the test run makes at some tokens and not at others.

msprobe names a torch call by a counter of its kind within a step, msit numbers repeated calls likewise: a call made at
some tokens only renames every later call of its kind there (`compare.pairing.token_realign`, which finds such kinds
and tokens and pairs their calls again at those tokens). Each such kind gets one line: a `note:` where its calls were
paired again at every such token, a `warning:` where they were not (the pairs there may compare different calls).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from workbench.compare.pairing.token_realign import CallDrift
from workbench.core.tokens import token_text

if TYPE_CHECKING:
    import duckdb

_SHOWN = 3  # kinds named in full; the rest counted


def drift_lines(drifts: list[CallDrift], realigned: dict[str, list[int]]) -> list[tuple[str, bool]]:
    """(line, paired again) per drifting kind, `note:` or `warning:` first; past the first few kinds, one line
    counting the rest."""
    lines: list[tuple[str, bool]] = []
    for drift in drifts:
        said = "; ".join(
            f"at token{'s' if len(toks) > 1 else ''} {token_text(toks)}: {_count(d)}"
            for d, toks in drift.by_difference.items()
        )
        head = (
            f"{drift.kind} calls, test against golden run, {said} (at token {drift.first_token}: "
            f"{_count(drift.first_difference)}): calls numbered by their kind are renamed past the difference"
        )
        repaired = set(drift.tokens) <= set(realigned.get(drift.kind, []))
        if repaired:
            lines.append((f"note: {head}; at those tokens they are paired by their order there", True))
        else:
            lines.append((f"warning: {head}, so at those tokens such pairs may compare different calls", False))
    if len(lines) > _SHOWN:
        rest = lines[_SHOWN:]
        word = "note" if all(ok for _, ok in rest) else "warning"
        lines = [*lines[:_SHOWN], (f"{word}: ... and {len(rest)} more kinds of call", word == "note")]
    return lines


def _count(diff: int) -> str:
    return "as many" if diff == 0 else f"{abs(diff)} {'more' if diff > 0 else 'fewer'}"


def store_call_drift(con: duckdb.DuckDBPyConnection, cmp_id: int, lines: list[tuple[str, bool]]) -> None:
    """Replace the comparison's rows of `call_drift` with `lines` (`drift_lines`'), in their order."""
    con.execute("DELETE FROM call_drift WHERE cmp_id = ?", [cmp_id])
    if lines:
        con.executemany(
            "INSERT INTO call_drift VALUES (?, ?, ?, ?)", [[cmp_id, i, line, ok] for i, (line, ok) in enumerate(lines)]
        )
