"""The error distribution and the worst elements of ONE tensor pair, read from its two files.

numpy only (the files are read by `formats.arrays`, memory-mapped): the app's detail pane never
imports torch. Worked in chunks, so memory stays bounded by a chunk whatever the tensor size.
"""

from __future__ import annotations

import numpy as np

from workbench.analysis.explorer.views import PairRow, TensorDiff
from workbench.formats.arrays import as_float64, read_array
from workbench.formats.model import DumpError

MAX_DETAIL_ELEMENTS = 256 * 1024 * 1024  # refuse to load a pair bigger than this (elements per side)
DIFF_CHUNK = 4 * 1024 * 1024  # elements per chunk when computing the error distribution
HIST_EDGES = np.arange(-12.0, 6.5, 0.5)  # log10 |error| bins: half decades from 1e-12 to 1e6


def tensor_diff(pair: PairRow, k: int = 8, chunk: int | None = None) -> TensorDiff:
    """Histogram of log10|error| and the k worst elements of one pair."""
    step = chunk or DIFF_CHUNK
    gpath, tpath = pair.golden.get("path"), pair.test.get("path")
    if not gpath or not tpath:
        return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], "statistics-only dump: no tensor data")
    try:
        g = read_array(gpath)
        if g.numel > MAX_DETAIL_ELEMENTS:
            raise DumpError(gpath, f"{g.numel:,} elements is too large to show")
        t = read_array(tpath)
    except DumpError as exc:
        return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], str(exc))
    if g.numel != t.numel:
        return TensorDiff(pair.pair_id, 0, [], [], 0, 0, [], f"shapes differ: {g.shape} vs {t.shape}")
    shape = g.shape
    gflat, tflat = g.array.reshape(-1), t.array.reshape(-1)
    n = int(gflat.size)
    counts = np.zeros(len(HIST_EDGES) - 1, dtype=np.int64)
    exact = nonfinite = 0
    cand_score: list[np.ndarray] = []
    cand_index: list[np.ndarray] = []
    cand_g: list[np.ndarray] = []
    cand_t: list[np.ndarray] = []
    for start in range(0, n, step):
        gc = as_float64(gflat[start : start + step], g.dtype)
        tc = as_float64(tflat[start : start + step], t.dtype)
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(gc - tc)
        finite = np.isfinite(err)
        nonfinite += int(err.size - int(finite.sum()))
        fe = err[finite]
        exact += int((fe == 0).sum())
        pos = fe[fe > 0]
        if pos.size:
            logs = np.clip(np.log10(pos), HIST_EDGES[0], HIST_EDGES[-1] - 1e-9)
            counts += np.histogram(logs, bins=HIST_EDGES)[0]
        score = np.where(finite, err, np.inf)
        kk = min(k, score.size)
        if kk:
            idx = np.argpartition(-score, kk - 1)[:kk]
            cand_score.append(score[idx])
            cand_index.append(idx + start)
            cand_g.append(gc[idx])
            cand_t.append(tc[idx])
    top: list[tuple[tuple[int, ...], float, float, float]] = []
    if cand_score:
        sc, ix = np.concatenate(cand_score), np.concatenate(cand_index)
        gv, tv = np.concatenate(cand_g), np.concatenate(cand_t)
        order = np.lexsort((ix, -sc))[:k]  # worst first, then by position
        for j in order:
            index = tuple(int(x) for x in np.unravel_index(int(ix[j]), shape)) if shape else ()
            top.append((index, float(gv[j]), float(tv[j]), float(abs(gv[j] - tv[j]))))
    nz = np.nonzero(counts)[0]
    edges: list[float] = []
    hist: list[int] = []
    if nz.size:
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        edges = [float(x) for x in HIST_EDGES[lo : hi + 1]]
        hist = [int(c) for c in counts[lo:hi]]
    return TensorDiff(pair.pair_id, n, edges, hist, exact, nonfinite, top)
