"""What a compare sends between processes (dumps, tasks) pickled by its fields: equal copies, and only where safe."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from tests.conftest import TinyDumps
from workbench.compare.execution.tasks import PairTask, StatsTask, Twin
from workbench.core.pickling import by_fields
from workbench.formats import open_dump
from workbench.formats.model import Node, Payload, TensorEntry, TensorStats


def test_a_dump_read_and_sent_back_is_equal_and_keeps_its_types(tiny_dumps: TinyDumps) -> None:
    dump = open_dump(tiny_dumps.golden)
    copy = pickle.loads(pickle.dumps(dump, protocol=pickle.HIGHEST_PROTOCOL))
    assert copy == dump and copy is not dump
    assert any(t.payload is not None for t in copy.tensors)
    entry = next(t for t in copy.tensors if t.payload is not None)
    assert type(entry) is TensorEntry and type(entry.payload) is Payload and type(copy.nodes[0]) is Node
    with pytest.raises(dataclasses.FrozenInstanceError):  # still frozen after the trip
        entry.token = 3  # type: ignore[misc]


def test_tasks_and_statistics_round_trip() -> None:
    at = Payload((1, 2, 3, 4), 64, "bfloat16", (2, 3))
    task = PairTask(
        7, "g.pth", "t.pth", "bfloat16", 1, 2, "layout:squeeze", {"max": 1.0, "min": None}, None, 6,
        (Twin(8, "g.pth", "u.pth", at, None),), at, None,
    )  # fmt: skip
    stats = TensorEntry(
        0, "root.m", "out", 0, None, "float32", (4,), stats=TensorStats(1.0, -1.0, 0.0, 2.0), digest=b"\x01"
    )
    for obj in (task, StatsTask(1, 2, "x.pth"), stats, Node("root.m", "Linear", "root", 1, 3, 0, None, {"k": 1})):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy == obj and type(copy) is type(obj)
    assert pickle.loads(pickle.dumps(task)).twins[0].golden_at == at


def test_only_classes_rebuilt_equal_from_their_fields_are_accepted() -> None:
    @dataclasses.dataclass(frozen=True)
    class KeywordOnly:
        a: int
        b: int = dataclasses.field(default=0, kw_only=True)

    @dataclasses.dataclass
    class Computed:
        a: int
        b: int = dataclasses.field(init=False, default=0)

    @dataclasses.dataclass
    class Adjusted:
        a: int

        def __post_init__(self) -> None:
            self.a += 1

    for cls in (KeywordOnly, Computed, Adjusted):
        with pytest.raises(TypeError, match="by_fields"):
            by_fields(cls)
