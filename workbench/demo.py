"""The built-in demo: a small Llama built from a config (fixed seed, nothing downloaded),
a golden fp32 run and a bf16 test run with one planted defect, both dumped.

Three test stacks: `torch` (the same Hugging Face model cast to bf16, defect planted in one
module), `atb` (the ATB-structured stack of `workbench.backends`, bf16, writing real ATB
dumps) and `quant` (the model's linears fake-quantized to int8, W8A16 or W8A8, `backends/quant.py`,
with a quantization defect). Both runs decode the same tokens (the golden run's greedy choice), so
every token compares like with like.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.core.files import CATALOG_NAME

DEMO_SEED = 1234
DEFAULT_SCHEME = "w8a8"
PROMPT_TOKENS = 24
NEW_TOKENS = 4


@dataclass(slots=True)
class DemoPlan:
    golden: Path
    test: Path
    mapping: Path | None
    description: str
    expected: str
    expected_token: int
    kept: set[str] = field(default_factory=set)  # entries of the output folder that were there before: not ours


def demo_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1024,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )


def build_model(seed: int = DEMO_SEED) -> Any:
    """The demo Llama in fp32, random weights from a fixed seed."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(demo_config())
    model.eval()
    return model


def demo_prompt(seed: int = DEMO_SEED, length: int = PROMPT_TOKENS, vocab: int = 1024) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(3, vocab, (1, length), generator=g)


@torch.no_grad()
def decode(model: Any, prompt: torch.Tensor, steps: int, forced: list[int] | None = None) -> list[int]:
    """Greedy decoding with the KV cache, one forward call per token; `forced` replays given tokens."""
    import inspect

    # transformers 5.x renamed `past_key_values` to `cache` (the old name warns on every call); older: the old name
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=prompt, use_cache=True)
    past = getattr(out, key)
    chosen: list[int] = []
    for step in range(steps):
        nxt = int(out.logits[0, -1].float().argmax()) if forced is None else forced[step]
        chosen.append(nxt)
        if step == steps - 1:
            break
        out = model(input_ids=torch.tensor([[nxt]]), use_cache=True, **{key: past})
        past = getattr(out, key)
    return chosen


# ---------------------------------------------------------------- torch test stack: defects
def _defect_rmsnorm_eps(model: Any) -> str:
    model.model.layers[1].post_attention_layernorm.variance_epsilon = 1e-2
    return "root.model.layers.1.post_attention_layernorm"


def _defect_attn_scale(model: Any) -> str:
    model.model.layers[0].self_attn.scaling = 1.0
    return "root.model.layers.0.self_attn"


def _defect_down_proj(model: Any) -> str:
    proj = model.model.layers[2].mlp.down_proj
    proj.register_forward_hook(lambda _m, _i, out: out * 1.25)
    return "root.model.layers.2.mlp.down_proj"


TORCH_DEFECTS: dict[str, tuple[str, Callable[[Any], str]]] = {
    "rmsnorm_eps": ("wrong RMSNorm epsilon (1e-2) in layer 1's post-attention norm", _defect_rmsnorm_eps),
    "attn_scale": ("attention without its 1/sqrt(head_dim) scale in layer 0", _defect_attn_scale),
    "down_proj": ("layer 2's MLP down projection scaled by 1.25", _defect_down_proj),
}


STACKS = ("atb", "torch", "torchair", "quant")


# ---------------------------------------------------------------- torchair test stack: defects
TORCHAIR_DEFECTS: dict[str, tuple[str, str, str]] = {  # name -> description, module, aten op
    "down_proj": ("layer 2's MLP down projection (a MatMulV2) scaled by 1.25", "model.layers.2.mlp.down_proj", "mm"),
    "o_proj": (
        "layer 1's attention output projection (a MatMulV2) scaled by 1.25",
        "model.layers.1.self_attn.o_proj",
        "mm",
    ),
}


def available_defects(stack: str) -> dict[str, str]:
    """Defect name -> one-line description, for one test stack."""
    if stack == "torch":
        return {k: v[0] for k, v in TORCH_DEFECTS.items()}
    if stack == "torchair":
        return {k: v[0] for k, v in TORCHAIR_DEFECTS.items()}
    if stack == "quant":
        from workbench.backends.quant import QUANT_DEFECTS

        return {k: d.text + ("" if len(d.schemes) > 1 else f" ({d.schemes[0]} only)") for k, d in QUANT_DEFECTS.items()}
    from workbench.backends.defects import DEFECT_KINDS

    return dict(DEFECT_KINDS)


