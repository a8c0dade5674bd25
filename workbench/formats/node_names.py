"""The short name of a node, as the trees and lists show it: the part of its full name that tells it from its
siblings.

A torch module path ends with its attribute (`root.model.layers.0.mlp` -> `mlp`), an ATB op path with the op
(`3_Prefill_layer/3_RmsNormOperation`). msprobe's names end with the call's direction instead
(`Module.model.layers.1.mlp.down_proj.Linear.forward`, `Functional.linear.13.forward`), so their last segment is
`forward` for every node: a module shows its attribute (`down_proj`; `down_proj#1` for its second call in a token),
an API call its function and count (`linear.13`, `__mul__.5`).
"""

from __future__ import annotations

import re

# the node names `formats.msprobe` gives (the call counter of a module dropped, `#j` after a module's j-th repeat
# within a token; an API call's counter kept)
_MSPROBE_MODULE_RE = re.compile(r"^(?:Module|Cell)\.(.+)\.[^.]+\.(?:forward|backward)(#[0-9]+)?$", re.DOTALL)
_MSPROBE_API_RE = re.compile(r"^[A-Za-z]\w*\.([^.].*\.[0-9]{1,9})\.(?:forward|backward)$", re.DOTALL)


def msprobe_short_name(name: str) -> str | None:
    """The short name of an msprobe module's or API call's node name; None for another dump's name."""
    m = _MSPROBE_MODULE_RE.match(name)
    if m:
        return m.group(1).rsplit(".", 1)[-1] + (m.group(2) or "")
    m = _MSPROBE_API_RE.match(name)
    return m.group(1) if m else None


def short_name(name: str) -> str:
    """The last segment of `name` that tells the node from its siblings (see the module's docstring)."""
    found = msprobe_short_name(name)
    if found is not None:
        return found
    for sep in (".", "/"):
        if sep in name:
            return name.rsplit(sep, 1)[-1]
    return name


def type_beside(short: str, node_type: str) -> str:
    """The type shown after a node's short name: none where the name already says it (an msprobe API call,
    `linear.13` of type `Functional.linear`), which leaves an 80-column tree room for the shape."""
    function, _sep, count = short.rpartition(".")
    if function and count.isdigit() and node_type.rsplit(".", 1)[-1] == function:
        return ""
    return node_type


def call_name(op_type: str | None) -> str:
    """An op type without its namespace, lower case: `Tensor.pow`, `torch.pow` and GE's `Pow` are all `pow`."""
    return (op_type or "").rsplit(".", 1)[-1].lower()
