"""The one compare path (`workbench.jobs.compare`) and the one NaN/Inf rule (`workbench.compare.judging.judge`)."""

from __future__ import annotations

import csv
import os
import threading
from concurrent.futures import Future
from pathlib import Path

import duckdb
import pytest

import workbench.compare.execution.executor as executor
import workbench.compare.execution.pool as pool_mod
from tests.conftest import TinyDumps
from workbench.compare.execution.tasks import PairTask, StatsTask
from workbench.compare.execution.worker import run_batch
from workbench.compare.judging.judge import PairResult, StatsResult, judge_pair, nan_inf_mismatch, result_from_wire
from workbench.compare.judging.thresholds import Thresholds
from workbench.core.metrics import ALL_METRICS, NAN_INF
from workbench.formats import open_dump
from workbench.formats.fingerprint import run_fingerprint
from workbench.formats.model import DumpError
from workbench.jobs.compare import CompareCancelled, _fingerprint_in_worker, _worker_fingerprint, run_compare


def _rows(catalog: Path) -> list[tuple[object, ...]]:
    con = duckdb.connect(str(catalog), read_only=True)
    rows = con.execute(
        f"SELECT golden_node, token_id, io, golden_index, {', '.join(ALL_METRICS)}, passed FROM comparison ORDER BY ALL"
    ).fetchall()
    con.close()
    return rows


def test_job_starts_its_own_pool_and_early_pairs(
    tiny_dumps: TinyDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a pool given, dumps worth a pool get one started in the background and their same-place pairs
    computed early (what `wb compare` did alone before; the app takes this path too): same numbers."""
    ref = run_compare(tiny_dumps.golden, tiny_dumps.defect, tmp_path / "a.duckdb", workers=1)
    monkeypatch.setattr(pool_mod, "IN_PROCESS_BYTES", 0)  # tiny dumps: worth a pool
    monkeypatch.setattr(executor, "IN_PROCESS_BYTES", 0)
    seen: list[str] = []
    pooled = run_compare(
        tiny_dumps.golden, tiny_dumps.defect, tmp_path / "b.duckdb", workers=2, progress=lambda p: seen.append(p.stage)
    )
    assert (pooled.pairs, pooled.failed, pooled.born) == (ref.pairs, ref.failed, ref.born)
    assert pooled.first_failing_token is not None
    assert _rows(tmp_path / "b.duckdb") == _rows(tmp_path / "a.duckdb")
    # the compare stage's label counts its pairs: `compare (N pairs ...)`
    assert seen[0] == "read dumps" and seen[-1] == "verdict" and any(s.startswith("compare (") for s in seen)


def test_a_worker_reads_the_test_dump_and_its_errors_read_as_here(
    tiny_dumps: TinyDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a pool, a worker reads the test dump while this process reads the golden one: a bad test dump gives
    the same one-line error as when read here, and a pool that cannot start leaves the reading to this process."""
    monkeypatch.setattr(pool_mod, "IN_PROCESS_BYTES", 0)
    monkeypatch.setattr(executor, "IN_PROCESS_BYTES", 0)
    starter = pool_mod.PoolStarter(1)
    try:
        assert starter.submit(os.getpid).result() != os.getpid()
    finally:
        starter.shutdown()
    with pytest.raises(pool_mod.PoolUnavailable):
        starter.submit(os.getpid).result()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "notes.txt").write_text("not a dump")
    with pytest.raises(DumpError) as here:
        open_dump(bad)
    with pytest.raises(DumpError) as there:
        run_compare(tiny_dumps.golden, bad, tmp_path / "x.duckdb", workers=2)
    assert str(there.value) == str(here.value) and str(bad) in str(there.value)

    ref = run_compare(tiny_dumps.golden, tiny_dumps.defect, tmp_path / "a.duckdb", workers=2)

    def no_pool(workers: int) -> None:
        raise OSError("no processes here")

    monkeypatch.setattr(pool_mod, "new_pool", no_pool)
    alone = run_compare(tiny_dumps.golden, tiny_dumps.defect, tmp_path / "b.duckdb", workers=2)
    assert (alone.pairs, alone.failed, alone.born) == (ref.pairs, ref.failed, ref.born)
    assert _rows(tmp_path / "b.duckdb") == _rows(tmp_path / "a.duckdb")


