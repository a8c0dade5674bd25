"""End to end: `wb open` on the demo catalog in a real terminal (tmux), keys typed, screen read back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.fixtures.app_catalogs import REPO

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30).stdout


def _screen(session: str) -> str:
    return _tmux("capture-pane", "-p", "-t", session)


def _wait_screen(session: str, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = _screen(session)
        if text in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared; last screen:\n{screen}")


def test_wb_open_in_tmux(demo_catalog: Path) -> None:
    con = duckdb.connect(str(demo_catalog), read_only=True)
    born = con.execute(
        "SELECT n.name FROM error_born b JOIN comparisons c USING (cmp_id) JOIN nodes n "
        "ON n.run_id = c.golden_run AND n.node_id = b.golden_node_id ORDER BY b.token_id "
        "LIMIT 1"
    ).fetchone()
    con.close()
    assert born is not None
    session = f"wb-e2e-{os.getpid()}"
    # COLUMNS/LINES from the test runner would override the tmux window size
    cmd = (
        f"cd {REPO} && env -u COLUMNS -u LINES PYTHONPATH={REPO} TERM=xterm-256color {sys.executable} "
        f"-m workbench.cli open {demo_catalog}; echo WB-EXIT-$?; sleep 30"
    )
    _tmux("new-session", "-d", "-s", session, "-x", "150", "-y", "45", cmd)
    _tmux("set-option", "-t", session, "window-size", "manual")
    _tmux("resize-window", "-t", session, "-x", "150", "-y", "45")
    try:
        screen = _wait_screen(session, f"error born at: {born[0]}")
        assert "by token x layers" in screen and "golden" in screen and "test" in screen
        # the status line comes first; keys typed before the trees and the heatmap are in were lost under load (a
        # `b` before the trees waits for them and then moves the heatmap's cursor back): wait for the born op's row
        # in the golden tree and the heatmap's cursor
        _wait_screen(session, f"◆ {born[0].rsplit('.', 1)[-1]}")
        _wait_screen(session, "◀")
        _tmux("send-keys", "-t", session, "b")  # go to where the error is born
        screen = _wait_screen(session, "error born here")
        assert born[0].rsplit(".", 1)[-1] in screen
        _tmux("send-keys", "-t", session, "Down", "Enter")  # drill into the first layer row
        _wait_screen(session, "ops of layer")
        _tmux("send-keys", "-t", session, "s")
        _wait_screen(session, "saved queries")
        _tmux("send-keys", "-t", session, "Escape")
        _wait_screen(session, "by token x")
        _tmux("send-keys", "-t", session, "q")
        _wait_screen(session, "WB-EXIT-0")
    finally:
        _tmux("kill-session", "-t", session)
