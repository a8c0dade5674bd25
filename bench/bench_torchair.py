"""Compare speed on TorchAir dumps (GE test against FX golden) next to the msit-dump compare, interleaved.

The TorchAir pair: `bench_compare`'s model (`--quick`: its small one) compiled with `torch.compile`, the golden
side dumped by our FX dumper in fp32, the test side by the TorchAir-like GE writer in bf16 (one fusion per MLP,
no defect), tokens 0-3, each a full forward over the prompt and the tokens so far. The reference pair: the same
model dumped by msit's own `register_hook` (bench_compare's headline dumps), when msit is installed; else our
torch dumper's. Each round runs `wb compare` on both pairs, one after the other; per run it prints wall time,
pairs/s, MB/s (bytes of the files compared, a hard-linked file counted at each of its names), the CPU of the
main process and of the workers (the machine may be shared: CPU time is the figure to compare), CPU per pair and
per MB, and peak RSS; then the medians and the TorchAir/msit-dump ratios.

msit itself is not timed on the TorchAir pair: `msit llm compare` (msit 8.x, `msit_llm/compare/torchair_acc_cmp.py`)
starts its GE/FX compare with `set_msaccucmp_path_from_cann()` (`components/utils/acc_cmp.py`), which raises
`OSError: CANN toolkit in not installed or not set` unless `TOOLCHAIN_HOME`/`ASCEND_TOOLKIT_HOME` names a CANN
toolkit holding `tools/operator_cmp/compare`: msit parses every GE dump file with that toolkit's msaccucmp
(`dump_parse.dump_utils.parse_dump_file`, `conversion.tensor_conversion`), which is not on PyPI. No NPU call is
involved, but without CANN msit compares no TorchAir dump at all; the bench runs it once and prints its error.

    .venv/bin/python bench/bench_torchair.py [--quick] [--ref-size 620mb] [--keep DIR] [--repeat R] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import _drop_cgroup, _new_cgroup, build_dumps, du, dump_dirs, model_config  # noqa: E402

TOKENS = 4


def dump_torchair(base: Path, size: str) -> tuple[Path, Path]:
    """FX golden (fp32) and GE test (bf16) of the bench model; returns the two dump folders."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.backends.torchair import GeDumper
    from workbench.dump.fx import FxDumper

    cfg, prompt_len = model_config(size)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg, max_position_embeddings=1024, tie_word_embeddings=False)).eval()
    prompt = torch.randint(3, cfg["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(1))
    seqs: list[torch.Tensor] = []
    for side, dumper in (("golden", FxDumper(base / "golden")), ("test", GeDumper(base / "test"))):
        compiled = torch.compile(model, backend=dumper, dynamic=False)
        seq = prompt
        with torch.no_grad():
            for step in range(TOKENS):
                seq = seqs[step] if side == "test" else seq
                if side == "golden":
                    seqs.append(seq)
                dumper.step([int(i) for i in seq[0]])
                nxt = int(compiled(input_ids=seq, use_cache=False).logits[0, -1].argmax())
                seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
        torch._dynamo.reset()
    return base / "golden", base / "test"


@dataclass
class Run:
    wall: float
    cpu: float  # every process of the command (a cpuacct cgroup; rusage when none can be made)
    main_cpu: float  # the `wb` process itself (rusage: the workers a forkserver reaps are not in it)
    rss_kib: int
    pairs: int


@dataclass
class Pair:
    label: str
    golden: Path
    test: Path
    mb: float = 0.0
    runs: list[Run] = field(default_factory=list)

    def med(self, attr: str) -> float:
        return statistics.median(getattr(r, attr) for r in self.runs)


def run_wb(pair: Pair, out: Path, workers: int) -> Run:
    """One `wb compare` of `pair` from a cold process: wall, CPU (all processes and the main one), peak RSS."""
    wb = shutil.which("wb") or str(Path(sys.executable).with_name("wb"))
    shutil.rmtree(out, ignore_errors=True)
    cmd = [wb, "compare", "-gp", str(pair.golden), "-mp", str(pair.test), "-o", str(out), "--workers", str(workers)]
    cg = _new_cgroup()
    prefix = ["sh", "-c", 'echo $$ > "$0/tasks" && exec "$@"', str(cg)] if cg is not None else []
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*prefix, "/usr/bin/time", "-f", "MAXRSS_KB=%M MAIN_CPU=%U+%S", *cmd],
        cwd=out.parent,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},  # this checkout's workbench
    )
    wall = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode not in (0, 1):
        print(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{log[-3000:]}")
    rss, main_cpu = 0, 0.0
    for line in log.splitlines():
        if line.startswith("MAXRSS_KB="):
            kb, cpu = line.split()
            rss = int(kb.split("=")[1])
            main_cpu = sum(float(x) for x in cpu.split("=")[1].split("+"))
    cpu = main_cpu
    if cg is not None:
        time.sleep(0.2)
        cpu = int((cg / "cpuacct.usage").read_text()) / 1e9
        _drop_cgroup(cg)
    pairs = next((int(ln.split()[2]) for ln in log.splitlines() if ln.startswith("pairs compared:")), 0)
    return Run(wall, cpu, main_cpu, rss, pairs)


def show(i: int, pair: Pair, r: Run) -> None:
    print(
        f"run {i + 1} [{pair.label}]: {r.wall:6.2f} s  {r.pairs} pairs  {r.pairs / r.wall:6.1f} pairs/s  "
        f"{pair.mb / r.wall:6.1f} MB/s  CPU {r.cpu:5.2f} s "
        f"(main {r.main_cpu:4.2f}, workers {r.cpu - r.main_cpu:4.2f})  "
        f"{r.cpu / max(r.pairs, 1) * 1e3:5.2f} ms/pair  {r.cpu / pair.mb * 1e3:5.1f} ms/MB  "
        f"peak RSS {r.rss_kib / 1024:.0f} MiB",
        flush=True,
    )


def try_msit(pair: Pair, out: Path) -> None:
    """Run msit's own compare once on the TorchAir pair and say what became of it."""
    msit = shutil.which("msit") or str(Path(sys.executable).with_name("msit"))
    if not Path(msit).exists():
        print("msit not installed: msit's TorchAir compare not tried")
        return
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ge = pair.test / "msit_ge_dump"
    cmd = [msit, "llm", "compare", "-gp", str(pair.golden / "msit_fx_dump"), "-mp", str(ge), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=out)
    reports = sorted(out.rglob("*.csv"))
    errors = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if "Error" in ln or "error" in ln]
    if reports:
        print(f"msit llm compare on the TorchAir pair wrote {', '.join(r.name for r in reports)}: time it too")
    else:
        print(f"msit llm compare on the TorchAir pair: no report ({errors[0] if errors else proc.returncode})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick",
        action="store_true",
        help="bench_compare's small model (the default model's FX "
        "dump, every node's inputs and outputs at every token, is several GB)",
    )
    ap.add_argument("--keep", type=Path, help="build the dumps here (reused when present)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--ref-size",
        choices=["quick", "620mb", "1.6gb"],
        help="bench_compare --size of the msit-made reference pair (default: the TorchAir model's; with --quick, "
        "620mb gives a reference of about the TorchAir pair's bytes)",
    )
    ap.add_argument("--dump-torchair", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    size = "quick" if args.quick else "620mb"
    if args.dump_torchair is not None:  # a fresh process per build: the compiled graphs and caches go with it
        dump_torchair(args.dump_torchair, size)
        return
    base = args.keep or Path(tempfile.mkdtemp(prefix="wb_bench_torchair_"))
    ta = base / "torchair"
    if not (ta / "test").is_dir():
        cmd = [sys.executable, __file__, "--dump-torchair", str(ta)] + (["--quick"] if args.quick else [])
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(f"TorchAir dumps built in {time.perf_counter() - t0:.0f} s")
    ref_size = args.ref_size or size
    suffix = "" if ref_size == size else f"_{ref_size}"
    ref_base = base / f"msit{suffix}"
    if not (ref_base / "test").is_dir():
        try:
            build_dumps(ref_base, "msit", ref_size)
        except subprocess.CalledProcessError:
            ref_base = base / f"wb{suffix}"
            if not (ref_base / "test").is_dir():
                build_dumps(ref_base, "wb", ref_size)
    ref_golden, ref_test = dump_dirs(ref_base)
    pairs = [
        Pair("torchair GE/FX", ta / "golden", ta / "test"),
        Pair(f"{ref_base.name.split('_')[0]}-made torch {ref_size}", ref_golden, ref_test),
    ]
    for p in pairs:
        p.mb = (du(p.golden) + du(p.test)) / 1e6
        found = [f.stat() for f in [*p.golden.rglob("*"), *p.test.rglob("*")] if f.is_file()]
        disk = sum({(st.st_dev, st.st_ino): st.st_size for st in found}.values()) / 1e6  # a hard link once
        print(f"{p.label}: {p.golden} + {p.test}: {len(found)} files, {p.mb:.0f} MB ({disk:.0f} MB on disk)")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for i in range(args.repeat):  # alternated, so both pairs see the same machine load
        for p in pairs:
            p.runs.append(run_wb(p, base / f"out_{p.label.split()[0]}", args.workers))
            show(i, p, p.runs[-1])
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for p in pairs:
        n = p.runs[0].pairs
        wall, cpu, main_cpu = p.med("wall"), p.med("cpu"), p.med("main_cpu")
        print(
            f"{p.label}: medians {wall:.2f} s wall, {n} pairs, {n / wall:.0f} pairs/s, {p.mb / wall:.0f} MB/s; "
            f"CPU {cpu:.2f} s (main {main_cpu:.2f}, workers {cpu - main_cpu:.2f}), {cpu / n * 1e3:.2f} ms/pair, "
            f"{cpu / p.mb * 1e3:.1f} ms/MB; peak RSS {max(r.rss_kib for r in p.runs) / 1024:.0f} MiB"
        )
    ta_p, ref = pairs
    per_run = [(a.pairs / a.wall) / (b.pairs / b.wall) for a, b in zip(ta_p.runs, ref.runs)]
    per_cpu = [(a.pairs / a.cpu) / (b.pairs / b.cpu) for a, b in zip(ta_p.runs, ref.runs)]
    print(
        f"TorchAir GE/FX over the {ref.label} dumps: pairs/s {statistics.median(per_run):.2f}x (per round "
        f"{', '.join(f'{x:.2f}' for x in per_run)}); pairs per CPU second {statistics.median(per_cpu):.2f}x "
        f"(per round {', '.join(f'{x:.2f}' for x in per_cpu)})"
    )
    try_msit(ta_p, base / "out_msit")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
