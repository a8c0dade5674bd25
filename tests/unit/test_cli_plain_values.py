"""`cli.plain_values`: the plain option values of every `wb` command come out as typer's own coercion makes them
(values, and the error of a value typer refuses), without pydantic on the way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.core import TyperOption

from tests.conftest import wb_loading
from workbench.cli import app, plain_values

_ROOT = Path(__file__).resolve().parents[2]


def _outcome(runtime: Any, param: Any, ctx: Any, value: Any) -> tuple[str, Any]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=ctx)
    except typer.BadParameter as exc:
        return "error", exc.format_message()


def _values(tmp_path: Path) -> list[Any]:
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    unreadable.chmod(0)  # (root reads it all the same)
    return [
        None, "", "7", "007", "-3", "+4", " 5", "1_000", "1.5", "x", "9" * 30, "٣", str(tmp_path), "missing/dir",
        str(unreadable), "a\0b", Path("rel"), True, False, 12, "true", "no",
    ]  # fmt: skip


def _repeated(values: list[Any]) -> list[Any]:
    """What a repeatable option's coercion is handed: nothing, a tuple of values (click's), or a bare string."""
    singles = [v for v in values if v is not None]
    return [None, (), "x", [], *[(v,) for v in singles], tuple(singles[:4]), ("7", "a\0b"), ["rel", Path("x")]]


@pytest.mark.skipif(plain_values.RuntimeParam is None, reason="typer without its coercion layer")
def test_plain_values_match_typers_coercion(tmp_path: Path) -> None:
    from typer._coercion import build_runtime_param

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    commands = [group, *group.commands.values()]
    installed = 0
    values = _values(tmp_path)
    repeated = _repeated(values)
    lists = 0
    for command in commands:
        ctx = command.make_context(command.name, [], resilient_parsing=True)
        params = [p for p in command.params if isinstance(p, TyperOption)]
        for p in params:
            p._runtime_param = None
        plain_values.install(params)
        for p in params:
            ours = p._runtime_param
            if ours is None:
                continue
            installed += 1
            lists += p.multiple
            typers = build_runtime_param(p.type_descriptor)
            for value in repeated if p.multiple else values:
                assert _outcome(ours, p, ctx, value) == _outcome(typers, p, ctx, value), (command.name, p.name, value)
    assert installed > 50  # most of wb's options are plain
    assert lists >= 2  # `wb query --attach` (paths) and `wb badcase --run` (strings)


def test_a_repeatable_option_loads_no_pydantic(tmp_path: Path) -> None:
    """`wb query` (a repeatable `--attach`), given it or not, runs without loading pydantic."""
    from workbench.catalog.store import open_catalog

    open_catalog(tmp_path / "c.duckdb").close()
    (tmp_path / "t.csv").write_text("a\n1\n")
    for attach in ([], ["--attach", str(tmp_path / "t.csv")]):
        args = ["query", "-c", str(tmp_path / "c.duckdb"), "-f", "csv", *attach, "SELECT 41 + 1 AS x"]
        out, pydantic = wb_loading("pydantic", *args)
        assert out.stdout.split() == ["x", "42"] and not pydantic, out.stderr


def test_a_command_line_loads_no_pydantic(tmp_path: Path) -> None:
    """Parsing `wb compare`'s options (every kind it has) leaves pydantic unloaded."""
    code = (
        "import sys\n"
        "import workbench.jobs.compare_dumps as cd\n"
        "from workbench.cli import app\n"
        "def stop(request, **kw):\n"
        "    print(request.golden, request.workers, request.tokens.text, 'pydantic' in sys.modules)\n"
        "    raise SystemExit(0)\n"
        "cd.compare_dumps = stop\n"
        "app(sys.argv[1:])\n"
    )
    args = ["compare", "-gp", str(tmp_path), "-mp", str(tmp_path), "-o", str(tmp_path / "o"), "-j", "2"]
    env = {**os.environ, "PYTHONPATH": str(_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, *args, "--tokens", "0-3", "--follow-symlinks"],
        capture_output=True, text=True, env=env, check=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.split() == [str(tmp_path), "2", "0-3", "False"]
