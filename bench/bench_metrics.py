"""Speed of `compare_tensors` against msit's per-metric approach on realistic activation tensors.

The reference is msit's own `cmp_algorithm` functions when `msit_llm` is importable, otherwise a
faithful re-implementation of them (7 separate full-tensor passes in torch float32, cosine in
float64, exactly as msit's code). Both sides also get msit's per-tensor max/min/mean (msit's
report columns). Prints one line per case and the ratio reference/ours (higher is better).

    PYTHONPATH=. .venv/bin/python bench/bench_metrics.py [--threads N] [--repeat R]
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F

from workbench.compare.judging.metrics import compare_tensors

FLOAT_EPSILON = torch.finfo(torch.float).eps


def _cosine_similarity(g: torch.Tensor, m: torch.Tensor) -> tuple[float, str]:
    if torch.all(g == 0) and torch.all(m == 0):
        return 1.0, ""
    return round(torch.cosine_similarity(g.double(), m.double(), dim=0).item(), 10), ""


def _masked(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.abs(g) > FLOAT_EPSILON, x, torch.tensor(0, dtype=g.dtype))


def _kl_divergence(g: torch.Tensor, m: torch.Tensor) -> tuple[float, str]:
    return max(F.kl_div(F.log_softmax(m, dim=-1), F.softmax(g, dim=-1), reduction="sum").item(), 0), ""


def _relative_euclidean_distance(g: torch.Tensor, m: torch.Tensor) -> tuple[float, str]:
    s = (g**2).sum()
    if s**0.5 <= FLOAT_EPSILON:
        return 0.0, ""
    return torch.sqrt(((m - g) ** 2).sum() / s).item(), ""


REFERENCE_ALGS: dict[str, Callable[[torch.Tensor, torch.Tensor], tuple[float, str]]] = {
    "cosine_similarity": _cosine_similarity,
    "max_relative_error": lambda g, m: (_masked(g, torch.abs(m / g - 1)).max().item(), ""),
    "mean_relative_error": lambda g, m: (_masked(g, torch.abs(m / g - 1)).mean().item(), ""),
    "max_absolute_error": lambda g, m: (_masked(g, torch.abs(m - g)).max().item(), ""),
    "mean_absolute_error": lambda g, m: (_masked(g, torch.abs(m - g)).mean().item(), ""),
    "kl_divergence": _kl_divergence,
    "relative_euclidean_distance": _relative_euclidean_distance,
}


def msit_algorithms() -> tuple[str, dict[str, Callable[..., Any]]]:
    """msit's CMP_ALG_MAP when installed, else the re-implementation above."""
    for mod in (
        "msit_llm.common.utils.cmp_algorithm",
        "components.utils.cmp_algorithm",
        "msit_llm.compare.cmp_algorithm",
    ):
        try:
            return f"msit ({mod})", dict(importlib.import_module(mod).CMP_ALG_MAP)
        except (ImportError, AttributeError):
            continue
    return "msit re-implementation", REFERENCE_ALGS


def msit_compare(algs: dict[str, Callable[..., Any]], golden: torch.Tensor, test: torch.Tensor) -> dict[str, Any]:
    """What msit does per pair: basic info of both sides, flatten + float32, then each metric."""
    out: dict[str, Any] = {}
    for side, t in (("golden", golden), ("my", test)):
        out[f"{side}_max"], out[f"{side}_min"] = t.max().item(), t.min().item()
        out[f"{side}_mean"] = t.float().mean().item()
    g, m = golden.reshape(-1).float(), test.reshape(-1).float()
    if not (torch.isfinite(g).all() and torch.isfinite(m).all()):
        return out
    for name, fn in algs.items():
        out[name] = fn(g, m)[0]
    return out


def _best(fn: Callable[[], Any], repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (compare workers use 1)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    name, algs = msit_algorithms()
    gen = torch.Generator().manual_seed(0)
    print(f"reference: {name}; torch threads: {args.threads}")
    ratios = []
    for shape, dtype in (
        ((384, 1024), torch.bfloat16),
        ((384, 2816), torch.bfloat16),
        ((384, 2816), torch.float16),
        ((8, 384, 4096), torch.bfloat16),
    ):
        golden = torch.randn(shape, generator=gen) * 2
        golden[golden.abs() < 0.01] = 0.0  # some exact zeros, as after masks and activations
        test = golden.to(dtype)
        t_ref = _best(lambda g=golden, m=test: msit_compare(algs, g, m), args.repeat)
        t_ours = _best(lambda g=golden, m=test: compare_tensors(g, m), args.repeat)
        ratios.append(t_ref / t_ours)
        print(
            f"{list(shape)!s:>16} fp32 vs {str(dtype).removeprefix('torch.'):<8} reference {t_ref * 1e3:8.2f} ms"
            f"  ours {t_ours * 1e3:8.2f} ms  ratio {t_ref / t_ours:5.2f}x"
        )
    print(f"geometric mean ratio {torch.tensor(ratios).log().mean().exp().item():.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
