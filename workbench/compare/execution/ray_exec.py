"""Running a compare's tasks on a Ray cluster (`wb compare --ray ADDRESS|auto|local`).

The compare plans its pairs as always (`executor.compute_pending`); with a cluster, each batch of pairs
(`tasks.batches`: up to 48 MB of tensors or 64 pairs) becomes one Ray task running the local pool's own
`worker.run_batch`, so the numbers are the same. A task gets file paths, reads the tensors itself on the node
it runs on and returns a few numbers per pair: nothing large goes through the object store, and a task holds
one pair in memory at a time.

Placement: before a dump's tasks are sent, one tiny probe task per alive node (pinned to it) stats a sample of
the files the tasks will read; the nodes that hold every sampled file with the size the driver sees are the
holders, and every batch is pinned to one of them (`NodeAffinitySchedulingStrategy`, not soft), the least
busy per CPU first. Shared storage mounted everywhere makes every node a holder; node-local copies make only
those nodes holders. Results stream back: at most two batches per holder CPU are in flight, each taken as soon
as `ray.wait` reports it. Cancelling (the app's event, Ctrl-C) cancels every task in flight.

`--ray local` starts a one-node cluster through `ray_guard.LocalCluster`, in a session of its own that ends
with `wb` (kill -9 included).

Ray is an optional dependency (`pip install 'workbench[ray]'`): it is imported only when a cluster is used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.compare.execution.ray_guard import (
    AUTH_ENV,
    LocalCluster,
    LocalClusterError,
    empty_folder,
    remove_empty_folder,
)
from workbench.compare.execution.tasks import PairTask, StatsTask
from workbench.compare.execution.worker import run_batch
from workbench.core.progress import CompareCancelled

RAY_MISSING = "ray is not installed: pip install 'workbench[ray]'"
LOCAL, AUTO = "local", "auto"
SAMPLE_FILES = 48  # files a placement probe stats per dump (spread over the tasks' files)
PROBE_TIMEOUT_S = 60.0
INFLIGHT_PER_CPU = 2
LOCAL_OBJECT_STORE = 128 * 1024 * 1024  # tasks ship paths and a few numbers per pair, never tensors

Batch = list[PairTask | StatsTask]
Take = Callable[[list[dict[str, Any]]], None]


class RayMissing(ValueError):
    """`--ray` without ray installed (a bad option here: the CLI says so in one line, exit 2)."""


class RayClusterError(ValueError):
    """The cluster cannot be reached or cannot run the compare (one line, names the address or file)."""


def import_ray() -> Any:
    """The `ray` module, or `RayMissing` with the one line that says how to install it."""
    try:
        import ray
    except ImportError:
        raise RayMissing(RAY_MISSING) from None
    return ray


@dataclass(frozen=True, slots=True)
class RayNode:
    node_id: str
    host: str
    cpus: int


def probe_files(paths: Sequence[str]) -> tuple[str, list[int | None]]:
    """Run on one node: its host name and the size of each path there (None where it is missing)."""
    sizes: list[int | None] = []
    for p in paths:
        try:
            sizes.append(os.stat(p).st_size)
        except OSError:
            sizes.append(None)
    return socket.gethostname(), sizes


def holds(want: Sequence[int], seen: Sequence[int | None]) -> bool:
    """Whether a node's probe (`seen`) shows every file with the size this process sees (`want`)."""
    return len(want) == len(seen) and all(w == s for w, s in zip(want, seen))


def _sample(todo: Sequence[Batch]) -> list[str]:
    """Up to `SAMPLE_FILES` distinct files the tasks read, spread evenly over them (first and last included)."""
    files: dict[str, None] = {}
    for batch in todo:
        for t in batch:
            for p in (t.golden_path, t.test_path) if isinstance(t, PairTask) else (t.path,):
                if p is not None:
                    files[p] = None
    every = list(files)
    if len(every) <= SAMPLE_FILES:
        return every
    step = (len(every) - 1) / (SAMPLE_FILES - 1)
    return list(dict.fromkeys(every[round(i * step)] for i in range(SAMPLE_FILES)))


