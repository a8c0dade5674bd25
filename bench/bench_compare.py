"""Compare speed: `wb compare` vs `msit llm compare` (and `msprobe compare`) on the same dumps, interleaved.

The dumps (`--size`, repeatable): `620mb`, an 8-layer, 1024-hidden Llama (fp32 golden, bf16 test, vocab 8000),
384-token prompt + 3 decode steps (tokens 0-3); `1.6gb`, the same with hidden 2048 and a 512-token prompt; `4.5gb`,
hidden 3072 and an 896-token prompt (how the ratio holds as dumps grow); `files`, hidden 512 with a 64-token prompt
and 63 decode steps: 151 MB in 13,376 files a side (how it holds as the file count grows: per-file costs).
The headline pair is dumped by msit's own `register_hook` (no manifest, no hard links: the dumps users have); a
second by msprobe's own `PrecisionDebugger` (level L0, one step per token), timed against `msprobe compare` on its
first step (msprobe compares a step at a time); the last by our dumper. Each round runs wb and the peer on every
pair; prints wall time, pairs/s, MB/s and peak memory (max RSS of the process tree), the load average, and the
peer/wb wall-time ratio of the medians and per round.

    .venv/bin/python bench/bench_compare.py [--quick] [--size 620mb|1.6gb|4.5gb|files ...] [--keep DIR] [--workers N]
        [--repeat R] [--no-ours] [--no-msit] [--no-msprobe] [--ref CHECKOUT]

`--ref` names another checkout (say /work/main): its `wb compare` runs in every round next to this checkout's, on
the same dumps, so the two are compared under the same load (the two take turns going first, and every timed run,
the peer's too, starts with both dumps read once into the page cache, untimed). The timed runs are not watched:
after the rounds, one more wb run per pair prints the CPU time of each of its processes (the main process, the
forkserver and each worker), sampled from /proc every 20 ms. That sampler costs ~7 % of a core, and with it every
wb run took ~4 % longer on this 2-core machine (a bias against the shorter run): it stays out of the medians.

Besides the ratios it prints, per dump: the metric pass's speed (GB of golden + test per CPU second), and the
machine's floor: every byte read once from the page cache on all cores, plus a Python start.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DECODE_CALLS = 4  # prefill + 3 decode steps: tokens 0-3
# forward calls per size where not DECODE_CALLS: `files` is a long generation on a small model (file count grows, bytes
# do not: the per-file cost of each tool)
DECODE_CALLS_OF = {"files": 64}
WALL_TARGETS = {"620mb": 6, "1.6gb": 10}  # issue 23: msit/wb wall time, by dump size


SIZES: dict[str, tuple[dict[str, int], int]] = {
    # issue 13/23: 8 layers, hidden 1024, vocab 8000, 384-token prompt (~620 MB of msit-made dumps)
    "620mb": (
        dict(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=8000,
        ),
        384,
    ),
    # issue 23: hidden 2048, 512-token prompt (~1.6 GB)
    "1.6gb": (
        dict(
            hidden_size=2048,
            intermediate_size=5632,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=16,
            vocab_size=8000,
        ),
        512,
    ),
    # as dumps grow: hidden 3072, an 896-token prompt (~4.6 GB; the model takes ~4 GB of memory to dump)
    "4.5gb": (
        dict(
            hidden_size=3072,
            intermediate_size=8192,
            num_hidden_layers=8,
            num_attention_heads=24,
            num_key_value_heads=24,
            vocab_size=8000,
        ),
        896,
    ),
    # as the file count grows: hidden 512, a 64-token prompt and 63 decode steps (64 tokens, ~13,000 files a side)
    "files": (
        dict(
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=4000,
        ),
        64,
    ),
    "quick": (
        dict(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=4000,
        ),
        96,
    ),
}


MSPROBE_SIZES = ("620mb", "quick")  # the sizes msprobe's own dumper makes a pair at (1.41 GB at 620mb)


def model_config(size: str) -> tuple[dict[str, int], int]:
    """The benchmark model's config and prompt length for a `--size`."""
    return SIZES[size]


