"""Reader for msprobe's ATB dumps: `atb_dump_data/data/{dev}_{pid}/{count}/statistic.csv` (+ `.bin` files).

msprobe's ATB probe (`libatb_probe_abi*.so`, loaded with `msprobe/scripts/atb/load_atb_probe.sh`) writes one
`statistic.csv` per execution-count folder whatever its `task` (`statistics`, `tensor` or `all`); the tensors
themselves (`tensor`/`all`) lie beside it as `{n}_{Op}/.../{before|after}/{in|out}tensor{k}.bin`. The columns,
in this order (the probe's `GenLineStrforStatsCsv`; msprobe's `compare -m atb` reads them by position)::

    Device and PID,Execution Count,Op Name,Op Type,Op Id,Input/Output,Index,Dtype,Format,Shape,
    Max,Min,Mean,Norm,Tensor Path                                         (one line in the file)

`Op Name` is the op folders' names without their index (`Prefill_layer/RmsNormOperation`), `Op Id` their indices
joined by `_` (`3_0`); together they rebuild the folder path `3_Prefill_layer/0_RmsNormOperation`, which is the
node name the ATB `.bin` reader (`formats/atb.py`) gives the same op, so both kinds of ATB dump compare by name.
`Dtype` and `Format` are the probe's names (`float`, `float16`, `bf16`, `nd`, `fractal_nz`, ...), `Shape` is
`8x128`, statistics are C++ `std::to_string` values (six decimals: `0.000011`), `N/A` where the task kept none,
and `Tensor Path` is the absolute `.bin` path (`N/A` for `statistics`). Rows are written by a thread pool, so their
order is not the execution order: that comes from the op ids. Tokens follow the ATB reader's rules.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from pathlib import Path

from workbench.core.capped import STATISTICS, FileRefused, open_capped
from workbench.core.files import ATB_PROBE_DUMP_DIR, ATB_PROBE_STATS_FILE
from workbench.core.metrics import STAT_STEP_KEY
from workbench.formats import atb, atb_bin
from workbench.formats.model import (
    Dump,
    DumpError,
    Node,
    TensorEntry,
    TensorRole,
    TensorStats,
    check_shape,
    checked_stats,
    token_folder_problem,
    token_number,
)
from workbench.formats.scan import list_dir

STATS_FILE = ATB_PROBE_STATS_FILE
DATA_DIR = "data"  # the probe's TENSOR_AND_STATS_DATA_DIR below `atb_dump_data/`
DUMP_DIR = ATB_PROBE_DUMP_DIR
HEADER = (
    "Device and PID,Execution Count,Op Name,Op Type,Op Id,Input/Output,Index,Dtype,Format,Shape,"
    "Max,Min,Mean,Norm,Tensor Path"
).split(",")
# the probe prints std::to_string values: six decimals, so each statistic is known to +-PRINT_STEP/2 (absolute)
PRINT_STEP = 1e-6
# the probe's Mki dtype names (`GetDTypeStr`) -> torch names
_DTYPES = {
    "float": "float32",
    "float16": "float16",
    "bf16": "bfloat16",
    "double": "float64",
    "int8": "int8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "uint8": "uint8",
    "uint16": "uint16",
    "uint32": "uint32",
    "uint64": "uint64",
    "bool": "bool",
    "complex64": "complex64",
    "complex128": "complex128",
    "float8_e5m2": "float8_e5m2",
    "float8_e4m3fn": "float8_e4m3fn",
}
_DEV_RE = re.compile(r"-?[0-9]+_[0-9]+")
_ROLES: dict[str, TensorRole] = {"input": "in", "output": "out"}


def is_device_dir(path: Path) -> bool:
    """A `data/{dev}_{pid}` folder of msprobe's ATB dump (one execution-count folder below holds a statistic.csv)."""
    if path.parent.name != DATA_DIR or not _DEV_RE.fullmatch(path.name):
        return False
    try:
        return any(e.is_dir and (Path(e.path) / STATS_FILE).is_file() for e in list_dir(path))
    except DumpError:
        return False


def device_dirs(path: Path) -> list[Path]:
    """The `{dev}_{pid}` folders below a dump path given at the `--output`, `atb_dump_data` or `data` level."""
    for data in (path, path / DATA_DIR, path / DUMP_DIR / DATA_DIR):
        if data.name == DATA_DIR and data.is_dir():
            try:
                found = sorted(Path(e.path) for e in list_dir(data) if e.is_dir and is_device_dir(Path(e.path)))
            except DumpError:
                found = []
            if found:
                return found
    return []


def _num(text: str) -> float | None:
    """A statistic as the probe prints it (`0.060616`, `246`, `nan`, `-inf`); None for `N/A` or a complex pair."""
    t = text.strip()
    if not t or t == "N/A" or t.startswith("(") or not t.isascii():  # float() also reads '٣'
        return None
    try:
        return float(t)  # accepts nan, -nan, inf, -inf as std::to_string prints them
    except ValueError:
        return None


