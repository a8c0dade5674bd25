"""The ATB side of `wb demo`: run the ATB-structured Llama (bf16) with a planted defect and dump it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.backends.atb_dump import AtbDumpConfig
from workbench.backends.atb_llama import AtbLlama
from workbench.backends.defects import DEFECT_KINDS, Defect

DEFAULT_DEFECT = "rmsnorm_eps"
DEFAULT_TP_DEFECT = "allreduce_scale"


def atb_defects() -> dict[str, str]:
    """Defect name -> one-line description (what `wb demo --list-defects` prints)."""
    return {k: v for k, v in DEFECT_KINDS.items() if k != "none"}


def run_atb_demo(
    model: Any,
    prompt: torch.Tensor,
    tokens: list[int],
    out: Path,
    defect: str | None,
    *,
    dtype: torch.dtype = torch.bfloat16,
    follow: Path | None = None,
    tp: int = 1,
) -> tuple[Path, str, str]:
    """Dump the ATB stack decoding `tokens` (the golden run's choice) into `out`; with `follow` (the golden
    dump) the tokens are taken from its manifest instead (`AtbDumpConfig.follow_tokens`).

    Returns (the msit_dump_* folder, a description, the op folder where the defect is born
    at its first active token: `Defect(kind).start`, 0 except for kv_slot). With `tp` >= 2 the stack runs
    tensor-parallel (`workbench.backends.atb_tp`): one `tensors/{rank}_{pid}` folder per rank in the dump.
    """
    name = defect or (DEFAULT_TP_DEFECT if tp > 1 else DEFAULT_DEFECT)
    if name not in DEFECT_KINDS:
        raise ValueError(f"--defect {name!r}: expected one of {', '.join(DEFECT_KINDS)}")
    planted = Defect(name)
    if planted.needs_tp and tp < 2:
        raise ValueError(f"--defect {name}: lives in an all-reduce; give --tp 2 (or more)")
    if name == "fp16_overflow":
        dtype = torch.float16  # the overflow only exists in fp16
    dump = AtbDumpConfig(dump_path=out, follow_tokens=follow)
    forced = None if follow is not None else list(tokens)
    if tp > 1:
        from workbench.backends.atb_tp import run_tp, shard_ranks

        base = AtbLlama.from_hf(model, dtype=dtype)
        ranks = shard_ranks(base, tp, planted if planted.kind != "none" else None)
        run = run_tp(ranks, prompt, len(tokens), dump=dump, forced=forced)
        atb = ranks[0]
    else:
        atb = AtbLlama.from_hf(model, dtype=dtype, defect=planted)
        run = atb.run(prompt, len(tokens), dump=dump, forced=forced)
    assert run.dump_root is not None
    expected = planted.expected_op(planted.start, atb.dims.num_layers, dtype=dtype) or ""
    return run.dump_root, f"{name}: {DEFECT_KINDS[name]}", expected
