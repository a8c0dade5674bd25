"""Thresholds: loading, merging, validation, judging, and calibration on a real tiny Llama.

Run as a script to print the calibration margins recorded in docs/metrics.md:
    PYTHONPATH=. .venv/bin/python tests/unit/test_thresholds.py
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from workbench.compare.judging.dtypes import more_precise
from workbench.compare.judging.gain import CARRIED_GAIN, carried_gain, few_elements_stretch
from workbench.compare.judging.judge import judge_pair, model_node
from workbench.compare.judging.metrics import compare_tensors
from workbench.compare.judging.thresholds import NAN_INF, Thresholds

Fault = tuple[str, Callable[[torch.nn.Module], None]]  # (module name, how to break the test model)


# ---------------------------------------------------------------------------------------------
# a tiny Llama, golden fp32 vs test bf16/fp16, module outputs captured with forward hooks

_CACHE: dict[str, object] = {}


def _model() -> torch.nn.Module:
    if "model" not in _CACHE:
        import transformers

        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=4,
            vocab_size=1000,
            max_position_embeddings=128,
            rms_norm_eps=1e-6,
        )
        _CACHE["model"] = transformers.LlamaForCausalLM(cfg).eval()
    return _CACHE["model"]  # type: ignore[return-value]


def _run(dtype: torch.dtype, fault: Fault | None = None, scale_output: str | None = None) -> dict[str, torch.Tensor]:
    """Outputs of every module (first tensor of tuples) for a fixed prompt of 48 tokens."""
    model = copy.deepcopy(_model()).to(dtype)
    if fault is not None:
        fault[1](model.get_submodule(fault[0]))
    outs: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Callable[..., object]:
        def fn(_mod: torch.nn.Module, _inp: object, out: object) -> object:
            first = out[0] if isinstance(out, tuple) else out
            if not isinstance(first, torch.Tensor):
                return None
            if name == scale_output:
                first = first * 1.05
                out = (first, *out[1:]) if isinstance(out, tuple) else first
            outs[name] = first.detach().clone()
            return out

        return fn

    for name, mod in model.named_modules():
        if name:
            mod.register_forward_hook(hook(name))
    ids = torch.randint(0, 1000, (1, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        model(ids)
    return outs


def _golden() -> dict[str, torch.Tensor]:
    if "golden" not in _CACHE:
        _CACHE["golden"] = _run(torch.float32)
    return _CACHE["golden"]  # type: ignore[return-value]


def _judge_all(
    th: Thresholds, test: dict[str, torch.Tensor], dtype: str, only: set[str] | None = None
) -> dict[str, tuple[bool | None, list[str], dict[str, float | None]]]:
    out = {}
    for name, g in _golden().items():
        if only is not None and name not in only:
            continue
        vals = compare_tensors(g, test[name], test_dtype=dtype).values
        passed, failed = th.judge(vals, dtype, node_name=name, node_type="")
        out[name] = (passed, failed, vals)
    return out


def _margins(
    th: Thresholds, results: dict[str, tuple[bool | None, list[str], dict[str, float | None]]], dtype: str
) -> dict[str, float]:
    """Per verdict metric, the smallest distance to its bound over all modules, as a factor."""
    worst: dict[str, float] = {}
    for name, (_p, _f, vals) in results.items():
        for metric in th.verdict_metrics(dtype, node_name=name):
            lo, hi = th.bounds_for(metric, dtype, node_name=name)
            v = vals[metric]
            if v is None:
                continue
            # cosine-like (min bound near 1): compare 1 - v with 1 - min; error-like: bound / v
            factor = ((1 - lo) / max(1 - v, 1e-12)) if lo is not None else (hi / max(v, 1e-30))  # type: ignore[operator]
            worst[metric] = min(worst.get(metric, math.inf), factor)
    return worst


FAULTS: dict[str, Fault] = {
    "rmsnorm eps 1e-2 (layer 0 input_layernorm)": (
        "model.layers.0.input_layernorm",
        lambda mod: setattr(mod, "variance_epsilon", 1e-2),
    ),
}
SCALED = ("model.layers.1.mlp", "model.layers.2.self_attn.o_proj", "model.layers.3", "model.norm", "lm_head")


# ---------------------------------------------------------------------------------------------
# calibration tests (real model, real metrics)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defaults_pass_every_module_of_a_clean_run(dtype: torch.dtype) -> None:
    th = Thresholds.load()
    name = str(dtype).removeprefix("torch.")
    results = _judge_all(th, _run(dtype), name)
    assert len(results) > 40
    failing = {k: (f, v) for k, (p, f, v) in results.items() if p is not True}
    assert not failing, failing
    assert all(f >= 2.0 for f in _margins(th, results, name).values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defaults_fail_an_output_scaled_by_1_05(dtype: torch.dtype) -> None:
    th = Thresholds.load()
    name = str(dtype).removeprefix("torch.")
    for module in ("model.layers.1.mlp", "lm_head"):
        res = _judge_all(th, _run(dtype, scale_output=module), name, only={module})
        passed, failed, vals = res[module]
        assert passed is False and "relative_euclidean_distance" in failed, (module, vals)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_defaults_fail_a_wrong_rmsnorm_epsilon(dtype: torch.dtype) -> None:
    th = Thresholds.load()
    name = str(dtype).removeprefix("torch.")
    module, fault = FAULTS["rmsnorm eps 1e-2 (layer 0 input_layernorm)"]
    res = _judge_all(th, _run(dtype, fault=(module, fault)), name, only={module})
    passed, failed, _ = res[module]
    assert passed is False and set(failed) >= {"relative_euclidean_distance"}


# ---------------------------------------------------------------------------------------------
# loading, merging, validation, judging


def test_defaults_load_and_describe_bounds() -> None:
    th = Thresholds.load()
    assert th.verdict == ("cosine_similarity", "relative_euclidean_distance")
    assert "max_relative_error" not in th.verdict
    assert th.bounds_for("cosine_similarity", "torch.bfloat16") == (0.999, None)
    assert th.bounds_for("kl_divergence", "bf16", node_name="lm_head") == (None, 0.005)
    assert th.bounds_for("kl_divergence", "fp16", node_type="LmHead") == (None, 0.0001)
    assert th.bounds_for("max_relative_error", "float16") == (None, None)
    assert th.verdict_metrics("bfloat16", node_name="model.lm_head")[-1] == "kl_divergence"
    # unknown float dtypes fall back to the default table, quantized ints to int8
    assert th.table_dtype("float64") == "float32" and th.table_dtype("uint8") == "int8"


def test_judge_semantics() -> None:
    th = Thresholds.load()
    good = {"cosine_similarity": 0.99995, "relative_euclidean_distance": 0.01, "max_relative_error": 500.0}
    assert th.judge(good, "bfloat16") == (True, [])
    # max_relative_error is informational: huge values never fail a pair
    assert th.judge(good, "bfloat16")[0] is True
    bad = {"cosine_similarity": 0.99, "relative_euclidean_distance": 0.05}
    assert th.judge(bad, "bfloat16") == (False, ["cosine_similarity", "relative_euclidean_distance"])
    assert th.judge({"relative_euclidean_distance": 0.01}, "float16") == (False, ["relative_euclidean_distance"])
    # logits get a KL verdict
    assert th.judge({**good, "kl_divergence": 0.01}, "bfloat16", node_name="lm_head") == (False, ["kl_divergence"])
    assert th.judge({**good, "kl_divergence": 0.001}, "bfloat16", node_name="lm_head") == (True, [])
    # nothing computable -> None; NaN/Inf mismatch fails even then
    assert th.judge(dict.fromkeys(good), "bfloat16") == (None, [])
    assert th.judge({}, "bfloat16", nan_inf_mismatch=True) == (False, [NAN_INF])
    assert th.judge({"cosine_similarity": float("nan")}, "bfloat16") == (False, ["cosine_similarity"])


def test_user_file_merges_over_defaults(tmp_path: Path) -> None:
    user = tmp_path / "th.toml"
    user.write_text(
        'verdict = ["cosine_similarity", "snr_db"]\n'
        "nan_inf_fails = false\n"
        "[dtype.bfloat16]\n"
        "snr_db = { min = 35.0 }\n"
        "[dtype.float8_e4m3fn]\n"
        "cosine_similarity = { min = 0.98 }\n"
        '[[rule]]\nname = "logits"\nmatch = "lm_head"\n'
        "[rule.dtype.bfloat16]\nkl_divergence = { max = 0.001 }\n"
        '[[rule]]\nname = "router"\nmatch = "gate$"\nverdict = ["max_absolute_error"]\n'
        "[rule.dtype.bfloat16]\nmax_absolute_error = { max = 0.5 }\n",
        encoding="utf-8",
    )
    th = Thresholds.load(user)
    assert th.verdict == ("cosine_similarity", "snr_db") and th.nan_inf_fails is False
    assert th.bounds_for("snr_db", "bfloat16") == (35.0, None)
    assert th.bounds_for("cosine_similarity", "bfloat16") == (0.999, None)  # kept from the defaults
    assert th.bounds_for("cosine_similarity", "float8_e4m3fn") == (0.98, None)
    assert th.bounds_for("kl_divergence", "bfloat16", node_name="lm_head") == (None, 0.001)
    assert th.bounds_for("cosine_similarity", "bfloat16", node_name="lm_head") == (0.999, None)
    assert [r.name for r in th.rules] == ["logits", "router"]
    assert th.judge(
        {"cosine_similarity": 1.0, "snr_db": 50.0, "max_absolute_error": 0.7}, "bf16", node_name="layers.0.mlp.gate"
    ) == (False, ["max_absolute_error"])
    assert th.judge({}, "bf16", nan_inf_mismatch=True) == (None, [])
    data = json.loads(th.to_json())
    assert data["dtype"]["bfloat16"]["snr_db"] == {"min": 35.0}
    assert th.to_json() == Thresholds.load(user).to_json()  # canonical
    assert th.to_json() != Thresholds.load().to_json()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("verdict = [", "not valid TOML"),
        ('verdict = ["cosine"]', "unknown metric 'cosine'"),
        ("colour = 1", "unknown key"),
        ("[dtype.bfloat16]\ncosine_similarity = 0.9", "must be { min = x }"),
        ('[dtype.bfloat16]\ncosine_similarity = { min = "a" }', "bounds must be numbers"),
        ("[dtype.bfloat16]\nsnr_db = { min = 9.0, max = 1.0 }", "min 9.0 > max 1.0"),
        ('[[rule]]\nmatch = "("', "bad regular expression"),
        ('[[rule]]\nname = "x"', "`match` must be"),
        ('default_dtype = "float64"', "has no [dtype.float64] table"),
    ],
)
def test_bad_user_file_is_a_one_line_error_naming_it(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as info:
        Thresholds.load(path)
    msg = str(info.value)
    assert msg.startswith(str(path)) and needle in msg and "\n" not in msg


def test_missing_user_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read thresholds file"):
        Thresholds.load(tmp_path / "nope.toml")


# ---------------------------------------------------------------------------------------------


def main() -> None:
    """Print the calibration figures (docs/metrics.md)."""
    th = Thresholds.load()
    for dtype in (torch.bfloat16, torch.float16):
        name = str(dtype).removeprefix("torch.")
        res = _judge_all(th, _run(dtype), name)
        print(
            f"clean {name}: {sum(p is True for p, _f, _v in res.values())}/{len(res)} modules pass; "
            f"margins {_margins(th, res, name)}"
        )
        for metric in ("cosine_similarity", "relative_euclidean_distance", "kl_divergence", "snr_db"):
            vals = [(v[metric], k) for k, (_p, _f, v) in res.items()]
            pick = min(vals) if metric in ("cosine_similarity", "snr_db") else max(vals)
            print(f"  worst {metric}: {pick[0]:.6g} at {pick[1]}")
        lm = res["lm_head"][2]
        print(
            f"  lm_head: cos {lm['cosine_similarity']:.8f} kl {lm['kl_divergence']:.3g} "
            f"red {lm['relative_euclidean_distance']:.4g}"
        )
        for module in SCALED:
            passed, failed, vals = _judge_all(th, _run(dtype, scale_output=module), name, only={module})[module]
            print(
                f"  x1.05 {module}: passed={passed} failed={failed} "
                f"red {vals['relative_euclidean_distance']:.4g} cos {vals['cosine_similarity']:.8f}"
            )
        for label, (module, fault) in FAULTS.items():
            passed, failed, vals = _judge_all(th, _run(dtype, fault=(module, fault)), name, only={module})[module]
            print(
                f"  {label}: passed={passed} failed={failed} red {vals['relative_euclidean_distance']:.4g} "
                f"cos {vals['cosine_similarity']:.6f}"
            )


if __name__ == "__main__":
    main()


def test_the_model_node_is_the_one_root() -> None:
    """The logits rule's `model_output` judges the run's root when it has exactly one (msit's `root`); where the top
    level holds several nodes (msprobe's modules, its L1 calls) none is the model's output."""

    def roots(ids: list[int], parents: list[int | None]) -> list[int]:
        return [n for n, parent in zip(ids, parents, strict=True) if parent is None]

    assert model_node(roots([0, 1, 2], [None, 0, 1])) == 0
    assert model_node(roots([5, 6, 7], [6, None, 6])) == 6
    assert model_node(roots([0, 1, 2], [None, None, 1])) is None
    assert model_node(roots([], [])) is None


def test_a_more_precise_tensor_is_judged_with_what_its_inputs_carried_in() -> None:
    """A float32 tensor of a bf16 run: as an input it is judged by bf16's bounds (it holds what ran before); as an
    output it passes by bf16's when it adds no error of its own (at most `CARRIED_GAIN` times its inputs' largest),
    and fails where it adds more (a wrong float32 kernel), or where the error it carries fails bf16's bounds too."""
    th = Thresholds.load()
    g = torch.randn(4096, generator=torch.Generator().manual_seed(0))
    noise = torch.randn(4096, generator=torch.Generator().manual_seed(1))

    def values(rel: float) -> dict[str, float | None]:
        m = compare_tensors(g, g + noise * (rel * float(g.norm()) / float(noise.norm())))
        return dict(m.values)

    carried, own, large = values(0.003), values(0.02), values(0.05)
    assert th.judge(carried, "float32")[0] is False  # float32's bounds alone fail a bf16 run's variance
    args = dict(golden=None, test=None, dtype="float32", run_dtype="bfloat16")
    assert judge_pair(th, carried, io="in", **args) == (True, [])
    assert judge_pair(th, carried, io="out", carried_in=0.0016, **args) == (True, [])  # x * x: twice its input's
    assert judge_pair(th, carried, io="out", **args)[0] is False  # no input compared: its own dtype's bounds
    assert judge_pair(th, own, io="out", carried_in=0.0016, **args)[0] is False  # adds 12x what came in
    assert judge_pair(th, large, io="out", carried_in=0.04, **args)[0] is False  # carried, but over bf16's bounds
    # a tensor of the run's own precision, or of a float32 run, is judged as before
    assert judge_pair(th, carried, golden=None, test=None, dtype="float32", run_dtype="float32", io="in")[0] is False
    assert more_precise("float32", "bfloat16") and not more_precise("bfloat16", "bfloat16")
    assert not more_precise("float32", None) and CARRIED_GAIN >= 2


def test_an_output_of_few_elements_may_carry_more_of_its_inputs_error() -> None:
    """A norm ratio over a handful of elements spreads far: a router's four float32 logits in a bf16 run carry their
    input's error at a gain of 3 with nothing wrong (msprobe's API-level DeepSeek-V3 dumps). The gain an output more
    precise than the run may carry grows as its element count shrinks, and stays `CARRIED_GAIN` at thousands."""
    th = Thresholds.load()
    args = dict(golden=None, test=None, dtype="float32", run_dtype="bfloat16", io="out")
    g = torch.tensor([0.9, -0.4, 0.3, 1.2])
    three_times = dict(compare_tensors(g, g * torch.tensor([1.012, 1.0, 1.0, 0.995])).values)
    distance = three_times["relative_euclidean_distance"]
    assert distance is not None and th.judge(three_times, "float32")[0] is False
    carried_in = distance / 3.0
    router = {"node_type": "Functional.linear"}
    assert judge_pair(th, three_times, carried_in=carried_in, numel=4, **router, **args) == (True, [])
    assert judge_pair(th, three_times, carried_in=carried_in, numel=4096, **router, **args)[0] is False
    assert judge_pair(th, three_times, carried_in=carried_in, **router, **args)[0] is False  # count unknown
    # an elementwise op's few elements are not re-weighted: a 2 % wrong rsqrt of one value a row stays its own
    rsqrt = {"node_type": "Torch.rsqrt"}
    assert judge_pair(th, three_times, carried_in=carried_in, numel=1, **rsqrt, **args)[0] is False
    assert few_elements_stretch(4, "Linear") > 1.6 and few_elements_stretch(1024, "Tensor.matmul") < 1.04
    assert few_elements_stretch(None, "linear") == 1.0 and few_elements_stretch(4, "Tensor.__mul__") == 1.0
    assert carried_gain(100_000, "Functional.linear") == pytest.approx(CARRIED_GAIN, rel=0.01)
