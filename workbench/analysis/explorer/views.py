"""What the app's read-only queries return: plain dataclasses, no SQL and no Textual."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from workbench.analysis.explorer.severity import Scale, scale_for
from workbench.compare.judging.thresholds import Thresholds
from workbench.formats.node_names import short_name, type_beside

Side = Literal["golden", "test"]


class ExploreError(Exception):
    """A catalog the app cannot show; the message is one line naming the file."""


@dataclass(frozen=True, slots=True)
class ComparisonInfo:
    """The comparison shown: runs, thresholds, tokens and size."""

    cmp_id: int
    golden_run: int
    test_run: int
    golden_path: str
    test_path: str
    golden_kind: str
    test_kind: str
    thresholds: Thresholds
    tokens: list[int]
    n_pairs: int
    comparisons: list[int]
    test_dtype: str | None = None  # what the test run computes in (`judge.compared_compute_dtype`)
    thresholds_note: str | None = None  # why the package defaults stand in for the stored thresholds

    def scale(self, colouring: str) -> Scale:
        """Bound of a colouring for the test dtype, and whether it decides pass/fail."""
        return scale_for(self.thresholds, colouring, self.test_dtype)

    def bound(self, colouring: str) -> float | None:
        """Pass/fail bound of a colouring for the test dtype (None: the thresholds give it none)."""
        return self.scale(colouring).bound

    def verdict_metrics(self) -> list[str]:
        """The metrics that decide pass/fail for the test dtype."""
        return self.thresholds.verdict_metrics(self.test_dtype)


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One topology node as the trees show it."""

    node_id: int
    name: str
    type: str
    parent_id: int | None
    depth: int
    exec_order: int | None
    layer: int | None
    shape: str
    counterpart: int | None  # matched node on the other side
    has_tensors: bool

    @property
    def short_name(self) -> str:
        return self.name if self.is_layer_group else short_name(self.name)

    @property
    def type_shown(self) -> str:
        """The type the trees show after the short name (`node_names.type_beside`)."""
        return type_beside(self.short_name, self.type)

    @property
    def is_layer_group(self) -> bool:
        """A row the trees add to hold one layer's calls where no module encloses them (`layer_groups`): it stands
        for no catalog node (whose ids are never negative)."""
        return self.node_id < 0


def layer_group_id(layer: int) -> int:
    """The row id of layer `layer`'s group (`TreeRow.is_layer_group`)."""
    return -1 - layer


@dataclass(frozen=True, slots=True)
class LayerGroupSummary:
    """What a layer's group row stands for at one token: its calls and how many of them fail."""

    layer: int
    side: Side
    calls: int
    compared: int  # calls with a verdict at this token
    failed: int
    nan_inf: int
    born: str | None  # the call where the error is born, when it is one of these
    worst: str | None  # the call whose value of the colouring is the worst
    worst_severity: float | None  # its severity (`severity.severity`)
    token: int | None


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """A golden node's roll-up for one token (from `node_results`)."""

    node_id: int
    counterpart: int | None  # the test node compared at this token
    passed: bool | None
    worst: float | None  # value of the colouring (a severity for the verdict colouring)
    added_error: float | None
    has_nan_inf: bool
    born: bool


@dataclass(frozen=True, slots=True)
class TokenStatus:
    """What the trees show at one token: the golden nodes' roll-ups, the verdict and each side's output shapes."""

    token: int
    status: dict[int, NodeStatus]  # by golden node id
    verdict: TokenVerdict
    shapes: dict[str, dict[int, str]]  # side -> node id -> first output's shape at this token


@dataclass(slots=True)
class Heatmap:
    """Rows (layers, or ops of one layer) x tokens of one metric, plus failing and NaN/Inf marks."""

    metric: str
    layer: int | None  # None: one row per layer; else one row per op of this layer
    row_labels: list[str]
    row_nodes: list[int | None]  # golden node id per row (op rows), None for layer rows
    row_layers: list[int | None]
    tokens: list[int]
    values: np.ndarray  # float64 [rows, tokens], NaN where nothing was compared
    failed: np.ndarray  # bool [rows, tokens]
    nan_inf: np.ndarray  # bool [rows, tokens]
    # bool [rows, tokens]: an output compared on statistics only, its lower bound of the rel. euclidean distance shown
    from_statistics: np.ndarray


@dataclass(frozen=True, slots=True)
class PairRow:
    """One compared tensor pair of the selected node and token."""

    pair_id: int
    io: str
    golden_index: int
    test_index: int
    metrics: dict[str, float | None]
    failed_metrics: list[str]
    passed: bool | None
    golden: dict[str, Any]  # dtype, shape, min, max, mean, std, norm, nan, inf, path
    test: dict[str, Any]
    fail_reason: str | None
    test_io: str = ""
    test_node: str = ""  # the test op this pair's test tensor belongs to
    # a tensor more precise than the run computes in that its own dtype's bounds would fail: what judged it instead
    judged_note: str | None = None


