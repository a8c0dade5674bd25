"""The compare worker pool, kept free of torch so a caller can start it before importing anything heavy.

A process with no thread but its own (the `wb compare` command at its start) forks its workers itself, at once, from
what it has already imported (numpy and the worker module): a worker is ready in milliseconds and loads each metric
kernel's machine code at its first use. Any other process (the app, a caller with threads: `fork` copies only the
calling thread, and a lock another thread held would stay locked in the copy) gets its workers from a forkserver
that has already imported the worker module and loaded the kernels (`forkserver_preload`, about 0.12 s, started on a
thread), so every worker starts warm; that overlaps with the caller's own start-up and with reading the dumps. Every
pool process dies with the process that started it (`lifeline`).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from workbench.compare.execution import lifeline

T = TypeVar("T")

IN_PROCESS_BYTES = 32 * 1024 * 1024  # below this, a pool costs more than it saves
# workers yield the CPU to the process that feeds them: its reading, ingest and verdicts are the critical path,
# the workers' batches fill whatever CPU is left (on 2 cores, ~0.3 s less wall time per compare)
WORKER_NICE = 10


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def fork_is_safe() -> bool:
    """Whether this process may fork its workers itself: on Linux, while it runs no thread but the calling one
    (Python's or a library's, such as a DuckDB database's or OpenBLAS's: the kernel's list of the process's
    tasks says)."""
    if not sys.platform.startswith("linux") or "fork" not in multiprocessing.get_all_start_methods():
        return False
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def _pool_context() -> multiprocessing.context.BaseContext:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["workbench.compare.execution.forkserver_preload"])
        return ctx
    return multiprocessing.get_context("spawn")


@contextlib.contextmanager
def _no_imports_from_the_current_folder() -> Iterator[None]:
    """The interpreters multiprocessing starts (its forkserver and resource tracker; with `spawn`, every worker)
    run `python -c ...`, which puts the current folder first on `sys.path` (Python 3.11's forkserver ignores the
    `sys.path` it is handed): a `numpy.py` or a `workbench/` folder where `wb` was started, say in a dump someone
    sent, would be imported and run there. `PYTHONSAFEPATH` (Python's `-P`) keeps the current folder off; it is set
    only while those interpreters start, so commands `wb` runs later for the user see their usual environment."""
    if os.environ.get("PYTHONSAFEPATH"):
        yield
        return
    os.environ["PYTHONSAFEPATH"] = "1"
    try:
        yield
    finally:
        os.environ.pop("PYTHONSAFEPATH", None)


_FORK_HELD = frozenset({signal.SIGTERM, signal.SIGINT})  # held from the fork until a worker's own handlers are set


def _worker_init(owner: int, forked: bool = False) -> None:
    if forked:
        # a worker forked from `wb` itself inherits its handlers: SIGTERM and Ctrl-C act on it as on a worker a
        # forkserver forks (SIGTERM ends it, Ctrl-C interrupts the task), not as `wb`'s own ending would. They were
        # held since the fork (`_held_across_fork`): one sent meanwhile is delivered now, to these handlers
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORK_HELD)
    lifeline.worker_init(owner, forked_by_owner=forked)
    with contextlib.suppress(OSError, AttributeError):  # not permitted, or no os.nice on this platform
        os.nice(WORKER_NICE)


def _warm_up() -> int:
    return os.getpid()


def bytes_at_least(root: Path, limit: int) -> bool:
    """Whether the files below `root` add up to `limit` bytes (stops as soon as they do)."""
    total, stack = 0, [root]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_dir(follow_symlinks=False):
                        stack.append(Path(e.path))
                    else:
                        total += e.stat(follow_symlinks=False).st_size
                        if total >= limit:
                            return True
        except OSError:
            continue
    return False


def worth_a_pool(golden: str | Path, test: str | Path, workers: int) -> bool:
    """A pool pays off for several workers and dumps of some size (a small compare runs in process)."""
    return (
        workers > 1
        and bytes_at_least(Path(golden), IN_PROCESS_BYTES)
        and bytes_at_least(Path(test), IN_PROCESS_BYTES // 2)
    )


@contextlib.contextmanager
def _real_stderr() -> Iterator[None]:
    """multiprocessing hands `sys.stderr.fileno()` to its helper processes; a TUI replaces stderr with an
    object that has no real descriptor, so put the process's own stderr back while pool processes start."""
    try:
        ok = sys.stderr.fileno() >= 0
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        ok = False
    if ok or sys.__stderr__ is None:
        yield
        return
    saved = sys.stderr
    sys.stderr = sys.__stderr__
    try:
        yield
    finally:
        sys.stderr = saved


@contextlib.contextmanager
def _held_across_fork() -> Iterator[None]:
    """SIGTERM and Ctrl-C held (blocked) in this process while it forks its workers: a forked worker would otherwise
    run this process's own handlers until its initializer replaces them (a SIGTERM to the process group just then
    ended it inside multiprocessing's start-up). Each worker releases them once its handlers are set; this process
    when its workers are forked, and a signal sent meanwhile then reaches its handler."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _FORK_HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def new_pool(workers: int) -> ProcessPoolExecutor:
    """A process pool with every worker process started now (forked here when `fork_is_safe`)."""
    if fork_is_safe():
        from workbench.compare.execution import worker  # noqa: F401  (the workers' module, forked loaded)

        with _held_across_fork():
            return _start_workers(multiprocessing.get_context("fork"), workers, forked=True)
    lifeline.mark_owner()
    ctx = _pool_context()
    with _real_stderr():
        if ctx.get_start_method() == "forkserver":
            # the two interpreters a forkserver pool starts (with the resource tracker), started here at once: the
            # workers are forked, not started
            with _no_imports_from_the_current_folder():
                multiprocessing.forkserver.ensure_running()
            pool = _start_workers(ctx, workers)
        else:
            with _no_imports_from_the_current_folder():
                pool = _start_workers(ctx, workers)
    return pool


def _start_workers(
    ctx: multiprocessing.context.BaseContext, workers: int, *, forked: bool = False
) -> ProcessPoolExecutor:
    pool = ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_worker_init, initargs=(os.getpid(), forked)
    )
    for _ in range(workers):
        pool.submit(_warm_up)
    return pool


class PoolUnavailable(Exception):
    """The pool could not start (or was shut down): the caller does the work in process."""


class PoolStarter:
    """Starts a pool and hands it over later: forked at once where `fork_is_safe`, else from a background thread (a
    forkserver's start and preload take ~0.3 s)."""

    def __init__(self, workers: int) -> None:
        self._future: Future[ProcessPoolExecutor] = Future()
        if fork_is_safe():
            self._start(workers)
        else:
            threading.Thread(target=self._start, args=(workers,), name="wb-pool-start", daemon=True).start()

    def _start(self, workers: int) -> None:
        try:
            self._future.set_result(new_pool(workers))
        except BaseException as exc:  # surfaced by get(); the compare then runs in process
            self._future.set_exception(exc)

    def get(self) -> ProcessPoolExecutor | None:
        """The started pool, or None when it could not start."""
        try:
            return self._future.result()
        except Exception:
            return None

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """`fn(*args)` in a worker as soon as the pool is up; the future raises `PoolUnavailable` when the pool
        could not start or was shut down before the task got in. Cancelling the future before the pool is up keeps
        the task out of it."""
        out: Future[T] = Future()

        def started(pool: Future[ProcessPoolExecutor]) -> None:
            if not out.set_running_or_notify_cancel():
                return
            try:
                inner = pool.result().submit(fn, *args)
            except Exception as exc:
                out.set_exception(PoolUnavailable(str(exc)))
                return
            inner.add_done_callback(lambda f: _settle(out, f))

        self._future.add_done_callback(started)
        return out

    def shutdown(self) -> None:
        """Stop the pool and wait for its processes (a task still running, say a dump being read, ends first; a
        pool left unjoined keeps its queues' semaphores registered and Python warns at exit)."""
        pool = self.get()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _settle(out: Future[T], done: Future[T]) -> None:
    if done.cancelled():
        out.set_exception(PoolUnavailable("cancelled"))
    elif (exc := done.exception()) is not None:
        out.set_exception(PoolUnavailable(str(exc)) if isinstance(exc, BrokenProcessPool) else exc)
    else:
        out.set_result(done.result())
