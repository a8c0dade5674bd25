"""Compare speed on TorchAir dumps (GE test against FX golden) next to the msit-dump compare, interleaved.

The TorchAir pair: `bench_compare`'s model (`--quick`: its small one) compiled with `torch.compile`, the golden
side dumped by our FX dumper in fp32, the test side by the TorchAir-like GE writer in bf16 (one fusion per MLP,
no defect), tokens 0-3, each a full forward over the prompt and the tokens so far. The reference pair: the same
model dumped by msit's own `register_hook` (bench_compare's headline dumps), when msit is installed; else our
torch dumper's. Each round runs `wb compare` on both pairs; prints wall time, pairs/s, MB/s, CPU and peak RSS
per run, and the medians with the TorchAir/msit-dump ratio of pairs/s.

    .venv/bin/python bench/bench_torchair.py [--quick] [--keep DIR] [--repeat R] [--workers N]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import Runs, build_dumps, du, model_config, run_wb  # noqa: E402

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
    seqs = []
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick",
        action="store_true",
        help="bench_compare's small model (the default model's FX "
        "dump, weights saved as mm inputs at every token, is several GB)",
    )
    ap.add_argument("--keep", type=Path, help="build the dumps here (reused when present)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
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
        subprocess.run(cmd, check=True, cwd=ROOT)
    ref_base = base / "msit"
    try:
        ref = build_dumps(ref_base, "msit", size) if not (ref_base / "test").is_dir() else None
    except subprocess.CalledProcessError:
        ref = None
    if ref is None and not (ref_base / "test").is_dir():
        ref_base = base / "wb"
        ref = build_dumps(ref_base, "wb", size)
    from bench_compare import dump_dirs

    ref_golden, ref_test = ref or dump_dirs(ref_base)
    pairs = [
        Runs("torchair GE/FX", ta / "golden", ta / "test"),
        Runs(f"{ref_base.name}-made torch", ref_golden, ref_test),
    ]
    sizes = {r.label: (du(r.golden) + du(r.test)) / 2**20 for r in pairs}
    for r in pairs:
        print(f"{r.label}: {r.golden} + {r.test}, {sizes[r.label]:.0f} MB")
    for i in range(args.repeat):
        for r in pairs:
            run_wb(r, base / f"out_{r.label.split()[0]}", args.workers, sizes[r.label], i)
    rates = {}
    for r in pairs:
        walls = [w for w, _rss, _n, _cpu in r.wb]
        n = r.wb[0][2] if r.wb else 0
        med = statistics.median(walls)
        rates[r.label] = n / med if med else 0.0
        mb_s = sizes[r.label] / med if med else 0.0
        print(f"{r.label}: median {med:.2f} s, {n} pairs, {rates[r.label]:.0f} pairs/s, {mb_s:.0f} MB/s")
    first, second = (rates[r.label] for r in pairs)
    if second:
        print(f"pairs/s, TorchAir GE/FX over the {pairs[1].label} dumps: {first / second:.2f}x")
    if args.keep is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
