"""What one compare worker process does: load a pair, compute every metric, return numbers.

A pair's payloads are read into this thread's reusable buffers (`formats/staging.py`: a fixed few, each capped;
larger payloads are memory-mapped): slot 0 and 1 hold the pair's golden and test tensors, 2 and 3 a twin's.

Kept free of DuckDB, of the catalog and of torch (numpy only: a worker starts in a tenth of a second)
so it can run in a process pool; one pair is in memory at a time, so a worker's peak is bounded by
the largest tensor pair. A `.pth` that is not a plain saved tensor still loads: torch is imported
then, in that worker only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from workbench.compare.execution.streamed import equal_arrays, layout_only, release_buffers, stream_pair
from workbench.compare.execution.tasks import PairTask, StatsTask, Twin
from workbench.compare.judging.kernel_code import kernel_code
from workbench.compare.judging.metrics import PairMetrics, compare_tensors, summarize
from workbench.compare.judging.stat_metrics import stat_metrics
from workbench.compare.pairing.layout import LAYOUT_PREFIX, layout_rule, not_comparable
from workbench.compare.pairing.quant_pairs import INT_ONLY, INT_STEP
from workbench.core.metrics import SUMMARY_FIELDS
from workbench.formats.arrays import RawTensor, payload_place, read_array, read_payload
from workbench.formats.model import Dump, DumpError, Payload
from workbench.formats.staging import Staging

_GOLDEN, _TEST, _TWIN_GOLDEN, _TWIN_TEST = range(4)  # the staging slots of the tensors a pair holds at once
_SLOTS = threading.local()


def _staging(slot: int) -> Staging:
    slots: list[Staging] | None = getattr(_SLOTS, "slots", None)
    if slots is None:
        slots = _SLOTS.slots = [Staging() for _ in range(4)]
    return slots[slot]


def release_staging() -> None:
    """Give this thread's read buffers back (a process that compared in process and lives on: the app)."""
    for slot in getattr(_SLOTS, "slots", None) or ():
        slot.release()
    release_buffers()


def _along(arr: np.ndarray, dim: int, start: int, stop: int) -> np.ndarray:
    if arr.ndim == 0 or not -arr.ndim <= dim < arr.ndim:
        raise IndexError(f"dimension {dim} out of range for a {arr.ndim}-d tensor")
    index = [slice(None)] * arr.ndim
    index[dim] = slice(start, stop)
    return arr[tuple(index)]