TEST_DTYPES = {"bfloat16": "", "float16": "_fp16"}  # the test run's dtype, and what its folders' names end with


def dump_one(base: Path, dumper: str, side: str, size: str, test_dtype: str = "bfloat16") -> None:
    """Dump one side (fp32 golden, or the test run in `test_dtype`) with `dumper` (`wb` or `msit`), in this
    process.

    msit's DumpConfig is a process-wide singleton and its hooks stay installed, so every side runs in a
    fresh process; the test side replays the golden side's tokens (saved next to the dumps).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from workbench.demo import decode

    cfg_kw, prompt_len = model_config(size)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**cfg_kw)).eval()
    if side == "test":
        model = model.to(getattr(torch, test_dtype))
    prompt = torch.randint(3, cfg_kw["vocab_size"], (1, prompt_len), generator=torch.Generator().manual_seed(1))
    token_file = base / "tokens.json"
    forced = json.loads(token_file.read_text()) if side == "test" else None
    out = base / side
    calls = DECODE_CALLS_OF.get(size, DECODE_CALLS)
    tokens = list(range(calls))
    if dumper == "msprobe":
        from bench.advisor_defects import decode_msprobe

        out.mkdir(parents=True, exist_ok=True)
        chosen = decode_msprobe(model, prompt, forced, out, steps=calls)
    elif dumper == "msit":
        import logging

        from msit_llm import DumpConfig as MsitConfig
        from msit_llm import register_hook as msit_register

        logging.getLogger("msit_logger").disabled = True
        msit_register(model, MsitConfig(dump_path=str(out), token_range=tokens))
        chosen = decode(model, prompt, calls, forced)
    else:
        from workbench.dump import DumpConfig, register_hook

        h = register_hook(model, DumpConfig(dump_path=str(out), token_range=tokens))
        try:
            chosen = decode(model, prompt, calls, forced)
        finally:
            h.remove()
    if side == "golden":
        token_file.write_text(json.dumps(chosen))


def build_dumps(base: Path, dumper: str, size: str, test_dtype: str = "bfloat16") -> tuple[Path, Path]:
    """Golden and test dumps by `dumper`, each side in a fresh process; returns their `{device}_{pid}` folders.

    When a dumper fails (msprobe saves every module's weights at every step: its 1.6gb pair fills a small disk), the
    folder is removed if this call made it, and the run ends with one line saying so and the disk's free space."""
    created = not base.exists()
    base.mkdir(parents=True, exist_ok=True)
    try:
        for side in ("golden", "test"):
            cmd = [sys.executable, __file__, "--dump-one", dumper, side, str(base), "--size", size]
            cmd += ["--test-dtype", test_dtype]
            subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    except (subprocess.CalledProcessError, OSError) as exc:
        if created:
            shutil.rmtree(base, ignore_errors=True)
        free = shutil.disk_usage(base.parent).free / 1e9
        kept = "the partial dumps were removed" if created else "the folder was there before: left as it is"
        raise SystemExit(
            f"{base}: building the {dumper}-made {size} dumps failed ({exc}); {free:.1f} GB free; {kept}"
        ) from None
    return dump_dirs(base)


def dump_dirs(base: Path) -> tuple[Path, Path]:
    """The folders the tools compare: msit's and ours `{device}_{pid}` (every token), msprobe's first step's
    `dump_tensor_data` (the prompt's forward call and every module's weights: msprobe compares one step at a time;
    the decode steps hold the weights again and one token's activations)."""
    if (base / "golden" / "msprobe_dump").exists():
        golden = next((base / "golden").glob("msprobe_dump/step0/*/dump_tensor_data"))
        test = next((base / "test").glob("msprobe_dump/step0/*/dump_tensor_data"))
        return golden, test
    golden = next((base / "golden").glob("msit_dump_*/torch_tensors/*"))
    test = next((base / "test").glob("msit_dump_*/torch_tensors/*"))
    return golden, test


def tensor_files(root: Path) -> list[Path]:
    """The tensor files below a dump folder: msit's `.pth`, msprobe's `.pt`."""
    return [*root.rglob("*.pth"), *root.rglob("*.pt")]


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
    for g in tensor_files(golden):
        t = test / g.relative_to(golden)
        if t.exists():
            best = max(best, g.stat().st_size + t.stat().st_size)
    return best / 1e6


CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def _new_cgroup() -> Path | None:
    """A cpuacct cgroup (v1) for one command: it counts every descendant, also the compare workers that a
    forkserver reaps (which rusage of the command's process never sees); None where it cannot be made."""
    for n in range(1000):
        cg = CPUACCT / f"wb_bench_{os.getpid()}_{n}"
        try:
            cg.mkdir()
            return cg
        except FileExistsError:
            continue
        except OSError:
            return None
    return None


def _drop_cgroup(cg: Path) -> None:
    for _ in range(50):  # a forkserver may outlive the command for a moment
        try:
            cg.rmdir()
            return
        except OSError:
            time.sleep(0.1)


class ProcessCpu:
    """CPU seconds (user + system) of every process below one pid, sampled from /proc every 20 ms in a thread (a
    process's last 20 ms are missed; the compare's processes live seconds)."""

    def __init__(self, pid: int) -> None:
        self.root = pid
        self.cpu: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.parents: dict[int, int] = {}
        self._stop = threading.Event()
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            stats: dict[int, tuple[int, float]] = {}
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    text = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                f = text[text.rfind(")") + 2 :].split()
                stats[int(entry)] = (int(f[1]), (int(f[11]) + int(f[12])) / self._tick)
            tree, grew = {self.root}, True
            while grew:
                grew = False
                for pid, (ppid, _cpu) in stats.items():
                    if ppid in tree and pid not in tree:
                        tree.add(pid)
                        grew = True
            for pid in tree & stats.keys():
                self.cpu[pid] = stats[pid][1]
                self.parents[pid] = stats[pid][0]
                if pid not in self.names:
                    with contextlib.suppress(OSError):
                        self.names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()

    def stop(self) -> str:
        """'main X s, forkserver Y s, workers A, B s': the wb processes by role (workers forked from the main
        process carry its command line: they are told apart by their parent)."""
        self._stop.set()
        self._thread.join()
        main = fork = 0.0
        workers: list[float] = []

        def is_wb(pid: int) -> bool:
            name = self.names.get(pid, "")
            return "workbench.cli" in name or name.rstrip().split(" ")[0].endswith("/wb") or " compare " in name

        for pid, cpu in sorted(self.cpu.items()):
            name = self.names.get(pid, "")
            if "forkserver" in name:
                if fork == 0.0 and cpu < 0.5:  # the forkserver itself; its children are the workers
                    fork = cpu
                else:
                    workers.append(cpu)
            elif is_wb(pid) and name == self.names.get(self.parents.get(pid, 0)):
                workers.append(cpu)  # forked by the main process: its command line
            elif is_wb(pid):
                main = max(main, cpu)
        return f"main {main:.2f} s, forkserver {fork:.2f} s, workers {', '.join(f'{w:.2f}' for w in workers)} s"


def run_timed(
    cmd: list[str], cwd: Path, root: Path = ROOT, *, sampled: bool = False
) -> tuple[float, float, int, str, str]:
    """Wall time, CPU time (user + system of every process the command started), peak RSS (KiB, the largest
    single process), output, and with `sampled` the CPU of each process by role (`ProcessCpu`, which takes CPU
    from the command: '' without). `root`: the checkout whose workbench runs."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cg = _new_cgroup()
    prefix = ["sh", "-c", 'echo $$ > "$0/tasks" && exec "$@"', str(cg)] if cg is not None else []
    t0 = time.perf_counter()
    child = subprocess.Popen(
        [*prefix, "/usr/bin/time", "-f", "MAXRSS_KB=%M", *cmd],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(root)},  # that checkout's workbench
    )
    sampler = ProcessCpu(child.pid) if sampled else None
    stdout, stderr = child.communicate()
    dt = time.perf_counter() - t0
    per_process = sampler.stop() if sampler is not None else ""
    proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if cg is not None:
        time.sleep(0.2)
        cpu = int((cg / "cpuacct.usage").read_text()) / 1e9
        _drop_cgroup(cg)
    out = proc.stdout + proc.stderr
    rss = 0
    for line in out.splitlines():
        if line.startswith("MAXRSS_KB="):
            rss = int(line.split("=")[1])
    if proc.returncode != 0:
        print(f"command failed ({proc.returncode}): {' '.join(cmd)}\n{out[-3000:]}")
    return dt, cpu, rss, out, per_process


def measure_floor(golden: Path, test: Path, distinct_only: bool = False) -> tuple[float, float, int]:
    """The floor of a compare on this machine: every same-place pair read once (memory-mapped, as the workers
    do) and one metric pass over it, in this process, nothing else (no process start, catalog or matching).
    `distinct_only`: only the first of the pairs whose two files hold the same bytes as an earlier pair's (a
    layer's output and the next layer's input, saved twice by msit); what a tool must compute at the least.
    Returns (wall s, CPU s, pairs); the pages are in the page cache, as for the tools."""
    from workbench.compare.judging.metrics import compare_tensors
    from workbench.formats.arrays import read_array

    pairs = [(g, test / g.relative_to(golden)) for g in sorted(tensor_files(golden))]
    pairs = [(g, t) for g, t in pairs if t.exists()]
    if distinct_only:
        seen: set[tuple[bytes, bytes]] = set()
        kept = []
        for g, t in pairs:  # full digests of the values, outside the timing
            key = (_payload_digest(g), _payload_digest(t))
            if key not in seen:
                seen.add(key)
                kept.append((g, t))
        pairs = kept
    c0, t0 = time.process_time(), time.perf_counter()
    for g, t in pairs:
        compare_tensors(read_array(g), read_array(t))
    return time.perf_counter() - t0, time.process_time() - c0, len(pairs)


def measure_pass(golden: Path, test: Path) -> float:
    """CPU seconds of the metric pass alone over every same-place pair: the files are opened, mapped and every page
    touched before the timing, so it times `compare_tensors` only (the kernels, loaded before too)."""
    import numpy as np

    from workbench.compare.judging.metrics import compare_tensors
    from workbench.formats.arrays import read_array

    pairs = [
        (read_array(g), read_array(test / g.relative_to(golden)))
        for g in sorted(tensor_files(golden))
        if (test / g.relative_to(golden)).exists()
    ]
    for g, t in pairs:  # page every byte in (a checksum the interpreter cannot skip)
        for raw in (g, t):
            np.asarray(raw.array).reshape(-1).view(np.uint8)[::4096].sum()
    compare_tensors(np.ones(4, np.float32), np.ones(4, np.float32))
    c0 = time.process_time()
    for g, t in pairs:
        compare_tensors(g, t)
    return time.process_time() - c0


def pair_bytes(golden: Path, test: Path) -> int:
    """Bytes of every same-place pair's two files (what a compare reads)."""
    total = 0
    for g in tensor_files(golden):
        t = test / g.relative_to(golden)
        if t.exists():
            total += g.stat().st_size + t.stat().st_size
    return total


