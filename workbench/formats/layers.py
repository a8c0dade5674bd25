"""Decoder-layer indices of nodes, shared by every reader.

Torch and msprobe names carry the index in a path segment (`model.layers.3`, `transformer.h.2`,
`encoder.layer.5`, `blocks.7`); ATB graphs do not, so there the index is the ordinal of the
layer op among its graph's layer ops. Either way descendants inherit their layer's index. A stream of calls that no
module encloses (msprobe's `level: L1`) has neither: there a layer is one copy of the block of calls that repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from workbench.formats.model import Node

# a container segment followed by an integer segment, separated by dots (or slashes)
_LAYER_RE = re.compile(r"(?:^|[./])(?:layers|layer|h|blocks|block)[./]([0-9]+)(?=$|[./])")


def layer_from_name(name: str) -> int | None:
    """The layer index named by a `layers.N` / `h.N` / `blocks.N` / `layer.N` segment (first one), else None."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


_MIN_BLOCK_KINDS = 3  # a decoder layer calls a norm, linears, an attention: a block of fewer kinds is no layer


def layers_by_repetition(kinds: Sequence[str]) -> list[int | None]:
    """Layer indices of a stream of calls that no module encloses, from the calls' kinds in the order they ran.

    A decoder stacks copies of one layer, so its calls repeat with the layer's period: the longest stretch of the
    stream made of one block repeated at least twice (the earliest such stretch, and the shortest block among those
    covering as much) is cut into blocks, and block k is layer k. What runs before it (the embedding, the rotary
    tables) and after it (the final norm, which repeats the start of a block, and the LM head) has no layer; so has
    every call of a stream with no repeated block of at least three kinds of call."""
    import numpy as np

    n = len(kinds)
    ids: dict[str, int] = {}
    codes = np.fromiter((ids.setdefault(k, len(ids)) for k in kinds), dtype=np.int64, count=n)
    best: tuple[int, int, int] | None = None  # (calls covered, -period, -start)
    for period in range(2, n // 2 + 1):
        same = np.concatenate(([0], (codes[:-period] == codes[period:]).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(same))
        starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
        repeats = (lengths + period) // period
        if not len(repeats) or repeats.max() < 2:
            continue
        covered = repeats * period
        i = int(np.argmax(covered))  # the first of the longest
        key = (int(covered[i]), -period, -int(starts[i]))
        if best is None or key > best:
            if len(set(codes[starts[i] : starts[i] + period].tolist())) >= _MIN_BLOCK_KINDS:
                best = key
    out: list[int | None] = [None] * n
    if best is not None:
        covered_calls, period, start = best[0], -best[1], -best[2]
        for i in range(start, start + covered_calls):
            out[i] = (i - start) // period
    return out


def is_layer_folder(suffix: str) -> bool:
    """Whether an ATB folder/op name looks like a layer (`Prefill_layer`, `Decoder_layer`, `BloomLayer`)."""
    return "layer" in suffix.lower() and "norm" not in suffix.lower()


def inherit_layers(nodes: Iterable[Node]) -> None:
    """Give every node without a layer its nearest ancestor's layer (in place)."""
    by_name = {n.name: n for n in nodes}
    resolved: dict[str, int | None] = {}

    def resolve(node: Node) -> int | None:
        chain: list[Node] = []
        cur: Node | None = node
        value: int | None = None
        while cur is not None:
            if cur.name in resolved:
                value = resolved[cur.name]
                break
            if cur.layer is not None:
                value = cur.layer
                resolved[cur.name] = value
                break
            chain.append(cur)
            cur = by_name.get(cur.parent) if cur.parent is not None else None
            if len(chain) > len(by_name):  # a parent cycle in bad input: stop
                break
        for c in chain:
            resolved[c.name] = value
        return value

    for n in by_name.values():
        if n.layer is None:
            n.layer = resolve(n)