def _chunk(arr: np.ndarray, dim: int, idx: int, n: int) -> np.ndarray:
    """Chunk `idx` of `torch.chunk(arr, n, dim)`: chunks of ceil(size / n), the last one shorter."""
    size = arr.shape[dim] if arr.ndim and -arr.ndim <= dim < arr.ndim else 0
    step = -(-size // n) if n > 0 else 0
    if n <= 0 or step == 0 or not 0 <= idx < -(-size // step):
        raise IndexError(f"chunk {idx} of {n} does not exist along dimension {dim} (size {size})")
    return _along(arr, dim, idx * step, min(size, (idx + 1) * step))


def _narrow(arr: np.ndarray, dim: int, start: int, stop: int) -> np.ndarray:
    size = arr.shape[dim] if arr.ndim and -arr.ndim <= dim < arr.ndim else 0
    if not 0 <= start <= stop <= size:
        raise ValueError(f"slice {start}:{stop} is outside dimension {dim} (size {size})")
    return _along(arr, dim, start, stop)


def apply_transform(golden: RawTensor, test: RawTensor, spec: str | None) -> tuple[RawTensor, RawTensor]:
    """Layout fixes recorded on a pair, `;`-separated, each for one side (`g.` golden, `t.` test):

    `t.chunk:DIM:I:N` keeps chunk I of N along DIM (a fused gate-up output holds gate then up);
    `t.int` compares an int tensor that has no scale with the golden rounded to integers;
    `t.sub:FILE` / `t.mul:FILE` subtract / multiply by the tensor in FILE, broadcast (an int tensor's offset and
    scales, `compare.pairing.quant_pairs`; a FILE of fewer dimensions lies along the last one);
    `t.slice:DIM:START:STOP` keeps a slice; `g.flat` / `t.flat` flattens; `layout:RULE` views the test
    tensor in the golden's shape when that layout rule (`workbench.compare.pairing.layout`) relates the two.
    """
    if not spec:
        return golden, test
    for step in spec.split(";"):
        if step.strip().startswith(LAYOUT_PREFIX):
            rule = layout_rule(golden.shape, test.shape)
            if rule is None:
                raise ValueError(not_comparable(list(golden.shape), list(test.shape)))
            test = RawTensor(test.array.reshape(golden.array.shape), test.dtype)
            continue
        side, _, op = step.strip().partition(".")
        parts = op.split(":")
        target = golden if side == "g" else test
        if parts[0] == "chunk":
            dim, idx, n = (int(x) for x in parts[1:4])
            target = RawTensor(_chunk(target.array, dim, idx, n), target.dtype)
        elif parts[0] == "slice":
            dim, start, stop = (int(x) for x in parts[1:4])
            target = RawTensor(_narrow(target.array, dim, start, stop), target.dtype)
        elif parts[0] == "flat":
            target = RawTensor(target.array.reshape(-1), target.dtype)
        elif parts[0] == "int":  # an int tensor without a scale: both sides as integers
            golden = RawTensor(np.rint(golden.array.astype(np.float64)), "float64")
            target = RawTensor(target.array.astype(np.float64), "float64")
        elif parts[0] in ("mul", "sub"):
            target = _dequant_step(target, parts[0], op.partition(":")[2])
        else:
            raise ValueError(f"unknown pair transform {step!r}")
        if side == "g":
            golden = target
        else:
            test = target
    return golden, test


def _dequant_step(target: RawTensor, op: str, path: str) -> RawTensor:
    if path.startswith("#"):
        raise ValueError("a scale or offset this int tensor needs is not in the dump at this token")
    operand = read_array(path).array.astype(np.float64)
    arr = target.array.astype(np.float64)
    if operand.ndim != arr.ndim:
        operand = operand.reshape(-1)
    try:
        arr = arr * operand if op == "mul" else arr - operand
    except ValueError:
        raise ValueError(f"{path}: shape {list(operand.shape)} does not broadcast against {list(arr.shape)}") from None
    return RawTensor(arr, "float64")


def _summary_dict(s: Any) -> dict[str, Any]:
    return {f: getattr(s, f) for f in SUMMARY_FIELDS}


def _load(path: str | None, side: str, slot: int, at: Payload | None = None) -> tuple[RawTensor | None, str | None]:
    if path is None:
        return None, f"{side}: no tensor data (statistics-only dump)"
    try:
        if at is not None and (known := read_payload(path, at, _staging(slot))) is not None:
            return known, None
        return read_array(path, _staging(slot)), None
    except DumpError as exc:
        return None, str(exc)


def run_pair(task: PairTask) -> dict[str, Any]:
    """Metrics and both sides' statistics for one pair; problems become `cmp_fail_reason`.

    Every pair also gets the statistics metrics (`stat_values`); a side of a statistics-only dump (no
    file, its statistics in the task) is compared on statistics only.
    """
    if task.golden_stats is not None or task.test_stats is not None:
        return _run_stats_pair(task)
    task = _placed(task)
    streamed = stream_pair(task)
    if streamed is not None:
        out, res = _ids(task), streamed[0]
        if task.transform:  # a layout view only: the pair compares the whole files, which the catalog describes
            out["golden"], out["test"] = _summary_dict(res.golden), _summary_dict(res.test)
        return _with_metrics(out, task, res)
    golden, g_err = _load(task.golden_path, "golden_data_path", _GOLDEN, task.golden_at)
    test, t_err = _load(task.test_path, "my_data_path", _TEST, task.test_at)
    return _pair_result(task, golden, g_err, test, t_err)


def _placed(task: PairTask) -> PairTask:
    """The task with where each side's values lie, found from the files' headers when its dump's reader did not say
    (pairs planned from the catalog): such a pair is streamed too, and read without a second header parse."""
    if not layout_only(task.transform) or (task.golden_at is not None and task.test_at is not None):
        return task
    golden_at = task.golden_at or (payload_place(task.golden_path) if task.golden_path else None)
    test_at = task.test_at or (payload_place(task.test_path) if task.test_path else None)
    return replace(task, golden_at=golden_at, test_at=test_at)


def _pair_result(
    task: PairTask, golden: RawTensor | None, g_err: str | None, test: RawTensor | None, t_err: str | None
) -> dict[str, Any]:
    """`run_pair` on the pair's tensors as read (None and the reason where a side could not be)."""
    out = _ids(task)
    if golden is None or test is None:
        # one side unreadable: still describe the other (compare_tensors does it otherwise, in its one pass)
        if golden is not None:
            out["golden"] = _summary_dict(summarize(golden))
        if test is not None:
            out["test"] = _summary_dict(summarize(test))
        out["values"] = {}
        out["finite_only"] = False
        out["reason"] = " ".join(r for r in (g_err, t_err) if r)
        return out
    if task.transform:
        # the catalog describes whole files; the pair compares a part of one
        out["golden"], out["test"] = _summary_dict(summarize(golden)), _summary_dict(summarize(test))
    try:
        golden, test = apply_transform(golden, test, task.transform)
    except (ValueError, RuntimeError, IndexError) as exc:
        out["values"], out["finite_only"] = {}, False
        text = str(exc)
        out["reason"] = (
            text if text.startswith("not comparable") else f"cannot apply transform {task.transform!r}: {text}"
        )
        return out
    return _with_metrics(out, task, compare_tensors(golden, test, test_dtype=task.test_dtype))


def _ids(task: PairTask) -> dict[str, Any]:
    return {"pair_id": task.pair_id, "golden_tensor_id": task.golden_tensor_id, "test_tensor_id": task.test_tensor_id}


def _with_metrics(out: dict[str, Any], task: PairTask, res: PairMetrics) -> dict[str, Any]:
    """`out` (the pair's ids, and both sides' statistics where a transform compared parts) with the pair's
    metrics."""
    out["values"] = dict(res.values)
    out["finite_only"] = bool(res.finite_only)
    out["reason"] = res.reason
    if task.transform and INT_STEP in task.transform.split(";"):
        out["reason"] = "; ".join(r for r in (res.reason, f"compared as integers: {INT_ONLY}") if r)
    golden, test = _summary_dict(res.golden), _summary_dict(res.test)  # read, not changed, by stat_metrics
    if not task.transform:
        out["golden"], out["test"] = golden, test
    if any(v is not None for v in res.values.values()):  # not for pairs the tensors could not compare (layout)
        out["stat_values"] = stat_metrics(golden, test, res.golden.numel)
    return out


def _run_stats_pair(task: PairTask) -> dict[str, Any]:
    """A pair with at least one statistics-only side: the other side (if it has data) is summarised in one
    pass, then both are compared on max/min/mean/L2 norm."""
    out: dict[str, Any] = {
        "pair_id": task.pair_id,
        "golden_tensor_id": task.golden_tensor_id,
        "test_tensor_id": task.test_tensor_id,
        "values": {},
        "finite_only": False,
        "reason": None,
    }
    sides: list[dict[str, Any] | None] = []
    numel = task.numel
    steps = [
        s.strip() for s in (task.transform or "").split(";") if s.strip() and not s.strip().startswith(LAYOUT_PREFIX)
    ]
    for name, path, stats, key, slot in (
        ("golden_data_path", task.golden_path, task.golden_stats, "golden", _GOLDEN),
        ("my_data_path", task.test_path, task.test_stats, "test", _TEST),
    ):
        own = ";".join(s for s in steps if s.startswith(key[0] + "."))  # steps on this side (g./t.)
        if stats is not None:
            if own:  # statistics describe the whole tensor; the pair compares a part of it
                out["reason"] = (
                    f"not comparable on statistics: the pair compares a part of the {key} tensor ({own}) "
                    f"but its dump kept statistics of the whole tensor only"
                )
                return out
            sides.append(dict(stats))
            continue
        arr, err = _load(path, name, slot)
        if arr is None:
            out["reason"] = err
            return out
        if own:
            try:
                arr = apply_transform(arr, arr, own)[0 if key == "golden" else 1]
            except (ValueError, RuntimeError, IndexError) as exc:
                out["reason"] = f"cannot apply transform {own!r}: {exc}"
                return out
        summary = _summary_dict(summarize(arr))
        out[key] = summary
        if key == "golden":
            numel = summary["numel"]
        sides.append(summary)
    g, t = sides
    assert g is not None and t is not None
    out["stat_values"] = stat_metrics(g, t, numel)
    if all(v is None for v in out["stat_values"].values()):
        out["reason"] = "no statistics to compare (statistics-only dump without max/min/mean/norm)"
    return out


def run_stats(task: StatsTask) -> dict[str, Any]:
    """Statistics of one tensor no pair covers (so the catalog describes every tensor)."""
    t, err = _load(task.path, "data_path", _GOLDEN)
    out: dict[str, Any] = {"run_id": task.run_id, "tensor_id": task.tensor_id, "error": err}
    if t is not None:
        out["summary"] = _summary_dict(summarize(t))
    return out


def _run_with_twins(task: PairTask) -> list[dict[str, Any]]:
    """The task's result, then one per twin: a copy of the task's for each twin whose two files hold the same
    bytes as the task's, a computed result for the others (their digests matched, their bytes do not)."""
    streamed = stream_pair(task)
    if streamed is not None:
        result = _with_metrics(_ids(task), task, streamed[0])
        out = [result]
        for twin, same in zip((Twin(*t) for t in task.twins), streamed[1], strict=True):
            if same:
                out.append({**result, "pair_id": twin.pair_id})
            else:
                alone = PairTask(twin.pair_id, twin.golden_path, twin.test_path, task.test_dtype, -1, -1)
                out.append(run_pair(replace(alone, golden_at=twin.golden_at, test_at=twin.test_at)))
        return out
    golden, g_err = _load(task.golden_path, "golden_data_path", _GOLDEN, task.golden_at)
    test, t_err = _load(task.test_path, "my_data_path", _TEST, task.test_at)
    result = _pair_result(task, golden, g_err, test, t_err)
    out = [result]
    for twin in (Twin(*t) for t in task.twins):
        g_twin, g_twin_err = _load(twin.golden_path, "golden_data_path", _TWIN_GOLDEN, twin.golden_at)
        t_twin, t_twin_err = _load(twin.test_path, "my_data_path", _TWIN_TEST, twin.test_at)
        if same_bytes(golden, g_twin) and same_bytes(test, t_twin):
            out.append({**result, "pair_id": twin.pair_id})
        else:  # computed on the twin's own tensors (the pair's slots still hold the pair's)
            alone = PairTask(twin.pair_id, twin.golden_path, twin.test_path, task.test_dtype, -1, -1)
            out.append(_pair_result(alone, g_twin, g_twin_err, t_twin, t_twin_err))
    return out


def same_bytes(a: RawTensor | None, b: RawTensor | None) -> bool:
    """Whether two tensors have one dtype and shape and bit-identical values (NaNs included)."""
    if a is None or b is None or a.dtype != b.dtype or a.shape != b.shape:
        return False
    x, y = a.array, b.array
    if x.dtype != y.dtype or not (x.flags.c_contiguous and y.flags.c_contiguous):
        return False
    return equal_arrays(x, y)


def read_dump(path: str, follow_symlinks: bool) -> Dump:
    """Read a dump in a worker (the caller reads the other one meanwhile); small to send back (~0.2 KB a file)."""
    from workbench.formats.detect import open_dump

    return open_dump(path, follow_symlinks=follow_symlinks)


def run_batch(tasks: Sequence[PairTask | StatsTask]) -> list[dict[str, Any]]:
    """A batch of tasks (batched to keep inter-process traffic low); a pair with twins answers for them too."""
    out: list[dict[str, Any]] = []
    for t in tasks:
        if isinstance(t, StatsTask):
            out.append(run_stats(t))
        elif t.twins:  # never a statistics-only side
            out.extend(_run_with_twins(t))
        else:
            out.append(run_pair(t))
    return out


def prepare_kernel(entry: tuple[str, tuple[str, ...]]) -> bool:
    """Load (or compile, on the first compare after an install: ~3 s) one kernel entry ahead of the pairs that run
    it: with one such task per entry, the workers compile different entries at once instead of one after the other.
    True when this worker compiled it; a failure is left to the pairs, which report it."""
    with contextlib.suppress(Exception):
        return kernel_code().prepare(*entry)
    return False