def _host_port(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `ray://HOST:PORT` -> (host, port); anything else is refused in one line."""
    hostport = address.removeprefix("ray://").split("/", 1)[0]
    host, sep, port = hostport.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        raise RayClusterError(
            f"ray: {address!r} is not a cluster address: use HOST:PORT, ray://HOST:PORT, auto or local"
        )
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_reachable(address: str, timeout: float = 10.0) -> None:
    """Fail in one line when nothing answers at the address (Ray itself retries it for minutes)."""
    try:
        socket.create_connection(_host_port(address), timeout=timeout).close()
    except OSError as exc:
        raise RayClusterError(
            f"ray: cannot connect to {address!r}: {exc.strerror or exc} (start one with `ray start --head`)"
        ) from None


def _auth_mode(mode: str) -> None:
    """Join with Ray's authentication `mode` (read by Ray's C++ config, which is cached: refreshed, as
    Ray itself does when `ray.init` turns token authentication on)."""
    os.environ[AUTH_ENV] = mode
    try:
        from ray._raylet import Config  # type: ignore[attr-defined]

        Config.initialize("")
    except (ImportError, AttributeError):
        pass  # another Ray: it reads the environment when it connects


def _restore_sigterm(handler: Any) -> None:
    """Put back wb's SIGTERM handler, which `ray.init` replaces with `sys.exit(15)` (wb ends a SIGTERM like
    Ctrl-C: what was computed is committed, exit 143)."""
    if threading.current_thread() is threading.main_thread() and handler is not None:
        signal.signal(signal.SIGTERM, handler)


@dataclass
class RayCluster:
    """A connection to a Ray cluster for the compare: `connect` it, hand it to `run_compare(cluster=...)`,
    `shutdown` it (stops the cluster only when `connect` started it)."""

    address: str
    started: bool = False
    _local: LocalCluster | None = field(default=None, repr=False)
    _folder: str | None = field(default=None, repr=False)  # the empty folder `ray.init` ran in (`connect`)
    _remote_batch: Any = field(default=None, repr=False)
    _remote_probe: Any = field(default=None, repr=False)

    @classmethod
    def connect(cls, address: str, workers: int | None = None) -> RayCluster:
        """`local` starts a one-node cluster here (`workers` CPUs, default all); `auto` joins the cluster
        started on this machine by `ray start`; anything else is a cluster address (`HOST:6379`, `ray://...`).
        An already initialised Ray (a test, a notebook) is used as it is."""
        ray = import_ray()
        if address not in (LOCAL, AUTO):
            _host_port(address)
        if ray.is_initialized():
            return cls(address, started=False)
        quiet = {"logging_level": logging.ERROR, "log_to_driver": False, "configure_logging": True}
        if address not in (LOCAL, AUTO):
            _check_reachable(address)
        term = signal.getsignal(signal.SIGTERM)
        local: LocalCluster | None = None
        # `ray.init` puts the folder the driver runs in on every worker's sys.path (unless the job ships a working
        # folder): it runs in an empty one of ours, never the user's (say a dump someone sent, with a numpy.py); a
        # local cluster's host has one, which it removes when it ends (a `wb` killed with -9 cannot)
        driver_folder: str | None = None
        try:
            if address == LOCAL:
                # started by a host process in a session of its own, which ends it when wb ends (ray_guard.py)
                local = LocalCluster.start(workers or os.cpu_count() or 1, LOCAL_OBJECT_STORE)
                if local.auth and AUTH_ENV not in os.environ:
                    _auth_mode(local.auth)  # join with the token the host's `ray.init` made
                with contextlib.chdir(local.folder):
                    ray.init(address=local.address, **quiet)
            else:
                # tasks run the driver's own wb, whatever the nodes have installed (they need numpy)
                pkg = str(Path(__file__).resolve().parents[1])
                driver_folder = empty_folder()
                with contextlib.chdir(driver_folder):
                    ray.init(
                        address=address,
                        runtime_env={"py_modules": [pkg], "excludes": ["__pycache__", "*.pyc"]},
                        **quiet,
                    )
        except BaseException as exc:
            if ray.is_initialized():
                ray.shutdown()
            if local is not None:
                local.close()  # Ctrl-C during start-up: stop what was started, no process left behind
            if driver_folder is not None:
                remove_empty_folder(driver_folder)
            if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM and callable(term):
                term(signal.SIGTERM, None)  # SIGTERM met Ray's own handler during start-up: end as wb ends it
            if isinstance(exc, LocalClusterError):
                raise RayClusterError(f"ray: the local cluster did not start: {exc}") from None
            if not isinstance(exc, ConnectionError | RuntimeError | ValueError | TimeoutError):
                raise
            text = str(exc).strip().splitlines()
            first = text[0] if text else type(exc).__name__
            hint = ""
            if address not in (LOCAL, AUTO) and AUTH_ENV not in os.environ:
                hint = (
                    " (a cluster with token authentication, Ray's default, also needs RAY_AUTH_MODE=token and "
                    "its token in RAY_AUTH_TOKEN or ~/.ray/auth_token)"
                )
            raise RayClusterError(f"ray: cannot connect to {address!r}: {first}{hint}") from None
        finally:
            _restore_sigterm(term)
        return cls(address, started=True, _local=local, _folder=driver_folder)

    def shutdown(self) -> None:
        """Disconnect; stop the cluster (every process of it) when `connect` started it."""
        if self.started:
            try:
                import_ray().shutdown()
            finally:
                self.started = False
                if self._local is not None:
                    self._local.close()
                    self._local = None
                if self._folder is not None:
                    remove_empty_folder(self._folder)
                    self._folder = None

    def nodes(self) -> list[RayNode]:
        """The alive nodes with CPUs."""
        ray = import_ray()
        out = []
        for n in ray.nodes():
            cpus = int(n.get("Resources", {}).get("CPU", 0))
            if n.get("Alive") and cpus > 0:
                out.append(RayNode(n["NodeID"], str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress")), cpus))
        return out

    def holders(self, paths: Sequence[str]) -> list[RayNode]:
        """The alive nodes that see `paths` as this process does (same sizes), by a probe task pinned to each.

        Only the paths this process sees count: a file missing here is reported missing by whichever node
        computes its pair, as the local pool would."""
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = self.nodes()
        _host, sizes = probe_files(paths)
        here = [p for p, n in zip(paths, sizes) if n is not None]
        if not here:
            return nodes
        want = [n for n in sizes if n is not None]
        if self._remote_probe is None:
            self._remote_probe = ray.remote(probe_files)
        refs = {
            self._remote_probe.options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)
            ).remote(here): n
            for n in nodes
        }
        ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
        for ref in late:
            ray.cancel(ref, force=True)
        found = []
        for ref in ready:
            try:
                _host, seen = ray.get(ref)
            except ray.exceptions.RayError:
                continue  # a node that died or cannot run the probe holds nothing we can use
            if holds(want, seen):
                found.append(refs[ref])
        return found

    def run(self, todo: Sequence[Batch], take: Take, cancel: threading.Event | None) -> None:
        """Run every batch on a node holding its files, handing each batch's results to `take` as they come."""
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if not todo:
            return
        if not self.nodes():
            raise RayClusterError(f"ray: the cluster {self.address!r} has no alive node with CPUs to compute on")
        sample = _sample(todo)
        nodes = self.holders(sample)
        if not nodes:
            where = sample[0] if sample else "the dumps"
            raise RayClusterError(
                f"{where}: no Ray node of {self.address!r} holds the dump's files as this machine sees them "
                "(mount them at the same path on the nodes, or run the driver where they are)"
            )
        if self._remote_batch is None:
            self._remote_batch = ray.remote(run_batch)
        busy = {n.node_id: 0 for n in nodes}
        limit = {n.node_id: INFLIGHT_PER_CPU * n.cpus for n in nodes}
        queue = list(reversed(todo))
        inflight: dict[Any, str] = {}
        try:
            while queue or inflight:
                if cancel is not None and cancel.is_set():
                    raise CompareCancelled()
                while queue:
                    node = min(busy, key=lambda k: busy[k] / limit[k])
                    if busy[node] >= limit[node]:
                        break
                    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
                    ref = self._remote_batch.options(num_cpus=1, scheduling_strategy=strategy).remote(queue.pop())
                    inflight[ref] = node
                    busy[node] += 1
                ready, _ = ray.wait(list(inflight), num_returns=1, timeout=0.2)
                for ref in ready:
                    busy[inflight.pop(ref)] -= 1
                    try:
                        results = ray.get(ref)
                    except ray.exceptions.RayError as exc:
                        text = str(exc).strip().splitlines()
                        raise RayClusterError(
                            f"ray: a compare task failed ({type(exc).__name__}: {text[-1] if text else ''}); "
                            "what was computed is kept, run again to finish"
                        ) from None
                    take(results)
        finally:
            for ref in inflight:  # Ctrl-C, cancel, a failed task: nothing keeps running on the cluster
                ray.cancel(ref, force=True)
