"""Tensor-parallel dumps of the ATB-structured stack for tests: an fp32 torch golden run (our dumper, one
rank) and a bf16/fp16 ATB test run on N ranks (one `tensors/{rank}_{pid}` folder per rank), decoding the
golden run's tokens, optionally with a planted all-reduce defect."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.backends import AtbDumpConfig, AtbLlama, Defect
from workbench.backends.atb_tp import run_tp, shard_ranks

SHAPES: dict[str, dict[str, int]] = {
    # hidden, heads, kv heads, intermediate, vocab, layers: two shapes (GQA and MHA, even and odd vocabulary)
    "gqa": {"hidden": 128, "heads": 4, "kv": 2, "inter": 256, "vocab": 300, "layers": 3},
    "mha": {"hidden": 96, "heads": 4, "kv": 4, "inter": 192, "vocab": 257, "layers": 2},
}
NEW = 3


def hf_model(shape: str, seed: int = 11) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    s = SHAPES[shape]
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=s["hidden"],
        intermediate_size=s["inter"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv"],
        vocab_size=s["vocab"],
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(cfg).eval()


def prompt(vocab: int, n: int = 8) -> torch.Tensor:
    return torch.randint(3, vocab, (1, n), generator=torch.Generator().manual_seed(5))


def golden_dump(model: Any, out: Path) -> Path:
    """The fp32 torch golden run (our dumper), `NEW` tokens; returns its msit_dump_* folder."""
    from workbench.demo import decode
    from workbench.dump import DumpConfig, register_hook

    handle = register_hook(model, DumpConfig(dump_path=str(out), token_range=list(range(NEW))))
    try:
        decode(model, prompt(model.config.vocab_size), NEW)
    finally:
        handle.remove()
    return sorted(out.glob("msit_dump_*"))[-1]


def tp_dump(
    model: Any,
    out: Path,
    *,
    size: int = 2,
    dtype: torch.dtype = torch.bfloat16,
    defect: Defect | None = None,
    follow: Path | None = None,
) -> Path:
    """The ATB stack on `size` ranks, dumped; follows the golden dump's tokens when given."""
    ranks = shard_ranks(AtbLlama.from_hf(model, dtype=dtype), size, defect)
    forced = None
    if follow is None:
        forced = AtbLlama.from_hf(model, dtype=torch.float32).run(prompt(model.config.vocab_size), NEW).tokens
        forced = forced[0, -NEW:].tolist()
    run = run_tp(
        ranks, prompt(model.config.vocab_size), NEW, dump=AtbDumpConfig(out, follow_tokens=follow), forced=forced
    )
    assert run.dump_root is not None
    return run.dump_root
