"""Layers of a call stream no module encloses (msprobe's `level: L1`): the repeated block of calls."""

from __future__ import annotations

from workbench.formats.layers import layers_by_repetition

PROLOGUE = ["embedding", "__add__", "__mul__", "cos", "__mul__", "sin", "__mul__"]
NORM = ["pow", "mean", "__add__", "rsqrt", "__mul__", "__mul__"]
ATTENTION = ["linear", "linear", "linear", "__mul__", "__mul__", "__add__", "sdpa", "linear", "__add__"]
MLP = ["linear", "silu", "linear", "__mul__", "linear", "__add__"]
LAYER = NORM + ATTENTION + NORM + MLP


def test_each_copy_of_the_repeated_block_is_a_layer() -> None:
    stream = PROLOGUE + LAYER * 3 + NORM + ["linear", "argmax"]
    layers = layers_by_repetition(stream)
    assert layers[: len(PROLOGUE)] == [None] * len(PROLOGUE)
    body = layers[len(PROLOGUE) : len(PROLOGUE) + 3 * len(LAYER)]
    assert body == [k for k in range(3) for _ in LAYER]  # a layer starts at its input norm, not one call later
    assert layers[len(PROLOGUE) + 3 * len(LAYER) :] == [None] * (len(NORM) + 2)  # final norm, LM head, argmax


def test_experts_repeated_inside_a_layer_do_not_make_layers() -> None:
    expert = ["linear", "silu", "linear", "__mul__", "linear"]
    moe_layer = NORM + ATTENTION + NORM + ["linear", "softmax", "topk"] + expert * 4 + ["__add__"]
    layers = layers_by_repetition(PROLOGUE + moe_layer * 2 + NORM + ["linear"])
    assert sorted({x for x in layers if x is not None}) == [0, 1]
    assert layers.count(0) == layers.count(1) == len(moe_layer)


def test_a_stream_without_a_repeated_block_has_no_layers() -> None:
    assert layers_by_repetition(PROLOGUE + NORM + ["linear", "argmax"]) == [None] * (len(PROLOGUE) + len(NORM) + 2)
    assert layers_by_repetition(["__mul__"] * 12) == [None] * 12  # one kind of call repeated is no layer
    assert layers_by_repetition([]) == []


def test_dense_layers_before_moe_layers_come_first() -> None:
    """A model whose first layers are dense and the rest MoE (DeepSeek's `first_k_dense_replace`): the repeated
    block is the MoE layer's; its run of repeats began inside the last dense layer (whose MLP ends as the experts
    do), and the dense layers were left out, the first MoE layer numbered 0. Each layer starts at its input norm,
    the dense ones first, however few."""
    expert = ["linear", "silu", "linear", "__mul__", "linear"]
    moe_layer = NORM + ATTENTION + NORM + ["linear", "softmax", "topk"] + expert * 4 + ["__add__"]
    for dense in (1, 3):
        stream = PROLOGUE + LAYER * dense + moe_layer * 4 + NORM + ["linear", "argmax"]
        layers = layers_by_repetition(stream)
        starts = [i for i in range(len(stream)) if layers[i] is not None and layers[i] != layers[i - 1]]
        expected = [len(PROLOGUE) + len(LAYER) * k for k in range(dense)]
        expected += [len(PROLOGUE) + len(LAYER) * dense + len(moe_layer) * k for k in range(4)]
        assert starts == expected, (dense, starts)
        assert [layers[i] for i in starts] == list(range(dense + 4))
        assert layers[: len(PROLOGUE)] == [None] * len(PROLOGUE)
        assert layers[-(len(NORM) + 2) :] == [None] * (len(NORM) + 2)  # the final norm and the LM head
