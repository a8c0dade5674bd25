"""Dumps whose call streams differ by one op, written by the real dumpers (msprobe, msit, ours).

Run as `python -m tests.align_dumps WHICH OUT` so that each peer dumper gets a fresh process (msit's
`register_hook` refuses a second registration per process; msprobe's `PrecisionDebugger` is a
singleton). Golden: a 3-layer tiny Llama in float32. Test: the same weights in bfloat16 with one extra op:

* msprobe: `mlp.forward` of layer 0 returns `out * 1.0`, one extra `Tensor.__mul__` that shifts the
  counter of every later multiply;
* msit (module dumps): an extra module inserted into `model.layers` at index 1 (`Scale`, `x * 1.0`), so
  every later layer's module path shifts by one (`layers.1` -> `layers.2`).

Also a run with a planted anomaly for the anomaly check (`planted`): layer 1's `mlp.down_proj` writes
+Inf into one element of its output (in its own forward, so every dumper records the poisoned output).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import torch
from torch import nn

PROMPT_LEN = 5
EXTRA_AT = 1  # index of the inserted module in `model.layers`


def llama3(seed: int = 0) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(cfg).eval()


class Scale(nn.Module):
    """An extra decoder-layer-shaped module: multiplies the hidden states by 1.0."""

    def forward(self, hidden_states: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return hidden_states * 1.0


def with_extra_mul(model: nn.Module) -> nn.Module:
    mlp = model.model.layers[0].mlp  # type: ignore[index, union-attr]
    orig = mlp.forward

    def forward(*args: object, **kwargs: object) -> torch.Tensor:
        return orig(*args, **kwargs) * 1.0

    mlp.forward = forward
    return model


def with_extra_module(model: nn.Module) -> nn.Module:
    model.model.layers.insert(EXTRA_AT, Scale())  # type: ignore[union-attr, operator]
    model.config.num_hidden_layers += 1  # type: ignore[union-attr, operator]
    return model


PLANTED = ("model.layers.1.mlp.down_proj", (0, 2, 3))  # module path, element index of its output


def with_planted_inf(model: nn.Module) -> nn.Module:
    lin = model.get_submodule(PLANTED[0])
    plain = type(lin).forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        out = plain(lin, x).clone()
        out[PLANTED[1]] = float("inf")
        return out

    lin.forward = forward  # type: ignore[method-assign]
    return model


def prompt() -> torch.Tensor:
    return torch.randint(0, 256, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))


def _forwards(model: nn.Module, tokens: int) -> None:
    ids = prompt()
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(ids, use_cache=False).logits
            ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)


def msprobe_pair(out: Path) -> None:
    """OUT/golden/step0/procN and OUT/test/step0/procN, dumped by msprobe's PrecisionDebugger at level mix."""
    from msprobe.pytorch import PrecisionDebugger

    cfg = {
        "task": "tensor",
        "level": "mix",
        "dump_path": str(out / "raw"),
        "rank": [],
        "step": [],
        "tensor": {"scope": [], "list": [], "data_mode": ["all"]},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(cfg))
    dbg = PrecisionDebugger(config_path=str(out / "config.json"), dump_path=str(out / "raw"))
    for model in (llama3(), with_extra_mul(llama3().to(torch.bfloat16)), with_planted_inf(llama3())):
        dbg.start(model=model)
        _forwards(model, 1)
        dbg.stop()
        dbg.step()
    # one debugger per process numbers the runs as steps; each run becomes its own dump at step 0
    for name, step in (("golden", "step0"), ("test", "step1"), ("planted", "step2")):
        (out / name).mkdir()
        shutil.move(str(out / "raw" / step), str(out / name / "step0"))


def msit_pair(out: Path, which: str) -> Path:
    """One run dumped by msit's own `register_hook` (which = golden | test | planted); returns the device folder.

    The planted run writes tensors and statistics (`dump_statistics_mode=2`)."""
    from msit_llm import DumpConfig, register_hook

    models = {"golden": llama3, "test": lambda: with_extra_module(llama3().to(torch.bfloat16))}
    models["planted"] = lambda: with_planted_inf(llama3())
    model = models[which]()
    stats_mode = 2 if which == "planted" else 0
    register_hook(model, DumpConfig(dump_path=str(out / which), token_range=[0, 1], dump_statistics_mode=stats_mode))
    _forwards(model, 2)
    return next((out / which).glob("msit_dump_*/torch_tensors/*"))


def ours_pair(out: Path) -> tuple[Path, Path]:
    """Golden and test dumped by our `register_hook`; returns both device folders."""
    from workbench.dump import DumpConfig, register_hook

    found = []
    for which in ("golden", "test"):
        model = llama3() if which == "golden" else with_extra_module(llama3().to(torch.bfloat16))
        handle = register_hook(model, DumpConfig(dump_path=str(out / which), token_range=[0, 1]))
        try:
            _forwards(model, 2)
        finally:
            handle.remove()
        found.append(next((out / which).glob("msit_dump_*/torch_tensors/*")))
    return found[0], found[1]


if __name__ == "__main__":
    which, dest = sys.argv[1], Path(sys.argv[2])
    if which == "msprobe":
        msprobe_pair(dest)
    else:
        print(msit_pair(dest, which))
