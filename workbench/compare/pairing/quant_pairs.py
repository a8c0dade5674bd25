"""Pairs of a quantized test run's int tensors with the golden float tensors they stand for.

The manifest's `quant` entry (`formats/quant_links.py`) says which int8/int32 tensor dequantizes with which
scales (and offset) into which float tensor. Each such tensor is paired with that golden tensor, the pair
carrying the transform `t.sub:OFFSET;t.mul:SCALE...` (operands written `@node|io|index` here, resolved per
token to `#tensor_id` by `resolve_operands`, and to file paths by the executor), so the worker compares
`(q - offset) * scale` with the golden float tensor. The node pair's evidence says it was compared dequantized.
An int tensor the entry gives no scale is compared as integers (`t.int`: the golden rounded), its pairs'
`cmp_fail_reason` saying that no float comparison was possible.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from workbench.formats.quant_links import QuantLink, TensorRef

if TYPE_CHECKING:  # the compare worker imports this module's constants, not the frames
    from workbench.compare.pairing.frames import NodeTable, TensorPairs, TensorTable

QuantMatch = tuple[int, int, str, float, str, tuple[str | None, int | None], tuple[str | None, int | None], str | None]
_ROLE = {"in": "input", "out": "output"}


def _operand(ref: TensorRef) -> str:
    return f"@{ref.node}|{ref.io}|{ref.index}"


def _name(ref: TensorRef) -> str:
    return f"{_ROLE[ref.io]} {ref.index} of {ref.node}"


INT_ONLY = "the dump's quant entry gives it no scale, so no float comparison is possible"
INT_STEP = "t.int"  # the worker compares the test ints with the golden rounded to integers


def dequant_transform(link: QuantLink) -> str:
    """The pair transform that dequantizes `link`'s int tensor (operands unresolved); `t.int` without scales."""
    if not link.scales:
        return INT_STEP
    steps = [f"t.sub:{_operand(link.offset)}"] if link.offset is not None else []
    steps += [f"t.mul:{_operand(s)}" for s in link.scales]
    return ";".join(steps)


def quant_matches(
    golden: dict[str, int], test: dict[str, int], links: list[QuantLink], taken: Collection[int]
) -> list[QuantMatch]:
    """(golden node, test node, method, confidence, evidence, golden (role, index), test (role, index),
    transform) per int tensor with scales whose float tensor the golden run has; the quantized module itself is
    paired with the golden module of its name (its float input and output compare as they are)."""
    out: list[QuantMatch] = []
    paired: set[tuple[int, int]] = set()
    for link in links:
        g = golden.get(link.float.node)
        t = test.get(link.tensor.node)
        if g is None or t is None or g in taken:
            continue
        own = test.get(link.float.node)
        if own is not None and (g, own) not in paired:
            paired.add((g, own))
            why = "identical name; the quantized module in place of the float one"
            out.append((g, own, "name", 1.0, why, (None, None), (None, None), None))
        deq = "(q - offset) x scale" if link.offset is not None else " x ".join(["q"] + ["scale"] * len(link.scales))
        why = (
            f"quant: {link.dtype} {_name(link.tensor)} compared dequantized, {deq} "
            f"(scales: {', '.join(_name(s) for s in link.scales)}), with the golden {_name(link.float)}"
            if link.scales
            else f"quant: {link.dtype} {_name(link.tensor)} compared as integers with the golden {_name(link.float)} "
            f"rounded: {INT_ONLY}"
        )
        sel_g: tuple[str | None, int | None] = (link.float.io, link.float.index)
        sel_t: tuple[str | None, int | None] = (link.tensor.io, link.tensor.index)
        out.append((g, t, "quant", 1.0, why, sel_g, sel_t, dequant_transform(link)))
    return out


def resolve_operands(pairs: TensorPairs, nodes: NodeTable, tensors: TensorTable) -> list[str | None]:
    """Each pair's transform with its `@node|io|index` operands replaced by that tensor's `#id` at the pair's
    token (`#missing` where the dump lacks it: the worker says so)."""
    node_id = dict(zip(nodes.name, nodes.node_id.tolist()))
    key = dict(
        zip(
            zip(tensors.node_id.tolist(), tensors.token_id.tolist(), tensors.io.text(), tensors.idx.tolist()),
            tensors.tensor_id.tolist(),
        )
    )
    out: list[str | None] = []
    for tr, tok in zip(pairs.transform, pairs.test_token_id.tolist()):
        if not isinstance(tr, str) or "@" not in tr:
            out.append(tr if isinstance(tr, str) else None)
            continue
        steps = []
        for step in tr.split(";"):
            head, sep, ref = step.partition(":@")
            if sep:
                node, io, idx = ref.rsplit("|", 2)
                nid = node_id.get(node)
                tid = None if nid is None else key.get((int(nid), int(tok), io, int(idx)))
                step = f"{head}:#{tid if tid is not None else 'missing'}"
            steps.append(step)
        out.append(";".join(steps))
    return out
