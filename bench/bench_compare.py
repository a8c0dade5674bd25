"""Compare throughput: `wb compare` vs `msit llm compare` on the same pair of dumps, in one run.

The dumps: an 8-layer, 1024-hidden Llama (fp32 golden, bf16 test), 384-token prompt, 4 decoded
tokens, dumped by our dumper in msit's layout (about 600 MB together). Prints wall time, pairs/s,
MB/s and peak memory (max RSS of the child process) of both tools over interleaved runs, and the ratio of
the medians.

    .venv/bin/python bench/bench_compare.py [--quick] [--keep DIR] [--workers N] [--repeat R]
"""

from __future__ import annotations

import argparse
import copy
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_dumps(base: Path, quick: bool) -> tuple[Path, Path]:
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.demo import decode
    from workbench.dump import DumpConfig, register_hook

    if quick:
        cfg = LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=4000,
        )
        prompt_len = 96
    else:
        cfg = LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=32000,
        )
        prompt_len = 384
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    prompt = torch.randint(3, cfg.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(1))
    roots = []
    tokens = None
    for name, m in (("golden", model), ("test", copy.deepcopy(model).to(torch.bfloat16))):
        h = register_hook(m, DumpConfig(dump_path=str(base / name), token_range=list(range(4))))
        try:
            tokens = decode(m, prompt, 4, tokens if name == "test" else None)
        finally:
            h.remove()
        torch_dir = next((base / name).glob("msit_dump_*/torch_tensors/*"))
        roots.append(torch_dir)
    return roots[0], roots[1]


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def count_msit_rows(reports: list[Path]) -> int:
    """Rows msit compared (every sheet of its xlsx, or its CSV)."""
    import pandas as pd

    n = 0
    for r in reports:
        if r.suffix == ".xlsx":
            n += sum(len(df) for df in pd.read_excel(r, sheet_name=None).values())
        elif r.suffix == ".csv":
            n += len(pd.read_csv(r))
    return n


def largest_pair_mb(golden: Path, test: Path) -> float:
    """Size of the largest golden file plus its test counterpart (the memory bound per worker)."""
    best = 0
    for g in golden.rglob("*.pth"):
        t = test / g.relative_to(golden)
        if t.exists():
            best = max(best, g.stat().st_size + t.stat().st_size)
    return best / 1e6


def run_timed(cmd: list[str], cwd: Path) -> tuple[float, int, str]:
    """Wall time, peak RSS (KiB) of the command's process tree, output tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "MAXRSS_KB=%M", *cmd],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    dt = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    rss = max(before, 0)
    for line in out.splitlines():
        if line.startswith("MAXRSS_KB="):
            rss = int(line.split("=")[1])
    if proc.returncode != 0:
        print(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    return dt, rss, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small model, for a smoke run")
    ap.add_argument("--keep", type=Path, help="keep (or reuse) the dumps in this folder")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved runs of each tool (medians are reported)")
    args = ap.parse_args()
    base = args.keep or Path(tempfile.mkdtemp(prefix="wb_bench_compare_"))
    base.mkdir(parents=True, exist_ok=True)
    if not (base / "golden").exists():
        t0 = time.perf_counter()
        golden, test = build_dumps(base, args.quick)
        print(f"dumps built in {time.perf_counter() - t0:.1f} s")
    else:
        golden = next((base / "golden").glob("msit_dump_*/torch_tensors/*"))
        test = next((base / "test").glob("msit_dump_*/torch_tensors/*"))
    size_mb = (du(golden) + du(test)) / 1e6
    print(f"dump size: {size_mb:.0f} MB (golden {du(golden) / 1e6:.0f} MB, test {du(test) / 1e6:.0f} MB)")

    wb = shutil.which("wb") or str(Path(sys.executable).with_name("wb"))
    msit = shutil.which("msit") or str(Path(sys.executable).with_name("msit"))
    has_msit = Path(msit).exists()
    out_wb, out_msit = base / "out_wb", base / "out_msit"
    wb_runs: list[tuple[float, int, int]] = []  # wall, peak RSS KiB, pairs
    msit_runs: list[tuple[float, int, int]] = []
    for i in range(args.repeat):  # interleaved, so both tools see the same machine load
        shutil.rmtree(out_wb, ignore_errors=True)
        t_wb, rss_wb, log_wb = run_timed(
            [wb, "compare", "-gp", str(golden), "-mp", str(test), "-o", str(out_wb), "--workers", str(args.workers)],
            base,
        )
        pairs = next((int(line.split()[2]) for line in log_wb.splitlines() if line.startswith("pairs compared:")), 0)
        wb_runs.append((t_wb, rss_wb, pairs))
        print(
            f"run {i + 1}: wb compare   {t_wb:6.2f} s  {pairs} pairs  {pairs / t_wb:7.1f} pairs/s  "
            f"{size_mb / t_wb:6.1f} MB/s  peak RSS {rss_wb / 1024:.0f} MiB (workers {args.workers})"
        )
        if not has_msit:
            continue
        shutil.rmtree(out_msit, ignore_errors=True)
        out_msit.mkdir()
        t_ms, rss_ms, _log = run_timed(
            [msit, "llm", "compare", "-gp", str(golden), "-mp", str(test), "-o", str(out_msit)], base
        )
        reports = list(out_msit.glob("msit_cmp_report_*"))
        msit_pairs = count_msit_rows(reports)
        msit_runs.append((t_ms, rss_ms, msit_pairs))
        print(
            f"run {i + 1}: msit compare {t_ms:6.2f} s  {msit_pairs} pairs  {msit_pairs / t_ms:7.1f} pairs/s  "
            f"peak RSS {rss_ms / 1024:.0f} MiB  ({', '.join(r.name for r in reports) or 'no report'})"
        )
    wb_med = statistics.median(r[0] for r in wb_runs)
    wb_pairs = wb_runs[0][2]
    print(
        f"wb compare:   median {wb_med:.2f} s, best {min(r[0] for r in wb_runs):.2f} s of {len(wb_runs)}: "
        f"{wb_pairs / wb_med:.1f} pairs/s (median)"
    )
    if not msit_runs:
        print("msit not installed (pip install msit && msit install llm): no reference measured")
    else:
        ms_med = statistics.median(r[0] for r in msit_runs)
        ms_pairs = msit_runs[0][2]
        print(
            f"msit compare: median {ms_med:.2f} s, best {min(r[0] for r in msit_runs):.2f} s of {len(msit_runs)}: "
            f"{ms_pairs / ms_med:.1f} pairs/s (median)"
        )
        print(
            f"wall-time ratio msit/wb (medians): {ms_med / wb_med:.1f}x (wb compares {wb_pairs} pairs, msit {ms_pairs})"
        )
        if ms_pairs:
            ratios = sorted((w[2] / w[0]) / (m[2] / m[0]) for w, m in zip(wb_runs, msit_runs))
            print(
                f"throughput ratio wb/msit (pairs/s, medians): {(wb_pairs / wb_med) / (ms_pairs / ms_med):.1f}x "
                f"(per interleaved run: {', '.join(f'{r:.1f}' for r in ratios)}; target >= 10x)"
            )
        print(
            f"peak memory: wb {max(r[1] for r in wb_runs) / 1024:.0f} MiB, msit "
            f"{max(r[1] for r in msit_runs) / 1024:.0f} MiB; "
            f"largest tensor pair {largest_pair_mb(golden, test):.0f} MB"
        )
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
