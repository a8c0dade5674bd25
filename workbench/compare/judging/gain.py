"""How far an op's output may carry its inputs' relative error with no error of its own: the gain the judge allows an
output more precise than the run (`CARRIED_GAIN`), and the stretch a tensor of few elements adds to it by sampling
alone (`few_elements_stretch`), which the advisor's noise model reads too."""

from __future__ import annotations

import math

from workbench.formats.node_names import call_name

# An op adds no error of its own when its output's relative euclidean distance is at most this many times its
# inputs' largest: x * x doubles a relative error, a product of two inputs adds theirs; a planted 2 % error on an
# input carrying 0.15 % is 13 times it (docs/metrics.md, "Tensors more precise than the run").
CARRIED_GAIN = 2.5


# matrix products as torch's calls and GE's types name them (`call_name`): a product of two activations, each output
# element a sum over a dimension (`causes.errors_add` reads them too)
MATRIX_PRODUCTS = frozenset(("matmul", "__matmul__", "mm", "bmm", "batchmatmul", "batchmatmulv2"))
# ops whose every output element sums many input elements (a projection): the matrix products, linear calls and
# modules (any type naming `linear`: torch, msprobe, ATB)
_PROJECTIONS = MATRIX_PRODUCTS | frozenset(("linear", "addmm", "baddbmm", "einsum"))


def projects(op_type: str | None) -> bool:
    """Whether an op of this type projects its input onto its outputs (a linear layer or a matrix product): each
    output element sums many input elements, with signs that may cancel."""
    return call_name(op_type) in _PROJECTIONS or "linear" in (op_type or "").lower()


def few_elements_stretch(numel: int | None, op_type: str | None) -> float:
    """The factor by which the relative euclidean distance of a projection's output of `numel` elements
    (`projects`) may exceed its input's, from its element count alone: e^(1/sqrt(n)), 1.65 at 4 elements, 1.13 at
    64, 1.03 at 1,024 (1 where the count is unknown, and for any other op).

    A relative euclidean distance is a ratio of two norms. A projection onto a few outputs weights the error's
    directions and the values' differently; the ratio of the two fluctuates like sqrt(F(n, n)), whose log spreads
    about 1/sqrt(n): nothing at thousands of elements, much at a handful. Measured on clean bf16 runs of a tiny
    DeepSeek-V3 dumped by msprobe's API level: its 4-expert router logits (a float32 `linear`) carried 3.0x their
    input's error, its projections onto 16 to 64 elements up to 1.4x. An elementwise op of one element has no such
    spread: an RMSNorm's `rsqrt` at a decode token holds one value a row, and one 2 % off is its own error.
    """
    if numel is None or numel <= 0 or not projects(op_type):
        return 1.0
    return math.exp(1.0 / math.sqrt(numel))


def carried_gain(numel: int | None, op_type: str | None) -> float:
    """`CARRIED_GAIN` for an output of `numel` elements of an op of `op_type` (`few_elements_stretch`)."""
    return CARRIED_GAIN * few_elements_stretch(numel, op_type)
