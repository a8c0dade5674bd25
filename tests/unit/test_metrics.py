"""Metrics: against msit's own functions, hand-computed values, and float64 references."""

from __future__ import annotations

import importlib
import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import workbench.compare.judging.kernel_state as kernel_state
import workbench.compare.judging.metrics as metrics
from workbench.catalog.schema import ALL_METRICS, MSIT_METRICS
from workbench.compare.judging.metrics import SNR_CAP_DB, TensorSummary, compare_tensors, summarize


def _msit_algs() -> dict[str, Callable[..., Any]] | None:
    try:
        return dict(importlib.import_module("components.utils.cmp_algorithm").CMP_ALG_MAP)
    except ImportError:
        return None


MSIT = _msit_algs()


def _true_kl(g: torch.Tensor, m: torch.Tensor) -> float:
    g64, m64 = g.reshape(-1).double(), m.reshape(-1).double()
    return F.kl_div(F.log_softmax(m64, -1), F.softmax(g64, -1), reduction="sum").item()


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(7)
    g = torch.randn(384, 1024, generator=gen) * 2
    g[g.abs() < 0.02] = 0.0  # exact zeros exercise msit's |golden| <= eps mask
    g[0, :5] = torch.tensor([1e-8, -5e-8, 1e-7, 2e-7, -1e-30])  # around eps
    big = torch.randn(70_000, generator=gen) * 300 + 20  # large magnitudes, |m - g| > 0.1
    return [
        ("bf16", g, g.to(torch.bfloat16)),
        ("fp16", g, g.to(torch.float16)),
        ("fp32-noise", g, g * (1 + 1e-6 * torch.randn(g.shape, generator=gen))),
        ("big-bf16", big, big.to(torch.bfloat16)),
        ("wrong", g, g.flip(0)),
        ("int", torch.arange(-500, 500).reshape(10, 100), torch.arange(-500, 500).reshape(10, 100) // 2 * 2),
        ("transposed", g[:64, :64], g[:64, :64].t().contiguous()),
    ]


@pytest.mark.skipif(MSIT is None, reason="msit (components.utils.cmp_algorithm) not installed")
@pytest.mark.parametrize("case", _cases(), ids=lambda c: c[0])
def test_agrees_with_msit(case: tuple[str, torch.Tensor, torch.Tensor]) -> None:
    _name, golden, test = case
    assert MSIT is not None
    ours = compare_tensors(golden, test).values
    g, m = golden.reshape(-1).float(), test.reshape(-1).float()
    for metric in MSIT_METRICS:
        ref = float(MSIT[metric](g, m)[0])
        if metric == "kl_divergence":
            # msit sums in float32 (absolute noise ~1e-6 on 400k elements); ours matches float64
            assert ours[metric] == pytest.approx(_true_kl(g, m), rel=1e-4, abs=1e-9)
            assert ours[metric] == pytest.approx(ref, rel=2e-3, abs=3e-6)
        elif metric in ("max_relative_error", "max_absolute_error", "cosine_similarity"):
            assert ours[metric] == ref, metric  # same elementwise float32 ops / float64 rounding
        else:
            assert ours[metric] == pytest.approx(ref, rel=2e-6, abs=1e-12), metric


def test_hand_computed_values() -> None:
    g = torch.tensor([1.0, 2.0, 0.0, -4.0])
    m = torch.tensor([1.5, 2.0, 1.0, -3.0])
    r = compare_tensors(g, m, test_dtype="float32")
    v = r.values
    assert set(v) == set(ALL_METRICS)
    dot, ng, nm = 1.5 + 4 + 12, math.sqrt(21), math.sqrt(2.25 + 4 + 1 + 9)
    assert v["cosine_similarity"] == round(dot / (ng * nm), 10)
    # position 2 has golden 0: masked out of msit's relative and absolute errors
    assert v["max_relative_error"] == pytest.approx(0.5)
    assert v["mean_relative_error"] == pytest.approx((0.5 + 0 + 0 + 0.25) / 4)
    assert v["max_absolute_error"] == pytest.approx(1.0)
    assert v["mean_absolute_error"] == pytest.approx((0.5 + 0 + 0 + 1.0) / 4)
    d2 = 0.25 + 0 + 1 + 1
    assert v["relative_euclidean_distance"] == pytest.approx(math.sqrt(d2 / 21))
    assert v["snr_db"] == pytest.approx(10 * math.log10(21 / d2))
    p = np.exp([1.0, 2.0, 0.0, -4.0]) / np.exp([1.0, 2.0, 0.0, -4.0]).sum()
    q = np.exp([1.5, 2.0, 1.0, -3.0]) / np.exp([1.5, 2.0, 1.0, -3.0]).sum()
    assert v["kl_divergence"] == pytest.approx(float((p * np.log(p / q)).sum()), rel=1e-6)
    # msprobe RE: 0.5, 0, (g == 0, m != 0: huge), 0.25 -> one position below 0.001 and 0.005
    assert v["one_thousandth_err_ratio"] == 0.25 and v["five_thousandths_err_ratio"] == 0.25
    # ULP (float32, msprobe): |m-g| * 2^(23 - eb), eb = max(floor(log2|g|), -126)
    assert v["max_ulp_error"] == pytest.approx(1.0 * 2.0 ** (23 + 126))
    assert r.reason is None and r.finite_only is False


def test_ulp_and_thousandth_ratios_per_dtype() -> None:
    g = torch.tensor([1.0, 3.0, 1000.0, 0.001])
    m = torch.tensor([1.0 + 2**-7, 3.0, 1000.0 + 8.0, 0.001])
    assert compare_tensors(g, m, "bfloat16").values["max_ulp_error"] == pytest.approx(2.0)  # 8 / ulp_bf16(1000)=4
    assert compare_tensors(g, m, "float16").values["max_ulp_error"] == pytest.approx(16.0)  # 8 / 0.5
    assert compare_tensors(g, m.to(torch.bfloat16)).values["max_ulp_error"] is not None
    assert compare_tensors(g.long(), m.long()).values["max_ulp_error"] is None  # int test dtype
    # rounding to bf16/fp16 costs at most half an ulp
    x = torch.randn(50_000, generator=torch.Generator().manual_seed(3)) * 10
    for dt in (torch.bfloat16, torch.float16):
        assert 0.4 < compare_tensors(x, x.to(dt)).values["max_ulp_error"] <= 0.5  # type: ignore[operator]
    # msprobe's RE with g == 0: 0 when m == 0 too, huge otherwise
    r = compare_tensors(torch.tensor([0.0, 0.0, 1.0, 1.0]), torch.tensor([0.0, 1e-3, 1.0004, 1.004])).values
    assert r["one_thousandth_err_ratio"] == 0.5 and r["five_thousandths_err_ratio"] == 0.75


def test_ratios_match_msprobe_float64_definition() -> None:
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(200_000, generator=gen)
    g[::97] = 0.0
    m = g + torch.randn(200_000, generator=gen) * 1e-3 * g.abs()
    m[::194] = 0.0
    n, b = m.double().numpy(), g.double().numpy()
    zero = b == 0
    re = np.abs(np.where(zero, n + np.finfo(float).eps, n) - np.where(zero, np.finfo(float).eps, b)) / np.abs(
        np.where(zero, np.finfo(float).eps, b)
    )
    v = compare_tensors(g, m).values
    # float32 vs float64 RE may differ at the boundary by an element or two
    assert v["one_thousandth_err_ratio"] == pytest.approx(float(np.mean(re < 0.001)), abs=2e-5)
    assert v["five_thousandths_err_ratio"] == pytest.approx(float(np.mean(re < 0.005)), abs=2e-5)


def test_kl_matches_float64_in_every_regime(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(11)
    g = torch.randn(150_000, generator=gen) * 3
    tests = {
        "series (small d)": g.to(torch.float16),
        "direct (|d| > 0.1)": g + 0.5 * torch.randn(150_000, generator=gen),
        "scaled": g * 1.05,
        "two-pass fallback (big shift)": g * 40 + 7,
        "shift only": g + 3.0,
    }
    for label, m in tests.items():
        ours = compare_tensors(g, m).values["kl_divergence"]
        assert ours == pytest.approx(_true_kl(g, m.float()), rel=1e-4, abs=2e-7), label
    monkeypatch.setattr(metrics, "CHUNK", 4096)  # many chunks: online merging of max and sums
    for label, m in tests.items():
        assert compare_tensors(g, m).values["kl_divergence"] == pytest.approx(
            _true_kl(g, m.float()), rel=1e-4, abs=2e-7
        ), label


def test_chunking_gives_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(3, 50_000, generator=gen)
    g[1, 100:200] = 0.0
    m = g.to(torch.bfloat16)
    whole = compare_tensors(g, m)
    monkeypatch.setattr(metrics, "CHUNK", 1000)
    chunked = compare_tensors(g, m)
    for k in ALL_METRICS:
        assert chunked.values[k] == pytest.approx(whole.values[k], rel=1e-5, abs=1e-12), k
    # float32 chunk sums: the mean is exact to ~1e-7 of the spread, not of its (near 0) value
    assert chunked.golden.mean == pytest.approx(whole.golden.mean, abs=1e-7)
    assert chunked.test.std == pytest.approx(whole.test.std, rel=1e-6)


def test_nan_inf_metrics_on_the_finite_part(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metrics, "CHUNK", 5000)  # non-finite values in some chunks only
    gen = torch.Generator().manual_seed(4)
    g = torch.randn(20_000, generator=gen)
    m = g.to(torch.float16).float()
    g[7] = float("nan")
    m[12_345] = float("inf")
    m[19_999] = float("nan")
    m[15_000] = -float("inf")
    r = compare_tensors(g, m, test_dtype="float16")
    assert r.finite_only is True
    assert (r.golden_nan_count, r.golden_inf_count, r.my_nan_count, r.my_inf_count) == (1, 0, 1, 2)
    assert r.reason is not None and "my_data includes 1 NaN and 2 Inf" in r.reason and "19996 of 20000" in r.reason
    keep = torch.isfinite(g) & torch.isfinite(m)
    ref = compare_tensors(g[keep], m[keep], test_dtype="float16")
    for k in ALL_METRICS:
        assert r.values[k] == pytest.approx(ref.values[k], rel=1e-6, abs=1e-12), k
    # statistics on each side's own finite part
    assert r.golden.numel == 20_000 and r.golden.mean == pytest.approx(
        float(g[torch.isfinite(g)].double().mean()), abs=1e-7
    )
    assert r.test.max == float(m[torch.isfinite(m)].max())
    nothing = compare_tensors(torch.full((4,), float("nan")), torch.ones(4))
    assert all(v is None for v in nothing.values.values()) and "no position is finite" in str(nothing.reason)


def test_special_cases_never_raise() -> None:
    # msit: cosine 1.0 when both all zero; torch's eps clamping makes one all-zero side 0
    assert compare_tensors(torch.zeros(5), torch.zeros(5)).values["cosine_similarity"] == 1.0
    one_zero = compare_tensors(torch.zeros(5), torch.ones(5)).values
    assert one_zero["cosine_similarity"] == 0.0 and one_zero["relative_euclidean_distance"] == 0.0
    assert one_zero["snr_db"] == -SNR_CAP_DB
    same = compare_tensors(torch.ones(5), torch.ones(5)).values
    assert same["snr_db"] == SNR_CAP_DB and same["kl_divergence"] == 0.0
    empty = compare_tensors(torch.zeros(0, 4), torch.zeros(0, 4))
    assert all(v is None for v in empty.values.values()) and "empty" in str(empty.reason)
    assert empty.golden == TensorSummary(0)
    mismatch = compare_tensors(torch.zeros(2, 3), torch.zeros(3, 3))
    assert all(v is None for v in mismatch.values.values())
    assert mismatch.reason == "data shape doesn't match: golden [2, 3] (6 elements) vs test [3, 3] (9 elements)"
    assert mismatch.test.numel == 9
    # a layout rule (merged dimensions) relates the shapes: compared, and nothing to report
    merged = compare_tensors(torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(1, 6))
    assert merged.values["cosine_similarity"] == 1.0 and merged.reason is None
    # the same element count under a transposed shape: not comparable, never flattened silently
    swapped = compare_tensors(torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(3, 2))
    assert all(v is None for v in swapped.values.values())
    assert swapped.reason == "not comparable: shape [2, 3] vs [3, 2] (no layout rule maps one onto the other)"
    scalar = compare_tensors(torch.tensor(2.0), torch.tensor(2.5))
    assert scalar.values["max_relative_error"] == pytest.approx(0.25)
    huge = compare_tensors(torch.full((10,), 3e38), torch.full((10,), -3e38)).values
    # m - g overflows float32, as in msit (everything is compared in float32)
    assert huge["max_absolute_error"] == math.inf and huge["relative_euclidean_distance"] == math.inf
    boolean = compare_tensors(torch.tensor([True, False]), torch.tensor([True, True]))
    assert boolean.values["max_absolute_error"] == 0.0  # golden 0 is masked, as in msit
    assert (
        compare_tensors(torch.ones(2, dtype=torch.complex64), torch.ones(2)).reason
        == "complex tensors are not compared"
    )


def test_summarize() -> None:
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(100_003, generator=gen) * 3 + 1000
    s = summarize(x.to(torch.bfloat16))
    ref = x.to(torch.bfloat16).double()
    assert s.numel == 100_003 and (s.nan_count, s.inf_count) == (0, 0)
    assert s.min == float(ref.min()) and s.max == float(ref.max())
    assert s.mean == pytest.approx(float(ref.mean()), rel=1e-7)
    assert s.std == pytest.approx(float(ref.std()), rel=1e-4)  # unbiased, like torch.std
    assert s.norm == pytest.approx(float(ref.norm()), rel=1e-6)
    assert summarize(torch.full((7,), 0.1)).std == 0.0
    with_bad = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 3.0])
    assert summarize(with_bad) == TensorSummary(5, 1.0, 3.0, 2.0, math.sqrt(2.0), math.sqrt(10.0), 1, 2)
    assert summarize(torch.tensor([5])) == TensorSummary(1, 5.0, 5.0, 5.0, None, 5.0, 0, 0)
    assert summarize(torch.zeros(0)) == TensorSummary(0)
    assert summarize(torch.tensor([float("nan")])) == TensorSummary(1, nan_count=1)


