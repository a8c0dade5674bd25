"""Interrupts: SIGTERM ending like Ctrl-C, and telling a signal from a storage fault when DuckDB wrapped it."""

from __future__ import annotations

import _thread
import signal
import sys
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered as an interrupt so it ends exactly like Ctrl-C (everything committed kept)."""


_sigterm_received = False


def on_sigterm(_signum: int, _frame: object) -> None:
    """The SIGTERM handler: end like Ctrl-C, remembering it was SIGTERM (DuckDB may report it as its own
    interrupt, and the line and exit code must still say "terminated")."""
    global _sigterm_received
    _sigterm_received = True
    raise Terminated


def keep_interrupts_from_finalizers() -> None:
    """An interrupt (Ctrl-C's `KeyboardInterrupt`, SIGTERM's `Terminated`) raised while Python runs a finalizer (a
    `__del__`, a weakref callback: when the signal lands there) is printed by Python as "Exception ignored in ..."
    and dropped, and the command would go on as if the signal never came: it is delivered again, from a thread of
    its own, so the main thread raises it once the finalizer has returned (a hook on `sys.unraisablehook`; other
    unraisable errors go to the previous hook)."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        exc = unraisable.exc_value
        if isinstance(exc, KeyboardInterrupt):
            # from this thread the main thread would raise it at once, still inside the finalizer
            signum = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
            _thread.start_new_thread(_thread.interrupt_main, (signum,))
            return
        previous(unraisable)

    sys.unraisablehook = hook


def sigterm_received() -> bool:
    """Whether this process got SIGTERM (then every error that follows is read as the termination)."""
    return _sigterm_received


def signal_inside(exc: BaseException) -> KeyboardInterrupt | None:
    """The interrupt a DuckDB error stands for, when a signal's exception was raised in Python code DuckDB was
    running (a DataFrame scan) and DuckDB wrapped it in an error of its own ("Traceback ..."), else None."""
    if _sigterm_received:
        return Terminated()
    if "KeyboardInterrupt" in str(exc) or str(exc).startswith("Query interrupted"):
        return KeyboardInterrupt()
    return None
