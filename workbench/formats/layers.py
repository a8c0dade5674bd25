"""Decoder-layer indices of nodes, shared by every reader.

Torch and msprobe names carry the index in a path segment (`model.layers.3`, `transformer.h.2`,
`encoder.layer.5`, `blocks.7`); ATB graphs do not, so there the index is the ordinal of the
layer op among its graph's layer ops. Either way descendants inherit their layer's index.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from workbench.formats.model import Node

# a container segment followed by an integer segment, separated by dots (or slashes)
_LAYER_RE = re.compile(r"(?:^|[./])(?:layers|layer|h|blocks|block)[./]([0-9]+)(?=$|[./])")


def layer_from_name(name: str) -> int | None:
    """The layer index named by a `layers.N` / `h.N` / `blocks.N` / `layer.N` segment (first one), else None."""
    m = _LAYER_RE.search(name)
    return int(m.group(1)) if m else None


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
