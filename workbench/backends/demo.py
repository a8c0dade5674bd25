"""The ATB side of `wb demo`: run the ATB-structured Llama (bf16) with a planted defect and dump it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from workbench.backends.atb_dump import AtbDumpConfig
from workbench.backends.atb_llama import AtbLlama
from workbench.backends.defects import DEFECT_KINDS, Defect

DEFAULT_DEFECT = "rmsnorm_eps"


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
) -> tuple[Path, str, str]:
    """Dump the ATB stack decoding `tokens` (the golden run's choice) into `out`; with `follow` (the golden
    dump) the tokens are taken from its manifest instead (`AtbDumpConfig.follow_tokens`).

    Returns (the msit_dump_* folder, a description, the op folder where the defect is born
    at its first active token: `Defect(kind).start`, 0 except for kv_slot).
    """
    name = defect or DEFAULT_DEFECT
    if name not in DEFECT_KINDS:
        raise ValueError(f"--defect {name!r}: expected one of {', '.join(DEFECT_KINDS)}")
    planted = Defect(name)
    if name == "fp16_overflow":
        dtype = torch.float16  # the overflow only exists in fp16
    atb = AtbLlama.from_hf(model, dtype=dtype, defect=planted)
    if follow is not None:
        run = atb.run(prompt, len(tokens), dump=AtbDumpConfig(dump_path=out, follow_tokens=follow))
    else:
        run = atb.run(prompt, len(tokens), dump=AtbDumpConfig(dump_path=out), forced=list(tokens))
    assert run.dump_root is not None
    expected = planted.expected_op(planted.start, atb.dims.num_layers, dtype=dtype) or ""
    return run.dump_root, f"{name}: {DEFECT_KINDS[name]}", expected
