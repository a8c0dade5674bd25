"""The GE protobuf messages (`DumpData` of a GE dump file, `GraphDef`/`ModelDef` of the GE graph text).

The schema lives in `formats/proto/*.proto` (GraphEngine's public field numbers, Apache-2.0); `make proto`
compiles it into `proto/ge_schema.desc`, a `FileDescriptorSet` the message classes are built from here at
import time. No generated Python module: the descriptor set works with any protobuf runtime.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SCHEMA_FILE = "ge_schema.desc"


@functools.cache
def _pool() -> descriptor_pool.DescriptorPool:
    data = resources.files("workbench.formats").joinpath("proto", SCHEMA_FILE).read_bytes()
    files = descriptor_pb2.FileDescriptorSet.FromString(data)
    pool = descriptor_pool.DescriptorPool()
    for f in files.file:
        pool.Add(f)
    return pool


@functools.cache
def message_class(full_name: str) -> Any:
    """The message class of `full_name` (`toolkit.dumpdata.DumpData`, `ge.proto.GraphDef`, ...)."""
    return message_factory.GetMessageClass(_pool().FindMessageTypeByName(full_name))


def dump_data() -> Any:
    """The `DumpData` class (a GE dump file's header)."""
    return message_class("toolkit.dumpdata.DumpData")


def graph_def() -> Any:
    """The `GraphDef` class (one GE graph)."""
    return message_class("ge.proto.GraphDef")


def model_def() -> Any:
    """The `ModelDef` class (graphs of one model)."""
    return message_class("ge.proto.ModelDef")