def test_memory_mapped_input_is_read_in_chunks(tmp_path: Any) -> None:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(300_000, generator=gen)
    path = tmp_path / "t.pt"
    torch.save(g.to(torch.bfloat16), path)
    mapped = torch.load(path, weights_only=True, mmap=True)
    r = compare_tensors(g, mapped)
    assert r.values["max_ulp_error"] <= 0.5  # type: ignore[operator]
    assert r.test == summarize(g.to(torch.bfloat16))


def _cosine64(g: torch.Tensor, m: torch.Tensor) -> float:
    """msit's cosine in float64 over the positions finite on both sides, chunk by chunk as `metrics` sums it."""
    g, m = g.reshape(-1).float(), m.reshape(-1).float()
    keep = torch.isfinite(g) & torch.isfinite(m)
    dot = gg = mm = 0.0
    for start in range(0, g.numel(), metrics.CHUNK):
        k = keep[start : start + metrics.CHUNK]
        a = g[start : start + metrics.CHUNK][k].double().numpy()
        b = m[start : start + metrics.CHUNK][k].double().numpy()
        dot, gg, mm = dot + float(np.dot(a, b)), gg + float(np.dot(a, a)), mm + float(np.dot(b, b))
    return round(dot / (math.sqrt(gg) * math.sqrt(mm)), 10)


