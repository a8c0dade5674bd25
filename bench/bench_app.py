"""Speed of the workbench app on a catalog of >= 1,000,000 compared pairs (issue 3 "Speed").

    python bench/bench_app.py [--catalog PATH] [--moves 40]

Measures, each in the same run:
* first paint: from process start (a fresh interpreter) to the main screen showing the heatmap
  and both trees, on the big catalog and on a tiny one (the reference: size must not matter);
* the CPU time those processes used up to the first paint (user + system, every thread): on a loaded machine
  the wall time waits for other jobs, the CPU time does not;
* peak memory (RSS) of those two processes (must not grow with the catalog);
* heatmap cursor move (same token) and token change (heatmap + both trees recoloured), in a
  headless app, key press to repainted screen, median and p95.
Targets: first paint <= 1.5 s, each repaint <= 50 ms. Prints figures and ratios to the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
FIRST_PAINT_TARGET = 1.5
REPAINT_TARGET_MS = 50.0


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM; ru_maxrss would carry the parent's peak across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_first_paint(catalog: str, started: float) -> None:
    """Run in a fresh process: open the app headless, report the first paint time and peak RSS."""
    from workbench.app.launch import make_app
    from workbench.app.main_screen import MainScreen

    app = make_app(catalog=Path(catalog))
    result: dict[str, float] = {}

    async def auto(pilot) -> None:  # type: ignore[no-untyped-def]
        while True:
            await pilot.pause(0.005)
            screen = app.screen
            if isinstance(screen, MainScreen) and screen.first_paint_at is not None:
                result["first_paint_s"] = time.time() - started
                result["rss_mb"] = peak_rss_mb()
                usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread's CPU: the workers' queries too
                result["cpu_s"] = usage.ru_utime + usage.ru_stime
                app.exit(0)
                return

    app.run(headless=True, auto_pilot=auto, size=(160, 48))
    print(json.dumps(result))


def first_paint(catalog: Path) -> dict[str, float]:
    started = time.time()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(catalog), str(started)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("{")), None)
    if line is None:
        raise SystemExit(f"child failed: {out.stderr[-2000:]}")
    return json.loads(line)


async def repaints(catalog: Path, moves: int) -> dict[str, list[float]]:
    """Key press -> the first screen update that shows the result, for cursor moves and token changes.

    The screen's compositor refresh is wrapped (here, in the bench only) to timestamp every update
    with the state it painted, so the harness's own waiting does not count.
    """
    from workbench.app.heatmap import HeatmapView
    from workbench.app.launch import make_app
    from workbench.app.main_screen import MainScreen

    app = make_app(catalog=catalog)
    times: dict[str, list[float]] = {"cursor": [], "token": []}
    async with app.run_test(size=(160, 48)) as pilot:
        while not (isinstance(app.screen, MainScreen) and app.screen.first_paint_at):
            await pilot.pause(0.01)
        screen = app.screen
        assert isinstance(screen, MainScreen)
        await app.workers.wait_for_complete()
        heat = screen.query_one(HeatmapView)
        painted: list[tuple[float, tuple[int, int], int | None]] = []
        original = screen._compositor_refresh

        def stamped() -> None:
            original()
            painted.append((time.perf_counter(), heat.cursor, screen.status_token))

        screen._compositor_refresh = stamped  # type: ignore[method-assign]

        async def first_paint_after(t0: float, cond) -> float:  # type: ignore[no-untyped-def]
            while True:
                hit = next((t for t, cur, tok in painted if t >= t0 and cond(cur, tok)), None)
                if hit is not None:
                    return (hit - t0) * 1000
                await asyncio.sleep(0.001)

        for i in range(moves):
            row = heat.cursor[0] + (1 if i % 2 == 0 else -1)
            painted.clear()
            t0 = time.perf_counter()
            await pilot.press("down" if i % 2 == 0 else "up")
            times["cursor"].append(await first_paint_after(t0, lambda cur, tok, row=row: cur[0] == row))
        for i in range(moves):
            col = heat.cursor[1] + (1 if i % 2 == 0 else -1)
            token = heat.data.tokens[col] if heat.data else None
            painted.clear()
            t0 = time.perf_counter()
            await pilot.press("right" if i % 2 == 0 else "left")
            times["token"].append(
                await first_paint_after(t0, lambda cur, tok, col=col, token=token: cur[1] == col and tok == token)
            )
            await pilot.pause()
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--catalog", type=Path, default=Path(tempfile.gettempdir()) / "wb_bench_big.duckdb")
    ap.add_argument("--moves", type=int, default=40)
    ap.add_argument("--child", nargs=2, metavar=("CATALOG", "STARTED"))
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    if args.child:
        child_first_paint(args.child[0], float(args.child[1]))
        return
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_big_catalog", REPO / "bench" / "make_big_catalog.py")
    assert spec and spec.loader
    mk = importlib.util.module_from_spec(spec)
    sys.modules["make_big_catalog"] = mk
    spec.loader.exec_module(mk)
    big = args.catalog
    if not big.exists():
        t = time.perf_counter()
        plan = mk.make_catalog(big)
        print(f"built {big}: {plan.pairs:,} pairs in {time.perf_counter() - t:.1f} s")
    import duckdb

    con = duckdb.connect(str(big), read_only=True)
    n_pairs = con.execute("SELECT count(*) FROM matches").fetchone()[0]  # type: ignore[index]
    con.close()
    tiny = big.with_name(f"{big.stem}_tiny.duckdb")  # next to the big one: two benches at once do not share it
    mk.make_catalog(tiny, layers=2, ops=12, tokens=4)

    fp_big = [first_paint(big) for _ in range(3)]
    fp_tiny = [first_paint(tiny) for _ in range(3)]
    best_big = min(r["first_paint_s"] for r in fp_big)
    best_tiny = min(r["first_paint_s"] for r in fp_tiny)
    cpu_big = min(r["cpu_s"] for r in fp_big)
    cpu_tiny = min(r["cpu_s"] for r in fp_tiny)
    rss_big = max(r["rss_mb"] for r in fp_big)
    rss_tiny = max(r["rss_mb"] for r in fp_tiny)
    times = asyncio.run(repaints(big, args.moves))
    ref = asyncio.run(repaints(tiny, args.moves))  # reference: the same moves on a tiny catalog

    def stats(xs: list[float]) -> tuple[float, float]:
        xs = sorted(xs)
        return statistics.median(xs), xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]

    cur_med, cur_p95 = stats(times["cursor"])
    tok_med, tok_p95 = stats(times["token"])
    ref_cur, _ = stats(ref["cursor"])
    ref_tok, _ = stats(ref["token"])
    print(f"catalog: {big} ({n_pairs:,} compared pairs, {big.stat().st_size / 2**20:.0f} MiB)")
    runs = ", ".join(f"{r['first_paint_s']:.2f}" for r in fp_big)
    print(
        f"first paint, big catalog:   {best_big:.2f} s (best of 3; runs {runs})  target {FIRST_PAINT_TARGET} s  "
        f"ratio {best_big / FIRST_PAINT_TARGET:.2f}"
    )
    print(f"first paint, tiny catalog:  {best_tiny:.2f} s   big/tiny ratio {best_big / best_tiny:.2f}")
    print(f"CPU time to first paint (least of 3): big {cpu_big:.2f} s, tiny {cpu_tiny:.2f} s")
    print(f"peak RSS: big {rss_big:.0f} MiB, tiny {rss_tiny:.0f} MiB   big/tiny ratio {rss_big / rss_tiny:.2f}")
    print(
        f"cursor move -> repainted: median {cur_med:.1f} ms, p95 {cur_p95:.1f} ms  "
        f"target {REPAINT_TARGET_MS:.0f} ms  p95 ratio {cur_p95 / REPAINT_TARGET_MS:.2f}  "
        f"(tiny catalog median {ref_cur:.1f} ms, big/tiny {cur_med / ref_cur:.2f})"
    )
    print(
        f"token change -> heatmap and both trees repainted: median {tok_med:.1f} ms, p95 {tok_p95:.1f} ms  "
        f"target {REPAINT_TARGET_MS:.0f} ms  p95 ratio {tok_p95 / REPAINT_TARGET_MS:.2f}  "
        f"(tiny catalog median {ref_tok:.1f} ms, big/tiny {tok_med / ref_tok:.2f})"
    )
    print(
        f"load average while measuring: {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, "
        f"on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
