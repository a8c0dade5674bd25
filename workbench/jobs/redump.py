"""Re-dump one op at one token with full tensors, by re-running the command recorded in the run's manifest.

The dumper records `command`, `executable` and `cwd` (and, for `wb dump --exec`, the exec line) in
`wb_manifest.json`; the catalog keeps the manifest in `runs.meta`. The job re-runs that command with
`WB_REDUMP` set, which makes every `DumpConfig` of the script dump just the op's subtree (`layer_name`)
at just that token, inputs and outputs as tensors, with weights, into a fresh folder. The new dump is
ingested as a run of its own, then the compared run's tensor rows of that op and token are pointed at
the new files and the metrics of their pairs are computed again, so the app shows full tensors where it
had statistics before. Cancelling stops the process (and its children) and changes nothing.

A recorded command is data from a file anyone can edit, so nothing runs unasked: `plan_redump` works out
the exact argv, folder and environment changes and whether the record verifies (`core.trust`: signed by
this user on this machine); `describe` shows them; `run_redump` runs a plan only with `confirmed=True`,
which the CLI (`--yes` or a `y` on a terminal) and the app (its confirmation screen) pass after asking.
A plan whose recorded command writes (`-o`, `--out`, ...) into the catalog's folder or a compared dump is
refused: re-running `wb demo --out DIR` would replace the very dumps and catalog being compared.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from workbench.catalog.schema import PAIR_RESULT_TABLES
from workbench.core.files import REDUMP_ENV
from workbench.core.progress import Progress, ProgressFn
from workbench.core.text import printable
from workbench.core.trust import unverified

REDUMP_DIR = "wb_redump"  # next to the catalog: one folder per re-dump
_NOT_RERUNNABLE = {"ipython", "jupyter", "jupyter-notebook", "jupyter-lab", "py.test"}
# options that name where a command writes: a re-run must not write over the catalog or the compared dumps
_OUT_OPTIONS = {
    "-o",
    "--out",
    "--output",
    "--outdir",
    "--out-dir",
    "--out_dir",
    "--output-dir",
    "--output_dir",
    "--output-path",
    "--output_path",
    "--save-dir",
    "--save_dir",
    "--dump-path",
    "--dump_path",
}
DEMO_DEFAULT_OUT = "wb_demo"  # `wb demo`'s folder when no --out is given


class RedumpError(Exception):
    """Why a re-dump cannot be done or failed; one line."""


class RedumpCancelled(RedumpError):
    """The user cancelled; nothing was changed."""


@dataclass(slots=True)
class RedumpPlan:
    """What will be re-run, where the dump goes and which catalog rows it refreshes."""

    cmp_id: int
    run_id: int
    node: str
    token: int
    argv: list[str]
    cwd: str
    env: dict[str, str]  # the variables the re-run gets on top of wb's own environment
    out_dir: Path
    untrusted: str | None = None  # why the record does not verify (None: signed here by this user, unchanged)


@dataclass(slots=True)
class RedumpResult:
    """What the re-dump brought: the new dump folder, its run id, tensors now full, pairs recomputed."""

    dump_dir: Path
    run_id: int
    tensors_updated: int
    pairs_recomputed: int
    log: Path
    notes: list[str] = field(default_factory=list)


_KIND_NAMES = {"atb": "an ATB dump", "msprobe": "an msprobe dump", "msit_torch": "an msit torch dump"}


def _recorded_command(meta: dict[str, Any]) -> tuple[list[str], str, bool]:
    """(argv, cwd, zero-code) from a run's manifest; `RedumpError` when it has none."""
    exec_spec = meta.get("exec")
    cwd = str(meta.get("cwd") or os.getcwd())
    if isinstance(exec_spec, dict) and isinstance(exec_spec.get("command"), str):
        try:
            argv = shlex.split(exec_spec["command"])
        except ValueError as exc:
            raise RedumpError(f"the recorded exec command cannot be split into words ({exc})") from None
        if not argv:
            raise RedumpError("the recorded exec command is empty")
        return argv, str(exec_spec.get("cwd") or cwd), True
    command = meta.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise RedumpError("the run has no recorded command (only dumps written by wb's dumper record one)")
    script = command[0]
    base = os.path.basename(script)
    if base in _NOT_RERUNNABLE or base.startswith("ipykernel") or "pytest" in base:
        raise RedumpError(f"the run was dumped from {base} (a test runner or notebook): no command to re-run")
    if script in ("-c", "") or script.startswith("<"):
        raise RedumpError(f"the recorded command cannot be re-run ({' '.join(command)[:80]})")
    if script.endswith(".py") or os.path.isfile(os.path.join(cwd, script)):
        return [str(meta.get("executable") or sys.executable), *command], cwd, False
    return list(command), cwd, False  # a console script (pytest, wb, ...): run as recorded


def plan_redump(
    con: duckdb.DuckDBPyConnection, cmp_id: int, golden_node: int | str, token: int, catalog: Path, side: str = "test"
) -> RedumpPlan:
    """Work out the command, environment and output folder for re-dumping one op of a comparison."""
    from workbench.catalog.lookup import NodeLookupError, compared_node

    try:
        run_id, node_id = compared_node(con, cmp_id, golden_node, token, side)
    except NodeLookupError as exc:
        raise RedumpError(f"{catalog}: {exc}") from None
    info = con.execute(
        "SELECT r.kind, r.meta, n.name FROM runs r JOIN nodes n ON n.run_id = r.run_id WHERE r.run_id = ? "
        "AND n.node_id = ?",
        [run_id, node_id],
    ).fetchone()
    if info is None:
        raise RedumpError(f"run {run_id} has no node {node_id}")
    kind, meta_text, node = info
    if kind != "msit_torch":
        raise RedumpError(
            f"this run is {_KIND_NAMES.get(kind, repr(kind) + ' dump')}: "
            "re-dump works only on dumps written by wb's torch dumper"
        )
    try:
        meta = json.loads(meta_text) if meta_text else {}
    except ValueError:
        raise RedumpError(f"run {run_id}: its recorded manifest (runs.meta) is not JSON") from None
    meta = meta if isinstance(meta, dict) else {}
    argv, cwd, zero_code = _recorded_command(meta)
    _refuse_overwrites(con, cmp_id, argv, cwd, catalog)
    stamp = time.strftime("%Y%m%d_%H%M%S")
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in str(node))[-80:]
    out_dir = catalog.resolve().parent / REDUMP_DIR / f"{stamp}_{safe}_t{token}"
    n = 1
    while out_dir.exists():  # never into a folder an earlier re-dump wrote
        n += 1
        out_dir = out_dir.with_name(f"{stamp}_{safe}_t{token}_{n}")
    request = {"dump_path": str(out_dir), "token_range": [token], "layer_name": f"{node}*"}
    env = {REDUMP_ENV: json.dumps(request)}
    if zero_code:
        from workbench.dump.autohook import hook_env

        exec_spec = meta.get("exec")
        config_text = exec_spec.get("config") if isinstance(exec_spec, dict) else None
        try:
            config = json.loads(config_text) if isinstance(config_text, str) else {}
        except ValueError:
            config = None
        if not isinstance(config, dict):
            raise RedumpError(f"run {run_id}: its recorded exec config is not a JSON object")
        env.update(hook_env(config | {"dump_path": str(out_dir)}))
    return RedumpPlan(cmp_id, run_id, str(node), token, argv, cwd, env, out_dir, unverified(meta))


def _out_folders(argv: list[str], cwd: str) -> list[Path]:
    """The folders a command says it writes (`-o X`, `--out=X`, ...; `wb demo` without --out: `wb_demo`)."""
    found: list[str] = []
    for i, arg in enumerate(argv):
        name, eq, value = arg.partition("=")
        if eq and name in _OUT_OPTIONS and name.startswith("--"):
            found.append(value)
        elif arg in _OUT_OPTIONS and i + 1 < len(argv):
            found.append(argv[i + 1])
    is_wb = any(os.path.basename(a) == "wb" or a == "workbench.cli" or "workbench/cli" in a for a in argv[:3])
    if not found and is_wb and "demo" in argv:
        found.append(DEMO_DEFAULT_OUT)
    return [Path(os.path.realpath(os.path.join(cwd, f))) for f in found if f]


def _refuse_overwrites(con: duckdb.DuckDBPyConnection, cmp_id: int, argv: list[str], cwd: str, catalog: Path) -> None:
    """`RedumpError` when the recorded command writes into the catalog's place or a compared dump."""
    row = con.execute(
        "SELECT g.path, t.path FROM comparisons c JOIN runs g ON g.run_id = c.golden_run "
        "JOIN runs t ON t.run_id = c.test_run WHERE c.cmp_id = ?",
        [cmp_id],
    ).fetchone()
    kept = [Path(os.path.realpath(catalog))] + [Path(os.path.realpath(p)) for p in (row or ()) if p]
    for out in _out_folders(argv, cwd):
        for path in kept:
            if path == out or path.is_relative_to(out) or (path != kept[0] and out.is_relative_to(path)):
                what = "the catalog" if path == kept[0] else "a compared dump"
                raise RedumpError(
                    f"the recorded command writes to {out}, which holds {what} ({path}): not re-run "
                    "(it would replace what is being compared)"
                )


def describe(plan: RedumpPlan) -> list[str]:
    """What will run, exactly: the argv (shell-quoted), the folder, the environment it adds, and a warning line
    when the record does not verify. Every value is escaped for the terminal."""
    lines = []
    if plan.untrusted is not None:
        lines.append(f"warning: recorded elsewhere or edited: {plan.untrusted}")
    lines.append(f"command: {shlex.join(plan.argv)}")
    program = plan.argv[0] if plan.argv else ""
    if program and os.sep not in program:
        where = shutil.which(program)
        lines.append(f"program: {where or 'not found on PATH'} (no shell: the words above are the arguments)")
    lines.append(f"in folder: {plan.cwd}")
    lines.extend(f"env: {k}={shlex.quote(v)}" for k, v in plan.env.items())
    lines.append(f"dump to: {plan.out_dir}")
    return [printable(line) for line in lines]


def run_redump(
    catalog: str | Path,
    plan: RedumpPlan,
    *,
    confirmed: bool,
    progress: ProgressFn | None = None,
    cancel: threading.Event | None = None,
    timeout_s: float | None = None,
) -> RedumpResult:
    """Run a plan the user confirmed (after `describe` was shown), ingest the dump and refresh the comparison."""
    from workbench.catalog.store import open_catalog

    if not confirmed:
        raise RedumpError("a recorded command runs only after the user confirmed it")
    cat = Path(catalog)
    report = progress or (lambda p: None)
    report(Progress("planning", 0, 4))
    try:
        plan.out_dir.parent.mkdir(parents=True, exist_ok=True)
        plan.out_dir.mkdir()
    except FileExistsError:
        raise RedumpError(f"{plan.out_dir}: exists already; not written into") from None
    except OSError as exc:
        raise RedumpError(f"{plan.out_dir}: cannot create ({exc.strerror or exc})") from None
    log = plan.out_dir / "redump.log"
    report(Progress(f"running {printable(shlex.join(plan.argv))[:100]}", 1, 4))
    _run(plan, log, report, cancel, timeout_s)
    report(Progress("reading the new dump", 2, 4))
    dump_dir = _new_dump(plan)
    report(Progress("ingesting and recomputing pairs", 3, 4))
    con = open_catalog(cat)
    try:
        result = _ingest(con, plan, dump_dir, log)
    finally:
        con.close()
    report(Progress("done", 4, 4))
    return result


def _run(
    plan: RedumpPlan, log: Path, report: ProgressFn, cancel: threading.Event | None, timeout_s: float | None
) -> None:
    env = {**os.environ, **plan.env}
    try:
        with open(log, "w", encoding="utf-8") as fh:
            proc = subprocess.Popen(
                plan.argv,
                cwd=plan.cwd,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: cancelling stops its children too
            )
    except OSError as exc:
        raise RedumpError(f"cannot start {plan.argv[0]}: {exc.strerror or exc}") from None
    start = time.monotonic()
    while proc.poll() is None:
        if (cancel is not None and cancel.is_set()) or (timeout_s is not None and time.monotonic() - start > timeout_s):
            _stop(proc)
            if cancel is not None and cancel.is_set():
                raise RedumpCancelled("re-dump cancelled; nothing was changed")
            raise RedumpError(f"the re-run took longer than {timeout_s:g} s and was stopped (log: {log})")
        report(Progress(f"running {printable(shlex.join(plan.argv))[:100]}", 1, 4, message=_last_line(log)))
        time.sleep(0.2)
    if proc.returncode != 0:
        raise RedumpError(
            f"the re-run exited with code {proc.returncode}: {_last_line(log) or 'no output'} (log: {log})"
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _last_line(log: Path) -> str:
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 400))
            lines = [ln for ln in fh.read().decode("utf-8", "replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return printable(lines[-1].strip()[:160]) if lines else ""


def _new_dump(plan: RedumpPlan) -> Path:
    found = sorted(plan.out_dir.glob("msit_dump_*/torch_tensors/*"))
    if not found:
        raise RedumpError(
            f"the re-run wrote no dump under {plan.out_dir} (did the script build its model with wb's dumper?)"
        )
    dev = found[-1]
    if not (dev / str(plan.token) / plan.node).is_dir():
        raise RedumpError(f"the re-run did not reach {plan.node} at token {plan.token} (dump: {dev})")
    return dev


def _ingest(con: duckdb.DuckDBPyConnection, plan: RedumpPlan, dump_dir: Path, log: Path) -> RedumpResult:
    from workbench.analysis.verdicts.born import refresh_verdicts
    from workbench.catalog.store import ingest_dump
    from workbench.compare.execution.executor import compute_pending
    from workbench.compare.judging.thresholds import Thresholds
    from workbench.compare.pair_store import load_frames, pending_pairs
    from workbench.formats.detect import open_dump

    dump = open_dump(dump_dir)
    new_run = ingest_dump(con, dump).run_id
    # the compared run's rows of the op's subtree at this token take the new files (same node, io, index)
    # the rows to update, kept in DuckDB (no DataFrame: pandas is not loaded for this)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _upd AS "
        "SELECT o.tensor_id, t.path, t.dtype, t.shape, t.numel FROM tensors o "
        "JOIN nodes on_ ON on_.run_id = o.run_id AND on_.node_id = o.node_id "
        "JOIN nodes nn ON nn.run_id = ? AND nn.name = on_.name "
        "JOIN tensors t ON t.run_id = nn.run_id AND t.node_id = nn.node_id AND t.io = o.io AND t.idx = o.idx "
        "AND t.token_id = o.token_id "
        "WHERE o.run_id = ? AND o.token_id = ? AND t.path IS NOT NULL AND t.error IS NULL",
        [new_run, plan.run_id, plan.token],
    )
    found = con.execute("SELECT count(*) FROM _upd").fetchone()
    updated = int(found[0]) if found else 0
    notes: list[str] = []
    if not updated:
        con.execute("DROP TABLE _upd")
        notes.append("no tensor of the compared run matched the re-dumped files (node names differ?)")
        return RedumpResult(dump_dir, new_run, 0, 0, log, notes)
    row = con.execute(
        "SELECT golden_run, test_run, thresholds FROM comparisons WHERE cmp_id = ?", [plan.cmp_id]
    ).fetchone()
    assert row is not None
    side_col = "test_tensor_id" if int(row[1]) == plan.run_id else "golden_tensor_id"
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(
            "UPDATE tensors SET path = u.path, dtype = u.dtype, shape = u.shape, numel = u.numel, std = NULL, "
            "error = NULL FROM _upd u WHERE tensors.run_id = ? AND tensors.tensor_id = u.tensor_id",
            [plan.run_id],
        )
        for table in PAIR_RESULT_TABLES:  # the next compare writes them again
            con.execute(
                f"DELETE FROM {table} WHERE cmp_id = ? AND pair_id IN (SELECT pair_id FROM matches WHERE cmp_id = ? "
                f"AND {side_col} IN (SELECT tensor_id FROM _upd))",
                [plan.cmp_id, plan.cmp_id],
            )
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        with contextlib.suppress(duckdb.Error):  # a connection that failed keeps its first error
            con.execute("DROP TABLE IF EXISTS _upd")
    pairs = pending_pairs(con, plan.cmp_id)
    th = Thresholds.from_dict(json.loads(row[2])) if row[2] else Thresholds.load(None)
    golden, test = load_frames(con, int(row[0])), load_frames(con, int(row[1]))
    computed = 0
    if len(pairs):
        computed, _, _ = compute_pending(con, plan.cmp_id, golden, test, pairs, th, workers=1, stats_for_unpaired=False)
    refresh_verdicts(con, plan.cmp_id)
    return RedumpResult(dump_dir, new_run, updated, computed, log, notes)