def test_fingerprints_made_by_a_worker_key_the_runs_as_made_here(
    tiny_dumps: TinyDumps, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a pool, a worker stats every file of each dump for its fingerprint while this process reads them: the
    catalog keys the runs by the digest `run_fingerprint` gives here, so a second compare into the same catalog finds
    both runs and computes nothing again. Without a worker (none, or the pool gone) the ingest computes it."""
    monkeypatch.setattr(pool_mod, "IN_PROCESS_BYTES", 0)
    monkeypatch.setattr(executor, "IN_PROCESS_BYTES", 0)
    roots = [open_dump(p).root for p in (tiny_dumps.golden, tiny_dumps.defect)]
    starter = pool_mod.PoolStarter(1)
    try:
        jobs = [_fingerprint_in_worker(r, starter) for r in roots]
        for job in jobs:
            assert job is not None and job.result(timeout=120)
        assert [_worker_fingerprint(job) for job in jobs] == [run_fingerprint(r) for r in roots]
    finally:
        starter.shutdown()
    assert _worker_fingerprint(_fingerprint_in_worker(roots[0], starter)) is None  # shut down: made by the ingest
    assert _fingerprint_in_worker(roots[0], None) is None
    queued: Future[str] = Future()  # behind the kernels' first compile, say: not waited for, and taken off the queue
    assert _worker_fingerprint(queued) is None and queued.cancelled()
    cat = tmp_path / "c.duckdb"
    first = run_compare(tiny_dumps.golden, tiny_dumps.defect, cat, workers=2)
    again = run_compare(tiny_dumps.golden, tiny_dumps.defect, cat, workers=2)
    con = duckdb.connect(str(cat), read_only=True)
    try:
        runs = con.execute("SELECT path, fingerprint FROM runs ORDER BY run_id").fetchall()
    finally:
        con.close()
    assert runs == [(str(r), run_fingerprint(r)) for r in roots]
    assert first.computed == first.pairs > 0 and again.computed == 0 and again.pairs == first.pairs


def test_job_cancelled_keeps_what_was_ingested(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(CompareCancelled):
        run_compare(tiny_dumps.golden, tiny_dumps.clean, tmp_path / "c.duckdb", workers=1, cancel=cancel)
    con = duckdb.connect(str(tmp_path / "c.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (2,)
    con.close()


def test_worker_results_become_typed(tiny_dumps: TinyDumps) -> None:
    pth = next(tiny_dumps.golden.rglob("output.pth"))
    missing = str(pth.parent / "absent.pth")
    wire = run_batch([PairTask(7, str(pth), str(pth), "float32", 1, 2), StatsTask(1, 3, str(pth))])
    pair, stats = (result_from_wire(r) for r in wire)
    assert isinstance(pair, PairResult) and isinstance(stats, StatsResult)
    assert pair.comparable and pair.values["cosine_similarity"] == 1.0 and pair.golden and pair.test
    assert stats.summary is not None and stats.summary["numel"] == pair.golden["numel"] and stats.error is None
    moved = pair.under(9, 4, 5)
    assert (moved.pair_id, moved.golden_tensor_id, moved.test_tensor_id, moved.values) == (9, 4, 5, pair.values)
    (unreadable,) = (result_from_wire(r) for r in run_batch([PairTask(1, str(pth), missing, "float32", 1, 2)]))
    assert isinstance(unreadable, PairResult) and not unreadable.comparable
    assert unreadable.test is None and unreadable.golden is not None and unreadable.reason


def test_one_nan_inf_rule() -> None:
    th = Thresholds.load()
    clean = {"nan_count": 0, "inf_count": 0}
    assert not nan_inf_mismatch(clean, clean)
    assert nan_inf_mismatch(clean, {"nan_count": 2, "inf_count": 0})
    assert not nan_inf_mismatch({"nan_count": 2, "inf_count": 1}, {"nan_count": 2, "inf_count": 1})  # same as golden
    assert nan_inf_mismatch({"nan_count": 2, "inf_count": 0}, {"nan_count": 0, "inf_count": 2})
    assert not nan_inf_mismatch({"nan_count": 3, "inf_count": 0}, clean)  # golden worse: not the test's fault
    assert not nan_inf_mismatch(None, {"nan_count": 1})  # one side unreadable: nothing to compare
    good = {m: None for m in ALL_METRICS} | {"cosine_similarity": 1.0, "relative_euclidean_distance": 0.0}
    assert judge_pair(th, good, clean, clean, "bfloat16") == (True, [])
    passed, failed = judge_pair(th, good, clean, {"nan_count": 1, "inf_count": 0}, "bfloat16")
    assert passed is False and NAN_INF in failed
    # no metric computable (every element non-finite): a mismatch still fails, a match decides nothing
    assert judge_pair(th, {}, clean, {"nan_count": 4, "inf_count": 0}, "bfloat16") == (False, [NAN_INF])
    assert judge_pair(th, {}, {"nan_count": 4, "inf_count": 0}, {"nan_count": 4, "inf_count": 0}, None) == (None, [])


def test_one_request_in_one_outcome_out(tiny_dumps: TinyDumps, tmp_path: Path) -> None:
    """`compare_dumps`: a `CompareRequest` (what `wb compare`, `wb demo` and the app pass) gives the outcome the
    CLI prints from: the result, the `--tokens` resolved among the dumps' tokens, the run labels, the CSV; the
    lines a terminal shows go to `emit`; without a report folder (the app) no CSV is written."""
    from workbench.core.tokens import token_ranges
    from workbench.jobs.compare_dumps import CompareRequest, compare_dumps

    lines: list[str] = []
    request = CompareRequest(
        tiny_dumps.golden,
        tiny_dumps.defect,
        tmp_path / "out" / "catalog.duckdb",
        report_dir=tmp_path / "out",
        tokens=token_ranges("0-1,1000"),
        workers=1,
    )
    outcome = compare_dumps(request, emit=lines.append)
    (rank,) = outcome.ranks
    assert rank.rank is None and rank.result is outcome.result and rank.result.pairs > 0
    assert rank.tokens == frozenset({0, 1})  # 1000 is not in the dumps
    assert rank.report is not None and rank.report.is_file() and rank.report.parent == tmp_path / "out"
    assert str(tiny_dumps.golden) in rank.golden_label and str(tiny_dumps.defect) in rank.test_label
    assert any(str(rank.report) in line for line in lines)
    with rank.report.open(newline="") as f:
        rows = list(csv.DictReader(f))
    column = next(c for c in rows[0] if "token" in c.lower())
    assert rows and {int(r[column]) for r in rows} == {0, 1}

    quiet = CompareRequest(tiny_dumps.golden, tiny_dumps.defect, tmp_path / "app" / "catalog.duckdb", workers=1)
    app_side = compare_dumps(quiet)
    assert app_side.ranks[0].report is None and not list((tmp_path / "app").glob("*.csv"))
    assert app_side.result.pairs > rank.result.pairs  # every token, not two


_BLAS_PROBE = """
import os, sys
from threadpoolctl import threadpool_info
from workbench.jobs.compare_dumps import _numpy_one_blas_thread
_numpy_one_blas_thread()
import numpy
blas = [x["num_threads"] for x in threadpool_info() if x["internal_api"] == "openblas" and "torch" not in x["filepath"]]
print(blas, os.environ.get("OPENBLAS_NUM_THREADS"))
"""


@pytest.mark.parametrize(("user", "want"), [(None, "[1] None"), ("2", "[2] 2")])
def test_compare_loads_numpy_with_one_blas_thread_and_leaves_the_environment(user: str | None, want: str) -> None:
    """A compare's process loads numpy's OpenBLAS on one thread (its threads are never used there); the setting
    is not left for what starts later, and a user's own OPENBLAS_NUM_THREADS is kept."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if user is not None:
        env["OPENBLAS_NUM_THREADS"] = user
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", _BLAS_PROBE], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == want, out.stderr
