"""`wb compare --ray`: the pairs computed on a Ray cluster started in the test (two nodes of 1 CPU) give the
same catalog as the local path, on our dumps, msit-made dumps and a 2-rank dump; cancelling stops the tasks and
keeps what was committed; placement finds the nodes that hold the files; without ray, one line and exit 2."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.conftest import ROOT, WB, TinyDumps, run_wb
from tests.fixtures.hostile_cases import cluster_host, in_session, proc_stat, wait_for, with_agents
from tests.fixtures.hostile_files import folder_with_planted_modules
from tests.fixtures.peers import PeerDumps

HAS_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(
    not HAS_RAY, reason="ray is not installed (pip install 'workbench[ray]'; `make test` installs it)"
)
# tables a compare fills
TABLES = (
    "metrics",
    "stat_metrics",
    "tensors",
    "node_results",
    "error_born",
    "advice",
    "token_status",
    "matches",
    "allreduce_checks",
)


def catalog_rows(catalog: Path) -> dict[str, list[tuple[object, ...]]]:
    """Every row a compare wrote, in a stable order, with run and comparison ids replaced by what they stand for
    (the dump's path; the two dumps' paths): ranks compared at once get their ids in any order."""
    con = duckdb.connect(str(catalog), read_only=True)
    try:
        runs = dict(con.execute("SELECT run_id, path FROM runs").fetchall())
        rows = con.execute("SELECT cmp_id, golden_run, test_run FROM comparisons").fetchall()
        cmps = {c: (runs[g], runs[t]) for c, g, t in rows}
        ids = {"run_id": runs, "golden_run": runs, "test_run": runs, "cmp_id": cmps}
        out = {}
        for table in TABLES:
            cur = con.execute(f"SELECT * FROM {table}")
            names = [d[0] for d in cur.description]
            mapped = [tuple(ids[n].get(v, v) if n in ids else v for n, v in zip(names, r)) for r in cur.fetchall()]
            out[table] = sorted(mapped, key=repr)
        return out
    finally:
        con.close()


def assert_same_catalog(local: Path, on_ray: Path) -> None:
    a, b = catalog_rows(local), catalog_rows(on_ray)
    assert a["metrics"], "the local compare computed nothing"
    for table in TABLES:
        assert a[table] == b[table], f"{table} differs between the local pool and Ray"


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A two-node Ray cluster on this machine (a head and one more node, 1 CPU each), as `ray start` makes
    on two machines; the tests and the CLI join it by its address."""
    if not HAS_RAY:
        pytest.skip("ray is not installed (pip install 'workbench[ray]'; `make test` installs it)")
    import ray
    from ray.cluster_utils import Cluster

    store = 80 * 1024 * 1024  # tasks ship paths and numbers only
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False, "object_store_memory": store}
    )
    try:
        cluster.add_node(num_cpus=1, object_store_memory=store)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        try:
            yield cluster.address
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()


def _both(golden: Path, test: Path, tmp_path: Path, address: str, *extra: str) -> tuple[Path, Path, str]:
    """`wb compare` locally and on the cluster: the two catalogs and the Ray run's output."""
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    p = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(local), "-j", "2", *extra)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    q = run_wb("compare", "-gp", str(golden), "-mp", str(test), "-o", str(on_ray), "--ray", address, *extra)
    assert q.returncode == 0, q.stdout[-2000:] + q.stderr[-2000:]
    assert p.stdout.count("error born at") == q.stdout.count("error born at")
    return local / "catalog.duckdb", on_ray / "catalog.duckdb", q.stdout


