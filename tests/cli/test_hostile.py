"""Issue 15's hostile inputs, one test per case (`tests/fixtures/hostile_cases.py`).

`bench/hostile.py` prints the table.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.hostile_cases import CASES, Case


@pytest.mark.parametrize("c", CASES, ids=[f"{c.item}-{c.name}" for c in CASES])
def test_hostile(c: Case, tmp_path: Path) -> None:
    if c.needs_root and os.geteuid() != 0:
        pytest.skip("needs root (mounts a file system)")
    if c.item == 4 and not Path("/proc/self/stat").exists():
        pytest.skip("needs /proc to find the pool's processes")
    out = c.run(tmp_path)
    assert out.ok, f"{c.name}: expected {c.expected}; got {out.got}"
