"""The root-cause advisor's rules: a dtype's rounding, the causes known from an op's kind, and how a reason
carries one (`advisor.py` writes them, the compare summary reads them)."""

from __future__ import annotations

from workbench.compare.judging.gain import MATRIX_PRODUCTS
from workbench.formats.node_names import call_name

# Unit roundoff of a test dtype: the relative error one rounding of an output adds.
ROUNDING: dict[str, float] = {
    "bfloat16": 2.0**-8,
    "float16": 2.0**-11,
    "float32": 2.0**-24,
    "float64": 2.0**-53,
    "float8_e4m3fn": 2.0**-4,
    "float8_e5m2": 2.0**-3,
    "int8": 2.0**-8,
}


CAUSE_LEAD = "likely cause: "  # how a known cause starts, wherever a reason carries it


def known_cause(op_type: str, dtype: str | None) -> str | None:
    """A cause that explains an op standing out by itself, known from its kind and the test dtype (None: none).

    A rotary embedding module computes cos/sin from its `inv_freq` buffer and the positions: with `inv_freq` in
    float32 its output only carries one rounding to the test dtype, but `model.to(bfloat16)` rounds the buffer
    too, and position x rounded frequency drifts further as positions grow (a tiny Llama at 400 positions:
    1.7e-2 against 1.2e-3 in bfloat16)."""
    if "rotary" in op_type.lower() and dtype in ("bfloat16", "float16"):
        return (
            f"{CAUSE_LEAD}the rotary embedding's inv_freq held in {dtype} (model.to({dtype}) rounds that buffer; "
            "the error grows with the position): keep inv_freq in float32"
        )
    return None


def cause_in(reason: str) -> str | None:
    """The known cause an advisor reason ends with (see `known_cause`), if any."""
    at = reason.find("; " + CAUSE_LEAD)
    return reason[at + 2 :] if at >= 0 else None


# The calls that compute a rotary embedding's tables: with no module recorded around them (msprobe's `level: L1`),
# a sin or cos computed in float32 in a bf16/fp16 model is taken for one.
_TABLE_CALLS = frozenset(("sin", "cos"))


def is_table_call(op_type: str | None) -> bool:
    """Whether an op computes what a rotary embedding's tables are made of (`_TABLE_CALLS`)."""
    return call_name(op_type) in _TABLE_CALLS


# Ops whose output carries a multiple of their input's relative error by what they compute: `x.pow(2)` (the variance
# in every RMSNorm, dumped by msprobe's API level) doubles it.
_ERROR_GAIN = {"pow": 2.0}


def error_gain(op_type: str | None) -> float:
    """The factor an op of this type multiplies its input's relative error by, doing nothing wrong (1 for most)."""
    return _ERROR_GAIN.get(call_name(op_type), 1.0)


# Ops whose inputs' relative errors add up in their output: the factors of a product or a quotient (torch's calls
# as msprobe's API levels name them, GE's types). One factor 2 % off and the other 2 % off make a product 4 % off.
_ELEMENTWISE_PRODUCTS = frozenset(
    (
        *("mul", "__mul__", "__rmul__", "__imul__", "multiply"),
        *("div", "__truediv__", "__rtruediv__", "__itruediv__", "true_divide", "divide", "realdiv"),
    )
)
_PRODUCTS = _ELEMENTWISE_PRODUCTS | MATRIX_PRODUCTS


def errors_add(op_type: str | None) -> bool:
    """Whether an op of this type carries the sum of its activation inputs' relative errors (a product), not the
    largest of them."""
    return call_name(op_type) in _PRODUCTS


def errors_add_per_element(op_type: str | None) -> bool:
    """Whether each element of an op of this type's output carries the sum of its factors' relative errors at that
    element (an elementwise product or quotient; a matmul sums over a dimension instead): its output's relative error
    is then at most the sum of its factors' largest elementwise relative errors, whatever the norms say."""
    return call_name(op_type) in _ELEMENTWISE_PRODUCTS


_SUMS = frozenset(("add", "__add__", "__radd__", "__iadd__", "sub", "__sub__", "__rsub__", "__isub__", "subtract"))


def is_sum(op_type: str | None) -> bool:
    """Whether an op of this type adds or subtracts its inputs elementwise: its output's error is at most the sum of
    its inputs' (absolute) errors, however far they cancel (a rotary `q * cos + rotate_half(q) * sin`)."""
    return call_name(op_type) in _SUMS


LOOKUP_TYPES = frozenset(("embedding", "gatheroperation", "gather", "gatherv2"))  # torch and msprobe, ATB, GE


def is_lookup(op_type: str | None) -> bool:
    """Whether an op of this type only looks rows up in a table (a token embedding): it computes nothing, so its
    output carries one rounding to the test dtype at most, and the advisor holds it to that."""
    return call_name(op_type) in LOOKUP_TYPES  # msprobe's `Functional.embedding` too


def reads_a_kv_cache(op_type: str | None) -> bool:
    """Whether an op reads what earlier tokens left in a KV cache besides its inputs (an attention module: the cache
    is no input a module dump records)."""
    return "attention" in (op_type or "").lower()


def kv_cache_cause(token: int, carried: float) -> str:
    """The cause of an attention standing out at a later token: the keys and values of an earlier token whose input
    was further off, which it reads from its cache."""
    return (
        f"{CAUSE_LEAD}its KV cache: token {token}'s keys and values came from an input {carried:.3g} off, and every "
        "later token reads them (the cache is no input the dump holds)"
    )