def read_floor(golden: Path, test: Path, cores: int) -> float:
    """Wall seconds to read every file of both dumps once from the page cache on `cores` threads (`readinto` a
    reused buffer releases the GIL): the machine's floor for any tool that looks at every byte (best of 3)."""
    from concurrent.futures import ThreadPoolExecutor

    files = sorted([*tensor_files(golden), *tensor_files(test)], key=lambda p: -p.stat().st_size)
    shards = [files[k::cores] for k in range(cores)]

    def read_all(paths: list[Path]) -> int:
        buf = bytearray(1 << 22)
        view = memoryview(buf)
        n = 0
        for p in paths:
            with open(p, "rb", buffering=0) as f:
                while k := f.readinto(view):
                    n += k
        return n

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(cores) as ex:
            list(ex.map(read_all, shards))
        best = min(best, time.perf_counter() - t0)
    return best


def _payload_digest(path: Path) -> bytes:
    from workbench.formats.arrays import read_array

    raw = read_array(path)
    h = hashlib.blake2b(f"{raw.dtype}|{raw.shape}|".encode(), digest_size=16)
    h.update(memoryview(raw.array.reshape(-1).view("uint8")))
    return h.digest()


def stack_start() -> float:
    """Wall seconds of a Python process that imports the fixed stack's compiled cores (numpy, DuckDB, typer) and
    exits: the least any `wb` command costs before it reads a byte (median of 5)."""
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy, duckdb, typer"], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Runs:
    """Every run of both tools on one pair of dumps."""

    label: str
    golden: Path
    test: Path
    folder: Path  # where the pair is kept
    size_mb: float  # golden + test, on disk
    peer: str = "msit"  # the tool timed against wb: msit, or msprobe on msprobe-made dumps
    wb: list[tuple[float, int, int, float]] = field(default_factory=list)  # wall, peak RSS KiB, pairs, CPU s
    peer_runs: list[tuple[float, int, int, float]] = field(default_factory=list)  # msit's or msprobe's
    ref: list[tuple[float, int, int, float]] = field(default_factory=list)  # `--ref`'s wb


