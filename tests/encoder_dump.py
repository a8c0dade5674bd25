"""A tiny BERT encoder (no LM head) dumped by msit's or msprobe's own dumper, in a fresh process.

`python -m tests.encoder_dump TOOL OUT [--bf16]` (TOOL: `msit` or `msprobe`, level L0). One forward pass of 8 ids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main() -> None:
    tool, out, bf16 = sys.argv[1], Path(sys.argv[2]), "--bf16" in sys.argv[3:]
    from transformers import BertConfig, BertModel

    torch.manual_seed(13)
    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=128)
    model = BertModel(cfg).eval()
    if bf16:
        model = model.to(torch.bfloat16)
    ids = torch.randint(3, 128, (1, 8), generator=torch.Generator().manual_seed(2))
    out.mkdir(parents=True, exist_ok=True)
    if tool == "msit":
        import logging

        from msit_llm import DumpConfig, register_hook

        logging.getLogger("msit_logger").disabled = True
        register_hook(model, DumpConfig(dump_path=str(out), token_range=[0]))
        with torch.no_grad():
            model(input_ids=ids)
        return
    from msprobe.pytorch import PrecisionDebugger

    config = out / "msprobe_config.json"
    body = {"scope": [], "list": [], "data_mode": ["all"]}
    config.write_text(
        json.dumps(
            {"task": "tensor", "dump_path": str(out / "dump"), "rank": [], "step": [], "level": "L0", "tensor": body}
        )
    )
    debugger = PrecisionDebugger(config_path=str(config))
    debugger.start(model)
    with torch.no_grad():
        model(input_ids=ids)
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    main()
