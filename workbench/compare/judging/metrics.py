"""Every number the catalog holds about one golden/test tensor pair, computed in one chunked pass.

msit's seven metrics follow msit's definitions exactly (flattened, cast to float32, eps = float32
machine eps, mask |golden| <= eps, ...); the extra metrics (ULP, SNR, msprobe's thousandth
ratios) and the per-side statistics come from the same pass. Definitions, and where our numbers
differ from msit's in the last bits, are documented in `docs/metrics.md`.

The pass is `kernels`' fused loop (`kernel_code().pass_pair`: numba-compiled machine code, called without the GIL),
which reads each element once (float32, bfloat16 and float16 in place) in chunks of `CHUNK` elements (a
memory-mapped tensor is paged in chunk by chunk): nothing the size of the pair is allocated. This module picks the
arrays, hands the chunks holding NaN or Inf to the kernels by their finite parts, and turns the kernel's state
(`kernel_state`) into the reported numbers. A compare worker never imports torch (torch tensors are
accepted too, viewed as arrays without a copy).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from workbench.catalog.schema import ALL_METRICS
from workbench.compare.judging import kernel_state as k
from workbench.compare.judging.kernel_code import KINDS, kernel_code
from workbench.compare.pairing.layout import layout_rule, not_comparable
from workbench.formats.arrays import RawTensor, as_raw
from workbench.formats.model import canonical_dtype

FLOAT_EPS = float(np.finfo(np.float32).eps)  # msit's FLOAT_EPSILON, 1.1920929e-07
COSINE_NORM_EPS = 1e-8  # torch.cosine_similarity's default eps (clamps each norm)
SNR_CAP_DB = 400.0  # |SNR| is clamped to this; identical tensors give +SNR_CAP_DB
CHUNK = 1 << 15  # elements per chunk: its float32 sums are added in float64; a chunk stays in the L2 cache
PART_BYTES = 64 * 1024 * 1024  # a pair of more than twice this (golden + test) is passed in parts, on threads

# (mantissa bits, minimum exponent) per test dtype, as in msprobe's ULP standard.
_ULP_PARAMS: dict[str, tuple[int, int]] = {
    "float32": (23, -126),
    "float16": (10, -14),
    "bfloat16": (7, -126),
    "float8_e4m3fn": (3, -6),
    "float8_e5m2": (2, -14),
}


@dataclass(frozen=True, slots=True)
class TensorSummary:
    """Statistics of one tensor; min..norm are over its finite elements (None when there are none)."""

    numel: int
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None  # unbiased (torch.std's default), None below 2 finite elements
    norm: float | None = None  # L2 norm
    nan_count: int = 0
    inf_count: int = 0


@dataclass(slots=True)
class PairMetrics:
    """Metrics of one pair: `values` is keyed by `ALL_METRICS` (None = not computable)."""

    values: dict[str, float | None]
    golden: TensorSummary
    test: TensorSummary
    finite_only: bool = False
    reason: str | None = None

    @property
    def golden_nan_count(self) -> int:
        return self.golden.nan_count

    @property
    def golden_inf_count(self) -> int:
        return self.golden.inf_count

    @property
    def my_nan_count(self) -> int:
        return self.test.nan_count

    @property
    def my_inf_count(self) -> int:
        return self.test.inf_count


# ----------------------------------------------------------------------------------------------
# the kernel's state, read out

_DIRECT_MAX_SHIFT = 10.0  # beyond this the one-pass direct KL loses precision: two passes in float64


def state_values(st: np.ndarray) -> list[float]:
    """The kernels' state as Python floats: the metrics' arithmetic on them is what it was on numpy's float64 scalars
    (IEEE doubles, the same operations in the same order), at a fraction of the cost (~25 us less a pair)."""
    values: list[float] = st.tolist()
    return values


def _side_summary(st: Sequence[float], side: int, numel: int, nan: int, inf: int) -> TensorSummary:
    """One side's statistics from the kernels' state (`st`: its values as Python floats, `state_values`)."""
    n = int(st[side + k.S_N])
    if n == 0:
        return TensorSummary(numel, nan_count=nan, inf_count=inf)
    c, s1, s2 = st[side + k.S_SHIFT], st[side + k.S_S1], st[side + k.S_S2]
    lo, hi = float(st[side + k.S_LO]), float(st[side + k.S_HI])
    mean = c + s1 / n
    sumsq = max(s2 + c * (2.0 * s1 + n * c), 0.0)
    std: float | None = None
    if n > 1:
        var = max(s2 - s1 * s1 / n, 0.0) / (n - 1)
        std = 0.0 if lo == hi else math.sqrt(var)
    return TensorSummary(numel, lo, hi, mean, std, math.sqrt(sumsq), nan, inf)


def _pair_values(st: Sequence[float], ulp_scale: float | None) -> dict[str, float | None]:
    """The reported metrics from the pair sums (`st`: the state as Python floats, holding at least one position
    finite on both sides)."""
    n = st[k.P_N]
    dot, g2, m2, d2 = st[k.P_DOT], st[k.P_GG], st[k.P_MM], st[k.P_D2]
    if g2 == 0.0 and m2 == 0.0:
        cos = 1.0
    else:  # msit's: float64 dot, torch's per-norm eps clamp
        cos = dot / (max(math.sqrt(g2), COSINE_NORM_EPS) * max(math.sqrt(m2), COSINE_NORM_EPS))
        # numpy's round to 10 decimals, as these metrics were computed on numpy scalars (x 1e10, to the even
        # integer, / 1e10), at a tenth of its cost
        cos = round(min(max(cos, -1.0), 1.0) * 1e10) / 1e10
    red = 0.0 if math.sqrt(g2) <= FLOAT_EPS else math.sqrt(d2 / g2)
    if d2 == 0.0:
        snr = SNR_CAP_DB
    elif g2 == 0.0 or math.isinf(d2):
        snr = -SNR_CAP_DB
    else:
        snr = min(max(10.0 * math.log10(g2 / d2), -SNR_CAP_DB), SNR_CAP_DB)
    return {
        "cosine_similarity": cos,
        "max_relative_error": float(st[k.P_REL_MAX]),
        "mean_relative_error": st[k.P_REL_SUM] / n,
        "max_absolute_error": float(st[k.P_ABS_MAX]),
        "mean_absolute_error": st[k.P_ABS_SUM] / n,
        "kl_divergence": _kl(st),
        "relative_euclidean_distance": red,
        "max_ulp_error": None if ulp_scale is None else float(st[k.P_ULP_MAX]) * ulp_scale,
        "snr_db": snr,
        "one_thousandth_err_ratio": st[k.P_N_LT1] / n,
        "five_thousandths_err_ratio": st[k.P_N_LT5] / n,
    }


def _kl(st: Sequence[float]) -> float | None:
    """KL(softmax(g) || softmax(m)) from the online sums; None when only the float64 two-pass form is exact enough."""
    z, a, b = st[k.P_KL_Z], st[k.P_KL_A], st[k.P_KL_B]
    if st[k.P_D_MAX] < k.SERIES_MAX:
        # log E_p[e^d] - E_p[d] = log1p(x) - x + E_p[expm1(d) - d], x = E_p[expm1(d)]:
        # no cancellation between O(1) terms, so tiny KLs keep their relative precision
        x = (a + b) / z
        kl = b / z + (math.log1p(x) - x)
    else:
        # -E_p[d] + LSE(m) - LSE(g): absolute error ~1e-7 * the terms, like msit's; when they
        # are large (a big shift between m and g) the float64 two-pass form takes over
        mean_d = a / z
        shift = st[k.P_KL_M] - st[k.P_KL_G]
        if abs(mean_d) + abs(shift) > _DIRECT_MAX_SHIFT:
            return None
        kl = -mean_d - math.log(z) + math.log(st[k.P_KL_ZM]) + shift
    return max(kl, 0.0) if math.isfinite(kl) else None


def _ulp_constants(dtype: str | None) -> tuple[int, int, float | None]:
    """(top, floor, scale) of the test dtype's ULP: the float32 whose bits are (top - exponent bits of g), clamped at
    floor, times scale, is 2^(mantissa bits - exponent); scale None when the dtype has no ULP standard."""
    params = _ULP_PARAMS.get(dtype or "")
    if params is None:
        return 0, 0, None
    mant, min_eb = params
    s = max(0, mant - min_eb - 127)  # keeps the float32 2^(mant - eb - s) normal
    return ((mant - s + 254) << 23) % (1 << 32), (min_eb + 127) << 23, 2.0**s


# ----------------------------------------------------------------------------------------------
# public API

TensorLike = Any  # a RawTensor, a numpy array or a torch tensor


def summarize(t: TensorLike) -> TensorSummary:
    """numel, min, max, mean, std, L2 norm (over the finite elements) and NaN/Inf counts of `t`."""

    raw = as_raw(t)
    if raw.array.dtype.kind == "c":
        return TensorSummary(raw.numel)
    st = k.new_state()
    nan = inf = 0
    whole = _kernel_array(raw)
    with np.errstate(all="ignore"):
        for x in [whole] if whole is not None else _chunks(raw, None):
            x_nan, x_inf = kernel_code().add_side(x, CHUNK, st, k.G_SIDE)
            nan, inf = nan + x_nan, inf + x_inf
    return _side_summary(state_values(st), k.G_SIDE, raw.numel, nan, inf)


def compare_tensors(golden: TensorLike, test: TensorLike, test_dtype: str | None = None) -> PairMetrics:
    """All metrics of one pair plus both sides' statistics; never raises on odd data.

    `test_dtype` names the dtype the test run computed in (for the ULP unit); by default the
    test tensor's own dtype. Two shapes are compared element by element only when they are equal or a
    layout rule relates them (`workbench.compare.pairing.layout`: squeezed batch, merged heads); otherwise the
    pair is `not comparable` (no metrics), never silently flattened.
    """
    with np.errstate(all="ignore"):  # overflow to Inf and 0/0 are data here, handled, not warnings
        return _compare(as_raw(golden), as_raw(test), test_dtype)


def _compare(g_raw: RawTensor, t_raw: RawTensor, test_dtype: str | None) -> PairMetrics:
    none = dict.fromkeys(ALL_METRICS)
    if g_raw.array.dtype.kind == "c" or t_raw.array.dtype.kind == "c":
        return PairMetrics(none, summarize(g_raw), summarize(t_raw), False, "complex tensors are not compared")
    gshape, tshape = list(g_raw.shape), list(t_raw.shape)
    if g_raw.numel != t_raw.numel:
        return PairMetrics(
            none,
            summarize(g_raw),
            summarize(t_raw),
            False,
            f"data shape doesn't match: golden {gshape} ({g_raw.numel} elements) vs "
            f"test {tshape} ({t_raw.numel} elements)",
        )
    if g_raw.numel == 0:
        return PairMetrics(none, summarize(g_raw), summarize(t_raw), False, "empty tensor: nothing to compare")
    if gshape != tshape and layout_rule(gshape, tshape) is None:
        return PairMetrics(none, summarize(g_raw), summarize(t_raw), False, not_comparable(gshape, tshape))
    top, floor, ulp_scale = _ulp_constants(canonical_dtype(test_dtype) or canonical_dtype(t_raw.dtype))
    st, counts = _pass(g_raw, t_raw, top, floor)
    return _metrics_of_state(st, counts, g_raw.numel, ulp_scale, lambda: _kl_direct(g_raw, t_raw))


class BlockPass:
    """One pair's metrics fed block by block: consecutive blocks of both sides (the arrays the kernels read:
    `kernel_dtype`), each but the last a whole number of `CHUNK`s, give the numbers `compare_tensors` gives for the
    whole pair, to the last bit. A caller reading a pair's files a block at a time keeps the block in the CPU's
    cache for the pass."""

    def __init__(self, test_dtype: str | None) -> None:
        self._top, self._floor, self._ulp_scale = _ulp_constants(canonical_dtype(test_dtype))
        self._st, self._counts = k.new_state(), [0, 0, 0, 0]
        self.numel = 0

    def add(self, g: np.ndarray, m: np.ndarray) -> None:
        """The next block of each side (1-D, contiguous, of one size)."""
        if g.size != m.size or (self.numel % CHUNK and g.size):
            raise ValueError("blocks of a pair: one size a side, whole chunks but the last")
        _add_chunks(g, m, 0, -(-g.size // CHUNK), self._st, self._counts, self._top, self._floor)
        self.numel += g.size

    def metrics(self, whole: Callable[[], tuple[RawTensor, RawTensor]]) -> PairMetrics:
        """The pair's metrics once every block was added; `whole` reads the pair in full when the KL divergence
        needs its float64 two-pass form (a large shift between the sides)."""

        def kl_direct() -> float | None:
            with np.errstate(all="ignore"):
                return _kl_direct(*whole())

        return _metrics_of_state(self._st, self._counts, self.numel, self._ulp_scale, kl_direct)


def kernel_dtype(dtype: str) -> np.dtype[Any] | None:
    """The array dtype the kernels read a payload of `dtype` (its name) as, in place; None for any other dtype."""
    return _KERNEL_DTYPES.get(dtype)


_KERNEL_DTYPES: dict[str, np.dtype[Any]] = {name: dt for dt, name in KINDS.items()}


def _metrics_of_state(
    st: np.ndarray, counts: list[int], numel: int, ulp_scale: float | None, kl_direct: Callable[[], float | None]
) -> PairMetrics:
    """The pair's metrics from the kernels' state of a pass over all its `numel` positions."""
    reasons: list[str] = []
    values_of_state = state_values(st)
    summ_g = _side_summary(values_of_state, k.G_SIDE, numel, counts[0], counts[1])
    summ_t = _side_summary(values_of_state, k.M_SIDE, numel, counts[2], counts[3])
    finite_only = any(counts)
    for side, s in (("golden_data", summ_g), ("my_data", summ_t)):
        if s.nan_count or s.inf_count:
            reasons.append(f"{side} includes {s.nan_count} NaN and {s.inf_count} Inf")
    n = int(st[k.P_N])
    if n == 0:
        reasons.append("no position is finite on both sides: no metrics")
        return PairMetrics(dict.fromkeys(ALL_METRICS), summ_g, summ_t, finite_only, "; ".join(reasons))
    if finite_only:
        reasons.append(f"metrics on the {n} of {numel} positions finite on both sides")
    values = _pair_values(values_of_state, ulp_scale)
    if values["kl_divergence"] is None:
        values["kl_divergence"] = kl_direct()
    return PairMetrics(values, summ_g, summ_t, finite_only, "; ".join(reasons) or None)


# ----------------------------------------------------------------------------------------------
# helpers


def _pass(g_raw: RawTensor, t_raw: RawTensor, top: int, floor: int) -> tuple[np.ndarray, list[int]]:
    """The kernels' state of the pair, and the (golden NaN, Inf, test NaN, Inf) counts. A pair of more than two
    `PART_BYTES` is cut into parts of whole chunks, each passed on a thread of its own (the kernels run without the
    GIL) and merged in order: one huge tensor keeps every core busy, with the same numbers on any machine."""
    st, counts = k.new_state(), [0, 0, 0, 0]
    g_whole, t_whole = _kernel_array(g_raw), _kernel_array(t_raw)
    if g_whole is None or t_whole is None:
        for g, m in zip(_chunks(g_raw, g_whole), _chunks(t_raw, t_whole), strict=True):
            _add_chunks(g, m, 0, 1, st, counts, top, floor)
        return st, counts
    g_arr, t_arr = g_whole, t_whole
    n_chunks = -(-g_arr.size // CHUNK)
    parts = max(1, min(n_chunks, (g_arr.nbytes + t_arr.nbytes) // PART_BYTES))
    if parts < 2:
        _add_chunks(g_arr, t_arr, 0, n_chunks, st, counts, top, floor)
        return st, counts
    per = -(-n_chunks // parts)

    def part(first: int) -> tuple[np.ndarray, list[int]]:
        part_st, part_counts = k.new_state(), [0, 0, 0, 0]
        _add_chunks(g_arr, t_arr, first, min(first + per, n_chunks), part_st, part_counts, top, floor)
        return part_st, part_counts

    for part_st, part_counts in _part_threads().map(part, range(0, n_chunks, per)):
        k.merge_state(st, part_st)  # into the empty state, the first part's sums as they are
        counts = [a + b for a, b in zip(counts, part_counts, strict=True)]
    return st, counts


def _add_chunks(
    g: np.ndarray, m: np.ndarray, first: int, stop: int, st: np.ndarray, counts: list[int], top: int, floor: int
) -> None:
    """Add chunks first .. stop - 1 of two arrays the kernels read in place to `st`; a chunk holding NaN or Inf by
    its finite parts (`_add_not_finite`)."""
    with np.errstate(all="ignore"):  # on a part's thread too: numpy's error state is per thread
        while (bad := kernel_code().pass_pair(g, m, first, stop, CHUNK, st, top, floor, True)) >= 0:
            chunk = slice(bad * CHUNK, (bad + 1) * CHUNK)
            _add_not_finite(g[chunk], m[chunk], st, counts, top, floor)
            first = bad + 1


_threads: ThreadPoolExecutor | None = None


def _part_threads() -> ThreadPoolExecutor:
    """The threads that pass the parts of a huge pair (one per core), started on first use in this process."""
    global _threads
    if _threads is None:
        _threads = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1), thread_name_prefix="wb-metric-part")
    return _threads


def _add_not_finite(g: np.ndarray, m: np.ndarray, st: np.ndarray, counts: list[int], top: int, floor: int) -> None:
    """A chunk holding NaN or Inf: each side's finite part to its statistics, the positions finite on both sides to
    the pair's."""
    for i, (side, x) in enumerate(((k.G_SIDE, g), (k.M_SIDE, m))):
        nan, inf = kernel_code().add_side(x, CHUNK, st, side)
        counts[2 * i] += nan
        counts[2 * i + 1] += inf
    g32, m32 = _as_float32(g), _as_float32(m)
    both = np.isfinite(g32) & np.isfinite(m32)
    n = int(np.count_nonzero(both))
    if n:
        kernel_code().pass_pair(g32[both], m32[both], 0, 1, n, st, top, floor, False)


