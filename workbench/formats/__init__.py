"""Dump readers: `open_dump(path)` reads an msit torch, ATB or msprobe dump into a `Dump`.

The data model is imported eagerly (it is light); `open_dump` and `load_tensor` pull in torch,
so they load on first use (PEP 562) and a caller that only needs `DumpError` stays fast.
"""

from typing import Any

from workbench.formats.model import Dump, DumpError, Node, TensorEntry, TensorStats

__all__ = ["Dump", "DumpError", "Node", "TensorEntry", "TensorStats", "load_tensor", "open_dump"]


def __getattr__(name: str) -> Any:
    if name == "open_dump":
        from workbench.formats.detect import open_dump

        return open_dump
    if name == "load_tensor":
        from workbench.formats.tensor_io import load_tensor

        return load_tensor
    raise AttributeError(f"module 'workbench.formats' has no attribute {name!r}")