def test_without_ray_one_line_and_exit_2(tmp_path: Path) -> None:
    """ray made unimportable in the real CLI process (None in sys.modules: `import ray` raises ImportError)."""
    code = "import sys; sys.modules['ray'] = None; from workbench.cli import main; sys.argv[0] = 'wb'; main()"
    args = ["compare", "-gp", str(tmp_path), "-mp", str(tmp_path), "-o", str(tmp_path / "out"), "--ray", "auto"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.strip().splitlines() == ["wb: error: ray is not installed: pip install 'workbench[ray]'"]
    assert not (tmp_path / "out" / "catalog.duckdb").exists()


@needs_ray
def test_unreachable_or_bad_address_one_line(tmp_path: Path) -> None:
    from workbench.compare.execution.ray_exec import RayCluster, RayClusterError

    p = run_wb("compare", "-gp", str(tmp_path), "-mp", str(tmp_path), "-o", str(tmp_path / "o"), "--ray", "127.0.0.1:9")
    assert p.returncode == 2, p.stdout + p.stderr
    said = "ray: cannot connect to '127.0.0.1:9': Connection refused (start one with `ray start --head`)"
    assert p.stderr.strip().splitlines() == [f"wb: error: {said}"]
    with pytest.raises(RayClusterError, match=r"'nonsense' is not a cluster address: use HOST:PORT, ray://"):
        RayCluster.connect("nonsense")


@needs_ray
def test_our_dumps_same_catalog(tiny_dumps: TinyDumps, ray_address: str, tmp_path: Path) -> None:
    local, on_ray, _ = _both(tiny_dumps.golden, tiny_dumps.bf16, tmp_path, ray_address)
    assert_same_catalog(local, on_ray)


@needs_ray
def test_ray_workers_import_nothing_from_the_folder_wb_runs_in(
    tiny_dumps: TinyDumps, ray_address: str, tmp_path: Path
) -> None:
    """Ray puts the folder a driver runs in on its workers' sys.path: `wb` started in a folder someone else filled
    (a dump with a numpy.py, a workbench/ package) must not have the workers import from it."""
    here, marker = folder_with_planted_modules(tmp_path)
    out = tmp_path / "out"
    # -P: `python -m` itself would import from the current folder (the console script `wb` does not)
    cmd = [sys.executable, "-P", "-m", "workbench.cli", "compare", "-gp", str(tiny_dumps.golden)]
    cmd += ["-mp", str(tiny_dumps.bf16), "-o", str(out), "--ray", ray_address]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, cwd=here, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "pairs compared:" in p.stdout
    assert not marker.exists(), f"imported from the current folder: {marker.read_text()}"


@needs_ray
def test_msit_dumps_same_catalog(peer_dumps: PeerDumps, ray_address: str, tmp_path: Path) -> None:
    msit = peer_dumps.need_msit()
    local, on_ray, _ = _both(msit["golden"], msit["test"], tmp_path, ray_address)
    assert_same_catalog(local, on_ray)


@needs_ray
def test_two_ranks_same_catalog(ray_address: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("msit_llm") is None:
        pytest.skip("msit_llm not installed (pip install msit && msit install llm): the 2-rank dump needs it")
    from tests.fixtures import tp_dumps

    golden = tp_dumps.dump(tmp_path / "golden")
    test = tp_dumps.dump(tmp_path / "test", bf16=True, defect=True)
    local, on_ray, out = _both(golden, test.parent, tmp_path, ray_address)
    assert "ranks: golden 2, test 2" in out and out.count("error born at: root.layers.1.all_reduce (token 0)") == 2
    assert_same_catalog(local, on_ray)
    con = duckdb.connect(str(on_ray), read_only=True)
    assert sorted(r[0] for r in con.execute("SELECT DISTINCT rank FROM runs").fetchall()) == [0, 1]
    con.close()
    # one golden rank as a single-rank golden partnering both test ranks (compared at once): ingested once
    single = sorted(golden.glob("cpu_*"))[0]
    local, on_ray, out = _both(single, test.parent, tmp_path / "single", ray_address)
    assert "paired 2 by the single-rank golden with each rank" in out
    assert_same_catalog(local, on_ray)
    con = duckdb.connect(str(on_ray), read_only=True)
    assert con.execute("SELECT count(*) FROM runs WHERE rank IS NULL").fetchall() == [(1,)]
    con.close()


@needs_ray
def test_placement_probes_each_node_for_the_files(tiny_dumps: TinyDumps, ray_address: str) -> None:
    import ray

    from workbench.compare.execution.ray_exec import RayCluster, holds, probe_files

    cluster = RayCluster.connect(ray_address)
    assert not cluster.started  # joined the test's cluster: shutting it down is the test's business
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    files = [str(p) for p in sorted(tiny_dumps.golden.rglob("*.pth"))[:5]]
    assert {n.node_id for n in cluster.holders(files)} == nodes  # one file system: both nodes hold the dump
    # a file this process lacks does not decide placement (its pair reports it missing, as locally)
    assert {n.node_id for n in cluster.holders([*files, str(tiny_dumps.golden / "gone.pth")])} == nodes
    # what a node without the files, or with other copies, answers: not a holder
    want = [s for s in probe_files(files)[1] if s is not None]
    assert holds(want, want)
    assert not holds(want, [None] * len(want))
    assert not holds(want, [*want[:-1], want[-1] + 1])


@needs_ray
def test_cancel_stops_the_tasks_and_keeps_what_was_committed(
    tiny_dumps: TinyDumps, ray_address: str, tmp_path: Path
) -> None:
    from workbench.compare.execution.ray_exec import RayCluster
    from workbench.core.progress import CompareCancelled, Progress
    from workbench.jobs.compare import run_compare

    cluster = RayCluster.connect(ray_address)
    cancel = threading.Event()

    def progress(p: Progress) -> None:
        if p.stage.startswith("compare") and p.done > 0:
            cancel.set()  # after the first batch came back

    catalog = tmp_path / "c" / "catalog.duckdb"
    with pytest.raises(CompareCancelled):
        run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, cluster=cluster, progress=progress, cancel=cancel)
    kept = len(catalog_rows(catalog)["metrics"])
    # the rest is computed on the next run; the result equals a local run's
    res = run_compare(tiny_dumps.golden, tiny_dumps.defect, catalog, cluster=cluster)
    assert 0 < kept < len(catalog_rows(catalog)["metrics"]) and res.computed < res.pairs
    local = tmp_path / "l" / "catalog.duckdb"
    run_compare(tiny_dumps.golden, tiny_dumps.defect, local, workers=1)
    assert_same_catalog(local, catalog)


# ---------------------------------------------------------------------------- the local cluster dies with wb


@pytest.fixture(scope="module")
def long_dumps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two dumps of 400 tokens x 3 modules (2400 pairs): seconds of tasks after the cluster is up."""
    from tests.fixtures.hostile_files import torch_dump

    base = tmp_path_factory.mktemp("long")
    modules, tokens = ["root.a", "root.b", "root.c"], list(range(400))
    return torch_dump(base / "g" / "cpu_1", modules, tokens), torch_dump(base / "t" / "cpu_1", modules, tokens, seed=5)


@needs_ray
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT, None])
def test_local_cluster_dies_with_wb(sig: signal.Signals | None, long_dumps: tuple[Path, Path], tmp_path: Path) -> None:
    """`wb compare --ray local` killed (-9, SIGTERM, Ctrl-C) once its cluster runs, agents included, or left
    to finish: within a bounded wait no process of the cluster's session is left. The session is found as
    the child of wb that hosts the cluster; other Ray processes on the machine are not looked at."""
    golden, test = long_dumps
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    args = ["compare", "-gp", str(golden), "-mp", str(test), "-o", str(tmp_path / "out"), "--ray", "local", "-j", "1"]
    wb = subprocess.Popen([*WB, *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        sid = wait_for(lambda: cluster_host(wb.pid), 120)
        assert sid is not None, "no cluster host started"

        cluster = wait_for(lambda: with_agents(sid), 240)
        assert cluster is not None, f"the agents never ran: {in_session(sid)}"
        assert any("raylet" in t for t in cluster.values()) and any("gcs_server" in t for t in cluster.values())
        if sig is not None:
            assert wb.poll() is None, "wb ended before it could be killed mid-run"
            wb.send_signal(sig)
        out, err = wb.communicate(timeout=300)
    finally:
        if wb.poll() is None:
            wb.kill()
            wb.communicate()
    expected = {signal.SIGKILL: -9, signal.SIGTERM: 143, signal.SIGINT: 130, None: 0}[sig]
    assert wb.returncode == expected, out[-2000:] + err[-2000:]
    left = wait_for(lambda: not in_session(sid) or None, 60)
    assert left, f"left running after wb ended: {in_session(sid)}"
    assert all(proc_stat(pid) is None or proc_stat(pid)[0] in (b"Z", b"X") for pid in cluster)  # type: ignore[index]
