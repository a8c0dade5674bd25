"""In-place calls that overwrite their target: what the target held before the call is not data the call reads.

msprobe dumps an API call's inputs before it runs. For `x[idx] = v` (`Tensor.__setitem__`), `x.copy_(y)`,
`x.fill_(0)` or `x.zero_()`, input 0 is the tensor about to be overwritten: a buffer made by `torch.empty` holds
whatever the allocator left there (a MoE layer's `inv_perm = torch.empty_like(perm); inv_perm[perm] = ...` gave
int64 garbage of 1e14-1e18 that differs between any two runs). Such an input is compared and shown but not judged;
what the call wrote is judged where the tensor is read next (a `__setitem__` has no output), and what the target
kept (a partial write) was judged where it was made. Calls that read their target (`add_`, `index_add_`,
`masked_fill_`'s kept elements feeding its output) are judged as any input.
"""

from __future__ import annotations

from workbench.formats.node_names import call_name

# the calls (`call_name`: no namespace, lower case) whose input 0 is overwritten before anything reads it, or has no
# output to carry what it kept
OVERWRITING_CALLS: frozenset[str] = frozenset(
    {
        "__setitem__",
        "copy_",
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
        "random_",
        "bernoulli_",
        "exponential_",
        "geometric_",
        "cauchy_",
        "log_normal_",
    }
)

# what the detail pane, the summary and docs/metrics.md say of such a pair
NOT_JUDGED = (
    "what an in-place call overwrites, before the write (a torch.empty buffer holds leftover bytes): not judged; "
    "what it holds after the write is judged where it is read next"
)


def overwrites_its_target(op_type: str | None) -> bool:
    """Whether an op of this type is an in-place call that overwrites its input 0 (`OVERWRITING_CALLS`)."""
    return call_name(op_type) in OVERWRITING_CALLS


def overwritten_target(op_type: str | None, io: str, idx: int) -> bool:
    """Whether a node's tensor (`io`, `idx`) is what an in-place call of `op_type` overwrites, before the write."""
    return io == "in" and idx == 0 and overwrites_its_target(op_type)


def overwritten_target_sql(node_type: str, io: str, idx: str) -> str:
    """`overwritten_target` as a SQL condition on the given columns (a node's type, a pair's io, a tensor's idx)."""
    names = ", ".join(f"'{n}'" for n in sorted(OVERWRITING_CALLS))
    return f"({io} = 'in' AND {idx} = 0 AND lower(regexp_extract({node_type}, '[^.]*$')) IN ({names}))"
