"""The nodes and tensors of one run as columns, and the tensor pairs made from them.

What matching, planning and the summary read of a run, held as numpy arrays and lists: no DataFrame (pandas'
import alone was ~0.13 s of a ~0.8 s `wb compare`) and no Python object per tensor (a 150k-file dump's frame stays
a few MB). Text columns with few distinct values (io, dtype, shape as text) are `Coded`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from workbench.formats.quant_links import QuantLink

_Rows = np.ndarray | slice  # positions (an index array or a boolean mask) or a slice


@dataclass(frozen=True, slots=True)
class Coded:
    """A text column of few distinct values: per row a code into `values`, -1 for NULL."""

    codes: np.ndarray  # int32
    values: list[str]

    @classmethod
    def of(cls, texts: Iterable[str | None]) -> Coded:
        """Coded from one text (or None) per row."""
        index: dict[str, int] = {}
        codes = [-1 if t is None else index.setdefault(t, len(index)) for t in texts]
        return cls(np.asarray(codes, dtype=np.int32), list(index))

    def __len__(self) -> int:
        return len(self.codes)

    def text(self) -> list[str | None]:
        """One text (or None) per row."""
        values = self.values
        return [values[c] if c >= 0 else None for c in self.codes.tolist()]

    def take(self, rows: _Rows) -> Coded:
        return Coded(self.codes[rows], self.values)

    def code(self, value: str) -> int:
        """The code of `value` (-1 when no row holds it)."""
        try:
            return self.values.index(value)
        except ValueError:
            return -1

    def is_in(self, wanted: Collection[str]) -> np.ndarray:
        """A mask of the rows whose text is one of `wanted`."""
        codes = [i for i, v in enumerate(self.values) if v in wanted]
        return np.isin(self.codes, np.asarray(codes, dtype=np.int32))


@dataclass(frozen=True, slots=True)
class NodeTable:
    """A run's nodes, one row each, ordered by node id."""

    node_id: np.ndarray  # int64
    name: list[str]
    type: list[str | None]
    parent_id: list[int | None]
    exec_order: list[int | None]
    layer: list[int | None]
    phase: list[str | None]
    params: list[str | None]  # JSON text

    def __len__(self) -> int:
        return len(self.name)

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[Any, ...]]) -> NodeTable:
        """From rows in field order (node_id, name, type, parent_id, exec_order, layer, phase, params)."""
        cols = list(zip(*rows)) if rows else [()] * 8
        return cls(
            np.asarray(cols[0], dtype=np.int64),
            [str(x) for x in cols[1]],
            list(cols[2]),
            list(cols[3]),
            list(cols[4]),
            list(cols[5]),
            list(cols[6]),
            list(cols[7]),
        )


@dataclass(frozen=True, slots=True)
class TensorTable:
    """A run's tensors, one row each, ordered by tensor id; numbers and codes only (no path)."""

    tensor_id: np.ndarray  # int64, ascending
    token_id: np.ndarray  # int64
    node_id: np.ndarray  # int64
    io: Coded  # in | out
    idx: np.ndarray  # int64
    dtype: Coded
    shape: Coded  # as text: `[4, 8]`
    numel: np.ndarray  # int64, -1 where unknown
    norm: np.ndarray  # float64, NaN where unknown
    mean: np.ndarray  # float64, NaN where unknown
    # (device, inode) of each tensor's file as its reader saw it, -1 where it did not (a run read back from the
    # catalog has none: None)
    file_id: np.ndarray | None = None  # int64, shape (n, 2)

    def __len__(self) -> int:
        return len(self.tensor_id)

    def known_files(self) -> dict[int, tuple[int, int]]:
        """Tensor id -> (device, inode) of its file, where the reader saw it (see `file_id`)."""
        if self.file_id is None:
            return {}
        ids = self.tensor_id.tolist()
        return {
            tid: (dev, ino)
            for tid, dev, ino in zip(ids, self.file_id[:, 0].tolist(), self.file_id[:, 1].tolist(), strict=True)
            if dev >= 0
        }

    def take(self, rows: _Rows) -> TensorTable:
        """The rows at `rows` (positions or a mask), in that order."""
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            picked[f.name] = value if value is None else value.take(rows) if isinstance(value, Coded) else value[rows]
        return TensorTable(**picked)

    def rows_of(self, tensor_ids: np.ndarray) -> np.ndarray:
        """The row of each tensor id, -1 where the table has none."""
        ids = np.asarray(tensor_ids, dtype=np.int64)
        if not len(self.tensor_id):
            return np.full(len(ids), -1, dtype=np.int64)
        pos = np.searchsorted(self.tensor_id, ids)
        pos = np.minimum(pos, len(self.tensor_id) - 1)
        return np.where(self.tensor_id[pos] == ids, pos, -1)

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[Any, ...]]) -> TensorTable:
        """From rows (tensor_id, token_id, node_id, io, idx[, dtype, shape, numel, norm, mean]) sorted by tensor id;
        absent columns are unknown (NULL)."""
        cols = list(zip(*rows)) if rows else [()] * 5
        n = len(rows)
        extra = cols[5:] + [(None,) * n] * (10 - len(cols))

        def ints(c: Sequence[Any], missing: int = -1) -> np.ndarray:
            return np.asarray([missing if v is None else int(v) for v in c], dtype=np.int64)

        def floats(c: Sequence[Any]) -> np.ndarray:
            return np.asarray([np.nan if v is None else float(v) for v in c], dtype=np.float64)

        return cls(
            ints(cols[0]),
            ints(cols[1]),
            ints(cols[2]),
            Coded.of(cols[3]),
            ints(cols[4]),
            Coded.of(extra[0]),
            Coded.of(extra[1]),
            ints(extra[2]),
            floats(extra[3]),
            floats(extra[4]),
        )


