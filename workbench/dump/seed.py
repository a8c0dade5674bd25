"""`seed_all`: the same determinism switches msit's `seed_all` turns on."""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import torch

log = logging.getLogger("workbench.dump")

# Environment variables msit sets for deterministic collective / matmul kernels on Ascend.
DETERMINISM_ENV = {
    "LCCL_DETERMINISTIC": "1",
    "HCCL_DETERMINISTIC": "true",
    "ATB_MATMUL_SHUFFLE_K_ENABLE": "0",
    "ATB_LLM_LCOC_ENABLE": "0",
}


def seed_all(seed: int = 2024) -> None:
    """Seed Python, numpy and torch (CPU, CUDA, NPU) RNGs and turn on deterministic algorithms."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed_all: seed must be an int, got {seed!r}")
    os.environ.update(DETERMINISM_ENV)
    os.environ["PYTHONHASHSEED"] = str(seed)
    # cuBLAS needs this for deterministic matmuls once use_deterministic_algorithms is on.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    npu = getattr(torch, "npu", None)  # torch_npu registers torch.npu when imported
    if npu is not None and hasattr(npu, "manual_seed_all"):
        npu.manual_seed_all(seed)
    log.info("deterministic computation on, seed %d", seed)
