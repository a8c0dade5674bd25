"""Every number the catalog holds about one golden/test tensor pair, computed in one chunked pass.

msit's seven metrics follow msit's definitions exactly (flattened, cast to float32, eps = float32
machine eps, mask |golden| <= eps, ...); the extra metrics (ULP, SNR, msprobe's thousandth
ratios) and the per-side statistics come from the same pass. Definitions, and where our numbers
differ from msit's in the last bits, are documented in `docs/metrics.md`.

Tensors are read in chunks of `CHUNK` elements (a memory-mapped tensor is paged in chunk by
chunk) and every step writes into reused chunk-sized scratch buffers, so the working set stays in
the L2 cache and nothing the size of the pair is ever allocated. The kernel is numpy: a compare
worker never imports torch (torch tensors are accepted too, viewed as arrays without a copy).
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.catalog.schema import ALL_METRICS
from workbench.compare.pairing.layout import layout_rule, not_comparable
from workbench.formats.arrays import RawTensor, as_raw
from workbench.formats.model import canonical_dtype

FLOAT_EPS = float(np.finfo(np.float32).eps)  # msit's FLOAT_EPSILON, 1.1920929e-07
COSINE_NORM_EPS = 1e-8  # torch.cosine_similarity's default eps (clamps each norm)
SNR_CAP_DB = 400.0  # |SNR| is clamped to this; identical tensors give +SNR_CAP_DB
CHUNK = 1 << 15  # elements per chunk: 128 KiB of float32; the ~10 scratch buffers stay in L2 cache

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
# scratch memory


class _Scratch(threading.local):
    """Chunk-sized buffers reused by every pair a thread compares (allocating them per chunk costs page faults)."""

    def __init__(self) -> None:
        self.size = 0

    def get(self, n: int) -> _Scratch:
        if n > self.size:
            self.size = max(n, CHUNK)
            f = self.size
            self.conv_g = np.empty(f, np.float32)
            self.conv_m = np.empty(f, np.float32)
            self.d = np.empty(f, np.float32)
            self.ad = np.empty(f, np.float32)
            self.ag = np.empty(f, np.float32)
            self.r = np.empty(f, np.float32)
            self.e = np.empty(f, np.float32)
            self.f = np.empty(f, np.float32)
            self.mask = np.empty(f, np.bool_)
            self.ones = np.ones(f, np.float32)
            self.g64 = np.empty(f, np.float64)
            self.m64 = np.empty(f, np.float64)
        return self


_SCRATCH = _Scratch()

_blas_pinned = False


def _one_blas_thread() -> None:
    """Make numpy's OpenBLAS run every call on the calling thread, once per process.

    The kernel's dots are over one chunk (32 Ki elements), above OpenBLAS's threading threshold (10^4): a dot then
    wakes its thread pool, which on a busy machine costs far more than it saves (a float64 dot of one chunk
    measured 34 us wall and 26 us of CPU against 3 us on one thread, with two compare workers on two cores). The
    compare's parallelism is its worker processes. The BLAS libraries loaded are found and set through
    threadpoolctl.
    """
    global _blas_pinned
    if _blas_pinned:
        return
    _blas_pinned = True
    from threadpoolctl import ThreadpoolController

    for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
        # torch's own BLAS (MKL, or an OpenBLAS some builds bundle) is left alone: torch sets its threads itself
        if "torch" not in str(lib.filepath).lower():
            lib.set_num_threads(1)


# ----------------------------------------------------------------------------------------------
# accumulators


@dataclass(slots=True)
class _Side:
    """Running statistics of one side's finite elements.

    Sums are kept around a shift (the first chunk's mean) so that std stays accurate when
    |mean| >> std even though chunks are summed in float32.
    """

    n: int = 0
    shift: float | None = None
    s1: float = 0.0  # sum (x - shift)
    s2: float = 0.0  # sum (x - shift)^2
    lo: float = math.inf
    hi: float = -math.inf
    nan: int = 0
    inf: int = 0

    def add(self, x: np.ndarray, lo: float, hi: float) -> float:
        """Add finite float32 elements with their min and max; returns their sum of squares."""
        n = x.size
        if n == 0:
            return 0.0
        self.lo = min(self.lo, lo)
        self.hi = max(self.hi, hi)
        if self.shift is None:
            mean = _sum(x) / n
            # shifting costs a pass; only worth it when the mean is large against the spread
            self.shift = mean if abs(mean) > (hi - lo) / 8 else 0.0
        c = self.shift
        y = np.subtract(x, np.float32(c), out=_SCRATCH.get(n).f[:n]) if c else x
        s1, s2 = _dot_sum(y), _sumsq(y)
        self.s1 += s1
        self.s2 += s2
        self.n += n
        return s2 + c * (2.0 * s1 + n * c)

    def summary(self, numel: int) -> TensorSummary:
        if self.n == 0 or self.shift is None:
            return TensorSummary(numel, nan_count=self.nan, inf_count=self.inf)
        n, c = self.n, self.shift
        mean = c + self.s1 / n
        sumsq = max(self.s2 + c * (2.0 * self.s1 + n * c), 0.0)
        std: float | None = None
        if n > 1:
            var = max(self.s2 - self.s1 * self.s1 / n, 0.0) / (n - 1)
            std = 0.0 if self.lo == self.hi else math.sqrt(var)
        return TensorSummary(numel, self.lo, self.hi, mean, std, math.sqrt(sumsq), self.nan, self.inf)


@dataclass(slots=True)
class _Pair:
    """Running sums of the pair metrics over the elements finite on both sides."""

    ulp: tuple[int, int] | None  # (mantissa bits, min exponent) of the test dtype
    n: int = 0
    g2: float = 0.0
    m2: float = 0.0
    d2: float = 0.0
    rel_max: float = 0.0
    rel_sum: float = 0.0
    abs_max: float = 0.0
    abs_sum: float = 0.0
    n_lt1: int = 0  # elements with msprobe RE < 0.001
    n_lt5: int = 0  # ... < 0.005
    ulp_max: float = 0.0
    # KL(softmax(g) || softmax(m)) = log E_p[e^d] - E_p[d], d = m - g, p = softmax(g):
    # online over chunks with a running max kl_g of g; sums are scaled by exp(-kl_g)
    kl_g: float = -math.inf
    kl_z: float = 0.0  # sum e^(g - kl_g)
    kl_a: float = 0.0  # sum e^(g - kl_g) * d
    kl_b: float = 0.0  # sum e^(g - kl_g) * (expm1(d) - d), while kl_series
    kl_series: bool = True  # every |d| < _SERIES_MAX so far
    kl_m: float = -math.inf  # running max of m
    kl_zm: float = 0.0  # sum e^(m - kl_m), once the series stopped (from the first chunk on)
    m_sum_pending: tuple[float, float] | None = None  # (max, sum) of m in the chunk where the series stopped
    _ulp_const: tuple[int, int, int, float] = field(default=(0, 0, 0, 1.0), repr=False)

    def __post_init__(self) -> None:
        if self.ulp is not None:
            mant, min_eb = self.ulp
            # scale 2^(mant - eb) is built as the float32 2^(mant - eb - s), s keeps it normal
            s = max(0, mant - min_eb - 127)
            self._ulp_const = ((mant - s + 254) << 23, (min_eb + 127) << 23, s, 2.0**s)

    def add(
        self,
        g: np.ndarray,
        m: np.ndarray,
        g2: float | None = None,
        m2: float | None = None,
        g_max: float | None = None,
        m_max: float | None = None,
    ) -> None:
        """Add contiguous float32 chunks finite on both sides (same length)."""
        n = g.size
        if n == 0:
            return
        sc = _SCRATCH.get(n)
        ones = sc.ones[:n]
        self.n += n
        self.g2 += _sumsq(g) if g2 is None else g2
        self.m2 += _sumsq(m) if m2 is None else m2
        d = np.subtract(m, g, out=sc.d[:n])
        self.d2 += _sumsq(d)
        ad = np.abs(d, out=sc.ad[:n])
        ag = np.abs(g, out=sc.ag[:n])
        r = sc.r[:n]
        # msit ignores positions where |g| <= eps (0 there)
        ag_min = float(ag.min())
        if ag_min <= FLOAT_EPS:
            keep = np.greater(ag, FLOAT_EPS, out=sc.mask[:n])
            np.divide(m, np.where(keep, g, np.float32(1.0)), out=r)
            np.subtract(r, np.float32(1.0), out=r)
            np.abs(r, out=r)
            r *= keep
            ad_m = ad * keep
        else:
            # msit: |m/g - 1| (not |m-g|/|g|), elementwise in float32
            np.divide(m, g, out=r)
            np.subtract(r, np.float32(1.0), out=r)
            np.abs(r, out=r)
            ad_m = ad
        self.rel_max = max(self.rel_max, float(r.max()))
        self.rel_sum += _sum(r)
        ad_m_max = float(ad_m.max())
        self.abs_max = max(self.abs_max, ad_m_max)
        self.abs_sum += _sum(ad_m)
        # msprobe's RE = |m-g|/|g|, with |g| = 0 replaced by float64 eps (msprobe adds eps to both)
        if ag_min < _F64_EPS:
            np.maximum(ag, np.float32(_F64_EPS), out=ag)
        rp = np.divide(ad, ag, out=r)
        self.n_lt1 += int(np.count_nonzero(np.less(rp, np.float32(0.001), out=sc.mask[:n])))
        self.n_lt5 += int(np.count_nonzero(np.less(rp, np.float32(0.005), out=sc.mask[:n])))
        d_max = ad_m_max if ad_m is ad else float(ad.max())
        if self.ulp is not None:
            top, floor, _s, _f = self._ulp_const
            # bit arithmetic modulo 2^32: the float32 whose bits are (top - exponent bits) is the scale
            e_bits = np.bitwise_and(g.view(np.uint32), np.uint32(0x7F800000), out=sc.r[:n].view(np.uint32))
            if ag_min < 2.0 ** ((floor >> 23) - 127):  # below the test dtype's normal range: clamp to its floor
                np.maximum(e_bits, np.uint32(floor), out=e_bits)
            np.subtract(np.uint32(top % (1 << 32)), e_bits, out=e_bits)
            np.multiply(ad, e_bits.view(np.float32), out=ad)
            self.ulp_max = max(self.ulp_max, float(ad.max()))
        gmax = float(g.max()) if g_max is None else g_max
        mmax = float(m.max()) if m_max is None else m_max
        eg = np.subtract(g, np.float32(gmax), out=sc.e[:n])
        np.exp(eg, out=eg)
        z = float(np.dot(eg, ones))
        a = float(np.dot(eg, d))
        series = self.kl_series and d_max < _SERIES_MAX
        if series:
            # expm1(d) - d = d^2 (1/2 + d/6 + d^2/24 + d^3/120 + ...), truncation < 3e-7 relative
            h = np.multiply(d, np.float32(1.0 / 120.0), out=sc.f[:n])
            h += np.float32(1.0 / 24.0)
            h *= d
            h += np.float32(1.0 / 6.0)
            h *= d
            h += np.float32(0.5)
            h *= d
            eg *= d
            b = float(np.dot(eg, h))
        else:
            b = 0.0
            zm = _exp_sum(m, mmax)
            if self.kl_series:
                # the series stops here: the direct form needs the sum over m of the chunks before too, which the
                # caller adds (`add_m_sums`) before this chunk's, so every sum is the one a pass without the series
                # would have made (not a float64 two-pass KL: that was 2/3 of the metric CPU on bf16 dumps of a
                # 2048-hidden Llama)
                self.kl_series = False
                self.m_sum_pending = (mmax, zm)
            else:
                self._add_m_sum(mmax, zm)
        if gmax > self.kl_g:
            k = math.exp(self.kl_g - gmax) if self.kl_g > -math.inf else 0.0
            self.kl_z, self.kl_a, self.kl_b, self.kl_g = self.kl_z * k, self.kl_a * k, self.kl_b * k, gmax
        else:
            k = math.exp(gmax - self.kl_g)
            z, a, b = z * k, a * k, b * k
        self.kl_z += z
        self.kl_a += a
        self.kl_b += b

    def _add_m_sum(self, mmax: float, zm: float) -> None:
        if mmax > self.kl_m:
            self.kl_zm = self.kl_zm * (math.exp(self.kl_m - mmax) if self.kl_m > -math.inf else 0.0) + zm
            self.kl_m = mmax
        else:
            self.kl_zm += zm * math.exp(mmax - self.kl_m)

    def add_m_sums(self, before: Iterator[tuple[np.ndarray, np.ndarray]]) -> None:
        """Once the series stopped (`m_sum_pending`): add the sums over m of the chunks `before` the one where it
        stopped (as `add` received them), then that chunk's."""
        assert self.m_sum_pending is not None
        for _g, m in before:
            if m.size:
                mmax = float(m.max())
                self._add_m_sum(mmax, _exp_sum(m, mmax))
        self._add_m_sum(*self.m_sum_pending)
        self.m_sum_pending = None

    def cosine(self) -> float:
        """The one-pass cosine of the elements added so far (unrounded)."""
        if self.g2 == 0.0 and self.m2 == 0.0:
            return 1.0
        # g.m = (|g|^2 + |m|^2 - |m-g|^2) / 2: |m-g|^2 carries the rounding of the small
        # difference only, so this is as exact as msit's float64 dot product
        dot = 0.5 * (self.g2 + self.m2 - self.d2) if self.g2 and self.m2 else 0.0
        return dot / (max(math.sqrt(self.g2), COSINE_NORM_EPS) * max(math.sqrt(self.m2), COSINE_NORM_EPS))

    def values(self) -> dict[str, float | None]:
        n = self.n
        cos = 1.0 if self.g2 == 0.0 and self.m2 == 0.0 else round(min(max(self.cosine(), -1.0), 1.0), 10)
        if math.sqrt(self.g2) <= FLOAT_EPS:
            red = 0.0
        else:
            red = math.sqrt(self.d2 / self.g2)
        if self.d2 == 0.0:
            snr = SNR_CAP_DB
        elif self.g2 == 0.0 or math.isinf(self.d2):
            snr = -SNR_CAP_DB
        else:
            snr = min(max(10.0 * math.log10(self.g2 / self.d2), -SNR_CAP_DB), SNR_CAP_DB)
        return {
            "cosine_similarity": cos,
            "max_relative_error": self.rel_max,
            "mean_relative_error": self.rel_sum / n,
            "max_absolute_error": self.abs_max,
            "mean_absolute_error": self.abs_sum / n,
            "kl_divergence": self._kl(),
            "relative_euclidean_distance": red,
            "max_ulp_error": None if self.ulp is None else self.ulp_max * self._ulp_const[3],
            "snr_db": snr,
            "one_thousandth_err_ratio": self.n_lt1 / n,
            "five_thousandths_err_ratio": self.n_lt5 / n,
        }

    def _kl(self) -> float | None:
        if self.kl_series:
            # log E_p[e^d] - E_p[d] = log1p(x) - x + E_p[expm1(d) - d], x = E_p[expm1(d)]:
            # no cancellation between O(1) terms, so tiny KLs keep their relative precision
            x = (self.kl_a + self.kl_b) / self.kl_z
            kl = self.kl_b / self.kl_z + (math.log1p(x) - x)
        else:
            # -E_p[d] + LSE(m) - LSE(g): absolute error ~1e-7 * the terms, like msit's; when they
            # are large (a big shift between m and g) the float64 two-pass form takes over
            mean_d = self.kl_a / self.kl_z
            if abs(mean_d) + abs(self.kl_m - self.kl_g) > _DIRECT_MAX_SHIFT:
                return None
            kl = -mean_d - math.log(self.kl_z) + math.log(self.kl_zm) + (self.kl_m - self.kl_g)
        return max(kl, 0.0) if math.isfinite(kl) else None


_F64_EPS = 2.220446049250313e-16  # np.finfo(float).eps, msprobe's
_SERIES_MAX = 0.1  # largest |m - g| for which KL uses the series for expm1(d) - d
_COSINE_EXACT_BELOW = 0.999  # below this the one-pass cosine may be off in the 10th decimal: redo in float64
# once the running one-pass cosine falls below this, every further chunk also gets its float64 sums in the pass (the
# chunk is in cache then); only the chunks before that are read again when the final cosine is below 0.999
_COSINE_TRACK_BELOW = 0.9999
_DIRECT_MAX_SHIFT = 10.0  # beyond this the one-pass direct KL loses precision: two passes in float64


def _exp_sum(m: np.ndarray, mmax: float) -> float:
    """sum e^(m - mmax) of a float32 chunk whose max is `mmax`."""
    n = m.size
    sc = _SCRATCH.get(n)
    em = np.subtract(m, np.float32(mmax), out=sc.f[:n])
    np.exp(em, out=em)
    return float(np.dot(em, sc.ones[:n]))


def _sumsq(x: np.ndarray) -> float:
    """Sum of squares: float32 BLAS dot, redone in float64 when float32 overflows."""
    v = float(np.dot(x, x))
    if math.isfinite(v):
        return v
    x64 = x.astype(np.float64)
    return float(np.dot(x64, x64))


def _dot_sum(x: np.ndarray) -> float:
    """Sum as a BLAS dot with ones (3x faster than numpy's pairwise sum, a little less exact), float64 on
    overflow; for sums whose rounding does not reach a reported digit."""
    v = float(np.dot(x, _SCRATCH.get(x.size).ones[: x.size]))
    return v if math.isfinite(v) else float(x.sum(dtype=np.float64))


def _sum(x: np.ndarray) -> float:
    """Sum (float32 accumulation, pairwise), redone in float64 when float32 overflows."""
    v = float(x.sum())
    return v if math.isfinite(v) else float(x.sum(dtype=np.float64))


# ----------------------------------------------------------------------------------------------
# public API

TensorLike = Any  # a RawTensor, a numpy array or a torch tensor


def summarize(t: TensorLike) -> TensorSummary:
    """numel, min, max, mean, std, L2 norm (over the finite elements) and NaN/Inf counts of `t`."""
    _one_blas_thread()
    raw = as_raw(t)
    if raw.array.dtype.kind == "c":
        return TensorSummary(raw.numel)
    side = _Side()
    with np.errstate(all="ignore"):
        for x in _chunks(raw, "g"):
            _add_side(side, x)
    return side.summary(raw.numel)


def compare_tensors(golden: TensorLike, test: TensorLike, test_dtype: str | None = None) -> PairMetrics:
    """All metrics of one pair plus both sides' statistics; never raises on odd data.

    `test_dtype` names the dtype the test run computed in (for the ULP unit); by default the
    test tensor's own dtype. Two shapes are compared element by element only when they are equal or a
    layout rule relates them (`workbench.compare.pairing.layout`: squeezed batch, merged heads); otherwise the
    pair is `not comparable` (no metrics), never silently flattened.
    """
    _one_blas_thread()
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
    reasons: list[str] = []
    if gshape != tshape and layout_rule(gshape, tshape) is None:
        return PairMetrics(none, summarize(g_raw), summarize(t_raw), False, not_comparable(gshape, tshape))
    dtype = canonical_dtype(test_dtype) or canonical_dtype(t_raw.dtype)
    gs, ts, pair = _Side(), _Side(), _Pair(_ULP_PARAMS.get(dtype or ""))
    exact: list[tuple[float, float, float]] | None = None  # float64 sums of each chunk from chunk `exact_from` on
    exact_from: int | None = None
    for k, (g, m) in enumerate(zip(_chunks(g_raw, "g"), _chunks(t_raw, "m"), strict=True)):
        g_lo, g_hi = float(g.min()), float(g.max())
        m_lo, m_hi = float(m.min()), float(m.max())
        if math.isfinite(g_lo + g_hi + m_lo + m_hi):  # NaN propagates through min/max
            g2, m2 = gs.add(g, g_lo, g_hi), ts.add(m, m_lo, m_hi)
            pair.add(g, m, g2, m2, g_hi, m_hi)
        else:
            fg, fm = _add_side(gs, g), _add_side(ts, m)
            both = fg & fm
            g, m = g[both], m[both]
            pair.add(g, m)
        if exact is None and pair.cosine() < _COSINE_TRACK_BELOW:
            exact, exact_from = [], k
        if exact is not None:
            exact.append(_sums64(g, m))
        if pair.m_sum_pending is not None:  # last in the loop: it reads the chunks before into the scratch buffers
            pair.add_m_sums(itertools.islice(_finite_pairs32(g_raw, t_raw), k))
    summ_g, summ_t = gs.summary(g_raw.numel), ts.summary(t_raw.numel)
    finite_only = bool(summ_g.nan_count or summ_g.inf_count or summ_t.nan_count or summ_t.inf_count)
    for side, s in (("golden_data", summ_g), ("my_data", summ_t)):
        if s.nan_count or s.inf_count:
            reasons.append(f"{side} includes {s.nan_count} NaN and {s.inf_count} Inf")
    if pair.n == 0:
        reasons.append("no position is finite on both sides: no metrics")
        return PairMetrics(none, summ_g, summ_t, finite_only, "; ".join(reasons))
    if finite_only:
        reasons.append(f"metrics on the {pair.n} of {g_raw.numel} positions finite on both sides")
    values = pair.values()
    cos = values["cosine_similarity"]
    if cos is not None and cos < _COSINE_EXACT_BELOW:
        values["cosine_similarity"] = _cosine_exact(g_raw, t_raw, exact_from, exact or [])
    if values["kl_divergence"] is None:
        values["kl_divergence"] = _kl_direct(g_raw, t_raw)
    return PairMetrics(values, summ_g, summ_t, finite_only, "; ".join(reasons) or None)


# ----------------------------------------------------------------------------------------------
# helpers


def _chunks(raw: RawTensor, side: str) -> Iterator[np.ndarray]:
    """Contiguous float32 chunks of a tensor, flattened: views when it is float32, else converted into the
    side's scratch buffer (valid until the next chunk)."""
    flat = np.asarray(raw.array).reshape(-1)  # a plain ndarray: memmap's subclass hooks cost per call
    n = flat.size
    for start in range(0, n, CHUNK):
        part = flat[start : start + CHUNK]
        if part.dtype == np.float32:
            yield part
            continue
        k = part.size
        sc = _SCRATCH.get(k)
        buf = (sc.conv_g if side == "g" else sc.conv_m)[:k]
        if raw.dtype == "bfloat16":
            np.left_shift(part, 16, out=buf.view(np.uint32), dtype=np.uint32)
        else:
            np.copyto(buf, part, casting="unsafe")
        yield buf


def _add_side(side: _Side, x: np.ndarray) -> np.ndarray:
    """Count NaN/Inf of chunk `x`, add its finite part to `side`; returns the finite mask."""
    fin = np.isfinite(x)
    n_fin = int(np.count_nonzero(fin))
    if n_fin < x.size:
        n_nan = int(np.count_nonzero(np.isnan(x)))
        side.nan += n_nan
        side.inf += x.size - n_fin - n_nan
        x = x[fin]
    if x.size:
        side.add(x, float(x.min()), float(x.max()))
    return fin


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


def _sums64(g: np.ndarray, m: np.ndarray) -> tuple[float, float, float]:
    """(g.m, g.g, m.m) of two float32 chunks in float64 (every product exact, as msit's float64 cosine)."""
    n = g.size
    sc = _SCRATCH.get(n)
    a, b = sc.g64[:n], sc.m64[:n]
    np.copyto(a, g)
    np.copyto(b, m)
    return float(np.dot(a, b)), float(np.dot(a, a)), float(np.dot(b, b))


def _cosine_exact(
    golden: RawTensor, test: RawTensor, exact_from: int | None, tail: list[tuple[float, float, float]]
) -> float:
    """msit's cosine (float64 dot, torch's per-norm eps clamp) for dissimilar pairs: the float64 sums of the chunks
    before chunk `exact_from` (all when None) are computed here, one more pass over them; `tail` holds those of the
    chunks from it on (over the positions finite on both sides)."""
    head = [_sums64(g, m) for g, m in itertools.islice(_finite_pairs32(golden, test), exact_from)]
    dot = g2 = m2 = 0.0
    for c_dot, c_g2, c_m2 in itertools.chain(head, tail):  # chunk order: the same sums whichever pass made them
        dot += c_dot
        g2 += c_g2
        m2 += c_m2
    if g2 == 0.0 and m2 == 0.0:
        return 1.0
    return round(dot / (max(math.sqrt(g2), COSINE_NORM_EPS) * max(math.sqrt(m2), COSINE_NORM_EPS)), 10)


def _finite_pairs32(golden: RawTensor, test: RawTensor) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The float32 chunks of both tensors as `_compare` hands them to `_Pair.add`: whole when every element of
    both is finite, else the positions finite on both sides."""
    for g, m in zip(_chunks(golden, "g"), _chunks(test, "m"), strict=True):
        if math.isfinite(float(g.min()) + float(g.max()) + float(m.min()) + float(m.max())):
            yield g, m
        else:
            both = np.isfinite(g) & np.isfinite(m)
            yield g[both], m[both]


def _finite_pairs(golden: RawTensor, test: RawTensor) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    for g, m in zip(_chunks(golden, "g"), _chunks(test, "m"), strict=True):
        both = np.isfinite(g) & np.isfinite(m)
        yield g[both].astype(np.float64), m[both].astype(np.float64)
