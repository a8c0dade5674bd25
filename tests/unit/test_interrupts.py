"""SIGTERM and Ctrl-C that land while Python runs a finalizer still end the command (`core/interrupts.py`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

_PROGRAM = """
import gc, os, signal, sys, time
from workbench.core.interrupts import Terminated, keep_interrupts_from_finalizers, on_sigterm

signal.signal(signal.SIGTERM, on_sigterm)
if sys.argv[1] == "hooked":
    keep_interrupts_from_finalizers()


class SignalledWhileCollected:
    def __del__(self):
        os.kill(os.getpid(), getattr(signal, sys.argv[2]))
        time.sleep(0.05)  # the handler runs here, inside the finalizer


try:
    SignalledWhileCollected()  # collected at once: the signal lands in its __del__
    for _ in range(50):
        time.sleep(0.01)
    print("went on")
except Terminated:
    print("terminated")
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize(("signal_name", "said"), [("SIGTERM", "terminated"), ("SIGINT", "interrupted")])
def test_a_signal_inside_a_finalizer_still_ends_the_program(signal_name: str, said: str) -> None:
    hooked = subprocess.run(
        [sys.executable, "-c", _PROGRAM, "hooked", signal_name], capture_output=True, text=True, timeout=60
    )
    assert hooked.stdout.strip() == said, hooked.stdout + hooked.stderr
    assert "Exception ignored" not in hooked.stderr
    # without the hook Python prints the interrupt as ignored and the program goes on: what the hook is for
    bare = subprocess.run(
        [sys.executable, "-c", _PROGRAM, "bare", signal_name], capture_output=True, text=True, timeout=60
    )
    assert bare.stdout.strip() == "went on" and "Exception ignored" in bare.stderr