def _kernel_array(raw: RawTensor) -> np.ndarray | None:
    """The tensor as the flat array the kernels read in place (float32, bfloat16's uint16 words, float16's as int16);
    None for any other dtype (converted chunk by chunk)."""
    flat = np.asarray(raw.array).reshape(-1)  # a plain ndarray: memmap's subclass hooks cost per call
    if flat.dtype == np.float32 and flat.dtype.isnative:
        return flat
    if raw.dtype == "bfloat16" and flat.dtype == np.uint16 and flat.dtype.isnative:
        return flat
    if flat.dtype == np.float16 and flat.dtype.isnative:
        return flat.view(np.int16)  # the kernels' float16 (numba has none on the CPU)
    return None


def _as_float32(x: np.ndarray) -> np.ndarray:
    """A chunk the kernels read (float32, bfloat16 or float16 words) as float32."""
    if x.dtype == np.float32:
        return x
    if x.dtype == np.int16:
        return x.view(np.float16).astype(np.float32)
    out = np.empty(x.size, np.float32)
    np.left_shift(x, 16, out=out.view(np.uint32), dtype=np.uint32)
    return out


def _chunks(raw: RawTensor, whole: np.ndarray | None) -> Iterator[np.ndarray]:
    """Contiguous chunks of a tensor, flattened, as the kernels read them: views of `whole` (its `_kernel_array`,
    flattened once) when there is one, else converted to float32."""
    flat = whole if whole is not None else np.asarray(raw.array).reshape(-1)
    for start in range(0, flat.size, CHUNK):
        part = flat[start : start + CHUNK]
        yield part if whole is not None else part.astype(np.float32)


