"""Multi-rank dumps: rank with rank compares into one catalog and the all-reduce check, on 2-rank
tensor-parallel dumps written by msit's own `register_hook` (one gloo process per rank)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb
import pytest

from tests.conftest import run_wb
from tests.fixtures import tp_dumps
from workbench.formats.detect import RankDump, find_ranks, pair_ranks
from workbench.formats.model import Dump

needs_msit = pytest.mark.skipif(
    importlib.util.find_spec("msit_llm") is None, reason="msit_llm not installed (pip install msit && msit install llm)"
)


def _rank(rank: int | None, label: str) -> RankDump:
    def never() -> Dump:
        raise AssertionError("not read")

    return RankDump(rank, label, Path(label), never)


def test_pair_ranks_by_id_then_by_order() -> None:
    by_id = pair_ranks([_rank(1, "npu1_7"), _rank(0, "npu0_9")], [_rank(0, "npu0_3"), _rank(1, "npu1_2")])
    assert [(g.label, t.label) for g, t in by_id] == [("npu0_9", "npu0_3"), ("npu1_7", "npu1_2")]
    # cpu_{pid} names no device: processes in pid order (numerically: 999 before 1000)
    by_order = pair_ranks(
        [_rank(None, "cpu_1000"), _rank(None, "cpu_999")], [_rank(None, "cpu_5"), _rank(None, "cpu_4")]
    )
    assert [(g.label, t.label) for g, t in by_order] == [("cpu_999", "cpu_4"), ("cpu_1000", "cpu_5")]
    # ids that differ between the sides (other devices): by order
    mixed = pair_ranks([_rank(0, "npu0_1"), _rank(1, "npu1_1")], [_rank(4, "npu4_1"), _rank(5, "npu5_1")])
    assert [(g.rank, t.rank) for g, t in mixed] == [(0, 4), (1, 5)]


@pytest.fixture(scope="module")
def tp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if importlib.util.find_spec("msit_llm") is None:
        pytest.skip("msit_llm not installed (pip install msit && msit install llm)")
    base = tmp_path_factory.mktemp("tp")
    return tp_dumps.dump(base / "golden"), tp_dumps.dump(base / "test", bf16=True, defect=True)


@needs_msit
def test_rank_with_rank_and_allreduce_check(tp: tuple[Path, Path], tmp_path: Path) -> None:
    golden, test = tp
    assert len(find_ranks(golden)) == 2 and len(find_ranks(test.parent)) == 2  # torch_tensors or msit_dump_*
    assert find_ranks(next(golden.glob("cpu_*"))) == []  # one rank's folder is a single-rank dump
    proc = run_wb("compare", "-gp", str(golden), "-mp", str(test.parent), "-o", str(tmp_path / "out"))
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-2000:]
    assert "ranks: golden 2, test 2; paired 2 by order" in out
    assert out.count("error born at: root.layers.1.all_reduce (token 0)") == 2  # on both ranks
    assert "all-reduce check (golden): 4 op calls x 2 ranks, 0 failing" in out
    assert "all-reduce check (test): 4 op calls x 2 ranks, 2 failing" in out
    assert "rank 1's contribution scaled by 0.5" in out
    assert len(list((tmp_path / "out").glob("msit_cmp_report_rank*_*.csv"))) == 2
    con = duckdb.connect(str(tmp_path / "out" / "catalog.duckdb"), read_only=True)
    ranks = con.execute(
        "SELECT g.rank, t.rank FROM comparisons c JOIN runs g ON g.run_id = c.golden_run "
        "JOIN runs t ON t.run_id = c.test_run ORDER BY g.rank"
    ).fetchall()
    assert ranks == [(0, 0), (1, 1)]
    checks = con.execute(
        "SELECT r.rank, a.node, a.token_id, a.passed, a.culprit_rank, a.factor FROM allreduce_checks a "
        "JOIN runs r USING (run_id) JOIN comparisons c ON c.test_run = r.run_id ORDER BY 1, 2, 3"
    ).fetchall()
    assert len(checks) == 8
    for rank, node, _tok, passed, culprit, factor in checks:
        if node == "root.layers.0.all_reduce":
            assert passed is True  # bf16 rounding of a correct sum passes
        else:
            assert passed is False and culprit == 1 and factor == pytest.approx(0.5, abs=0.02), (rank, node)


def test_ranks_at_once_print_in_rank_order_and_one_failure_cancels_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--ray`'s ranks run in threads: each rank's lines print whole and in rank order whatever finishes first; a
    rank that fails cancels the others (they see the event) and its error is what the command reports."""
    import threading
    import time

    from workbench.cli.common import say
    from workbench.jobs.compare_dumps import _ranks_at_once

    seen: dict[int, bool] = {}

    def one_rank(rank: int, g: str, t: str, emit: object, cancel: threading.Event) -> str:
        assert callable(emit)
        time.sleep(0.2 if rank == 0 else 0.0)  # rank 1 finishes first
        emit(f"== rank {rank}")
        emit(f"rank {rank} summary")
        return f"result {rank}"

    ranked = [(0, "g0", "t0"), (1, "g1", "t1")]
    assert _ranks_at_once(ranked, one_rank, tmp_path / "catalog.duckdb", [], say) == ["result 0", "result 1"]
    assert capsys.readouterr().out.splitlines() == ["== rank 0", "rank 0 summary", "== rank 1", "rank 1 summary"]
    assert (tmp_path / "catalog.duckdb").exists()  # the schema was written once, before the threads

    def failing(rank: int, g: str, t: str, emit: object, cancel: threading.Event) -> str:
        if rank == 0:
            raise ValueError("rank 0: unreadable dump")
        seen[rank] = cancel.wait(10)  # a long compare, stopped by the event
        return "cancelled"

    with pytest.raises(ValueError, match="rank 0: unreadable dump"):
        _ranks_at_once(ranked, failing, tmp_path / "catalog.duckdb", [], say)
    assert seen == {1: True}
