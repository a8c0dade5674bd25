"""A 2-rank tensor-parallel toy decoder dumped by msit's own `register_hook`, one process per rank (gloo).

Each layer: RMSNorm, column-parallel up projection (each rank holds half the rows), SiLU, row-parallel down
projection (half the columns) and an `AllReduce` module that sums the ranks' partial outputs, as Megatron/ATB
split an MLP. `--defect` scales rank 1's contribution to layer 1's all-reduce by 0.5 (the dumped input is the
rank's true partial sum, so the sum of inputs no longer matches the output).

    python -m tests.tp_dumps OUT [--bf16] [--defect]     (starts both ranks, waits for them)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORLD = 2
HIDDEN, INTER, VOCAB, LAYERS, STEPS = 64, 128, 96, 2, 2


def dump(out: Path, *, bf16: bool = False, defect: bool = False) -> Path:
    """Run both ranks (rank 0 started first); returns the `torch_tensors` folder holding `cpu_{pid}` per rank."""
    with tempfile.TemporaryDirectory() as td:
        init = Path(td) / "init"
        procs = []
        for rank in range(WORLD):
            args = [sys.executable, "-m", "tests.tp_dumps", str(out), "--rank", str(rank), "--init", str(init)]
            args += ["--bf16"] if bf16 else []
            args += ["--defect"] if defect else []
            env = {**os.environ, "PYTHONPATH": str(ROOT), "LOCAL_WORLD_SIZE": str(WORLD), "OMP_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        logs = [p.communicate(timeout=300) for p in procs]
        for p, (o, e) in zip(procs, logs):
            if p.returncode != 0:
                raise RuntimeError(f"tp rank failed:\n{o.decode()[-2000:]}\n{e.decode()[-3000:]}")
    folders = sorted({d.parent for d in out.glob("msit_dump_*/torch_tensors/cpu_*")})
    if len(folders) != 1:
        raise RuntimeError(f"expected one torch_tensors folder for both ranks, found {folders}")
    return folders[0]


def _run(out: Path, rank: int, init: Path, bf16: bool, defect: bool) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    full_up = [torch.randn(INTER, HIDDEN) / HIDDEN**0.5 for _ in range(LAYERS)]
    full_down = [torch.randn(HIDDEN, INTER) / INTER**0.5 for _ in range(LAYERS)]
    embed = torch.randn(VOCAB, HIDDEN)
    head = torch.randn(VOCAB, HIDDEN) / HIDDEN**0.5
    part = INTER // WORLD

    class AllReduce(nn.Module):
        """Sums the ranks' partial outputs (out of place, so the dumped input is this rank's part)."""

        def __init__(self, scale: float) -> None:
            super().__init__()
            self.scale = scale

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.float() * self.scale
            dist.all_reduce(y)
            return y.to(x.dtype)

    class Layer(nn.Module):
        def __init__(self, i: int) -> None:
            super().__init__()
            self.norm = nn.RMSNorm(HIDDEN, eps=1e-6)
            self.up = nn.Linear(HIDDEN, part, bias=False)
            self.down = nn.Linear(part, HIDDEN, bias=False)
            self.act = nn.SiLU()
            with torch.no_grad():
                self.up.weight.copy_(full_up[i][rank * part : (rank + 1) * part])  # column parallel
                self.down.weight.copy_(full_down[i][:, rank * part : (rank + 1) * part])  # row parallel
            self.all_reduce = AllReduce(0.5 if defect and i == 1 and rank == 1 else 1.0)

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return h + self.all_reduce(self.down(self.act(self.up(self.norm(h)))))

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding.from_pretrained(embed)
            self.layers = nn.ModuleList(Layer(i) for i in range(LAYERS))
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(head)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            h = self.embed(ids)
            for layer in self.layers:
                h = layer(h)
            return self.lm_head(h)

    model = Model().eval()
    if bf16:
        model = model.to(torch.bfloat16)
    import logging

    from msit_llm import DumpConfig, register_hook

    logging.getLogger("msit_logger").disabled = True
    register_hook(model, DumpConfig(dump_path=str(out), token_range=list(range(STEPS))))
    ids = torch.arange(3, 11)[None, :]
    with torch.no_grad():
        for step in range(STEPS):
            model(ids if step == 0 else ids[:, -1:] + step)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--init")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--defect", action="store_true")
    ns = parser.parse_args()
    if ns.rank is None:
        print(dump(Path(ns.out), bf16=ns.bf16, defect=ns.defect))
        return
    _run(Path(ns.out), ns.rank, Path(ns.init), ns.bf16, ns.defect)


if __name__ == "__main__":
    main()
