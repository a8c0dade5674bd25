"""The small random models the tests build: one builder, each test saying only what differs from the default."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def tiny_llama(
    seed: int = 7,
    *,
    hidden: int = 64,
    intermediate: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 256,
    max_positions: int = 128,
    qwen: bool = False,
    **config: Any,
) -> nn.Module:
    """A Llama (or Qwen2) causal LM with random weights from `seed`, in eval mode; no download."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    kw = dict(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        **config,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**kw)) if qwen else LlamaForCausalLM(LlamaConfig(**kw))
    return model.eval()
