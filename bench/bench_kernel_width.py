"""The fused metric pass compiled for 256-bit and for 512-bit vectors, timed in the same run.

LLVM's tuning for every Intel AVX-512 CPU prefers 256-bit vectors; `compare/judging/kernels.py` lifts that preference
(`_wide_vectors`). This bench compiles the `pass_pair` entry both ways, each in a child process of its own (numba
reads the CPU features once, when it makes its code generator), times it on the same pairs (float32 golden against
bfloat16, float16 and float32 tests, 4 Mi elements a side: the size of a large activation), interleaved, and prints
the speed of each (GB of golden + test bytes per second, one core) and their ratio.

    .venv/bin/python bench/bench_kernel_width.py [--rounds R] [--elements N]

On a CPU without AVX-512 both builds are the same code and the ratio is ~1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_CHILD = r"""
import ctypes, json, sys, time
import numpy as np
from numba.core import config
from numba.core.codegen import get_host_cpu_features

wide, n, rounds = sys.argv[1] == "512", int(sys.argv[2]), int(sys.argv[3])
config.CPU_FEATURES = get_host_cpu_features() + (",-prefer-256-bit" if wide else "")
from workbench.compare.judging import kernels
from workbench.compare.judging.kernel_state import STATE_LEN
from workbench.compare.judging.metrics import CHUNK

rng = np.random.default_rng(0)
g = rng.standard_normal(n, dtype=np.float32)
m = g * (1 + np.float32(0.004) * rng.standard_normal(n, dtype=np.float32))
tests = {
    "bfloat16": (m.view(np.uint32) >> 16).astype(np.uint16),
    "float16": m.astype(np.float16).view(np.int16),
    "float32": m,
}
out = {}
for kind, t in tests.items():
    fn = ctypes.CFUNCTYPE(*[ctypes.c_int64] * 11)(kernels.compile_entry("pass_pair", ("float32", kind)).address)
    chunks = -(-n // CHUNK)
    best = []
    for _ in range(rounds):
        st = np.zeros(STATE_LEN)
        start = time.perf_counter()
        fn(g.ctypes.data, t.ctypes.data, n, 0, chunks, CHUNK, st.ctypes.data, 0x4B000000, 0, 1)
        best.append(time.perf_counter() - start)
    out[kind] = [(g.nbytes + t.nbytes) / s / 1e9 for s in best]
print(json.dumps(out))
"""


def _child(width: str, elements: int, rounds: int) -> dict[str, list[float]]:
    env = dict(os.environ)
    env.pop("NUMBA_CPU_FEATURES", None)
    run = subprocess.run(
        [sys.executable, "-c", _CHILD, width, str(elements), str(rounds)],
        check=True,
        capture_output=True,
        text=True,
        env=env,
    )
    speeds: dict[str, list[float]] = json.loads(run.stdout.strip().splitlines()[-1])
    return speeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="child processes per width, interleaved")
    ap.add_argument("--elements", type=int, default=1 << 22, help="elements a side")
    args = ap.parse_args()
    got: dict[str, dict[str, list[float]]] = {"256": {}, "512": {}}
    for r in range(args.rounds):
        for width in ("256", "512") if r % 2 == 0 else ("512", "256"):
            for kind, speeds in _child(width, args.elements, 5).items():
                got[width].setdefault(kind, []).extend(speeds)
    for kind in got["256"]:
        narrow, wide = statistics.median(got["256"][kind]), statistics.median(got["512"][kind])
        print(
            f"float32 vs {kind:8s}: 256-bit {narrow:5.2f} GB/s, 512-bit {wide:5.2f} GB/s per core "
            f"(medians of {len(got['256'][kind])}): 512/256 = {wide / narrow:.2f}x"
        )


if __name__ == "__main__":
    main()