def _shape(text: str) -> tuple[int, ...] | None:
    t = text.strip()
    if t == "":
        return ()
    parts = t.split("x")
    if not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return tuple(int(p) for p in parts)


def _node_name(names: str, ids: str) -> str | None:
    """The op folder path (`3_Prefill_layer/0_RmsNormOperation`) from `Op Name` and `Op Id`, as msprobe rebuilds it."""
    parts, nums = names.split("/"), ids.split("_")
    if len(parts) != len(nums) or not all(n.isascii() and n.isdigit() and len(n) <= 9 for n in nums):
        return None
    if any(not p for p in parts):
        return None
    return "/".join(f"{n}_{p}" for n, p in zip(nums, parts))


class _Count:
    """The rows of one execution-count folder's statistic.csv."""

    def __init__(self, number: int, folder: Path) -> None:
        self.number = number
        self.folder = folder
        self.rows: dict[tuple[str, TensorRole, int], TensorEntry] = {}


def read_atb_csv(dev_dir: Path, *, count_folder: str | None = None, root: Path | None = None) -> Dump:
    """Read `data/{dev}_{pid}` of an msprobe ATB dump (every `{count}/statistic.csv`, or only `count_folder`)."""
    problems: list[str] = []
    counts: list[_Count] = []
    entries = list_dir(dev_dir)
    for e in entries:
        if not e.is_dir:
            continue
        num = token_number(e.name)
        if num is None:
            bad = token_folder_problem(e.path, e.name)
            if bad:
                problems.append(bad)
            continue
        if count_folder is not None and e.name != count_folder:
            continue
        if (Path(e.path) / STATS_FILE).is_file():
            counts.append(_Count(num, Path(e.path)))
    counts.sort(key=lambda c: c.number)
    ops: dict[str, atb._OpInfo] = {}
    for c in counts:
        _read_csv(c, ops, problems)
        for rel in {k[0] for k in c.rows}:  # the probe saves each op's op_param.json in its folder
            info = ops[rel]
            if not info.param_read and (c.folder / rel).is_dir():
                info.param_read = True
                info.node.params = atb._read_params(c.folder / rel, None, problems)
    _fill_phases(counts, ops)
    per_count = [(c.number, sorted({(k[0], "") for k in c.rows}, key=lambda r: ops[r[0]].index_path)) for c in counts]
    meta: dict[str, object] = {
        "device_folder": dev_dir.name,
        "atb_source": f"msprobe {STATS_FILE}",
        STAT_STEP_KEY: PRINT_STEP,  # the statistics' resolution, for the statistics bound
    }
    tokens_of = atb._assign_tokens(per_count, ops, atb._Graphs(), meta)
    tensors: list[TensorEntry] = []
    for c in counts:
        for (rel, _role, _idx), entry in sorted(c.rows.items(), key=lambda kv: (ops[kv[0][0]].index_path, kv[0][1:])):
            token = tokens_of.get((c.number, ops[rel].node.phase))
            if token is None:
                continue  # warmup
            tensors.append(dataclasses.replace(entry, token=token))
    nodes = [o.node for o in sorted(ops.values(), key=lambda o: o.index_path)]
    for i, n in enumerate(nodes):
        n.exec_order = i
    atb._assign_layers(nodes, ops)
    if not tensors and not problems:
        problems.append(f"{dev_dir}: no tensor rows in any {STATS_FILE}")
    return Dump(
        kind="atb",
        root=(root or dev_dir).resolve(),
        nodes=nodes,
        tensors=tensors,
        order_source="topology",
        meta=meta,
        problems=problems,
    )


def _fill_phases(counts: list[_Count], ops: dict[str, atb._OpInfo]) -> None:
    """Without a topology a top-level op's own name says prefill/decode only for layers (`Prefill_layer`); an
    execution-count folder runs one graph, so its other ops (`WordEmbedding`, `LmHead`) take its layers' phase."""
    for c in counts:
        heads = {k[0].split("/", 1)[0] for k in c.rows}
        phases = {ops[h].node.phase for h in heads if h in ops} - {None}
        if len(phases) != 1:
            continue
        phase = phases.pop()
        for rel in {k[0] for k in c.rows}:
            parts = rel.split("/")
            for depth in range(1, len(parts) + 1):
                node = ops["/".join(parts[:depth])].node
                if node.phase is None:
                    node.phase = phase


def _ensure_node(rel: str, op_type: str, ops: dict[str, atb._OpInfo]) -> None:
    """Add the op and every enclosing graph op (a row may name a child whose parent kept no row)."""
    parts = rel.split("/")
    for depth in range(1, len(parts) + 1):
        name = "/".join(parts[:depth])
        if name in ops:
            continue
        suffix = parts[depth - 1].split("_", 1)[1]
        index_path = tuple(int(p.split("_", 1)[0]) for p in parts[:depth])
        phase = atb._classify(parts[0].split("_", 1)[1])
        node = Node(
            name=name,
            type=op_type if depth == len(parts) else suffix,
            parent="/".join(parts[: depth - 1]) or None,
            depth=depth - 1,
            phase=phase,
        )
        ops[name] = atb._OpInfo(node, index_path, None)