def run_wb(runs: Runs, out: Path, workers: int, i: int, ref: Path | None = None, *, sampled: bool = False) -> None:
    """One `wb compare` of the pair: this checkout's, or with `ref` that checkout's (kept in `runs.ref`). `sampled`:
    the run that prints each process's CPU, kept out of the medians (the sampler slows what it watches)."""
    wb = shutil.which("wb") or str(Path(sys.executable).with_name("wb"))
    shutil.rmtree(out, ignore_errors=True)
    cmd = [wb, "compare", "-gp", str(runs.golden), "-mp", str(runs.test), "-o", str(out), "--workers", str(workers)]
    t_wb, cpu_wb, rss_wb, log_wb, per_process = run_timed(cmd, out.parent, ref or ROOT, sampled=sampled)
    pairs = next((int(line.split()[2]) for line in log_wb.splitlines() if line.startswith("pairs compared:")), 0)
    if sampled:
        who = "wb" if ref is None else "wb (--ref)"
        print(
            f"[{runs.label}] {who}, one more run with each process's CPU sampled from /proc (not in the medians): "
            f"{t_wb:.2f} s, CPU {cpu_wb:.2f} s; {per_process}",
            flush=True,
        )
        return
    (runs.wb if ref is None else runs.ref).append((t_wb, rss_wb, pairs, cpu_wb))
    who = "wb compare " if ref is None else "wb (--ref) "
    print(
        f"run {i + 1} [{runs.label}]: {who}  {t_wb:6.2f} s  {pairs} pairs  {pairs / t_wb:7.1f} pairs/s  "
        f"{runs.size_mb / t_wb:6.1f} MB/s  CPU {cpu_wb:5.2f} s  peak RSS {rss_wb / 1024:.0f} MiB (workers {workers})",
        flush=True,
    )


