"""Pool processes die with the `wb` process that started them (kill -9, OOM kill, SIGTERM included).

The forkserver and the workers would otherwise outlive it: they keep running and hold its stdout and
stderr open (`wb compare ... | cat` never ends). Two mechanisms, because each alone has a hole:

- Linux's parent-death signal (`prctl(PR_SET_PDEATHSIG, SIGKILL)`) in each worker: its parent is the
  forkserver's main thread, which lives exactly as long as the forkserver;
- a watchdog thread that polls `getppid()` twice a second and exits when the process was re-parented
  (its parent died). The forkserver uses it (the parent-death signal follows the *thread* that forked
  it, and `wb` starts a forkserver pool from a short-lived thread); workers use it where `prctl` is missing.

The resource tracker needs nothing: it exits when the last process holding its pipe is gone.
The forkserver's preload calls `watch_owner`, which starts the watchdog when the environment names the
forkserver's parent as the pool's owner. Workers `wb` forks itself need only the signal (their parent
thread is its main thread).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

OWNER_ENV = "WB_POOL_OWNER"  # pid of the wb process that owns the pool
POLL_S = 0.5
_PR_SET_PDEATHSIG = 1


def _die_with_parent_signal() -> bool:
    """Ask the kernel to SIGKILL this process when its parent (thread) dies; False where unavailable."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int) -> None:
    while True:
        time.sleep(POLL_S)
        if os.getppid() != parent:
            os._exit(1)


def watch_parent(parent: int) -> None:
    """Exit this process (at once, no clean-up) when `parent` is no longer its parent."""
    if os.getppid() != parent:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent,), name="wb-lifeline", daemon=True).start()


def worker_init(owner: int, forked_by_owner: bool = False) -> None:
    """`ProcessPoolExecutor` initializer: this worker dies with its parent: the owner that forked it
    (`forked_by_owner`), its forkserver, or its owner when spawned. A worker the owner forked knows its parent's
    pid, so one whose owner died before the signal was armed (re-parented already) ends too."""
    parent = owner if forked_by_owner else os.getppid()
    if not _die_with_parent_signal():
        watch_parent(parent)
    elif os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def mark_owner() -> None:
    """Name this process as the owner of the pool it is about to start (read by the forkserver's preload)."""
    os.environ[OWNER_ENV] = str(os.getpid())


def watch_owner() -> None:
    """In a forkserver: exit with the pool's owner (when the environment names this process's parent as it)."""
    if os.environ.get(OWNER_ENV) == str(os.getppid()):
        watch_parent(os.getppid())
