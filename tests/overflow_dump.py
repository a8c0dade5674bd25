"""An fp16 overflow dumped by msprobe's own `PrecisionDebugger` (level L1: API calls), in a fresh process.

`python -m tests.overflow_dump OUT TASK` (TASK: `statistics` or `tensor`). An fp16 `Functional.linear` whose output
holds +inf and -inf (and no NaN: its Mean is NaN only because both infinities are there); the next op,
`Tensor.__sub__` (`y - y`), turns them into real NaN.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch import nn


class Overflow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4, bias=False)
        with torch.no_grad():
            self.lin.weight.copy_(torch.diag(torch.tensor([6e4, -6e4, 1.0, 1.0])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)  # [1.2e5, -1.2e5, 1, 1] overflows float16: +inf, -inf
        return y - y  # inf - inf: NaN


def main() -> None:
    out, task = Path(sys.argv[1]), sys.argv[2]
    from msprobe.pytorch import PrecisionDebugger

    out.mkdir(parents=True, exist_ok=True)
    cfg = out / "msprobe_config.json"
    cfg.write_text(
        json.dumps(
            {
                "task": task,
                "dump_path": str(out / "dump"),
                "rank": [],
                "step": [],
                "level": "L1",
                task: {"scope": [], "list": [], "data_mode": ["all"]},
            }
        )
    )
    net = Overflow().half().eval()
    debugger = PrecisionDebugger(config_path=str(cfg))
    debugger.start(net)
    with torch.no_grad():
        net(torch.tensor([[2.0, 2.0, 1.0, 1.0]], dtype=torch.float16))
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    main()