def check_choice(stack: str, defect: str | None, tp: int = 1, scheme: str | None = None) -> None:
    """Refuse an unknown stack or a defect the stack cannot plant (before any work); ValueError says which."""
    if stack not in STACKS:
        raise ValueError(f"--stack {stack!r}: expected one of {', '.join(STACKS)}")
    if scheme is not None and stack != "quant":
        raise ValueError("--scheme: a quantization scheme is a mode of the quantized stack (--stack quant)")
    if stack == "quant":
        from workbench.backends.quant import check_defect

        if tp > 1:
            raise ValueError("--tp: tensor parallelism is a mode of the ATB stack (--stack atb)")
        check_defect(defect, scheme or DEFAULT_SCHEME)
        return
    if tp < 1:
        raise ValueError(f"--tp {tp}: the number of tensor-parallel ranks is 1 or more")
    if tp > 1:
        if stack != "atb":
            raise ValueError("--tp: tensor parallelism is a mode of the ATB stack (--stack atb)")
        cfg = demo_config()
        for what, n in (("attention heads", cfg.num_attention_heads), ("kv heads", cfg.num_key_value_heads)):
            if n % tp:
                raise ValueError(f"--tp {tp}: the demo model's {n} {what} do not divide by {tp} ranks")
    if defect is None:
        return
    if tp < 2 and defect.startswith("allreduce"):
        raise ValueError(f"--defect {defect}: lives in an all-reduce; give --tp 2 (or more)")
    known = available_defects(stack)
    if defect not in known:
        other = [s for s in STACKS if s != stack and defect in available_defects(s)]
        hint = f" ({defect!r} is a defect of --stack {other[0]})" if other else ""
        raise ValueError(f"--defect {defect!r}: --stack {stack} plants one of {', '.join(known)}{hint}")


def _dump_torch(model: Any, dump_path: Path, prompt: torch.Tensor, follow: Path | None) -> tuple[Path, list[int]]:
    """Dump a greedy decode; a test run follows the golden dump's tokens (`follow_tokens`)."""
    from workbench.dump import DumpConfig, register_hook

    cfg = DumpConfig(dump_path=str(dump_path), token_range=list(range(NEW_TOKENS)), follow_tokens=follow)
    handle = register_hook(model, cfg)
    try:
        tokens = decode(model, prompt, NEW_TOKENS)
    finally:
        handle.remove()
    roots = sorted(dump_path.glob("msit_dump_*"))
    if not roots:
        raise RuntimeError(f"{dump_path}: the dumper wrote nothing")
    return roots[-1], tokens


def make_demo(
    out: Path,
    *,
    stack: str = "atb",
    defect: str | None = None,
    log: Callable[[str], None] = print,
    tp: int = 1,
    scheme: str | None = None,
) -> DemoPlan:
    """Build, run and dump the demo into `out` (replacing only what an earlier demo created there; a folder
    holding anything else is refused, `core.owned`); returns what to compare. `finish_demo` ends it."""
    from workbench.core.owned import claim
    from workbench.dump import seed_all

    check_choice(stack, defect, tp, scheme)
    out = Path(out)
    kept = claim(out, "demo", ["golden", "test", CATALOG_NAME])
    seed_all(DEMO_SEED)
    model = build_model()
    if stack == "quant":
        from workbench.backends.quant import add_outliers

        add_outliers(model)
    prompt = demo_prompt()
    log(
        f"demo: Llama {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
        f"prompt {prompt.shape[1]} tokens, {NEW_TOKENS} tokens decoded"
    )
    if stack == "torchair":
        return _torchair_demo(model, prompt, out, defect, log, kept)
    golden_root, tokens = _dump_torch(model, out / "golden", prompt, None)
    log(f"demo: golden run (torch fp32) dumped to {golden_root}")
    if stack == "torch":
        name = defect or "rmsnorm_eps"
        if name not in TORCH_DEFECTS:
            raise ValueError(f"--defect {name!r}: expected one of {', '.join(TORCH_DEFECTS)}")
        text, plant = TORCH_DEFECTS[name]
        test_model = copy.deepcopy(model).to(torch.bfloat16)
        expected = plant(test_model)
        test_root, _ = _dump_torch(test_model, out / "test", prompt, golden_root)
        log(f"demo: test run (torch bf16, defect: {text}) dumped to {test_root}")
        return DemoPlan(golden_root, test_root, None, f"{name}: {text}", expected, 0, kept)
    if stack == "quant":
        return _quant_test(model, prompt, out, defect, scheme or DEFAULT_SCHEME, golden_root, kept, log)
    from workbench.backends.defects import Defect
    from workbench.backends.demo import DEFAULT_DEFECT, DEFAULT_TP_DEFECT, run_atb_demo

    test_root, text, expected = run_atb_demo(model, prompt, tokens, out / "test", defect, follow=golden_root, tp=tp)
    ranks = f", {tp} tensor-parallel ranks" if tp > 1 else ""
    log(f"demo: test run (ATB-structured stack, bf16{ranks}, defect: {text}) dumped to {test_root}")
    name = defect or (DEFAULT_TP_DEFECT if tp > 1 else DEFAULT_DEFECT)
    return DemoPlan(golden_root, test_root, None, text, expected, Defect(name).start, kept)


def quant_model(scheme: str, defect: str | None, keep_float: tuple[str, ...] = ()) -> tuple[Any, Any, list[str]]:
    """(the demo's fp32 model, its quantized copy, the quantized linears' names): the quant stack's two models."""
    from workbench.backends.quant import add_outliers, check_defect, quantize

    planted = check_defect(defect, scheme)
    seed_all_demo()
    model = build_model()
    add_outliers(model)
    test = copy.deepcopy(model)
    names = quantize(test, scheme, planted, keep_float)
    return model, test, names


