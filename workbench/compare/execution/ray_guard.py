"""The one-node cluster of `wb compare --ray local`, hosted so that it dies with `wb`, SIGKILL included.

Ray ties its GCS and raylet to the process that starts them (the kernel's parent-death signal), but the
raylet's own children, `ray::DashboardAgent` and `ray::RuntimeEnvAgent` (Ray 2.60 starts both whatever
`include_dashboard` says), outlive a killed starter: re-parented to PID 1, they wait on the dead GCS and
ignore SIGTERM. So `wb` does not start the cluster itself:

- a host process (`python -m workbench.compare.execution.ray_guard`) is started in a session of its own (so a
  terminal's Ctrl-C or a kill of `wb`'s process group does not reach it first); it starts the cluster
  (`ray.init`), so every process of the cluster, agents and workers included, is in that session;
- it tells `wb` the cluster's address on its stdout, and `wb` joins it as a driver;
- its stdin is a pipe whose only write end is in `wb`. The pipe closes when `wb` is done (`LocalCluster.close`,
  on every exit path) or dies in any way; the host then kills every other process of its session (stopped,
  then SIGKILLed) until none is left, and exits. `close` waits for that (bounded).

Only the host's own session is touched: other clusters, other users' Ray, a `ray start` cluster joined with
`--ray auto` are not. Linux (`/proc`); elsewhere the host cannot find its session and Ray's clean-up is all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NoReturn

START_TIMEOUT_S = 600.0  # a loaded machine took 15 s; past this the start is given up
SWEEP_S = 30.0  # the host gives up after this long (a process it cannot kill is not its to wait for)
CLOSE_WAIT_S = 20.0  # `LocalCluster.close` waits this long for the host's sweep
_ERROR = "error: "
AUTH_ENV = "RAY_AUTH_MODE"


class LocalClusterError(ValueError):
    """The local cluster did not start (one line)."""


def session_members(sid: int, proc: Path = Path("/proc")) -> list[int]:
    """PIDs of the live processes in session `sid` (zombies are dead)."""
    found = []
    try:
        entries = list(proc.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[-1].split()
            state, session = fields[0], int(fields[3])  # after the name: state ppid pgrp session
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if session == sid and state not in (b"Z", b"X"):
            found.append(int(entry.name))
    return found


def end_session() -> int:
    """Kill every other process of this process's session until none is left or `SWEEP_S` passed; returns
    how many were killed. Each pass stops them all first (SIGSTOP: none forks a new one or reacts to another's
    death, this process's Ray driver included, which would exit when its raylet dies), then SIGKILLs them."""
    me = os.getpid()
    sid = os.getsid(0)
    if sid != me:
        return 0  # only the leader of its own session ends it
    hit: set[int] = set()
    start = time.monotonic()
    quiet = 0
    while quiet < 2 and time.monotonic() - start < SWEEP_S:  # twice empty: nothing was starting a new one
        pids = [p for p in session_members(sid) if p != me]
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        hit.update(pids)
        _reap()
        quiet = 0 if pids else quiet + 1
        time.sleep(0.1)
    return len(hit)


def _reap() -> None:
    """Collect the host's dead children (the GCS, the raylet), so they leave the process table."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class LocalCluster:
    """`wb`'s side: `start` the host (returns once the cluster runs), `address` to join, `close` when done."""

    def __init__(self, proc: subprocess.Popen[bytes], address: str, folder: str, auth: str = "") -> None:
        self._proc = proc
        self.address = address
        self.auth = auth  # the cluster's RAY_AUTH_MODE ("token": the token is in ~/.ray/auth_token)
        self.folder = folder  # the host's working folder (`empty_folder`), where a driver joining it starts Ray

    @property
    def session(self) -> int:
        """The session (and pid) of the host: every process of the cluster is in it."""
        return self._proc.pid

    @classmethod
    def start(cls, cpus: int, object_store: int) -> LocalCluster:
        """Start the host and its cluster of `cpus` CPUs; `LocalClusterError` in one line when it fails."""
        folder = empty_folder()
        proc = subprocess.Popen(
            # -P: `-m` would put the current folder first on sys.path (a `workbench/` or `ray/` there would run);
            # the cluster's processes start in the host's folder, and Ray puts the folder a driver runs in on its
            # workers' sys.path: an empty one of ours, not the user's (say a dump someone sent, with a numpy.py)
            [sys.executable, "-P", "-m", "workbench.compare.execution.ray_guard", str(cpus), str(object_store), folder],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=folder,
        )
        try:
            line = _read_line(proc, START_TIMEOUT_S)
        except BaseException:
            cls(proc, "", folder).close()  # Ctrl-C during the start: the host stops what it started
            raise
        if not line or line.startswith(_ERROR):
            cls(proc, "", folder).close()
            said = line.removeprefix(_ERROR) if line else "the host process ended before the cluster ran"
            raise LocalClusterError(said)
        address, _, auth = line.partition(" ")
        return cls(proc, address, folder, auth)

    def close(self) -> None:
        """Close the host's pipe: it stops the cluster and exits; wait (bounded) until it did."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            self._proc.stdin.close()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        try:
            self._proc.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            return  # it goes on by itself, in its folder, and removes it when it ends
        remove_empty_folder(self.folder)


def empty_folder() -> str:
    """A new, empty folder only this user can write to (a Ray process's working folder)."""
    return tempfile.mkdtemp(prefix="wb-ray-")


def remove_empty_folder(folder: str) -> None:
    """`empty_folder`'s folder removed, when nothing was left in it (what is there stays)."""
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The host's first line (the address or an error), '' when it ended first or after `timeout`."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
    return buf.split(b"\n", 1)[0].decode("utf-8", "replace").strip() if b"\n" in buf else ""


_FOLDER: list[str] = []  # the host's working folder, made for it by `LocalCluster.start`


def _end_host(code: int) -> NoReturn:
    """End the session (the cluster), then this host, and its working folder when empty."""
    end_session()
    for folder in _FOLDER:
        remove_empty_folder(folder)
    os._exit(code)


def _watch_owner() -> None:
    """Host thread: block on stdin until `wb` closes it or dies, then end the session and exit."""
    while True:
        try:
            if not os.read(0, 4096):
                break
        except InterruptedError:
            continue
        except OSError:
            break
    _end_host(0)


def _host(cpus: int, object_store: int) -> None:
    """The host's life: lead a session of its own, watch the owner, start the cluster, say its address, wait."""
    if os.getsid(0) != os.getpid():
        try:
            os.setsid()  # never end a session this process does not lead (its starter's terminal, say)
        except OSError as exc:
            print(f"{_ERROR}cannot start a session of its own ({exc.strerror})", flush=True)
            os._exit(1)
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    # the address goes to `wb` on a private copy of stdout; nothing else (Ray's logs, the cluster's
    # processes) writes to the pipe, so `wb` closing or dying cannot break this process
    report = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    threading.Thread(target=_watch_owner, name="wb-ray-owner", daemon=True).start()
    try:
        import ray

        os.environ.pop("RAY_ADDRESS", None)
        ray.init(
            address="local",  # always a new cluster of our own: never join one another program started here
            num_cpus=cpus,
            include_dashboard=False,
            object_store_memory=object_store,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=True,
        )
        address = ray.get_runtime_context().gcs_address
        auth = os.environ.get(AUTH_ENV, "")  # `ray.init` turns token authentication on for a new cluster
    except BaseException as exc:  # whatever it was, `wb` gets one line
        text = str(exc).strip().splitlines()
        print(_ERROR + (text[0] if text else type(exc).__name__), file=report, flush=True)
        _end_host(1)
    signal.signal(signal.SIGTERM, lambda *_: _end_host(0))
    print(f"{address} {auth}".strip(), file=report, flush=True)
    report.close()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    _FOLDER.extend(sys.argv[3:4])
    _host(int(sys.argv[1]), int(sys.argv[2]))