def _logsumexp(x: np.ndarray) -> float:
    top = float(x.max())
    return top + math.log(float(np.exp(x - top).sum()))


def _logaddexp(a: float, b: float) -> float:
    if a == -math.inf:
        return b
    if b == -math.inf:
        return a
    top = max(a, b)
    return top + math.log(math.exp(a - top) + math.exp(b - top))


def _kl_direct(golden: RawTensor, test: RawTensor) -> float | None:
    """KL in float64, two passes: log-softmax of each side, then sum p (log p - log q), as msit."""
    lse_g = lse_m = -math.inf
    for g, m in _finite_pairs(golden, test):
        if g.size:
            lse_g = _logaddexp(lse_g, _logsumexp(g))
            lse_m = _logaddexp(lse_m, _logsumexp(m))
    if not math.isfinite(lse_g) or not math.isfinite(lse_m):
        return None
    kl = 0.0
    for g, m in _finite_pairs(golden, test):
        lp, lq = g - lse_g, m - lse_m
        kl += float(np.dot(np.exp(lp), lp - lq))
    return max(kl, 0.0) if math.isfinite(kl) else None


def _finite_pairs(golden: RawTensor, test: RawTensor) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for g, m in zip(_chunks(golden, _kernel_array(golden)), _chunks(test, _kernel_array(test)), strict=True):
        g, m = _as_float32(g), _as_float32(m)
        both = np.isfinite(g) & np.isfinite(m)
        yield g[both].astype(np.float64), m[both].astype(np.float64)
