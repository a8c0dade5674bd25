"""Shared fixtures: real tiny Llama runs dumped once per test session."""

from __future__ import annotations

import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.fixtures.app_catalogs import (  # noqa: F401  (fixtures, hooks)
    demo_catalog,
    rope_demo_catalog,
    small_catalog,
    small_catalog_master,
    tp_demo_catalog,
)
from tests.fixtures.peers import peer_dumps  # noqa: F401  (fixtures, hooks)
from tests.fixtures.tiny_models import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WB = [sys.executable, "-m", "workbench.cli"]
# the dumper signs recorded commands with a per-user key (workbench/core/trust.py): the tests (and the wb
# processes they start) make and use their own key, never the user's ~/.config/wb/dump.key
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="wb-test-config-")
# Ctrl-C as a terminal sends it: the tests that interrupt a `wb` process need it to take SIGINT. A suite started in the
# background of a non-interactive shell (`make test &`) inherits SIGINT ignored, and every process it starts would keep
# it ignored (Python then installs no KeyboardInterrupt handler). A handled signal is reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def shared_fixtures() -> Path:
    """`shared/formats/fixtures` beside the checkout (as CI lays it out), else the copy in tests/data."""
    for cand in (ROOT.parent / "shared" / "formats" / "fixtures", Path("/work/shared/formats/fixtures")):
        if cand.is_dir():
            return cand
    return ROOT / "tests" / "data" / "fixtures"


def run_wb(*args: str, cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """The real CLI, as a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([*WB, *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=timeout)


def wb_loading(module: str, *args: str) -> tuple[subprocess.CompletedProcess[str], bool]:
    """`wb ARGS` in a fresh interpreter, and whether it loaded `module` by the time it ended."""
    code = (
        "import sys\n"
        "from workbench.cli import app\n"
        "try:\n"
        "    app(sys.argv[2:])\n"
        "finally:\n"
        "    print(sys.argv[1] in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code, module, *args], capture_output=True, text=True, env=env, timeout=120
    )
    *printed, loaded = out.stdout.splitlines() or [""]
    return subprocess.CompletedProcess(out.args, out.returncode, "\n".join(printed), out.stderr), loaded == "True"


@dataclass(frozen=True)
class WbResult:
    """What `invoke_wb` saw, named as `subprocess.CompletedProcess` names it."""

    returncode: int
    stdout: str
    stderr: str


def invoke_wb(*args: str, cwd: Path | None = None, input: str | None = None, columns: int = 200) -> WbResult:
    """`wb ARGS` in this process, through typer's CliRunner: for argument checks, refusals, help text and error
    lines, where nothing needs a process of its own (a signal, a terminal, start-up, the environment it reads at
    import: those use `run_wb`). It does what `workbench.cli.main` does before typer (`--debug`), on the same
    app (the commands' `guarded` errors included), `columns` wide (200, as `run_wb`); an exception that would reach
    `main`'s crash line fails the test instead. os.environ, the working directory, sys.argv and the SIGINT and
    SIGTERM handlers are put back afterwards, so tests stay independent of their order."""
    from typer.testing import CliRunner

    from workbench.cli.common import app

    argv = list(args)
    env = {"COLUMNS": str(columns)}
    if "--debug" in argv:
        argv.remove("--debug")
        env["WB_DEBUG"] = "1"
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_signals = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.argv = ["wb", *argv]  # what a dump's manifest records as its command
    os.chdir(cwd or ROOT)
    try:
        res = CliRunner(env=env).invoke(app, argv, input=input, prog_name="wb", catch_exceptions=False)
    finally:
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        for sig, handler in saved_signals.items():
            signal.signal(sig, handler)
    return WbResult(res.exit_code, res.stdout, res.stderr)


def run_python(code: str, timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter that sees only this checkout (what a module imports, measured cleanly)."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )


def atb_test_llama(init: float = 0.02, layers: int = 2):  # type: ignore[no-untyped-def]
    """The small Llama the ATB-stack tests share (GQA, 128 hidden); `init` sharpens attention."""
    return tiny_llama(
        3, hidden=128, intermediate=256, layers=layers, vocab=300, max_positions=64, initializer_range=init
    )


@dataclass
class TinyDumps:
    golden: Path  # torch_tensors/cpu_PID of the fp32 golden run
    clean: Path  # identical fp32 run
    defect: Path  # fp32 run with layers.1.mlp.down_proj scaled by 1.5
    defect_norm: Path  # fp32 run with a wrong RMSNorm epsilon in layers.0.post_attention_layernorm
    bf16: Path  # the same model in bf16, no defect
    tokens: list[int]


def dump_run(model, base: Path, prompt: torch.Tensor, forced: list[int] | None, steps: int = 3):  # type: ignore[no-untyped-def]
    from workbench.demo import decode
    from workbench.dump import DumpConfig, register_hook

    handle = register_hook(model, DumpConfig(dump_path=str(base), token_range=list(range(steps))))
    try:
        tokens = decode(model, prompt, steps, forced)
    finally:
        handle.remove()
    return next(base.glob("msit_dump_*/torch_tensors/*")), tokens


@pytest.fixture(scope="session")
def tiny_dumps(tmp_path_factory: pytest.TempPathFactory) -> TinyDumps:
    base = tmp_path_factory.mktemp("tiny_dumps")
    model = tiny_llama()
    prompt = torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(3))
    golden, tokens = dump_run(model, base / "golden", prompt, None)
    clean, _ = dump_run(copy.deepcopy(model), base / "clean", prompt, tokens)
    bad = copy.deepcopy(model)
    bad.model.layers[1].mlp.down_proj.register_forward_hook(lambda _m, _i, out: out * 1.5)
    defect, _ = dump_run(bad, base / "defect", prompt, tokens)
    bad_norm = copy.deepcopy(model)
    bad_norm.model.layers[0].post_attention_layernorm.variance_epsilon = 1.0
    defect_norm, _ = dump_run(bad_norm, base / "defect_norm", prompt, tokens)
    bf16, _ = dump_run(copy.deepcopy(model).to(torch.bfloat16), base / "bf16", prompt, tokens)
    return TinyDumps(golden, clean, defect, defect_norm, bf16, tokens)


@pytest.fixture()
def copy_tree(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Copy a dump so a test may damage it."""

    def _copy(src: Path, name: str = "copy") -> Path:
        dst = tmp_path / name
        shutil.copytree(src, dst)
        return dst

    return _copy


SLOW_MODULES = [
    "test_advisor",
    "test_align",
    "test_app_e2e",
    "test_app_flows",
    "test_app_pilot",
    "test_app_quant",
    "test_app_ranks",
    "test_app_snapshots",
    "test_app_torchair",
    "test_app_verdict",
    "test_atb_statistic_csv",
    "test_compare_e2e",
    "test_compare_statistics",
    "test_demo_torchair",
    "test_dump_msit_compat",
    "test_errcheck",
    "test_exec_follow",
    "test_exec_redump",
    "test_formats_torchair",
    "test_guide",
    "test_hostile",
    "test_logits_tokens",
    "test_mapping_stale",
    "test_packaging",
    "test_precheck_torch",
    "test_quant",
    "test_ray",
    "test_recorded_commands",
    "test_report",
    "test_second_walk",
    "test_second_walk_app",
]  # test modules taking more than a few seconds on 2 cores


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The `slow` marker on every test of SLOW_MODULES (`pytest -m "not slow"` for a quick run)."""
    for item in items:
        if item.module is not None and item.module.__name__.rpartition(".")[2] in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
