"""Dumps of the tiny Llama written by the peers' own dumpers (msit, msprobe), each in a fresh process.

msit's `DumpConfig` is a process-wide singleton and msprobe's debugger is global too, so every dump runs in
its own subprocess: `python -m tests.peer_dumps TOOL OUT [--defect] [--bf16] [--forced 1,2,3]`.
TOOL: `msit` (full module dump), `msit_logits` (`dump_last_logits=True`), `msprobe` (tensor task, mix level).
The process prints the generated ids on its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = 4


def dump(
    tool: str,
    out: Path,
    *,
    defect: bool = False,
    bf16: bool = False,
    forced: list[int] | None = None,
    scale_down: float | None = None,
) -> list[int]:
    """Run the peer dumper in a subprocess; returns the ids the run generated."""
    args = [sys.executable, "-m", "tests.peer_dumps", tool, str(out)]
    args += ["--defect"] if defect else []
    args += ["--scale-down", str(scale_down)] if scale_down is not None else []
    args += ["--bf16"] if bf16 else []
    args += ["--forced", ",".join(map(str, forced))] if forced else []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{tool} dump failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return [int(x) for x in json.loads(proc.stdout.strip().splitlines()[-1])]


def _model(defect: bool, bf16: bool, scale_down: float | None = None):  # type: ignore[no-untyped-def]
    import torch

    from tests.conftest import tiny_llama

    model = tiny_llama()
    if defect:  # a wrong epsilon that changes the greedy tokens after token 0
        model.model.layers[1].input_layernorm.variance_epsilon = 1.0
    if scale_down is not None:  # a subtle defect: layer 1's down_proj weight scaled (every output may still pass)
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(scale_down)
    return model.to(torch.bfloat16) if bf16 else model


def _prompt():  # type: ignore[no-untyped-def]
    import torch

    return torch.randint(3, 256, (1, 8), generator=torch.Generator().manual_seed(3))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tool", choices=["msit", "msit_logits", "msprobe"])
    parser.add_argument("out")
    parser.add_argument("--defect", action="store_true")
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--forced", default="")
    parser.add_argument("--scale-down", type=float, default=None)
    ns = parser.parse_args()
    from workbench.demo import decode

    model = _model(ns.defect, ns.bf16, ns.scale_down)
    forced = [int(x) for x in ns.forced.split(",")] if ns.forced else None
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if ns.tool.startswith("msit"):
        from msit_llm import DumpConfig, register_hook

        cfg = DumpConfig(dump_path=str(out), token_range=list(range(STEPS)), dump_last_logits=ns.tool == "msit_logits")
        register_hook(model, cfg)
        tokens = decode(model, _prompt(), STEPS, forced)
    else:
        from msprobe.pytorch import PrecisionDebugger

        config = out / "msprobe_config.json"
        config.write_text(
            json.dumps(
                {
                    "task": "tensor",
                    "dump_path": str(out / "dump"),
                    "rank": [],
                    "step": [],
                    "level": "mix",
                    "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
                }
            )
        )
        debugger = PrecisionDebugger(config_path=str(config), dump_path=str(out / "dump"))
        debugger.start(model=model)
        tokens = decode(model, _prompt(), STEPS, forced)
        debugger.stop()
        debugger.step()
    print(json.dumps(tokens))


if __name__ == "__main__":
    main()
