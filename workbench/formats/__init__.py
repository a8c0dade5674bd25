"""Dump readers: `open_dump(path)` reads an msit torch, ATB or msprobe dump into a `Dump`."""

from workbench.formats.detect import open_dump
from workbench.formats.model import Dump, DumpError, Node, TensorEntry, TensorStats
from workbench.formats.tensor_io import load_tensor

__all__ = ["Dump", "DumpError", "Node", "TensorEntry", "TensorStats", "load_tensor", "open_dump"]