@dataclass(slots=True)
class RunFrames:
    """The nodes and tensors of one run, as loaded from the catalog."""

    run_id: int
    kind: str
    nodes: NodeTable
    tensors: TensorTable
    quant: list[QuantLink] = field(default_factory=list)  # int tensors and their scales (the manifest's `quant`)

    def by_name(self) -> dict[str, int]:
        return dict(zip(self.nodes.name, self.nodes.node_id.tolist()))


@dataclass(slots=True)
class TensorPairs:
    """Tensor pairs, one row each (`compare.pairing.matching.pair_tensors`); `pair_id` is -1 until stored."""

    token_id: np.ndarray  # int64, the golden token
    test_token_id: np.ndarray  # int64
    golden_tensor_id: np.ndarray  # int64
    test_tensor_id: np.ndarray  # int64
    golden_node_id: np.ndarray  # int64
    test_node_id: np.ndarray  # int64
    io: list[str]
    method: list[str]
    confidence: np.ndarray  # float64
    transform: list[str | None]
    pair_id: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.token_id)

    @classmethod
    def of_rows(cls, rows: Sequence[tuple[Any, ...]]) -> TensorPairs:
        """From rows in field order (token_id, test_token_id, golden_tensor_id, test_tensor_id, golden_node_id,
        test_node_id, io, method, confidence, transform, pair_id), as the catalog's `matches` holds them."""
        if not rows:
            return cls.empty()
        cols = list(zip(*rows))
        ints = [np.asarray(c, dtype=np.int64) for c in cols[:6]]
        return cls(
            ints[0],
            ints[1],
            ints[2],
            ints[3],
            ints[4],
            ints[5],
            [str(x) for x in cols[6]],
            [str(x) for x in cols[7]],
            np.asarray([np.nan if x is None else float(x) for x in cols[8]], dtype=np.float64),
            list(cols[9]),
            np.asarray(cols[10], dtype=np.int64),
        )

    @classmethod
    def empty(cls) -> TensorPairs:
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, z, z, z, z, [], [], np.zeros(0, dtype=np.float64), [], z)

    def take(self, rows: np.ndarray) -> TensorPairs:
        """The pairs at positions (or mask) `rows`, in that order."""
        pos = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows
        picked: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            picked[f.name] = value[pos] if isinstance(value, np.ndarray) else [value[i] for i in pos.tolist()]
        return TensorPairs(**picked)

    @classmethod
    def concat(cls, parts: Sequence[TensorPairs]) -> TensorPairs:
        """The pairs of `parts`, one after another."""
        joined: dict[str, Any] = {}
        for f in fields(cls):
            cols = [getattr(p, f.name) for p in parts]
            joined[f.name] = np.concatenate(cols) if isinstance(cols[0], np.ndarray) else [x for c in cols for x in c]
        return cls(**joined)

    def with_transform(self, transform: list[str | None]) -> TensorPairs:
        return replace(self, transform=transform)

    def columns(self, names: Sequence[str]) -> dict[str, Any]:
        """The named columns, for `con.register` (text columns as object arrays)."""
        out: dict[str, Any] = {}
        for name in names:
            value = getattr(self, name)
            out[name] = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
        return out