def _read_csv(c: _Count, ops: dict[str, atb._OpInfo], problems: list[str]) -> None:
    path = c.folder / STATS_FILE
    try:
        with open_capped(path, STATISTICS, newline="") as fh:
            reader = csv.reader(fh)
            head = next(reader, None)
            if head is None:
                problems.append(f"{path}: empty file (no header): not read")
                return
            if [h.strip() for h in head] != HEADER:
                problems.append(f"{path}: not msprobe's ATB statistic.csv (header {','.join(head)[:120]!r}): not read")
                return
            for line_no, row in enumerate(reader, start=2):
                bad = _read_row(c, row, ops, f"{path}:{line_no}", problems)
                if bad:
                    problems.append(f"{path}:{line_no}: {bad}: row skipped")
    except FileRefused as exc:
        problems.append(str(exc))
    except UnicodeDecodeError:
        problems.append(f"{path}: not UTF-8 text: not read")
    except (OSError, csv.Error) as exc:
        problems.append(f"{path}: cannot read: {exc}")


def _read_row(c: _Count, row: list[str], ops: dict[str, atb._OpInfo], where: str, problems: list[str]) -> str | None:
    """Add one row to `c.rows`; the problem (without the file) when it cannot be read. Impossible statistics are
    dropped from the row with their own line (`checked_stats`), the row is kept."""
    if not any(x.strip() for x in row):
        return None
    if len(row) != len(HEADER):
        return f"{len(row)} columns, expected {len(HEADER)}"
    _dev, _count, names, op_type, ids, io, index, dtype, fmt, dims, mx, mn, mean, norm, tensor_path = row
    rel = _node_name(names, ids)
    if rel is None:
        return f"Op Name {names[:60]!r} and Op Id {ids[:30]!r} do not name one op folder path"
    role = _ROLES.get(io.strip())
    if role is None:
        return f"Input/Output {io[:20]!r} is neither input nor output"
    if not (index.isascii() and index.isdigit() and len(index) <= 6):
        return f"Index {index[:20]!r} is not a tensor index"
    shape = _shape(dims)
    if shape is None:
        return f"Shape {dims[:40]!r} is not like 8x128"
    try:
        shape = check_shape(c.folder / STATS_FILE, shape)
    except DumpError as exc:
        return exc.reason
    key = (rel, role, int(index))
    if key in c.rows:
        return f"a second row for {rel} {io} {index}"
    _ensure_node(rel, op_type.strip() or rel.rsplit("_", 1)[-1], ops)
    stats = TensorStats(max=_num(mx), min=_num(mn), mean=_num(mean), norm=_num(norm))
    if all(v is None for v in (stats.max, stats.min, stats.mean, stats.norm)):
        stats_or_none: TensorStats | None = None
    else:
        stats_or_none = stats
    layout = fmt.strip().upper() if fmt.strip() else "ND"
    name = dtype.strip()
    entry = TensorEntry(0, rel, role, int(index), None, _DTYPES.get(name), shape, layout, stats_or_none)
    bin_path = _tensor_file(c.folder, tensor_path.strip(), rel, role, int(index))
    if bin_path is not None:
        entry = _from_bin(entry, bin_path)
    elif stats_or_none is None:
        entry = TensorEntry(
            0, rel, role, int(index), None, entry.dtype, shape, layout, None, "no statistics and no tensor"
        )
    c.rows[key] = checked_stats(entry, where, problems, label=f"{rel} {io.strip()} {index}")
    return None


def _tensor_file(count_dir: Path, tensor_path: str, rel: str, role: TensorRole, index: int) -> Path | None:
    """The `.bin` file of a row dumped with task `tensor`/`all`, found below the count folder as msprobe does
    (the recorded absolute path may come from another machine); None for `N/A`."""
    if tensor_path == "N/A" or not tensor_path:
        return None
    when, prefix = ("before", "intensor") if role == "in" else ("after", "outtensor")
    return count_dir / rel / when / f"{prefix}{index}.bin"


def _from_bin(entry: TensorEntry, path: Path) -> TensorEntry:
    """The row's tensor file when it is there and readable (its own dtype and shape); else the row's statistics."""
    try:
        h = atb_bin.read_header(str(path))
    except DumpError as exc:
        if entry.stats is not None:
            return entry
        return TensorEntry(
            0, entry.node, entry.role, entry.index, str(path), entry.dtype, entry.shape, error=exc.reason
        )
    if h.payload_length == 0:
        return entry
    return TensorEntry(0, entry.node, entry.role, entry.index, str(path), h.dtype, h.shape, h.layout, entry.stats)