def warm_page_cache(runs: Runs) -> None:
    """Every file of both dumps read once, untimed, before a timed run: on this VM the host reclaims page cache the
    guest has not touched for a while (a 1.77 GB pair left alone through a 10 s msit run was read back from disk
    by the next tool at ~40 MB/s: one wb run took 47.8 s), and whichever tool ran first in a round paid for it."""
    for root in (runs.golden, runs.test):
        for folder, _dirs, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError), open(os.path.join(folder, name), "rb", buffering=0) as fh:
                    while fh.read(1 << 20):
                        pass


def run_peer(runs: Runs, out: Path, exe: str, i: int) -> None:
    """One run of the pair's peer: `msit llm compare` on the dumps, or `msprobe compare` on their step folders (the
    level it takes, `-tp`/`-gp`); its report rows counted as its pairs."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if runs.peer == "msprobe":
        test_step, golden_step = runs.test.parent.parent, runs.golden.parent.parent
        cmd = [exe, "compare", "-tp", str(test_step), "-gp", str(golden_step), "-o", str(out)]
        pattern = "compare_result_*"
    else:
        cmd = [exe, "llm", "compare", "-gp", str(runs.golden), "-mp", str(runs.test), "-o", str(out)]
        pattern = "msit_cmp_report_*"
    t_peer, cpu_peer, rss_peer, _log, _per_process = run_timed(cmd, out.parent)
    reports = list(out.glob(pattern))
    pairs = count_msit_rows(reports)
    runs.peer_runs.append((t_peer, rss_peer, pairs, cpu_peer))
    print(
        f"run {i + 1} [{runs.label}]: {runs.peer} compare {t_peer:6.2f} s  {pairs} pairs  "
        f"{pairs / t_peer:7.1f} pairs/s  CPU {cpu_peer:5.2f} s  peak RSS {rss_peer / 1024:.0f} MiB  "
        f"({', '.join(r.name for r in reports) or 'no report'})",
        flush=True,
    )


def summarise(runs: Runs) -> None:
    print(f"--- {runs.label} dumps ({runs.folder.name}) ---")
    wb_med = statistics.median(r[0] for r in runs.wb)
    wb_pairs = runs.wb[0][2]
    print(
        f"wb compare:   median {wb_med:.2f} s, best {min(r[0] for r in runs.wb):.2f} s of {len(runs.wb)}: "
        f"{wb_pairs / wb_med:.1f} pairs/s (median), peak RSS {max(r[1] for r in runs.wb) / 1024:.0f} MiB"
    )
    if runs.ref:
        ref_med = statistics.median(r[0] for r in runs.ref)
        ref_cpu = statistics.median(r[3] for r in runs.ref)
        per_run = sorted(r[0] / w[0] for w, r in zip(runs.wb, runs.ref))
        print(
            f"[{runs.label}] --ref wb: median {ref_med:.2f} s, CPU {ref_cpu:.2f} s (all processes, median); this "
            f"checkout {wb_med:.2f} s, CPU {statistics.median(r[3] for r in runs.wb):.2f} s; wall ratio ref/this "
            f"{ref_med / wb_med:.2f}x (per interleaved run {', '.join(f'{r:.2f}' for r in per_run)})"
        )
    peer = runs.peer
    if not runs.peer_runs:
        print(
            f"{peer} not run (--no-msit, or not installed: pip install msit && msit install llm; pip install "
            "mindstudio-probe)"
        )
        return
    ms_med = statistics.median(r[0] for r in runs.peer_runs)
    ms_pairs = runs.peer_runs[0][2]
    print(
        f"{peer} compare: median {ms_med:.2f} s, best {min(r[0] for r in runs.peer_runs):.2f} s of "
        f"{len(runs.peer_runs)}: "
        f"{ms_pairs / ms_med:.1f} pairs/s (median), peak RSS {max(r[1] for r in runs.peer_runs) / 1024:.0f} MiB"
    )
    per_run = sorted(m[0] / w[0] for w, m in zip(runs.wb, runs.peer_runs))
    target = next((f"; target >= {x}x" for size, x in WALL_TARGETS.items() if size in runs.label), "")
    target = target if peer == "msit" else ""
    print(
        f"[{runs.label}] wall-time ratio {peer}/wb: {ms_med / wb_med:.1f}x (medians; per interleaved run "
        f"{', '.join(f'{r:.1f}' for r in per_run)}, median {statistics.median(per_run):.1f}x{target}); "
        f"wb compares {wb_pairs} pairs, {peer} {ms_pairs}"
    )
    wb_cpu, ms_cpu = statistics.median(r[3] for r in runs.wb), statistics.median(r[3] for r in runs.peer_runs)
    print(
        f"[{runs.label}] CPU-time ratio {peer}/wb (medians, all processes): {ms_cpu / wb_cpu:.1f}x "
        f"(wb {wb_cpu:.2f} s, {peer} {ms_cpu:.2f} s)"
    )
    print(f"largest tensor pair {largest_pair_mb(runs.golden, runs.test):.0f} MB")


def _of_peer(runs: Runs, ms_wall: float | None, wall: float) -> str:
    """' = msit/N' (or msprobe) for a wall time, or nothing when the peer was not timed."""
    return "" if ms_wall is None else f" = {runs.peer}/{ms_wall / wall:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="a small model, for a smoke run (= --size quick)")
    ap.add_argument(
        "--size", action="append", choices=sorted(SIZES), help="dump size(s) to measure (default 620mb; repeatable)"
    )
    ap.add_argument("--keep", type=Path, help="keep (or reuse) the dumps in this folder")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved runs of each tool (medians are reported)")
    ap.add_argument("--no-ours", action="store_true", help="measure msit-made dumps only")
    ap.add_argument("--no-msit", action="store_true", help="do not time msit (its dumps are still used)")
    ap.add_argument(
        "--no-msprobe", action="store_true", help="no msprobe-made pair (msprobe's own dumper and `msprobe compare`)"
    )
    ap.add_argument("--ref", type=Path, help="another checkout whose wb runs in every round too (e.g. /work/main)")
    ap.add_argument(
        "--test-dtype",
        choices=sorted(TEST_DTYPES),
        default="bfloat16",
        help="the test run's dtype against the fp32 golden (default bfloat16; float16 pairs live in *_fp16 folders)",
    )
    ap.add_argument("--dump-one", nargs=3, metavar=("DUMPER", "SIDE", "BASE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dump_one:
        dumper, side, base_dir = args.dump_one
        dump_one(Path(base_dir), dumper, side, (args.size or ["620mb"])[0], args.test_dtype)
        return
    sizes = ["quick"] if args.quick else (args.size or ["620mb"])
    base = args.keep or Path(tempfile.mkdtemp(prefix="wb_bench_compare_"))
    base.mkdir(parents=True, exist_ok=True)
    msit = shutil.which("msit") or str(Path(sys.executable).with_name("msit"))
    can_dump_msit = Path(msit).exists()
    has_msit = can_dump_msit and not args.no_msit
    msprobe = shutil.which("msprobe") or str(Path(sys.executable).with_name("msprobe"))
    has_msprobe = Path(msprobe).exists() and not args.no_msprobe
    dumpers = (
        (["msit"] if can_dump_msit else []) + (["msprobe"] if has_msprobe else []) + ([] if args.no_ours else ["wb"])
    )
    all_runs: list[Runs] = []
    for size, dumper in [(z, d) for z in sizes for d in dumpers]:
        if dumper == "msprobe" and size not in MSPROBE_SIZES:
            # msprobe saves every module's weights at every step: its pair of a larger model fills a small disk
            print(f"msprobe-made {size} pair skipped (msprobe's own pairs are made at {' and '.join(MSPROBE_SIZES)})")
            continue
        # 620mb keeps the folder name earlier runs used, so a --keep folder is reused
        ending = TEST_DTYPES[args.test_dtype]
        where = base / (f"{dumper}_made{ending}" if size in ("620mb", "quick") else f"{dumper}_made_{size}{ending}")
        if not (where / "test").exists():
            t0 = time.perf_counter()
            build_dumps(where, dumper, size, args.test_dtype)
            print(f"{dumper}-made dumps ({size}, test {args.test_dtype}) built in {time.perf_counter() - t0:.1f} s")
        golden, test = dump_dirs(where)
        size_mb = (du(golden) + du(test)) / 1e6
        n_files = len(tensor_files(golden))
        print(
            f"{dumper}-made dumps: {size_mb:.0f} MB (golden {du(golden) / 1e6:.0f} MB, test {du(test) / 1e6:.0f} MB), "
            f"{n_files} golden files"
        )
        peer = "msprobe" if dumper == "msprobe" else "msit"
        label = f"{dumper}-made {size}" + (f" {args.test_dtype}" if ending else "")
        all_runs.append(Runs(label, golden, test, where, size_mb, peer))
    for checkout in [ROOT, *([args.ref] if args.ref else [])]:
        # the byte code of each timed checkout, written now: under PYTHONDONTWRITEBYTECODE (set on some machines)
        # every wb run would compile workbench's sources again (~0.3 s of the main process), which users never pay
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(checkout) / "workbench")], check=True)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for i in range(args.repeat):  # interleaved, so both tools see the same machine load
        for runs in all_runs:
            # this checkout and `--ref` take turns going first; every timed run starts with both dumps in the page
            # cache (`warm_page_cache`)
            order: list[Path | None] = [None] + ([args.ref.resolve()] if args.ref is not None else [])
            for ref in order if i % 2 == 0 else order[::-1]:
                warm_page_cache(runs)
                run_wb(runs, base / "out_wb", args.workers, i, ref)
            warm_page_cache(runs)
            if runs.peer == "msprobe":
                run_peer(runs, base / "out_msprobe", msprobe, i)
            elif has_msit:
                run_peer(runs, base / "out_msit", msit, i)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for runs in all_runs:
        warm_page_cache(runs)
        run_wb(runs, base / "out_wb", args.workers, args.repeat, sampled=True)
        if args.ref is not None:
            warm_page_cache(runs)
            run_wb(runs, base / "out_wb", args.workers, args.repeat, args.ref.resolve(), sampled=True)
    start = stack_start()
    cores = max(1, min(args.workers, os.cpu_count() or 1))
    for runs in all_runs:
        summarise(runs)
        wb_wall = statistics.median(r[0] for r in runs.wb)
        wb_cpu = statistics.median(r[3] for r in runs.wb)
        rounds = [(d, measure_floor(runs.golden, runs.test, d)) for _ in range(3) for d in (False, True)]  # alternated
        for distinct in (False, True):
            wall, cpu, n = min((f for d, f in rounds if d == distinct), key=lambda f: f[1])
            what = "distinct-content pairs" if distinct else "pairs"
            print(
                f"[{runs.label}] floor (read each of {n} {what} once + one metric pass, one process, best of 3): "
                f"{wall:.2f} s wall, {cpu:.2f} s CPU; wb uses {wb_cpu / cpu:.1f}x the floor's CPU, "
                f"{wb_wall / (cpu / cores):.1f}x its wall time on {cores} idle cores"
            )
        floor_wall = start + cpu / cores
        ms_wall = statistics.median(r[0] for r in runs.peer_runs) if runs.peer_runs else None
        print(
            f"[{runs.label}] start of a Python process importing numpy, DuckDB and typer: {start:.2f} s; "
            f"with the distinct-content metric pass on {cores} cores: {floor_wall:.2f} s, the least wall time "
            f"of a compare in this stack{_of_peer(runs, ms_wall, floor_wall)}; wb is {wb_wall / floor_wall:.1f}x it"
        )
        _wall, all_cpu, _n = min((f for d, f in rounds if not d), key=lambda f: f[1])
        gb = pair_bytes(runs.golden, runs.test) / 1e9
        print(
            f"[{runs.label}] read + metric pass: {gb:.2f} GB of pairs in {all_cpu:.2f} s of CPU = {gb / all_cpu:.2f} "
            f"GB/s per core (golden + test bytes, read from the page cache, each file opened and mapped)"
        )
        pass_cpu = min(measure_pass(runs.golden, runs.test) for _ in range(3))
        print(
            f"[{runs.label}] metric pass alone (the pairs mapped and their pages touched first, best of 3): {gb:.2f} "
            f"GB in {pass_cpu:.2f} s of CPU = {gb / pass_cpu:.2f} GB/s per core (issue 23's target: 2)"
        )
        rd = read_floor(runs.golden, runs.test, cores)
        print(
            f"[{runs.label}] machine floor: every byte read once from the page cache on {cores} cores {rd:.2f} s "
            f"({gb / rd:.1f} GB/s) + a Python start {start:.2f} s = {rd + start:.2f} s"
            f"{_of_peer(runs, ms_wall, rd + start)}; wb is {wb_wall / (rd + start):.1f}x it"
        )
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
