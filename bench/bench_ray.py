"""`wb compare --ray` against the local process pool on the same dumps, in one interleaved run.

The dumps are `bench_compare.py`'s (a Llama dumped fp32 golden / bf16 test, tokens 0-3; msit-made when msit is
installed, and ours). One local Ray cluster (`--workers` CPUs) is started once, as a user would keep one
running; its start-up is timed on its own. Each round runs the compare job (`run_compare`: read, ingest,
match, compute, verdicts) into a fresh catalog with the local pool (`--workers` processes) and then on the
cluster; prints wall time and pairs/s of each, the ray/local wall-time ratio of the medians, and checks that
both catalogs hold the same metric rows.

    .venv/bin/python bench/bench_ray.py [--quick] [--keep DIR] [--workers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def metric_rows(catalog: Path) -> list[tuple[object, ...]]:
    import duckdb

    con = duckdb.connect(str(catalog), read_only=True)
    try:
        return con.execute("SELECT * EXCLUDE (cmp_id) FROM metrics ORDER BY pair_id").fetchall()
    finally:
        con.close()


def one_run(golden: Path, test: Path, out: Path, workers: int, cluster: object | None) -> tuple[float, int]:
    """Wall time and pairs computed of one compare job into a fresh catalog."""
    from workbench.jobs.compare import run_compare

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = run_compare(golden, test, out / "catalog.duckdb", workers=workers, cluster=cluster)  # type: ignore[arg-type]
    return time.perf_counter() - t0, res.computed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small model, for a smoke run")
    ap.add_argument("--keep", type=Path, help="keep (or reuse) the dumps in this folder")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs of each path (medians are reported)")
    args = ap.parse_args()

    from bench_compare import build_dumps, du, dump_dirs

    from workbench.compare.execution.ray_exec import RayCluster

    base = args.keep or Path(tempfile.mkdtemp(prefix="wb_bench_ray_"))
    base.mkdir(parents=True, exist_ok=True)
    has_msit = shutil.which("msit") is not None or Path(sys.executable).with_name("msit").exists()
    dumpers = ["msit", "wb"] if has_msit else ["wb"]
    sets = []
    for dumper in dumpers:
        where = base / f"{dumper}_made"
        if not (where / "test").exists():
            t0 = time.perf_counter()
            build_dumps(where, dumper, args.quick)
            print(f"{dumper}-made dumps built in {time.perf_counter() - t0:.1f} s", flush=True)
        golden, test = dump_dirs(where)
        print(f"{dumper}-made dumps: {(du(golden) + du(test)) / 1e6:.0f} MB", flush=True)
        sets.append((f"{dumper}-made", golden, test))

    t0 = time.perf_counter()
    cluster = RayCluster.connect("local", args.workers)
    print(f"local Ray cluster ({args.workers} CPUs) started in {time.perf_counter() - t0:.1f} s", flush=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    try:
        for label, golden, test in sets:
            local_t: list[float] = []
            ray_t: list[float] = []
            pairs = 0
            for i in range(args.repeat):  # interleaved: both paths see the same machine load
                t_local, pairs = one_run(golden, test, base / "out_local", args.workers, None)
                t_ray, pairs_ray = one_run(golden, test, base / "out_ray", args.workers, cluster)
                local_t.append(t_local)
                ray_t.append(t_ray)
                print(
                    f"run {i + 1} [{label}]: local pool {t_local:6.2f} s {pairs / t_local:7.1f} pairs/s | "
                    f"ray {t_ray:6.2f} s {pairs_ray / t_ray:7.1f} pairs/s",
                    flush=True,
                )
            same = metric_rows(base / "out_local" / "catalog.duckdb") == metric_rows(
                base / "out_ray" / "catalog.duckdb"
            )
            ml, mr = statistics.median(local_t), statistics.median(ray_t)
            print(
                f"[{label}] {pairs} pairs, {args.workers} workers: local pool {ml:.2f} s ({pairs / ml:.0f} pairs/s), "
                f"ray {mr:.2f} s ({pairs / mr:.0f} pairs/s); ray/local wall time {mr / ml:.2f}x; "
                f"same metric rows: {same}"
            )
    finally:
        cluster.shutdown()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
