"""Decoder-layer indices of nodes, shared by every reader.

Torch and msprobe names carry the index in a path segment (`model.layers.3`, `transformer.h.2`,
`encoder.layer.5`, `blocks.7`); ATB graphs do not, so there the index is the ordinal of the
layer op among its graph's layer ops. Either way descendants inherit their layer's index. A stream of calls that no
module encloses (msprobe's `level: L1`) has neither: there a layer is one copy of the block of calls that repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from workbench.formats.model import Node
from workbench.formats.node_names import call_name

if TYPE_CHECKING:
    import numpy as np

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
    covering as much) is cut into blocks, and block k is layer k; layers before it that start as its block does and
    differ after (dense layers before MoE ones: `_layers_before`) come first. What runs before them (the embedding,
    the rotary tables) and after them (the final norm, which repeats the start of a block, and the LM head) has no
    layer; so has every call of a stream with no repeated block of at least three kinds of call."""
    import numpy as np

    n = len(kinds)
    ids: dict[str, int] = {}
    codes = np.fromiter((ids.setdefault(k, len(ids)) for k in kinds), dtype=np.int64, count=n)
    best: tuple[int, int, int, int] | None = None  # (calls covered, -period, -start, calls repeated past them)
    for period in range(2, n // 2 + 1):
        same = np.concatenate(([0], (codes[:-period] == codes[period:]).astype(np.int8), [0]))
        edges = np.flatnonzero(np.diff(same))
        starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
        repeats = (lengths + period) // period
        if not len(repeats) or repeats.max() < 2:
            continue
        covered = repeats * period
        i = int(np.argmax(covered))  # the first of the longest
        key = (int(covered[i]), -period, -int(starts[i]), int(lengths[i]) + period - int(covered[i]))
        if best is None or key[:3] > best[:3]:
            if len(set(codes[starts[i] : starts[i] + period].tolist())) >= _MIN_BLOCK_KINDS:
                best = key
    out: list[int | None] = [None] * n
    if best is not None:
        covered_calls, period, start = best[0], -best[1], -best[2]
        start = _at_a_norm(kinds, start, min(best[3], period - 1))
        before = _layers_before(codes, start, period)
        for k, (first, stop) in enumerate(before):
            out[first:stop] = [k] * (stop - first)
        for i in range(start, start + covered_calls):
            out[i] = len(before) + (i - start) // period
    return out


# the first call of a norm, as msprobe names torch's (HF's RMSNorm computes `x.pow(2).mean(...)`) and torch_npu's
_NORM_CALLS = frozenset(("pow", "square", "layer_norm", "rms_norm", "npu_rms_norm", "npu_add_rms_norm", "group_norm"))


def _at_a_norm(kinds: Sequence[str], start: int, slack: int) -> int:
    """Where the layers of a repeated stretch start: the stretch begins as early as the calls before it repeat the
    block's end (a dense layer's MLP ends as an MoE layer's experts do), up to `slack` calls before its first
    layer; a decoder layer starts with its input norm, so the first norm call in that reach, else the stretch's
    start."""
    for first in range(start, start + slack + 1):
        if call_name(kinds[first]) in _NORM_CALLS:
            return first
    return start


_MIN_SHARED_CALLS = 2 * _MIN_BLOCK_KINDS  # a layer before the repeated ones starts as they do for at least this long


def _layers_before(codes: np.ndarray, start: int, period: int) -> list[tuple[int, int]]:
    """The (first, stop) calls of the layers that run just before the repeated stretch at `start` and are not copies
    of its block: a model's dense layers before its MoE ones (DeepSeek's first layers, however few). Such a layer
    starts as a repeated one does (its norm and attention) and differs after (its MLP): going back from `start`,
    each is the stretch whose calls share the longest start with the block (at least `_MIN_SHARED_CALLS`, and half
    its own calls), the latest of those that share as much; the embedding and rotary tables before them share none."""
    import numpy as np

    block = codes[start : start + period]
    found: list[tuple[int, int]] = []
    stop = start
    while stop >= _MIN_SHARED_CALLS:
        best: tuple[int, int] | None = None  # (calls shared, first call)
        for first in range(max(0, stop - 2 * period), stop - _MIN_SHARED_CALLS + 1):
            length = min(stop - first, period)
            differ = np.flatnonzero(codes[first : first + length] != block[:length])
            shared = int(differ[0]) if len(differ) else length
            if shared >= _MIN_SHARED_CALLS and 2 * shared >= stop - first and (best is None or (shared, first) > best):
                best = (shared, first)
        if best is None:
            break
        found.append((best[1], stop))
        stop = best[1]
    return found[::-1]


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