def seed_all_demo() -> None:
    from workbench.dump import seed_all

    seed_all(DEMO_SEED)


def _quant_test(
    model: Any,
    prompt: torch.Tensor,
    out: Path,
    defect: str | None,
    scheme: str,
    golden_root: Path,
    kept: set[str],
    log: Callable[[str], None],
) -> DemoPlan:
    from workbench.backends.quant import check_defect, quant_manifest, quantize
    from workbench.dump import DumpConfig, register_hook

    planted = check_defect(defect, scheme)
    test_model = copy.deepcopy(model)
    names = quantize(test_model, scheme, planted)
    cfg = DumpConfig(dump_path=str(out / "test"), token_range=list(range(NEW_TOKENS)), follow_tokens=golden_root)
    handle = register_hook(test_model, cfg)
    try:
        if handle.manifest is not None:
            handle.manifest.meta["quant"] = {
                **quant_manifest(test_model, scheme),
                "demo": {"scheme": scheme, "defect": defect},
            }
        decode(test_model, prompt, NEW_TOKENS)
    finally:
        handle.remove()
    roots = sorted((out / "test").glob("msit_dump_*"))
    if not roots:
        raise RuntimeError(f"{out / 'test'}: the dumper wrote nothing")
    text = planted.text if planted else "no defect"
    log(
        f"demo: test run (torch fake-quantized {scheme}, {len(names)} linears in int8, defect: {text}) "
        f"dumped to {roots[-1]}"
    )
    expected = f"root.{planted.linear}" if planted else ""
    return DemoPlan(golden_root, roots[-1], None, f"{defect or 'none'}: {text}", expected, 0, kept)


def measure_fallback(
    scheme: str, defect: str | None, fallback: list[str]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The quant demo's logits KL and top-1 agreement against the fp32 model, as dumped and with the `fallback`
    linears (module paths, `root.` prefix allowed) kept in float: ((kl, top1) before, (kl, top1) after)."""
    from workbench.backends.quant import logits_agreement

    keep = tuple(n.removeprefix("root.") for n in fallback)
    golden, before_model, _ = quant_model(scheme, defect)
    _, after_model, _ = quant_model(scheme, defect, keep)
    prompt = demo_prompt()
    tokens = decode(golden, prompt, NEW_TOKENS)
    ids = torch.cat([prompt, torch.tensor([tokens[:-1]])], dim=1)
    first = prompt.shape[1]
    return logits_agreement(golden, before_model, ids, first), logits_agreement(golden, after_model, ids, first)


def finish_demo(out: Path, plan: DemoPlan) -> None:
    """Record every file the demo created in `out` (the next `wb demo --out` there replaces exactly those)."""
    from workbench.core.owned import seal

    seal(Path(out), "demo", plan.kept)


def _torchair_demo(
    model: Any, prompt: torch.Tensor, out: Path, defect: str | None, log: Callable[[str], None], kept: set[str]
) -> DemoPlan:
    """Golden: the compiled model's FX dump in fp32 (`wb dump --fx`'s dumper); test: the same aten graph run in
    bf16 and written as GE dumps with one fusion per MLP and a planted defect (`workbench.backends.torchair`).
    Every token is a full forward over the prompt and the tokens so far (no KV cache: one graph per length)."""
    from workbench.backends.torchair import GeDefect, GeDumper
    from workbench.dump.fx import FxDumper

    name = defect or "down_proj"
    text, module, op = TORCHAIR_DEFECTS[name]
    fx_dumper = FxDumper(out / "golden")
    seqs = _compiled_decode(model, fx_dumper, prompt, None)
    golden_root = out / "golden"
    log(f"demo: golden run (torch.compile, FX dump, fp32) dumped to {golden_root}")
    ge = GeDumper(out / "test", dtype=torch.bfloat16, defect=GeDefect(module, op, description=text), follow=golden_root)
    _compiled_decode(copy.deepcopy(model), ge, prompt, seqs)
    log(f"demo: test run (TorchAir-like GE dump, bf16, defect: {text}) dumped to {out / 'test'}")
    return DemoPlan(golden_root, out / "test", None, f"{name}: {text}", ge.planted or "?", 0, kept)


@torch.no_grad()
def _compiled_decode(
    model: Any, dumper: Any, prompt: torch.Tensor, forced: list[torch.Tensor] | None
) -> list[torch.Tensor]:
    """Greedy decoding through `torch.compile(model, backend=dumper)`, one full forward per token;
    `forced` replays the sequences of an earlier run."""
    compiled = torch.compile(model, backend=dumper, dynamic=False)
    seq = prompt
    seqs = []
    for step in range(NEW_TOKENS):
        if forced is not None:
            seq = forced[step]
        seqs.append(seq)
        dumper.step([int(i) for i in seq[0]])
        logits = compiled(input_ids=seq, use_cache=False).logits
        nxt = int(logits[0, -1].float().argmax())
        seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
    torch._dynamo.reset()  # the next run compiles afresh with its own backend
    return seqs
