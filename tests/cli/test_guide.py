"""docs/guide.md, run as written: every complete `wb` command of the guide, in its order, on the demo's dumps."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from tests.conftest import ROOT, run_wb

GUIDE = ROOT / "docs" / "guide.md"
# syntax lines and examples about files the reader has (not the demo): placeholders, alternatives, elisions
PLACEHOLDER = re.compile(r"\[|\.\.\.|\||\*|\b(?:PID|NODE|DIR|FILE|DUMP|GOLDEN|N|K|T)\b|run\.py|_results\.csv|1234")
# the app (a terminal UI) and the demo (it builds its own dumps) are walked through in test_app_* and the demo tests;
# `wb dump` needs the reader's own script (test_dump_hooks, test_exec_* and the TorchAir tests run it)
NOT_HERE = ("open", "demo", "dump")
# documented exits besides 0: an op disagrees (1) or not everything was checked (4) / an anomaly was found (1)
FOUND: dict[str, set[int]] = {"precheck": {1, 4}, "errcheck": {1}}


def guide_commands(text: str) -> list[str]:
    """Every `wb ...` of the guide in order: code-block lines and inline code spans."""
    out: list[str] = []
    for m in re.finditer(r"```[^\n]*\n(.*?)```|`(wb [^`]+)`", text, re.S):
        if m.group(1) is not None:
            for line in m.group(1).splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("wb "):
                    out.append(line.split("  #")[0].strip())
        else:
            out.append(" ".join(m.group(2).split()))
    return out


def runnable(cmd: str) -> bool:
    words = cmd.split()
    return len(words) > 2 and words[1] not in NOT_HERE and not PLACEHOLDER.search(cmd)


def test_every_complete_command_of_the_guide_runs_in_order(demo_catalog: Path, tmp_path: Path) -> None:
    for side in ("golden", "test"):
        shutil.copytree(demo_catalog.parent / side, tmp_path / side, symlinks=True)
    cmds = [c for c in guide_commands(GUIDE.read_text(encoding="utf-8")) if runnable(c)]
    # the walk of steps 2-6: compare, the queries on its catalog, the advisor, precheck, the report
    assert cmds[0] == "wb compare -gp golden/ -mp test/ -o out/", cmds
    for needed in ("wb query layer_error_growth -c out/catalog.duckdb", "wb report out/catalog.duckdb -o report.html"):
        assert needed in cmds, cmds
    assert len(cmds) >= 10, cmds
    for cmd in cmds:
        words = shlex.split(cmd)
        res = run_wb(*words[1:], cwd=tmp_path)
        allowed = {0} | FOUND.get(words[1], set())
        assert res.returncode in allowed, f"{cmd}: rc {res.returncode}: {res.stderr[-600:]}"
        assert "wb: error" not in res.stderr and "Traceback" not in res.stderr, f"{cmd}: {res.stderr[-600:]}"
    assert (tmp_path / "report.html").is_file()
