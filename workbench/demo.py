"""The built-in demo: a small Llama built from a config (fixed seed, nothing downloaded),
a golden fp32 run and a bf16 test run with one planted defect, both dumped.

Two test stacks: `torch` (the same Hugging Face model cast to bf16, defect planted in one
module) and `atb` (the ATB-structured stack of `workbench.backends`, bf16, writing real ATB
dumps). Both runs decode the same tokens (the golden run's greedy choice), so every token
compares like with like.
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


STACKS = ("atb", "torch")


def available_defects(stack: str) -> dict[str, str]:
    """Defect name -> one-line description, for one test stack."""
    if stack == "torch":
        return {k: v[0] for k, v in TORCH_DEFECTS.items()}
    from workbench.backends.defects import DEFECT_KINDS

    return dict(DEFECT_KINDS)


def check_choice(stack: str, defect: str | None, tp: int = 1) -> None:
    """Refuse an unknown stack or a defect the stack cannot plant (before any work); ValueError says which."""
    if stack not in STACKS:
        raise ValueError(f"--stack {stack!r}: expected one of {', '.join(STACKS)}")
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
    out: Path, *, stack: str = "atb", defect: str | None = None, log: Callable[[str], None] = print, tp: int = 1
) -> DemoPlan:
    """Build, run and dump the demo into `out` (replacing only what an earlier demo created there; a folder
    holding anything else is refused, `core.owned`); returns what to compare. `finish_demo` ends it."""
    from workbench.core.owned import claim
    from workbench.dump import seed_all

    check_choice(stack, defect, tp)
    out = Path(out)
    kept = claim(out, "demo", ["golden", "test", CATALOG_NAME])
    seed_all(DEMO_SEED)
    model = build_model()
    prompt = demo_prompt()
    log(
        f"demo: Llama {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, "
        f"prompt {prompt.shape[1]} tokens, {NEW_TOKENS} tokens decoded"
    )
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
    from workbench.backends.defects import Defect
    from workbench.backends.demo import DEFAULT_DEFECT, DEFAULT_TP_DEFECT, run_atb_demo

    test_root, text, expected = run_atb_demo(model, prompt, tokens, out / "test", defect, follow=golden_root, tp=tp)
    ranks = f", {tp} tensor-parallel ranks" if tp > 1 else ""
    log(f"demo: test run (ATB-structured stack, bf16{ranks}, defect: {text}) dumped to {test_root}")
    name = defect or (DEFAULT_TP_DEFECT if tp > 1 else DEFAULT_DEFECT)
    return DemoPlan(golden_root, test_root, None, text, expected, Defect(name).start, kept)


def finish_demo(out: Path, plan: DemoPlan) -> None:
    """Record every file the demo created in `out` (the next `wb demo --out` there replaces exactly those)."""
    from workbench.core.owned import seal

    seal(Path(out), "demo", plan.kept)
