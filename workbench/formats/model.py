"""The in-memory description of one dump, shared by every reader and by the catalog.

A reader turns a folder on disk (msit torch, ATB, msprobe, TorchAir GE/FX) into a `Dump`: the topology
(`Node`s), the tensor files (`TensorEntry`s, headers only, no payload read) and what it
could not read (`problems`, one line each). Payloads are read later, one pair at a time,
by `workbench.formats.tensor_io.load_tensor`.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from workbench.core.pickling import by_fields

DumpKind = Literal["msit_torch", "atb", "msprobe", "torchair_ge", "torchair_fx"]
GE_KIND: DumpKind = "torchair_ge"  # a TorchAir GE dump (`formats/ge_run.py`)
FX_KIND: DumpKind = "torchair_fx"  # a TorchAir FX dump (`formats/fx_dump.py`)
GRAPH_ROOT = "graph"  # the root node both TorchAir readers give the ops of a graph (the trees and the heatmap need one)
TensorRole = Literal["in", "out", "param"]  # param: a module's weight (once per run, or per call)
TENSOR_ROLES: tuple[TensorRole, TensorRole] = ("in", "out")  # the roles of a call's own tensors
# How the execution order of nodes was obtained:
#   recorded   - written by the dumper at run time (our manifest, msprobe call counters)
#   topology   - ATB graph order (node order in the topology JSON / folder index)
#   data-flow  - reconstructed by matching each module's inputs to earlier outputs
#   definition - only the module definition order is known (a guess)
OrderSource = Literal["recorded", "topology", "data-flow", "definition"]

_PARAM_INDEX = {"weight": 0, "bias": 1}


def param_index(name: str) -> int:
    """The index of a module's parameter `name` among its `param` tensors: the same name gets the same index in
    every dump, so parameters pair by name (a dropped bias leaves the weights paired): `weight` 0, `bias` 1,
    any other name a stable number from 2 up."""
    if name in _PARAM_INDEX:
        return _PARAM_INDEX[name]
    return 2 + zlib.crc32(name.encode()) % 99_991


_DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def canonical_dtype(dtype: object) -> str | None:
    """`torch.bfloat16`, `bf16`, `BFloat16` ... -> `bfloat16`; None stays None."""
    if dtype is None:
        return None
    text = str(dtype).strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(text, text)


def dtype_name(dtype: object) -> str:
    """Canonical dtype name (`float16`, `bfloat16`, ...) of a torch or numpy dtype or a string."""
    return str(dtype).removeprefix("torch.")


class DumpError(Exception):
    """A problem with one file or folder of a dump; `str()` is a one-line message naming it."""

    def __init__(self, path: str | Path, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self) -> tuple[type[DumpError], tuple[str, str]]:  # raised in a worker, re-raised here
        return type(self), (self.path, self.reason)


MAX_DIMS = 32  # numpy stops at 64; no model tensor comes near
MAX_DIM = 2**62 - 1  # the catalog stores dims and element counts as BIGINT
MAX_TOKEN = 2**31 - 1  # token ids are INTEGER in the catalog


def check_shape(path: str | Path, shape: tuple[int, ...] | list[int], what: str = "shape") -> tuple[int, ...]:
    """`shape` as a tuple when a real tensor can have it; `DumpError` naming the file otherwise."""
    dims = tuple(shape)
    if len(dims) > MAX_DIMS:
        raise DumpError(path, f"{what} has {len(dims)} dimensions (at most {MAX_DIMS} are read)")
    numel = 1
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise DumpError(path, f"{what} {_short(dims)} has a negative or non-integer dimension")
        if d > MAX_DIM:
            raise DumpError(path, f"{what} {_short(dims)} has a dimension above 2^62")
        numel *= d
    if numel > MAX_DIM:
        raise DumpError(path, f"{what} {_short(dims)} holds more than 2^62 elements")
    return dims


def _short(dims: tuple[int, ...]) -> str:
    text = str(list(dims))
    return text if len(text) <= 80 else text[:77] + "...]"


def token_number(name: str) -> int | None:
    """The token (or execute count) a folder name gives: ASCII digits only (`int()` would take `²` or `٣`)."""
    if not (name.isascii() and name.isdigit()):
        return None
    value = int(name)
    return value if value <= MAX_TOKEN else None


def token_folder_problem(path: str, name: str) -> str | None:
    """The problem line for a folder that looks like a token folder but cannot be one (None when it is fine
    or clearly not meant as one)."""
    if not name.isdigit():
        return None
    if not name.isascii():
        return f"{path}: folder name is not ASCII digits: not read as a token"
    if int(name) > MAX_TOKEN:
        return f"{path}: token number above {MAX_TOKEN}: not read"
    return None


@by_fields
@dataclass(frozen=True, slots=True)
class Payload:
    """Where a tensor file's values lie, as its reader found them (header parsed and checked against the file's
    size): `shape` x `dtype`, contiguous, at byte `offset` of the file whose identity was `file_key` (device, inode,
    size, modification time in ns). A compare worker that finds the file unchanged reads the values there instead of
    parsing the header again."""

    file_key: tuple[int, int, int, int]
    offset: int
    dtype: str
    shape: tuple[int, ...]


@by_fields
@dataclass(frozen=True, slots=True)
class TensorStats:
    """Statistics a statistics-only dump records instead of the payload."""

    max: float | None = None
    min: float | None = None
    mean: float | None = None
    norm: float | None = None


STATS_SLACK = 1 / 32  # recorded statistics are rounded (printed digits, half-precision sums): bounds get this much room
_ROLE_WORDS = {"in": "input", "out": "output", "param": "param"}


def stats_problem(stats: TensorStats, shape: tuple[int, ...] | None) -> str | None:
    """Why no tensor of `shape` can have these statistics, else None.

    A tensor holding inf or NaN legitimately has an infinite max or min and a NaN mean or norm (max=inf, min=-inf,
    mean=NaN is real), and a half-precision sum may overflow to an infinite mean or norm. Impossible: a negative
    norm, min above max, a finite mean outside [min, max], a norm below the largest magnitude, and for n elements a
    norm above sqrt(n) times the largest magnitude, a mean magnitude above norm / sqrt(n), a non-zero norm of an
    empty tensor."""
    mx, mn, mean, norm = stats.max, stats.min, stats.mean, stats.norm

    def known(v: float | None) -> bool:
        return v is not None and not math.isnan(v)

    if norm is not None and norm < 0:
        return f"negative norm {norm:g}"
    if known(mx) and known(mn) and mn > mx:  # type: ignore[operator]
        return f"min {mn:g} above max {mx:g}"
    mags = [abs(v) for v in (mx, mn) if v is not None and known(v)]
    amax = max(mags) if mags else None
    finite = [abs(v) for v in (mx, mn) if v is not None and math.isfinite(v)]
    room = STATS_SLACK * max(finite, default=0.0) + 1e-30
    if mean is not None and math.isfinite(mean):
        if (known(mn) and mean < mn - room) or (known(mx) and mean > mx + room):  # type: ignore[operator]
            return f"mean {mean:g} outside [min {_g(mn)}, max {_g(mx)}]"
    if norm is None or not math.isfinite(norm):
        return None
    if amax is not None and norm < amax * (1 - STATS_SLACK) - 1e-30:
        return f"norm {norm:g} below the largest magnitude {amax:g}"
    if shape is None:
        return None
    n = math.prod(shape)
    if n == 0:
        return f"norm {norm:g} of an empty tensor (shape {list(shape)})" if norm > 0 else None
    root_n = math.sqrt(n)
    if amax is not None and math.isfinite(amax) and norm > root_n * amax * (1 + STATS_SLACK) + 1e-30:
        return f"norm {norm:g} above sqrt({n}) x the largest magnitude {amax:g}"
    if mean is not None and math.isfinite(mean) and abs(mean) > norm / root_n * (1 + STATS_SLACK) + 1e-30:
        return f"mean {mean:g} above norm / sqrt({n}) for {n} elements"
    return None


def _every_element_nan(stats: TensorStats) -> bool:
    """Statistics of a tensor whose every element is NaN, as msprobe's ATB probe prints them: its max and min are
    the reductions' starting values (-FLT_MAX, FLT_MAX: no element compared greater or less), its mean NaN."""
    mx, mn, mean = stats.max, stats.min, stats.mean
    return mx is not None and mn is not None and mn > mx and mean is not None and math.isnan(mean)


def _g(v: float | None) -> str:
    return "?" if v is None else f"{v:g}"


def checked_stats(entry: TensorEntry, where: str | Path, problems: list[str], label: str | None = None) -> TensorEntry:
    """`entry` as read, or without its statistics (one line in `problems` naming `where`) when no tensor of its shape
    can have them (`stats_problem`): a statistics-only entry is then not judged at all, one with a tensor file on
    its payload only."""
    if entry.stats is not None and _every_element_nan(entry.stats):
        nan = math.nan
        return dataclasses.replace(entry, stats=TensorStats(max=nan, min=nan, mean=nan, norm=nan))
    why = None if entry.stats is None else stats_problem(entry.stats, entry.shape)
    if why is None:
        return entry
    what = label if label is not None else f"token {entry.token} {entry.node} {_ROLE_WORDS[entry.role]} {entry.index}"
    head = f"{where}: {what}: " if what else f"{where}: "
    if entry.path is None:
        problems.append(f"{head}impossible statistics ({why}): refused; the tensor is not judged")
        return dataclasses.replace(entry, stats=None, error=f"impossible statistics ({why})")
    problems.append(f"{head}impossible statistics ({why}): refused; the tensor is judged on its file only")
    return dataclasses.replace(entry, stats=None)


@by_fields
@dataclass(slots=True)
class Node:
    """One module (torch) or operation (ATB, msprobe call) of the dumped model.

    `name` is unique within a dump: the dotted module path for torch
    (`root.model.layers.3.mlp`), the folder path below the token folder for ATB
    (`2_Prefill_layer/3_RmsNormOperation`), the call name for msprobe.
    """

    name: str
    type: str
    parent: str | None = None
    depth: int = 0
    exec_order: int | None = None
    layer: int | None = None
    phase: str | None = None  # "prefill" / "decode" for ATB graphs
    params: dict[str, Any] | None = None
    in_names: list[str] | None = None  # graph tensor names (ATB topology), for data flow
    out_names: list[str] | None = None


@by_fields
@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor file (or one statistics record) of one node at one token."""

    token: int
    node: str
    role: TensorRole
    index: int
    path: str | None
    dtype: str | None = None  # torch dtype name without prefix: float32, bfloat16, int64 ...
    shape: tuple[int, ...] | None = None
    layout: str = "ND"  # "ND" or a device layout such as "FRACTAL_NZ"
    stats: TensorStats | None = None  # statistics-only dumps
    error: str | None = None  # why this file cannot be used (reader-level), one line
    # a digest of dtype, shape and sampled values, where the reader hashed the file (msit's data-flow order):
    # files with equal digests are likely byte-equal, which a compare worker checks before reusing a result
    digest: bytes | None = None
    payload: Payload | None = None  # where the values lie, where the reader parsed a header that says so


@dataclass(slots=True)
class Dump:
    """A dump as read from disk: topology, tensor files and problems."""

    kind: DumpKind
    root: Path
    nodes: list[Node]
    tensors: list[TensorEntry]
    order_source: OrderSource
    model_name: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def order_known(self) -> bool:
        return self.order_source == "recorded"

    @property
    def tokens(self) -> list[int]:
        return sorted({t.token for t in self.tensors})

    def node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes}
