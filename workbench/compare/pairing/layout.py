"""When two tensors of different shapes may be compared element by element: the known layout rules.

A torch module and the accelerated op that replaces it often hold the same values in the same
row-major order under another shape: ATB drops the batch dimension (`[1, 24, 256]` vs `[24, 256]`),
keeps attention heads split (`[24, 256]` vs `[24, 8, 32]`) or unpads tokens (`[2, 12, 256]` vs
`[24, 256]`). Those pairs are compared, and the rule is recorded in `matches.transform`, not in
`cmp_fail_reason`. Any other shape difference (a transpose, a permutation, two unrelated tensors
with the same element count) is not comparable: no metric is computed, never silently flattened.

Rules (checked on the shapes after any pair transform such as a fused gate-up chunk):

* `squeeze`: the shapes are equal once their size-1 dimensions are dropped;
* `merge-dims`: once size-1 dimensions are dropped, one shape is the other with runs of consecutive
  dimensions merged (split heads, unpadded tokens); the element order is the same.
"""

from __future__ import annotations

from collections.abc import Sequence

LAYOUT_PREFIX = "layout:"
SQUEEZE = "squeeze"
MERGE_DIMS = "merge-dims"


def _squeezed(shape: Sequence[int]) -> list[int]:
    return [int(d) for d in shape if int(d) != 1]


def _merges_into(fine: list[int], coarse: list[int]) -> bool:
    """True when `coarse` is `fine` with runs of consecutive dimensions multiplied together."""
    i = 0
    for d in coarse:
        acc = 1
        start = i
        while i < len(fine) and acc < d:
            acc *= fine[i]
            i += 1
        if acc != d or i == start:
            return False
    return i == len(fine)


def layout_rule(golden: Sequence[int], test: Sequence[int]) -> str | None:
    """The rule under which two shapes hold the same elements in the same order ('' when equal), else None."""
    g, t = [int(d) for d in golden], [int(d) for d in test]
    if g == t:
        return ""
    gs, ts = _squeezed(g), _squeezed(t)
    if gs == ts:
        return SQUEEZE
    if not gs or not ts:
        return None
    if _merges_into(gs, ts) or _merges_into(ts, gs):
        return MERGE_DIMS
    return None


def shape_after(shape: Sequence[int] | None, transform: str | None, side: str) -> list[int] | None:
    """The shape of one side (`g` or `t`) after a pair transform's `chunk`/`slice`/`flat` steps."""
    if shape is None:
        return None
    out = [int(d) for d in shape]
    for step in (transform or "").split(";"):
        who, _, op = step.strip().partition(".")
        if who != side:
            continue
        parts = op.split(":")
        try:
            if parts[0] == "chunk":
                dim, _idx, n = (int(x) for x in parts[1:4])
                if out and n > 0:
                    out[dim] = -(-out[dim] // n)
            elif parts[0] == "slice":
                dim, start, stop = (int(x) for x in parts[1:4])
                out[dim] = max(0, min(out[dim], stop) - start)
            elif parts[0] == "flat":
                n = 1
                for d in out:
                    n *= d
                out = [n]
        except (ValueError, IndexError):
            return None
    return out


def with_layout(transform: str | None, rule: str) -> str:
    """`transform` plus a `layout:RULE` step."""
    step = LAYOUT_PREFIX + rule
    return f"{transform};{step}" if transform else step


def not_comparable(golden: Sequence[int], test: Sequence[int]) -> str:
    """The `cmp_fail_reason` of a pair whose shapes no layout rule relates."""
    return f"not comparable: shape {list(golden)} vs {list(test)} (no layout rule maps one onto the other)"
