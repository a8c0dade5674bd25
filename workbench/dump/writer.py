"""Background writing of dump files: tensors, statistics rows, the manifest.

The model's thread only hands over host copies of tensors; writer threads `torch.save` them. Jobs
are sharded by module folder, so one folder (and its `statistics.csv`) is always written by the
same thread in submission order. The bytes of tensors waiting to be written are bounded: when the
bound is reached the model's thread waits, so memory stays bounded by the queue plus one tensor.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import queue
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

log = logging.getLogger("workbench.dump")

STATS_HEADER = ["NodeName", "NodeType", "InputOutput", "Index", "DataType", "Shape", "Max", "Min", "Mean", "L2Norm"]
_STATS_HEADER_LINE = ",".join(STATS_HEADER) + "\r\n"  # what csv.writer writes for it
ANALYZE_HEADER = ["Node Name", "Node Type", "Tensor Path", "dtype", "shape", "max", "min", "variance", "mean"]


class Ready:
    """Something a writer must wait for before reading a host tensor (a device-to-host copy)."""

    def synchronize(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


@dataclass(slots=True)
class Saved:
    """One tensor file: set `done` once written; later duplicates are copied from it."""

    path: str
    done: threading.Event = field(default_factory=threading.Event)
    ok: bool = False


class _Barrier:
    """Runs `fn` once every writer thread has reached it (all earlier jobs are finished)."""

    def __init__(self, parties: int, fn: Callable[[], None] | None) -> None:
        self.left = parties
        self.fn = fn
        self.lock = threading.Lock()
        self.done = threading.Event()


def _stat_values(stats: torch.Tensor | None, ready: Ready | None, count: int) -> list[Any]:
    if stats is None:
        return ["N/A"] * count
    if ready is not None:
        ready.synchronize()
    return stats.tolist()[:count]


class AsyncWriter:
    """Writer threads with per-thread FIFO queues and a byte bound on queued tensors."""

    def __init__(
        self, threads: int, max_bytes: int, on_error: Callable[[str], None], openmp_team: bool = False
    ) -> None:
        """`openmp_team`: see `run_when_idle`; worth it when there is much to write."""
        self._max_bytes = max_bytes
        self._openmp_team = openmp_team
        self._pending_bytes = 0
        self._cond = threading.Condition()
        self._on_error = on_error
        self._made_dirs: set[str] = set()
        # files written so far; one written again (a module called twice in a token) is unlinked
        # first, so that a hard link made to its earlier content keeps that content
        self._written: set[str] = set()
        self._analyze_lock = threading.Lock()
        self._local = threading.local()  # per writer thread: statistics.csv rows not yet written
        self._queues: list[queue.SimpleQueue[Any]] = [queue.SimpleQueue() for _ in range(threads)]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"wb-dump-writer-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        self._closed = False
        for thread in self._threads:
            thread.start()

    # -- submission (model thread) -------------------------------------------------------------
    def _queue(self, shard: str) -> queue.SimpleQueue[Any]:
        return self._queues[hash(shard) % len(self._queues)] if len(self._queues) > 1 else self._queues[0]

    def _reserve(self, nbytes: int) -> None:
        with self._cond:
            while self._pending_bytes and self._pending_bytes + nbytes > self._max_bytes:
                self._cond.wait()
            self._pending_bytes += nbytes

    def _release(self, nbytes: int) -> None:
        with self._cond:
            self._pending_bytes -= nbytes
            self._cond.notify_all()

    def save(self, shard: str, path: str, tensor: torch.Tensor, ready: Ready | None) -> Saved:
        """Queue `torch.save(tensor, path)`; `tensor` is a host copy owned by the writer from now on."""
        saved = Saved(path)
        nbytes = tensor.numel() * tensor.element_size()
        self._reserve(nbytes)
        self._queue(shard).put((self._do_save, (path, tensor, ready, saved, nbytes)))
        return saved

    def copy(self, shard: str, src: Saved, path: str) -> None:
        """Queue a second name for an already queued tensor file (the same tensor seen again)."""
        self._queue(shard).put((self._do_copy, (src, path)))

    def stats_row(
        self, shard: str, csv_path: str, head: list[Any], stats: torch.Tensor | None, ready: Ready | None
    ) -> None:
        """Queue one msit `statistics.csv` row: `head` + Max, Min, Mean, L2Norm taken from `stats`."""
        self._queue(shard).put((self._do_stats, (csv_path, head, stats, ready)))

    def analyze_row(self, csv_path: str, row: list[Any], stats: torch.Tensor | None, ready: Ready | None) -> None:
        """Queue one msit `tensor_analyze.csv` row (max, min, variance, mean come from `stats`)."""
        self._queues[0].put((self._do_analyze, (csv_path, row, stats, ready)))

    def call(self, fn: Callable[[], None]) -> None:
        """Run `fn` on a writer thread once everything queued before it is written; does not wait."""
        self._barrier(fn)

    def flush(self) -> None:
        """Wait until everything queued so far is written."""
        if not self._closed:
            self._barrier(None).done.wait()

    def close(self) -> None:
        """Write what is queued, then stop the threads."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join()

    def _barrier(self, fn: Callable[[], None] | None) -> _Barrier:
        barrier = _Barrier(len(self._queues), fn)
        for q in self._queues:
            q.put((self._do_barrier, (barrier,)))
        return barrier

    # -- writer threads -------------------------------------------------------------------------
    def _run(self, q: queue.SimpleQueue[Any]) -> None:
        run_when_idle(self._openmp_team)
        rows: dict[str, io.StringIO] = {}
        self._local.rows = rows
        while True:
            job = q.get()
            if job is None:
                break
            fn, args = job
            try:
                if fn == self._do_barrier:
                    self._write_rows(rows)
                fn(*args)
            except Exception as exc:  # a failed file must not stop the writer or the model
                self._on_error(f"{args[0] if args and isinstance(args[0], str) else 'writer'}: {_reason(exc)}")
        self._write_rows(rows)

    def _write_rows(self, rows: dict[str, io.StringIO]) -> None:
        """Append the buffered rows of every statistics.csv: one open, one write, one close per file."""
        for path, buf in rows.items():
            try:
                self._mkdir(os.path.dirname(path))
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
                try:
                    data = buf.getvalue()
                    if os.fstat(fd).st_size == 0:
                        data = _STATS_HEADER_LINE + data
                    os.write(fd, data.encode("utf-8"))
                finally:
                    os.close(fd)
            except OSError as exc:
                self._on_error(f"{path}: {_reason(exc)}")
        rows.clear()

    def _mkdir(self, folder: str) -> None:
        if folder not in self._made_dirs:
            try:
                os.mkdir(folder, 0o750)  # the token folder exists after its first module: one system call
            except FileExistsError:
                pass
            except FileNotFoundError:
                os.makedirs(folder, mode=0o750, exist_ok=True)
            self._made_dirs.add(folder)

    def _fresh(self, path: str) -> None:
        """Make sure `path` can be created as a new file (its folder exists, an earlier version is gone)."""
        if path in self._written:
            os.unlink(path)
        else:
            self._mkdir(os.path.dirname(path))
            self._written.add(path)

    def _do_save(self, path: str, tensor: torch.Tensor, ready: Ready | None, saved: Saved, nbytes: int) -> None:
        try:
            if ready is not None:
                ready.synchronize()
            self._fresh(path)
            torch.save(tensor, path)
            saved.ok = True
        except Exception as exc:
            self._on_error(f"{path}: {_reason(exc)}")
        finally:
            saved.done.set()
            del tensor
            self._release(nbytes)

    def _do_copy(self, src: Saved, path: str) -> None:
        src.done.wait()
        if not src.ok:
            self._on_error(f"{path}: not written because {src.path} could not be written")
            return
        self._fresh(path)
        try:
            # the same bytes again: a hard link costs nothing and both names stay plain files
            os.link(src.path, path)
        except OSError:
            shutil.copyfile(src.path, path)

    def _do_stats(self, csv_path: str, head: list[Any], stats: torch.Tensor | None, ready: Ready | None) -> None:
        rows: dict[str, io.StringIO] = self._local.rows
        buf = rows.get(csv_path)
        if buf is None:  # written at the next barrier (token end, flush): creating files is what costs
            buf = rows[csv_path] = io.StringIO()
        csv.writer(buf).writerow(head + _stat_values(stats, ready, 4))

    def _do_analyze(self, csv_path: str, row: list[Any], stats: torch.Tensor | None, ready: Ready | None) -> None:
        values = _stat_values(stats, ready, 5)
        max_, min_, mean, var = values[0], values[1], values[2], values[4] if len(values) > 4 else "N/A"
        with self._analyze_lock, open(csv_path, "a", encoding="utf-8", newline="") as fh:
            if fh.tell() == 0:
                csv.writer(fh).writerow(ANALYZE_HEADER)
            csv.writer(fh).writerow([*row, max_, min_, var, mean])

    def _do_barrier(self, barrier: _Barrier) -> None:
        with barrier.lock:
            barrier.left -= 1
            last = barrier.left == 0
        if not last:
            return
        try:
            if barrier.fn is not None:
                barrier.fn()
        except Exception as exc:
            self._on_error(f"manifest: {_reason(exc)}")
        finally:
            barrier.done.set()


def run_when_idle(openmp_team: bool) -> None:
    """Let the calling thread use only CPU time the model leaves idle.

    The thread is scheduled `SCHED_IDLE` (nice 19 where that is refused): any normal thread that wakes
    takes its core at once. With nice 19 alone, an intra-op worker woken for the next parallel op may
    wait a scheduler slice behind the writer while the whole op waits at its barrier.
    With `openmp_team` the thread also runs one parallel op, so libgomp gives it an OpenMP team of its
    own. libgomp spins idle workers for milliseconds after every parallel op (GOMP_SPINCOUNT), which on
    a machine whose cores are all intra-op threads leaves a background thread no CPU until the model
    stops. Once libgomp manages more threads than there are CPUs it spins only briefly, as
    GOMP_SPINCOUNT documents. That costs the model a wake-up per parallel op, so it pays only when
    there is much to write (tensors; statistics rows only where each new file costs milliseconds). The effect
    ends when this thread exits and its team goes with it. Other OpenMP runtimes are left as they are.
    """
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest nice level, else normal priority
        try:
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        except (AttributeError, OSError):
            pass
    if openmp_team and torch.get_num_threads() > 1:
        torch.empty(1 << 18).fill_(0.0)  # above ATen's grain size (32768): a parallel region


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]
