"""The fused metric pass: numba loops that read each element of a golden/test pair once and keep every sum, max and
count the catalog reports.

A pair is walked in chunks of `chunk` elements. Per chunk, one loop finds both sides' min and max (and whether any
element is NaN or Inf), further loops compute the rest: float32 sums over blocks of `BLOCK` elements, added in
float64 (vectorised: LLVM may reorder the sums, never the NaN/Inf semantics or the rounding of a division), into the
pair's state, `st`, a float64 array laid out by `kernel_state`'s `S_*`/`P_*` offsets. The cosine's three sums are
float64 from the first element (msit's float64 dot). The KL's sums are kept online against a running max of each
side, so the series form (while every |m - g| < `SERIES_MAX`) and the direct form are both ready at the end. Loops
index slices from 0: a loop from a variable start keeps numba's negative-index check on every load, and LLVM does
not vectorise it.

Golden and test arrays are 1-D and contiguous: float32, uint16 holding bfloat16 bits or int16 holding float16 bits
(read in place). A chunk with a NaN or an Inf stops the walk (`pass_pair` returns its index) and is handed back to the
caller, which adds each side's finite part (`add_side`) and the positions finite on both sides (`pass_pair` on those)
to the same state. States of consecutive parts of a pair merge (`kernel_state.merge_state`). The entry points are C
functions (`compile_entry`), one per element kind of each array; `kernel_code` keeps their machine code and calls them.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic, overload

from workbench.compare.judging.kernel_state import (
    G_SIDE,
    M_SIDE,
    P_ABS_MAX,
    P_ABS_SUM,
    P_D2,
    P_D_MAX,
    P_DOT,
    P_GG,
    P_KL_A,
    P_KL_B,
    P_KL_G,
    P_KL_M,
    P_KL_Z,
    P_KL_ZM,
    P_MM,
    P_N,
    P_N_LT1,
    P_N_LT5,
    P_REL_MAX,
    P_REL_SUM,
    P_ULP_MAX,
    S_DECIDED,
    S_HI,
    S_LO,
    S_N,
    S_S1,
    S_S2,
    S_SHIFT,
    STATE_LEN,
)


def _wide_vectors() -> None:
    """Let LLVM vectorise the kernels 512 bits wide on a CPU with AVX-512 (16 float32 lanes, not 8): its tuning for
    every AVX-512 CPU prefers 256-bit vectors (older ones slowed their clock for wider ones), and the fused pass then
    runs ~1.6x slower here (`bench/bench_kernel_width.py`). Tuning only: the code runs on the same CPUs either way.
    Set before numba makes its code generator (this module's first `overload`), and only where the user has not
    chosen the CPU (`NUMBA_CPU_NAME`, `NUMBA_CPU_FEATURES`) and no code generator exists yet."""
    from numba.core import config, registry

    settings = vars(config)  # numba fills its settings in from the environment (no attributes a checker sees)
    chosen = settings.get("CPU_NAME") is not None or settings.get("CPU_FEATURES") is not None
    if chosen or "_toplevel_target_context" in vars(registry.cpu_target):
        return
    from numba.core.codegen import get_host_cpu_features

    features = get_host_cpu_features()
    if {"+avx512f", "+avx512vl", "+avx512bw"} <= set(features.split(",")):
        settings["CPU_FEATURES"] = features + ",-prefer-256-bit"


_wide_vectors()


def _array_math_without_scipy() -> None:
    """Load numba's array-math registry (what a first compile or cache load does) telling its BLAS probe there is no
    SciPy: the probe imports scipy.linalg, numpy.f2py with it, ~0.2 s of every compare process's start, and the
    kernels call no BLAS. SciPy itself is left as it was: only numba's `np.dot` in jitted code of this process is
    off."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    sys.modules["scipy.linalg"] = None  # type: ignore[assignment]  # makes `import scipy.linalg...` fail at once
    try:
        import numba.np.arraymath  # noqa: F401
    finally:
        del sys.modules["scipy.linalg"]


_array_math_without_scipy()


def _cpu_converts_halves() -> bool:
    """Whether the code is compiled for this CPU and it converts float16 to float32 itself (x86's F16C, every 64-bit
    ARM): elsewhere LLVM would call a runtime helper the loaded machine code cannot find."""
    import platform

    import llvmlite.binding as llvm

    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return False
    if platform.machine().lower() in ("aarch64", "arm64"):
        return True
    try:
        return bool(llvm.get_host_cpu_features().get("f16c", False))
    except RuntimeError:
        return False


_CPU_CONVERTS_HALVES = _cpu_converts_halves()

BLOCK = 256  # elements summed in float32 before their sum is added in float64

_FASTMATH = {"reassoc", "contract", "nsz"}  # reorder sums and fuse multiply-adds; NaN, Inf and division stay exact
# the helpers are inlined into the entry points (C functions, compiled by `compile_entry`)
_JIT: dict[str, Any] = dict(fastmath=_FASTMATH, boundscheck=False, error_model="numpy")

_F = np.float32
_EPS = _F(np.finfo(np.float32).eps)  # msit's FLOAT_EPSILON (`metrics.FLOAT_EPS`): |golden| at or below it is masked
_F64_EPS = _F(2.220446049250313e-16)  # msprobe's eps (float64's), as float32
_F32_MAX = _F(3.4028235e38)
_EXPONENT_BITS = np.uint32(0x7F800000)
_EXP_FLOOR = _F(-87.3)  # below it e^x leaves float32's normal range: taken as 0 (against a sum of at least 1)
_LOG2E = _F(1.44269504088896341)
_LN2_HI = _F(0.693359375)
_LN2_LO = _F(-2.12194440e-4)


# ----------------------------------------------------------------------------------------------
# bit casts and element loads


def _f32_from_bits_typing(typingctx: Any, bits: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


def _bits_of_f32_typing(typingctx: Any, x: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def _f32_from_f16_bits_typing(typingctx: Any, bits: Any) -> Any:
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        # exact (every half is a float); LLVM turns a loop of these into the CPU's own conversion (F16C, AVX-512)
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.int16), codegen


# compiled code only: the float32 with these bits, the bits of a float32, and the float32 of float16 bits
_f32_from_bits: Any = intrinsic(_f32_from_bits_typing)
_bits_of_f32: Any = intrinsic(_bits_of_f32_typing)
_f32_from_f16_bits: Any = intrinsic(_f32_from_f16_bits_typing)


def _load(a: np.ndarray, i: int) -> Any:
    """Element i as float32 of a float32 array, a uint16 array of bfloat16 bits or an int16 array of float16 bits
    (numba has no float16 on the CPU)."""
    raise NotImplementedError  # replaced by the overload in compiled code


@overload(_load)
def _load_impl(a: Any, i: Any) -> Any:
    # the implementations repeat the typing function's signature, annotations included (numba compares them)
    def float32_at(a: Any, i: Any) -> Any:
        return a[i]

    def bfloat16_at(a: Any, i: Any) -> Any:
        return _f32_from_bits(np.uint32(a[i]) << np.uint32(16))

    def float16_at(a: Any, i: Any) -> Any:
        return _f32_from_f16_bits(a[i])

    def float16_in_bits_at(a: Any, i: Any) -> Any:
        # a CPU without its own conversion: exponent and mantissa moved into float32's places and scaled by 2^112
        # (normal and subnormal halves alike); Inf and NaN keep float32's top exponent; then the sign
        h = np.uint32(a[i]) & np.uint32(0xFFFF)
        em = (h & np.uint32(0x7FFF)) << np.uint32(13)
        v = _bits_of_f32(_f32_from_bits(em) * _F(5.192296858534828e33))
        v = v if em < np.uint32(0x0F800000) else em | np.uint32(0x7F800000)
        return _f32_from_bits(v | ((h & np.uint32(0x8000)) << np.uint32(16)))

    if a.dtype == types.float32:
        return float32_at
    if a.dtype == types.uint16:
        return bfloat16_at
    if a.dtype == types.int16:
        return float16_at if _CPU_CONVERTS_HALVES else float16_in_bits_at
    return None


@njit(inline="always", **_JIT)
def _order_key(x: Any) -> Any:
    """An int32 whose order is the float's (min and max over ints vectorise; over floats they need no-NaN math)."""
    b = np.int32(_bits_of_f32(x))
    return b ^ ((b >> np.int32(31)) & np.int32(0x7FFFFFFF))


@njit(inline="always", **_JIT)
def _from_order_key(k: Any) -> Any:
    return _f32_from_bits(np.uint32(k ^ ((k >> np.int32(31)) & np.int32(0x7FFFFFFF))))


@njit(inline="always", **_JIT)
def _exp_neg(x: Any) -> Any:
    """e^x in float32 for x <= 0 (Cephes expf's range reduction and polynomial, ~1 ulp)."""
    xc = max(x, _EXP_FLOOR)
    k = np.int32(xc * _LOG2E - _F(0.5))  # round to nearest (x <= 0)
    kf = _F(k)
    r = xc - kf * _LN2_HI - kf * _LN2_LO
    p = _F(1.9875691500e-4)
    p = p * r + _F(1.3981999507e-3)
    p = p * r + _F(8.3334519073e-3)
    p = p * r + _F(4.1665795894e-2)
    p = p * r + _F(1.6666665459e-1)
    p = p * r + _F(5.0000001201e-1)
    p = p * r * r + r + _F(1.0)
    e = p * _f32_from_bits(np.uint32((k + np.int32(127)) << np.int32(23)))
    return e if x >= _EXP_FLOOR else _F(0.0)


# ----------------------------------------------------------------------------------------------
# one chunk


@njit(inline="always", **_JIT)
def _scan(g: np.ndarray, m: np.ndarray, lo: int, hi: int) -> Any:
    """(golden min, max, test min, max, whether any element is NaN or Inf, golden sum, test sum) of elements lo..hi."""
    top = np.int32(0x7FFFFFFF)
    g_lo, g_hi, m_lo, m_hi = top, -top - np.int32(1), top, -top - np.int32(1)
    top_exponent = np.uint32(0)  # NaN and Inf alone have every exponent bit set: one max, no count
    g_sum = m_sum = _F(0.0)
    gc, mc = g[lo:hi], m[lo:hi]  # indices from 0: numba then drops its negative-index check (which stops SIMD)
    for i in range(hi - lo):
        gv, mv = _load(gc, i), _load(mc, i)
        exponents = max(_bits_of_f32(gv) & _EXPONENT_BITS, _bits_of_f32(mv) & _EXPONENT_BITS)
        top_exponent = max(top_exponent, exponents)
        kg, km = _order_key(gv), _order_key(mv)
        g_lo, g_hi, m_lo, m_hi = min(g_lo, kg), max(g_hi, kg), min(m_lo, km), max(m_hi, km)
        g_sum += gv
        m_sum += mv
    return (
        _from_order_key(g_lo),
        _from_order_key(g_hi),
        _from_order_key(m_lo),
        _from_order_key(m_hi),
        top_exponent == _EXPONENT_BITS,
        g_sum,
        m_sum,
    )


@njit(inline="always", **_JIT)
def _decide_shift(st: np.ndarray, side: int, total: Any, n: int, lo: Any, hi: Any) -> None:
    """Side sums are kept around a shift, the first chunk's mean when it is large against the spread, so the std
    stays accurate when |mean| >> std."""
    if st[side + S_DECIDED] == 0.0 and n > 0:
        mean = total / n
        st[side + S_SHIFT] = mean if abs(mean) > (hi - lo) / 8.0 else 0.0
        st[side + S_DECIDED] = 1.0


@njit(inline="always", **_JIT)
def _add_side_sums(st: np.ndarray, side: int, n: int, s1: Any, s2: Any, lo: Any, hi: Any) -> None:
    st[side + S_N] += n
    st[side + S_S1] += s1
    st[side + S_S2] += s2
    st[side + S_LO] = min(st[side + S_LO], lo)
    st[side + S_HI] = max(st[side + S_HI], hi)


@njit(inline="always", **_JIT)
def _side_sums(x: np.ndarray, lo: int, hi: int, shift: Any) -> Any:
    """(sum of x - shift, sum of (x - shift)^2) over the finite elements lo..hi: float32 sums of `BLOCK` elements,
    added in float64 (as exact as a pairwise sum, at the speed of a float32 one)."""
    zero: Any = 0.0
    s1 = s2 = zero
    for start in range(lo, hi, BLOCK):
        b1 = b2 = _F(0.0)
        xb = x[start : min(start + BLOCK, hi)]
        for i in range(xb.size):
            v = _load(xb, i)
            y = v - shift if abs(v) <= _F32_MAX else _F(0.0)
            b1 += y
            b2 += y * y
        if abs(b1) <= _F32_MAX and b2 <= _F32_MAX:
            s1 += b1
            s2 += b2
        else:  # float32 overflowed (values near its max): this block in float64
            for i in range(xb.size):
                v = _load(xb, i)
                y6 = np.float64(v - shift) if abs(v) <= _F32_MAX else 0.0
                s1 += y6
                s2 += y6 * y6
    return s1, s2


@njit(inline="always", **_JIT)
def _finite_sum(x: np.ndarray, lo: int, hi: int, total: Any) -> Any:
    """`total`, the float32 sum of the finite elements lo..hi, redone in float64 when it overflowed."""
    if abs(total) <= _F32_MAX:
        return total
    t6 = 0.0
    xc = x[lo:hi]
    for i in range(hi - lo):
        v = _load(xc, i)
        t6 += np.float64(v) if abs(v) <= _F32_MAX else 0.0
    return t6


@njit(inline="always", **_JIT)
def _fused(
    g: np.ndarray,
    m: np.ndarray,
    lo: int,
    hi: int,
    g_max: Any,
    m_max: Any,
    ulp_top: int,
    ulp_floor: int,
) -> Any:
    """Every pair sum, max and count of elements lo..hi (all finite), 16 float64 values (read by `_add_pair_sums`)."""
    zero: Any = 0.0
    dot = gg = mm = d2 = rel_sum = abs_sum = z = a = b = zm = zero
    rel_max = abs_max = d_max = ulp_max = np.uint32(0)  # float32 bits of non-negative values: ordered as ints
    count: Any = 0
    n1 = n5 = count
    top32, floor32 = np.uint32(ulp_top), np.uint32(ulp_floor)
    for start in range(lo, hi, BLOCK):
        # float32 sums of one block, added in float64 below; the cosine's products are float64 (exact)
        b_d2 = b_rel = b_abs = b_z = b_a = b_b = b_zm = _F(0.0)
        gb, mb = g[start : min(start + BLOCK, hi)], m[start : min(start + BLOCK, hi)]
        for i in range(gb.size):
            gv, mv = _load(gb, i), _load(mb, i)
            g6, m6 = np.float64(gv), np.float64(mv)
            dot += g6 * m6
            gg += g6 * g6
            mm += m6 * m6
        # the float64 products alone above: the loops below hold float32 and 32-bit words only (the counts are
        # float32, exact up to a block's 256), and LLVM vectorises them twice as wide (16 lanes with AVX-512); the
        # two exps of the KL's loop were a third of the pass at 8 lanes
        c1 = c5 = _F(0.0)
        for i in range(gb.size):
            gv, mv = _load(gb, i), _load(mb, i)
            d = mv - gv
            b_d2 += d * d
            ad, ag = abs(d), abs(gv)
            d_max = max(d_max, _bits_of_f32(ad))
            # msit: |m/g - 1| (not |m - g|/|g|) in float32, 0 where |g| <= eps
            keep = ag > _EPS
            r = abs(mv / (gv if keep else _F(1.0)) - _F(1.0)) if keep else _F(0.0)
            b_rel += r
            rel_max = max(rel_max, _bits_of_f32(r))
            ad_kept = ad if keep else _F(0.0)
            b_abs += ad_kept
            abs_max = max(abs_max, _bits_of_f32(ad_kept))
            # msprobe's RE = |m - g| / |g|, |g| = 0 replaced by float64's eps
            rp = ad / max(ag, _F64_EPS)
            c1 += _F(1.0) if rp < _F(0.001) else _F(0.0)
            c5 += _F(1.0) if rp < _F(0.005) else _F(0.0)
            # ULP: the float32 whose bits are (ulp_top - exponent bits of g) is 2^(mantissa - exponent) (mod 2^32)
            e_bits = max(_bits_of_f32(gv) & np.uint32(0x7F800000), floor32)
            ulp_max = max(ulp_max, _bits_of_f32(ad * _f32_from_bits(np.uint32(top32 - e_bits))))
        n1 += np.int64(c1)
        n5 += np.int64(c5)
        for i in range(gb.size):
            gv, mv = _load(gb, i), _load(mb, i)
            d = mv - gv
            # KL(softmax(g) || softmax(m)) = log E_p[e^d] - E_p[d], p = softmax(g); expm1(d) - d as its series
            eg = _exp_neg(gv - g_max)
            b_z += eg
            ed = eg * d
            b_a += ed
            b_b += ed * (((d * _F(1.0 / 120.0) + _F(1.0 / 24.0)) * d + _F(1.0 / 6.0)) * d + _F(0.5)) * d
            b_zm += _exp_neg(mv - m_max)
        if b_d2 <= _F32_MAX and b_rel <= _F32_MAX and b_abs <= _F32_MAX:
            d2 += b_d2
            rel_sum += b_rel
            abs_sum += b_abs
        else:  # float32 overflowed: these sums of the block in float64 (Inf only where float64 overflows too)
            for i in range(gb.size):
                gv, mv = _load(gb, i), _load(mb, i)
                d6 = np.float64(mv - gv)  # the float32 difference, Inf where it overflows (as msit)
                d2 += d6 * d6
                keep = abs(gv) > _EPS
                rel_sum += np.float64(abs(mv / gv - _F(1.0))) if keep else 0.0
                abs_sum += abs(np.float64(mv - gv)) if keep else 0.0
        z += b_z
        a += b_a
        b += b_b
        zm += b_zm
    f6 = np.float64
    return (
        dot,
        gg,
        mm,
        d2,
        rel_sum,
        f6(_f32_from_bits(rel_max)),
        abs_sum,
        f6(_f32_from_bits(abs_max)),
        f6(n1),
        f6(n5),
        f6(_f32_from_bits(ulp_max)),
        z,
        a,
        b,
        zm,
        f6(_f32_from_bits(d_max)),
    )


@njit(inline="always", **_JIT)
def _rescaled(total_max: Any, total: Any, part_max: Any, part: Any) -> Any:
    """Two sums of e^(x - max) against their own maxes, as one against the larger max: (max, sum)."""
    if part_max > total_max:
        k = np.exp(total_max - part_max) if total_max > -np.inf else 0.0
        return part_max, total * k + part
    return total_max, total + part * np.exp(part_max - total_max)


@njit(inline="always", **_JIT)
def _add_pair_sums(st: np.ndarray, n: int, c: Any, g_max: Any, m_max: Any) -> None:
    st[P_N] += n
    st[P_DOT] += c[0]
    st[P_GG] += c[1]
    st[P_MM] += c[2]
    st[P_D2] += c[3]
    st[P_REL_SUM] += c[4]
    st[P_REL_MAX] = max(st[P_REL_MAX], c[5])
    st[P_ABS_SUM] += c[6]
    st[P_ABS_MAX] = max(st[P_ABS_MAX], c[7])
    st[P_N_LT1] += c[8]
    st[P_N_LT5] += c[9]
    st[P_ULP_MAX] = max(st[P_ULP_MAX], c[10])
    st[P_D_MAX] = max(st[P_D_MAX], c[15])
    if g_max > st[P_KL_G]:
        k = np.exp(st[P_KL_G] - g_max) if st[P_KL_G] > -np.inf else 0.0
        st[P_KL_Z], st[P_KL_A], st[P_KL_B] = st[P_KL_Z] * k + c[11], st[P_KL_A] * k + c[12], st[P_KL_B] * k + c[13]
        st[P_KL_G] = g_max
    else:
        k = np.exp(g_max - st[P_KL_G])
        st[P_KL_Z] += c[11] * k
        st[P_KL_A] += c[12] * k
        st[P_KL_B] += c[13] * k
    st[P_KL_M], st[P_KL_ZM] = _rescaled(st[P_KL_M], st[P_KL_ZM], m_max, c[14])


# ----------------------------------------------------------------------------------------------
# entry points


@njit(inline="always", **_JIT)
def _pass_chunks(
    g: np.ndarray,
    m: np.ndarray,
    first: int,
    stop: int,
    chunk: int,
    st: np.ndarray,
    ulp_top: int,
    ulp_floor: int,
    sides: bool,
) -> int:
    """Add chunks `first` .. `stop - 1` of the pair to `st` (each side's statistics too when `sides`); returns the
    index of the first chunk holding a NaN or an Inf (not added), or -1 when every chunk was added."""
    n = g.size
    for c in range(first, min(stop, (n + chunk - 1) // chunk)):
        lo = c * chunk
        hi = min(lo + chunk, n)
        g_lo, g_hi, m_lo, m_hi, bad, g_sum, m_sum = _scan(g, m, lo, hi)
        if bad:
            return c
        if sides:  # a second read of the chunk, from the cache: the same loop as `add_side`, so the same sums
            _decide_shift(st, G_SIDE, _finite_sum(g, lo, hi, g_sum), hi - lo, g_lo, g_hi)
            s1, s2 = _side_sums(g, lo, hi, _F(st[G_SIDE + S_SHIFT]))
            _add_side_sums(st, G_SIDE, hi - lo, s1, s2, g_lo, g_hi)
            _decide_shift(st, M_SIDE, _finite_sum(m, lo, hi, m_sum), hi - lo, m_lo, m_hi)
            s1, s2 = _side_sums(m, lo, hi, _F(st[M_SIDE + S_SHIFT]))
            _add_side_sums(st, M_SIDE, hi - lo, s1, s2, m_lo, m_hi)
        _add_pair_sums(st, hi - lo, _fused(g, m, lo, hi, g_hi, m_hi, ulp_top, ulp_floor), g_hi, m_hi)
    return -1


@njit(inline="always", **_JIT)
def _add_side_chunks(x: np.ndarray, chunk: int, st: np.ndarray, side: int) -> tuple[int, int]:
    """Add the finite elements of `x` to one side's statistics in `st`, chunk by chunk; returns its (NaN, Inf)
    counts."""
    n = x.size
    top = np.int32(0x7FFFFFFF)
    nan = not_finite = 0
    for c in range((n + chunk - 1) // chunk):
        lo = c * chunk
        hi = min(lo + chunk, n)
        k_lo, k_hi = top, -top - np.int32(1)
        total = _F(0.0)
        fin = 0
        xc = x[lo:hi]
        for i in range(hi - lo):
            v = _load(xc, i)
            finite = abs(v) <= _F32_MAX
            nan += 1 if v != v else 0
            fin += 1 if finite else 0
            k = _order_key(v)
            k_lo, k_hi = min(k_lo, k if finite else top), max(k_hi, k if finite else -top - np.int32(1))
            total += v if finite else _F(0.0)
        not_finite += hi - lo - fin
        if fin == 0:
            continue
        v_lo, v_hi = _from_order_key(k_lo), _from_order_key(k_hi)
        _decide_shift(st, side, _finite_sum(x, lo, hi, total), fin, v_lo, v_hi)
        s1, s2 = _side_sums(x, lo, hi, _F(st[side + S_SHIFT]))
        _add_side_sums(st, side, fin, s1, s2, v_lo, v_hi)
    return nan, not_finite - nan


# ----------------------------------------------------------------------------------------------
# entry points: C functions on raw pointers, one per element kind of each array (`kernel_code` calls them through
# ctypes, without the GIL, and keeps their machine code between processes)

ELEMENT_TYPES = {"float32": types.float32, "bfloat16": types.uint16, "float16": types.int16}


def _pass_pair(
    gp: Any, mp: Any, n: int, first: int, stop: int, chunk: int, stp: Any, ulp_top: int, ulp_floor: int, sides: int
) -> int:
    """Add chunks `first` .. `stop - 1` of the pair (n elements each side) to the state (each side's statistics too
    when `sides`); returns the index of the first chunk holding a NaN or an Inf (not added), or -1 when every chunk
    was added."""
    st = carray(stp, STATE_LEN)
    return _pass_chunks(carray(gp, n), carray(mp, n), first, stop, chunk, st, ulp_top, ulp_floor, sides != 0)


def _add_side(xp: Any, n: int, chunk: int, stp: Any, side: int, countp: Any) -> int:
    """Add the finite elements of one side (n elements) to its statistics in the state, chunk by chunk; its (NaN, Inf)
    counts into `countp`."""
    nan, inf = _add_side_chunks(carray(xp, n), chunk, carray(stp, STATE_LEN), side)
    counts = carray(countp, 2)
    counts[0], counts[1] = nan, inf
    return 0


def compile_entry(entry: str, kinds: tuple[str, ...]) -> Any:
    """numba's C function for `entry` ("pass_pair": golden and test kinds; "add_side": one kind), kinds named as in
    `ELEMENT_TYPES`: its `address`, `native_name` and `_library` (the machine code)."""
    i8, state = types.int64, types.CPointer(types.float64)
    ptrs = [types.CPointer(ELEMENT_TYPES[k]) for k in kinds]
    # no numba cache: a function loaded from it has no object code left to keep (`kernel_code` keeps its own)
    options: dict[str, Any] = dict(fastmath=_FASTMATH, boundscheck=False, error_model="numpy")
    if entry == "pass_pair":
        g, m = ptrs
        return cfunc(i8(g, m, i8, i8, i8, i8, state, i8, i8, i8), **options)(_pass_pair)
    if entry == "add_side":
        (x,) = ptrs
        return cfunc(i8(x, i8, i8, state, i8, types.CPointer(i8)), **options)(_add_side)
    raise ValueError(f"no kernel entry {entry!r}")