def test_dissimilar_pairs_get_the_float64_cosine_wherever_they_diverge(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair whose running cosine falls below 0.999 only in a later chunk: the float64 sums of the chunks before are
    computed again, those after come from the pass; the cosine is msit's float64 one either way."""
    monkeypatch.setattr(metrics, "CHUNK", 1000)
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(20_000, generator=gen)
    late = g.to(torch.bfloat16).float()
    late[15_000:] = torch.randn(5_000, generator=gen)  # similar for 15 chunks, then not
    early = g.flip(0)  # dissimilar from the first chunk
    between = g + 0.02 * torch.randn(20_000, generator=gen)  # cosine in [0.999, 0.9999): tracked, one-pass kept
    with_nan = late.clone()
    with_nan[3] = float("nan")
    with_nan[17_000] = float("inf")
    for label, m in (("late", late), ("early", early), ("with NaN and Inf", with_nan)):
        assert compare_tensors(g, m).values["cosine_similarity"] == _cosine64(g, m), label
    cos = compare_tensors(g, between).values["cosine_similarity"]
    assert cos is not None and 0.999 <= cos < 0.9999
    assert cos == pytest.approx(_cosine64(g, between), abs=2e-10)


def test_kl_series_that_stops_in_a_later_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The KL's series stops where |m - g| first reaches 0.1 (chunk 12 of 20 here): the direct form's sums are kept
    from the first chunk on, so the KL is the one a pass without the series makes, to the last bit."""
    monkeypatch.setattr(metrics, "CHUNK", 1000)
    gen = torch.Generator().manual_seed(9)
    g = torch.randn(20_000, generator=gen) * 2
    m = g.to(torch.bfloat16).float()
    m[12_500] += 0.5
    with_nan = m.clone()
    with_nan[40] = float("nan")  # a chunk before the stop reduced to its finite positions
    for label, test in (("finite", m), ("NaN before the stop", with_nan)):
        stops = compare_tensors(g, test).values["kl_divergence"]
        keep = torch.isfinite(test)
        assert stops == pytest.approx(_true_kl(g[keep], test[keep]), rel=1e-4, abs=2e-7), label
        with monkeypatch.context() as never:
            never.setattr(kernel_state, "SERIES_MAX", -1.0)  # the direct form from the first chunk on
            assert compare_tensors(g, test).values["kl_divergence"] == stops, label


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_words_read_in_place_give_the_numbers_of_their_float32_copy(
    dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernels read bfloat16 and float16 words in place: the same numbers as the same values handed over as
    float32, on both sides, in one chunk and in many (float16 subnormals, Inf and NaN included)."""
    gen = torch.Generator().manual_seed(12)
    g = torch.randn(70_001, generator=gen)
    m = (g * 1.01 + 0.01 * torch.randn(70_001, generator=gen)).to(dtype)
    m[:3] = torch.tensor([1e-7, -3e-6, float("inf")]).to(dtype)  # float16 subnormals, an Inf
    m[5] = float("nan")
    name = str(dtype).removeprefix("torch.")
    for chunk in (metrics.CHUNK, 4096):
        monkeypatch.setattr(metrics, "CHUNK", chunk)
        in_place, copied = compare_tensors(g, m), compare_tensors(g, m.float(), test_dtype=name)
        assert in_place.values == copied.values
        a, b = in_place.test, copied.test  # float32 block sums: the loops may group the lanes otherwise
        assert (a.numel, a.min, a.max, a.nan_count, a.inf_count) == (b.numel, b.min, b.max, 1, 1)
        for stat in ("mean", "std", "norm"):
            assert getattr(a, stat) == pytest.approx(getattr(b, stat), rel=1e-7), stat
        both = compare_tensors(g.to(dtype), m)
        assert both.values == compare_tensors(g.to(dtype).float(), m.float(), name).values


def test_float32_overflow_in_a_sum_is_redone_in_float64() -> None:
    """An attention mask of float32's lowest value: its statistics are float64's (the float32 sums overflow)."""
    mask = torch.zeros(64, 64)
    mask.triu_(1)
    mask[mask > 0] = torch.finfo(torch.float32).min
    ref = mask.double()
    s = summarize(mask)
    assert s.mean == pytest.approx(float(ref.mean()), rel=1e-6)
    assert s.norm == pytest.approx(float(ref.norm()), rel=1e-6)
    assert s.std == pytest.approx(float(ref.std()), rel=1e-6)
    r = compare_tensors(mask, mask.to(torch.bfloat16))
    assert r.golden == s and r.values["cosine_similarity"] == pytest.approx(1.0, abs=1e-5)
    assert r.values["mean_absolute_error"] is not None and math.isfinite(r.values["mean_absolute_error"])


def test_kernels_compile_without_scipy_linalg() -> None:
    """numba's BLAS probe imports scipy.linalg (~0.2 s of every process compiling the kernels): they compile
    without it."""
    code = (
        "import sys; from workbench.compare.judging import kernels; "
        "kernels.compile_entry('add_side', ('float32',)); print('scipy.linalg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_a_pair_passed_in_parts_on_threads_gives_the_numbers_of_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge pair is cut into parts of whole chunks, passed on threads and merged: every metric is the one pass's
    to float64 rounding (the KL's running maxes, NaN/Inf in one part), the statistics to float32's (each part sums
    its side around a shift of its own)."""
    gen = torch.Generator().manual_seed(21)
    g = torch.randn(200_000, generator=gen) * 3 + 50  # |mean| >> std: the sides' sums are kept around a shift
    g[150_000:] -= 80  # the later parts have other means (and the KL's running max moves)
    cases = {
        "bf16 series": g.to(torch.bfloat16),
        "direct KL": g + 0.5 * torch.randn(200_000, generator=gen),
    }
    with_bad = g.to(torch.bfloat16).float()
    with_bad[123_456], with_bad[7] = float("nan"), float("inf")
    cases["NaN and Inf"] = with_bad
    monkeypatch.setattr(metrics, "CHUNK", 4096)
    whole = {label: compare_tensors(g, m) for label, m in cases.items()}
    monkeypatch.setattr(metrics, "PART_BYTES", 4096 * 8 * 5)  # parts of 5 chunks: 10 parts
    for label, m in cases.items():
        split, one = compare_tensors(g, m), whole[label]
        assert split.reason == one.reason and split.finite_only == one.finite_only, label
        for key in ALL_METRICS:
            assert split.values[key] == pytest.approx(one.values[key], rel=1e-9, abs=1e-10), (label, key)
        for side in ("golden", "test"):
            a, b = getattr(split, side), getattr(one, side)
            assert (a.numel, a.min, a.max, a.nan_count, a.inf_count) == (
                b.numel,
                b.min,
                b.max,
                b.nan_count,
                b.inf_count,
            )
            for stat in ("mean", "std", "norm"):
                assert getattr(a, stat) == pytest.approx(getattr(b, stat), rel=1e-7), (label, side, stat)


def test_metrics_from_the_state_as_python_floats_are_those_of_numpy_scalars() -> None:
    """The metrics are computed from the kernels' state as Python floats (`state_values`): the same IEEE operations
    as on numpy's float64 scalars, and the cosine's rounding to 10 decimals done as numpy does it (x 1e10, to the
    even integer, / 1e10): every value equal to the last bit."""
    from workbench.formats.arrays import as_raw

    rng = np.random.default_rng(3)
    top, floor, scale = metrics._ulp_constants("bfloat16")
    for n in (1, 7, 1000, 70_001):
        g = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        m = (g * (1 + 0.01 * torch.randn(n))).to(torch.bfloat16)
        st, _counts = metrics._pass(as_raw(g), as_raw(m), top, floor)
        scalars, floats = list(st), metrics.state_values(st)
        assert all(type(v) is float for v in floats) and all(isinstance(v, np.float64) for v in scalars)
        for side in (kernel_state.G_SIDE, kernel_state.M_SIDE):
            assert metrics._side_summary(floats, side, n, 0, 0) == metrics._side_summary(scalars, side, n, 0, 0)
        assert metrics._pair_values(floats, scale) == metrics._pair_values(scalars, scale)
    cosines = np.concatenate([rng.uniform(-1, 1, 20_000), 1 - rng.exponential(1e-7, 20_000), [0.25e-10, 2.5e-10]])
    assert all(round(np.float64(c), 10) == round(float(c) * 1e10) / 1e10 for c in cosines)