@dataclass(slots=True)
class TensorDiff:
    """Error distribution and worst elements of one pair, read from its two tensor files."""

    pair_id: int
    numel: int
    hist_edges: list[float]  # log10(|error|) bin edges
    hist_counts: list[int]
    exact: int  # elements with zero error
    nonfinite: int
    top: list[tuple[tuple[int, ...], float, float, float]]  # index, golden, test, abs error
    error: str | None = None


BORN_FAILS = "fails"
BORN_PRECHECK = "precheck"
BORN_ADVISOR = "advisor"


@dataclass(frozen=True, slots=True)
class TokenVerdict:
    """Where the error is born at a token, and what that rests on: the one verdict the status line, the trees'
    mark and the detail pane show."""

    golden: int | None  # the golden node named, or None: nothing fails and no op stands out
    test: int | None  # the test op a precheck pinned down, if any
    evidence: str | None
    why: str | None  # BORN_FAILS, BORN_PRECHECK or BORN_ADVISOR
    score: float | None  # the advisor's score of `golden` at this token, if it ranked it
    # the op the advisor scores highest inside `golden` (a module whose child op adds its error), and that score
    inside_name: str | None = None
    inside_score: float | None = None
    inputs_differ: str | None = None  # why the runs' inputs differ at this token (`token_status`): no op is named
    inputs_unchecked: bool = False  # `golden` fails with no input judged (`analysis.verdicts.born.inputs_unchecked`)
    # `golden` is born in the noise (score under STANDS_OUT) while the advisor's first op is another, standing out
    origin_name: str | None = None
    origin_score: float | None = None


@dataclass(slots=True)
class PairDetail:
    """Everything the detail pane shows for a golden node at a token."""

    node_id: int
    token: int
    golden_name: str
    golden_type: str
    test_name: str | None
    test_type: str | None
    pairs: list[PairRow]
    born_name: str | None  # verdict for this token
    born_here: bool
    born_test_name: str | None = None  # the test op the verdict pins down (precheck), if any
    evidence: str | None = None  # how that test op was pinned down
    test_node_id: int | None = None
    # why the verdict names `born_name`: BORN_FAILS (its outputs fail while its inputs pass), BORN_PRECHECK (a
    # test op of it disagrees with its own re-run) or BORN_ADVISOR (no born op: the advisor's first op stands out)
    born_why: str | None = None
    born_score: float | None = None  # the advisor's score of `born_name` at this token, if it ranked it
    born_quantized: bool = False  # `born_name` is a quantized linear: its score is over its expected int8 rounding
    born_lookup: bool = False  # `born_name` is a lookup (a token embedding): its score is over one rounding
    born_peerless: bool = False  # the advisor found no peers for `born_name`: its score is over twice the rounding
    born_inside_name: str | None = None  # the op the advisor scores highest inside `born_name` (`TokenVerdict`)
    born_inside_score: float | None = None
    inputs_differ: str | None = None  # `TokenVerdict.inputs_differ`
    born_inputs_unchecked: bool = False  # `TokenVerdict.inputs_unchecked`
    origin_name: str | None = None  # `TokenVerdict.origin_name`
    origin_score: float | None = None


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A node with tensors and no counterpart."""

    node_id: int
    name: str
    type: str
    layer: int | None
    exec_order: int | None
    outs: int
    ins: int
    tokens: int = 1  # tokens at which it has tensors
    first_token: int = 0
    out_numel: int | None = None  # elements of its first output (to warn when paired sizes differ)


@dataclass(frozen=True, slots=True)
class NodePair:
    """A current node-level pair (what the mapping editor can unpair)."""

    golden: str
    test: str
    method: str


@dataclass(slots=True)
class ResultSet:
    """A SQL console result: columns, at most `limit` rows, and whether more existed."""

    columns: list[str]
    rows: list[tuple[Any, ...]]
    truncated: bool
    elapsed_ms: float = 0.0
    types: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TensorStats:
    """One dumped tensor of a node at a token, with its own statistics (unmatched ops show these)."""

    io: str
    index: int
    dtype: str
    shape: str
    stats: dict[str, Any]  # min, max, mean, std, norm, nan_count, inf_count
    path: str | None


@dataclass(frozen=True, slots=True)
class NodeTensors:
    """A node of one side at a token: what it is and its tensors (no counterpart needed)."""

    side: Side
    node_id: int
    name: str
    type: str
    token: int
    tensors: list[TensorStats]
    tokens_with_tensors: list[int]


@dataclass(frozen=True, slots=True)
class ComparisonSummary:
    """One comparison of a catalog, for the picker."""

    cmp_id: int
    golden: str
    test: str
    created: str
    pairs: int
    failed: int
