"""Crafted catalogs whose runs record a command (issue 21, items 1 and 2): what `wb redump` must show and ask.

`crafted_catalog` compares two tiny torch dumps whose test dump carries the `wb_manifest.json` a test writes
(a shell one-liner, an edited or foreign record); `wb_cli` runs the real CLI with no terminal on stdin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.hostile_files import torch_dump

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["root.a", "root.b", "root.c"]
EXIT_NOT_CONFIRMED = 4


def wb_cli(*args: str | Path, stdin: Any = subprocess.DEVNULL, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The real CLI as a subprocess; stdin is no terminal unless the caller passes one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "workbench.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        stdin=stdin,
        timeout=300,
    )


def shell_record(target: Path, cwd: Path) -> dict[str, Any]:
    """A manifest's `exec` record that runs `sh -c 'id > target'` (what a shared dump could carry)."""
    return {"exec": {"command": f"sh -c 'id > {target}'", "cwd": str(cwd), "config": "{}"}}


def env_record(target: Path, cwd: Path) -> dict[str, Any]:
    """A manifest's plain record: `/usr/bin/env` as the interpreter, `/bin/sh -c ...` as the script's argv."""
    return {"command": ["/bin/sh", "-c", f"id > {target}"], "executable": "/usr/bin/env", "cwd": str(cwd)}


def crafted_catalog(tmp: Path, record: dict[str, Any]) -> Path:
    """A compared catalog whose test run's manifest holds `record` (on top of a minimal valid manifest)."""
    g = torch_dump(tmp / "golden" / "cpu_1", MODULES, [0])
    t = torch_dump(tmp / "test" / "cpu_2", MODULES, [0], seed=5, noise=1e-4)
    manifest = {"format": "wb-dump", "version": 1, "tokens": [0], "exec_order": {"0": MODULES}, **record}
    (t / "wb_manifest.json").write_text(json.dumps(manifest))
    r = wb_cli("compare", "-gp", g, "-mp", t, "-o", tmp / "out")
    if r.returncode != 0:
        raise RuntimeError(f"compare of the crafted dumps failed: {r.stderr[-500:]}")
    return tmp / "out" / "catalog.duckdb"


def set_test_meta(catalog: Path, meta: dict[str, Any]) -> None:
    """Overwrite the test run's `runs.meta` (what an edited shared catalog holds)."""
    import duckdb

    con = duckdb.connect(str(catalog))
    try:
        con.execute(
            "UPDATE runs SET meta = ? WHERE run_id = (SELECT test_run FROM comparisons ORDER BY cmp_id DESC LIMIT 1)",
            [json.dumps(meta)],
        )
    finally:
        con.close()


def recorded_meta(catalog: Path) -> dict[str, Any]:
    """The test run's `runs.meta`."""
    import duckdb

    con = duckdb.connect(str(catalog), read_only=True)
    try:
        row = con.execute(
            "SELECT meta FROM runs WHERE run_id = (SELECT test_run FROM comparisons ORDER BY cmp_id DESC LIMIT 1)"
        ).fetchone()
    finally:
        con.close()
    assert row is not None
    meta: dict[str, Any] = json.loads(row[0])
    return meta


def tree_state(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file below `folder` with its size and mtime (to show nothing was replaced)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }
