"""The pool path of compare (real worker processes), the pairs computed early, and the torch-free worker."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
import torch

import workbench.compare.execution.executor as executor
import workbench.jobs.compare as pipeline
from tests.conftest import TinyDumps
from tests.fixtures.hostile_cases import running
from tests.fixtures.hostile_files import folder_with_planted_modules
from tests.fixtures.peers import PeerDumps
from workbench.catalog.schema import ALL_METRICS
from workbench.compare.execution.early import EarlyPairs
from workbench.compare.execution.pool import WORKER_NICE, new_pool
from workbench.compare.execution.tasks import PairTask, Twin
from workbench.compare.execution.worker import apply_transform, run_batch, run_pair, same_bytes
from workbench.formats import open_dump
from workbench.formats.arrays import RawTensor, as_raw

ROOT = Path(__file__).resolve().parents[2]


def _metrics(catalog: Path) -> dict[tuple[str, int, str, int], tuple[object, ...]]:
    """Every pair's metrics and verdict, keyed by what it compares (ids differ between catalogs)."""
    con = duckdb.connect(str(catalog), read_only=True)
    rows = con.execute(
        f"SELECT golden_node, token_id, io, golden_index, {', '.join(ALL_METRICS)}, passed, "
        "golden_std, my_std FROM comparison"
    ).fetchall()
    con.close()
    return {tuple(r[:4]): tuple(r[4:]) for r in rows}


def test_pool_and_early_pairs_give_the_in_process_numbers(
    tiny_dumps: TinyDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_process = pipeline.run_compare(tiny_dumps.golden, tiny_dumps.bf16, tmp_path / "a.duckdb", workers=1)
    monkeypatch.setattr(executor, "IN_PROCESS_BYTES", 0)  # tiny dumps: force the pool
    pool = new_pool(2)
    try:
        g, t = open_dump(tiny_dumps.golden), open_dump(tiny_dumps.bf16)
        early = EarlyPairs(g, t, pool)
        # the kernel entries its pairs run (each prepared on a worker of its own ahead of the pairs, `prepare_kernel`)
        assert ("pass_pair", ("float32", "bfloat16")) in early.kernels
        pooled = pipeline.run_compare(g, t, tmp_path / "b.duckdb", workers=2, pool=pool, early=early)
        assert early.taken > 0 and all(f.done() for f in early.futures)
        # a token selection leaves most early pairs unclaimed: they are dropped, the rest is right
        early_all = EarlyPairs(g, t, pool)
        one_token = pipeline.run_compare(g, t, tmp_path / "c.duckdb", workers=2, pool=pool, early=early_all, tokens={1})
        assert 0 < early_all.taken < len(early_all.keys)
        # a re-run into the same catalog has nothing left to compute: the early batches are all dropped, before the
        # verdicts and the report (`then` runs after them), not left to run meanwhile
        again = EarlyPairs(g, t, pool)
        left_at_report: list[int] = []
        rerun = pipeline.run_compare(
            g,
            t,
            tmp_path / "b.duckdb",
            workers=2,
            pool=pool,
            early=again,
            then=lambda _con, _res: left_at_report.append(len(again.batches) + len(again.keys)),
        )
        assert rerun.computed == 0 and again.taken == 0 and left_at_report == [0]
        # a pool that is gone: nothing is submitted early, every pair is computed the usual way
        gone = new_pool(2)
        gone.shutdown()
        lost = EarlyPairs(g, t, gone)
        late = pipeline.run_compare(g, t, tmp_path / "d.duckdb", workers=2, pool=pool, early=lost)
        assert lost.taken == 0 and not lost.futures and late.pairs == in_process.pairs
    finally:
        pool.shutdown()
    assert (pooled.pairs, pooled.failed) == (in_process.pairs, in_process.failed)
    ref = _metrics(tmp_path / "a.duckdb")
    assert _metrics(tmp_path / "b.duckdb") == ref
    sub = _metrics(tmp_path / "c.duckdb")
    assert sub and all(k[1] == 1 for k in sub) and sub == {k: v for k, v in ref.items() if k[1] == 1}
    assert one_token.pairs == len(sub)
    assert _metrics(tmp_path / "d.duckdb") == ref


def test_msit_made_twins_are_computed_once_with_the_same_numbers(
    peer_dumps: PeerDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """msit saves a tensor once per module that sees it (a layer's output is the next layer's input): such pairs
    go to a worker as twins of one pair, checked byte for byte, and the catalog holds the same numbers as when
    every pair is computed on its own."""
    msit = peer_dumps.need_msit()
    g, t = open_dump(msit["golden"]), open_dump(msit["planted"])
    one_by_one = pipeline.run_compare(g, t, tmp_path / "a.duckdb", workers=1)
    monkeypatch.setattr(executor, "IN_PROCESS_BYTES", 0)  # tiny dumps: force the pool
    pool = new_pool(2)
    try:
        assert set(pool.map(_own_nice, range(4))) == {min(19, _own_nice() + WORKER_NICE)}  # workers yield the CPU
        early = EarlyPairs(g, t, pool)
        pooled = pipeline.run_compare(g, t, tmp_path / "b.duckdb", workers=2, pool=pool, early=early)
    finally:
        pool.shutdown()
    assert early.twins > 0, "a layer's output and the next layer's input should be twins"
    assert early.taken == pooled.pairs == one_by_one.pairs
    assert _metrics(tmp_path / "b.duckdb") == _metrics(tmp_path / "a.duckdb")


def _own_nice(_: int = 0) -> int:
    import os

    return os.nice(0)


def test_twins_whose_bytes_differ_are_computed_on_their_own(tmp_path: Path) -> None:
    """Equal digests are a hint, never trusted: a twin whose bytes differ gets its own numbers."""
    x = torch.randn(64, 33, generator=torch.Generator().manual_seed(0))
    files = {}
    for name, tensor in {"g": x, "t": x.bfloat16(), "g2": x.clone(), "t2": (x * 1.01).bfloat16()}.items():
        files[name] = str(tmp_path / f"{name}.pth")
        torch.save(tensor, files[name])
    torch.save(x.clone(), str(tmp_path / "g3.pth"))
    task = PairTask(
        0,
        files["g"],
        files["t"],
        "bfloat16",
        -1,
        -1,
        twins=(Twin(1, files["g2"], files["t2"]), Twin(2, str(tmp_path / "g3.pth"), files["t"])),
    )
    first, differs, same = run_batch([task])
    assert [r["pair_id"] for r in (first, differs, same)] == [0, 1, 2]
    alone = run_pair(PairTask(1, files["g2"], files["t2"], "bfloat16", -1, -1))
    assert differs["values"] == alone["values"] != first["values"]
    assert same["values"] == first["values"] and same["test"] == first["test"]
    raw = as_raw(x)
    assert same_bytes(raw, as_raw(x.clone())) and not same_bytes(raw, as_raw(x.reshape(33, 64)))
    nan = x.clone()
    nan[0, 0] = float("nan")
    assert same_bytes(as_raw(nan), as_raw(nan.clone()))  # bit-identical, NaN included
    # compared as 64-bit words, the last bytes of an odd size as bytes: one bit anywhere tells them apart
    odd = torch.arange(1003, dtype=torch.uint8)
    for where in (0, 500, 999, 1002):
        other = odd.clone()
        other[where] ^= 1
        assert same_bytes(as_raw(odd), as_raw(odd.clone())) and not same_bytes(as_raw(odd), as_raw(other)), where


def test_worker_never_imports_torch(tiny_dumps: TinyDumps) -> None:
    pth = next(tiny_dumps.golden.rglob("output.pth"))
    code = (
        "import sys\n"
        "from workbench.compare.execution.worker import run_pair\n"
        "from workbench.compare.execution.tasks import PairTask\n"
        f"r = run_pair(PairTask(0, {str(pth)!r}, {str(pth)!r}, 'float32', 0, 0))\n"
        "assert r['values']['cosine_similarity'] == 1.0, r\n"
        "assert 'torch' not in sys.modules\nprint('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# a driver script's lines that start a pool of two, from its main thread or (`from_thread`) from another thread
_START_POOL = (
    "    if {from_thread}:\n"
    "        with ThreadPoolExecutor(1) as starter:\n"
    "            pool = starter.submit(new_pool, 2).result()\n"
    "    else:\n"
    "        pool = new_pool(2)\n"
)


@pytest.mark.parametrize("started_from", ["main thread", "a thread"])
def test_pool_processes_import_nothing_from_the_folder_wb_runs_in(tmp_path: Path, started_from: str) -> None:
    """`wb` started in a folder someone else filled (a dump): a forkserver pool's forkserver and resource tracker run
    `python -c`, which would import that folder's `numpy.py`, `multiprocessing/` or `workbench/` first. A process
    with no other thread (`wb compare` at its start) forks its workers itself: their parent is that process; from a
    thread (the app), the forkserver forks them."""
    here, marker = folder_with_planted_modules(tmp_path)
    driver = tmp_path / "driver" / "start_pool.py"  # a script: its own folder, not the current one, leads sys.path
    driver.parent.mkdir()
    from_thread = started_from == "a thread"
    driver.write_text(
        "import os, threading\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from workbench.compare.execution.pool import new_pool\n"
        "def parent():\n"
        "    return os.getpid(), os.getppid()\n"
        "if __name__ == '__main__':\n"
        + _START_POOL.format(from_thread=from_thread)
        + "    seen = {pool.submit(parent).result(timeout=120) for _ in range(8)}\n"
        "    pool.shutdown()\n"
        "    pids, parents = {p for p, _ in seen}, {pp for _, pp in seen}\n"
        "    assert pids and os.getpid() not in pids, pids\n"
        f"    assert (os.getpid() in parents) is (not {from_thread}), (os.getpid(), parents)\n"
        "    assert 'PYTHONSAFEPATH' not in os.environ  # set only while the helper interpreters start\n"
        "    print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", "PYTHONPATH")}
    out = subprocess.run([sys.executable, str(driver)], cwd=here, env=env, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    assert not marker.exists(), f"imported from the current folder: {marker.read_text()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layout_transforms_follow_torch(dtype: torch.dtype) -> None:
    x = torch.arange(2 * 7 * 5, dtype=torch.float32).reshape(2, 7, 5).to(dtype)
    raw = as_raw(x)

    def same(got: RawTensor, want: torch.Tensor) -> None:
        assert got.dtype == str(want.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(as_raw(want.contiguous()).array, np.ascontiguousarray(got.array))

    for dim in (1, 2):
        for n in (2, 3, 4):
            for i, part in enumerate(torch.chunk(x, n, dim=dim)):
                same(apply_transform(raw, raw, f"t.chunk:{dim}:{i}:{n}")[1], part)
    same(apply_transform(raw, raw, "g.slice:-1:1:4")[0], x.narrow(-1, 1, 3))
    same(apply_transform(raw, raw, "t.flat;t.slice:0:3:9")[1], x.reshape(-1)[3:9])
    with pytest.raises(IndexError):
        apply_transform(raw, raw, "t.chunk:2:3:4")  # torch.chunk of 5 into 4 makes only 3 chunks (2, 2, 1)
    with pytest.raises(ValueError):
        apply_transform(raw, raw, "t.slice:2:3:9")


def test_early_results_are_not_held_when_the_pairs_are_computed_in_process(
    tiny_dumps: TinyDumps, tmp_path: Path
) -> None:
    """Tiny tensors are computed in this process, not by the pool: the early batches the pool already
    computed are dropped with their results (held, a dict per pair stayed in memory until the compare
    ended: ~90 MB at 36,864 pairs), and the numbers are those of a plain run."""
    from concurrent.futures import wait

    pool = new_pool(2)
    try:
        g, t = open_dump(tiny_dumps.golden), open_dump(tiny_dumps.bf16)
        early = EarlyPairs(g, t, pool)
        early.wait_submitted()
        wait(early.futures)
        assert early.futures and all(f.result() for f in early.futures)  # computed: the results are held
        res = pipeline.run_compare(g, t, tmp_path / "e.duckdb", workers=2, pool=pool, early=early)
        assert early.taken == 0 and not early.futures and not early.keys
    finally:
        pool.shutdown()
    plain = pipeline.run_compare(tiny_dumps.golden, tiny_dumps.bf16, tmp_path / "p.duckdb", workers=1)
    assert (res.pairs, res.failed) == (plain.pairs, plain.failed)
    assert _metrics(tmp_path / "e.duckdb") == _metrics(tmp_path / "p.duckdb")


@pytest.mark.parametrize("started_from", ["main thread", "a thread"])
def test_pool_processes_end_with_their_owner_killed(tmp_path: Path, started_from: str) -> None:
    """The owner killed with SIGKILL (no clean-up runs): its workers, forked by it or by a forkserver, and the
    forkserver end within seconds (`lifeline`), instead of living on and holding its stdout."""
    driver = tmp_path / "owner.py"
    from_thread = started_from == "a thread"
    driver.write_text(
        "import multiprocessing.forkserver, os, signal, sys\n"
        "from concurrent.futures import ThreadPoolExecutor\n"
        "from workbench.compare.execution.pool import new_pool\n"
        "if __name__ == '__main__':\n"
        + _START_POOL.format(from_thread=from_thread)
        + "    [pool.submit(os.getpid).result(timeout=120) for _ in range(8)]\n"
        "    pids = set(pool._processes)  # every worker, whichever took the tasks\n"
        "    server = multiprocessing.forkserver._forkserver._forkserver_pid\n"
        "    print(' '.join(str(p) for p in sorted(pids | ({server} if server else set()))), flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    printed = tmp_path / "pids.txt"  # a file, not a pipe: workers left alive would hold a pipe open
    with printed.open("w") as sink:
        owner = subprocess.Popen([sys.executable, str(driver)], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
        assert owner.wait(timeout=180) == -9, printed.read_text()[-2000:]
    family = [int(p) for p in printed.read_text().split()]
    assert len(family) == (3 if from_thread else 2), family  # two workers, and the forkserver where it forked them

    deadline = time.monotonic() + 20
    while any(running(p) for p in family) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in family if running(p)], "pool processes outlived their owner"


def test_a_forked_worker_whose_owner_died_before_it_started_ends(tmp_path: Path) -> None:
    """The race `kill -9` can hit just after `wb` forks its workers: the owner dies before a worker's initializer
    arms the parent-death signal, so the worker is already re-parented. It knows its owner's pid and ends at once,
    instead of living on (and holding `wb`'s stdout)."""
    driver = tmp_path / "owner.py"
    driver.write_text(
        "import os, signal, sys, time\n"
        "from workbench.compare.execution import lifeline\n"
        "owner = os.getpid()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    while os.getppid() == owner:  # the owner is killed first\n"
        "        time.sleep(0.01)\n"
        "    lifeline.worker_init(owner, forked_by_owner=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "os.kill(owner, signal.SIGKILL)\n"
    )
    printed = tmp_path / "pid.txt"
    with printed.open("w") as sink:
        owner = subprocess.Popen([sys.executable, str(driver)], cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
        assert owner.wait(timeout=120) == -9, printed.read_text()[-2000:]
    worker = int(printed.read_text().split()[0])
    deadline = time.monotonic() + 20
    while running(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = running(worker)
    if left:
        os.kill(worker, 9)
    assert not left, "a worker re-parented before its initializer ran lived on"


def test_a_sigterm_between_a_workers_fork_and_its_initializer_ends_it_as_a_worker(tmp_path: Path) -> None:
    """A forked worker starts with `wb`'s own SIGTERM handler (its one line and exit code) until its initializer
    sets a worker's: a SIGTERM sent to the process group just then is held across the fork and delivered once the
    worker's handlers are set, so the worker ends by the signal; the pool's workers run with nothing held, and so
    does the process that forked them, once they are forked."""
    driver = tmp_path / "window.py"
    driver.write_text(
        "import os, signal\n"
        "from workbench.compare.execution import pool\n"
        "signal.signal(signal.SIGTERM, lambda *_: os._exit(7))  # as `wb`'s own: its line, then its exit code\n"
        "with pool._held_across_fork():\n"
        "    child = os.fork()\n"
        "    if child == 0:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)  # sent after the fork, before the initializer\n"
        "        pool._worker_init(os.getppid(), forked=True)\n"
        "        os._exit(0)\n"
        "_, status = os.waitpid(child, 0)\n"
        "print(os.waitstatus_to_exitcode(status))\n"
        "workers = pool.new_pool(2)\n"
        "held = [workers.submit(signal.pthread_sigmask, signal.SIG_BLOCK, []).result(timeout=120) for _ in range(4)]\n"
        "workers.shutdown()\n"
        "print(sorted(int(s) for mask in held for s in mask), sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])))\n"
    )
    out = subprocess.run([sys.executable, str(driver)], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    ended, masks = out.stdout.splitlines()
    assert int(ended) == -15, f"the forked worker ended with {ended}, not by the SIGTERM (-15)"
    assert masks == "[] []", f"signals still held (workers, then the process that forked them): {masks}"
