"""Every message the app's workers, screens and app post to one another (widgets keep their own nested
messages, e.g. `HeatmapView.CellSelected`). Screens talk to the app only by these, never by reaching into it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from textual.message import Message

if TYPE_CHECKING:
    from workbench.analysis.checks.precheck.result import PrecheckResult
    from workbench.analysis.explorer.explore import Explorer, NodePair, ResultSet, Unmatched
    from workbench.analysis.explorer.ranks import RankEntry
    from workbench.analysis.explorer.views import (
        Heatmap,
        NodeStatus,
        NodeTensors,
        PairDetail,
        TensorDiff,
        TokenVerdict,
        TreeRow,
    )
    from workbench.app.screens import PickerEntry
    from workbench.compare.pairing.fingerprint import StaleEntry
    from workbench.compare.pairing.mapping import PairSpec
    from workbench.core.progress import Progress
    from workbench.jobs.redump import RedumpPlan


# the app: opening a catalog, the compare worker, the mapping editor's writes
@dataclass
class CatalogOpened(Message):
    explorer: Explorer
    token: int | None
    select: int | None = None  # golden node to select at start-up


@dataclass
class OpenFailed(Message):
    title: str
    reason: str


@dataclass
class CompareProgress(Message):
    progress: Progress


@dataclass
class CompareDone(Message):
    cmp_id: int


@dataclass
class EditDone(Message):
    explorer: Explorer | None
    text: str
    error: bool


# screens to the app
@dataclass
class EditRequested(Message):
    """Pair (and unpair) nodes: the app closes its connection, writes, recomputes and reopens."""

    pairs: list[PairSpec]
    remove: list[tuple[str, str]]


class CancelRequested(Message):
    """Stop the running compare (everything committed so far is kept)."""


@dataclass
class ComparisonChosen(Message):
    """Show another comparison of the catalog (another rank: at this token, this golden op where it exists)."""

    cmp_id: int
    token: int | None = None
    golden_node: str | None = None


# the main screen's workers
@dataclass
class HeatmapReady(Message):
    data: Heatmap
    cursor: tuple[int, int] | None


@dataclass
class TreesReady(Message):
    golden: list[TreeRow]
    test: list[TreeRow]


@dataclass
class StatusReady(Message):
    token: int
    status: dict[int, NodeStatus]
    verdict: TokenVerdict
    shapes: dict[str, dict[int, str]]  # side -> node id -> output shape at this token
    request: int = 0  # the screen's status load it answers: an answer to an earlier one is dropped


@dataclass
class DetailReady(Message):
    detail: PairDetail | None
    diff: TensorDiff | None


@dataclass
class NodeTensorsReady(Message):
    node: NodeTensors


@dataclass
class SelectNode(Message):
    """Select a golden node (drill result or verdict) once its data arrives."""

    node_id: int | None


@dataclass
class MappingStale(Message):
    """The comparison's mapping file has entries that no longer fit the dumps (not used)."""

    entries: list[tuple[str, str, str, str]]  # kind, golden, test, reason


@dataclass
class CallDrift(Message):
    """Kinds of call the test run makes at some tokens only: pairs named alike may compare different calls there."""

    lines: list[tuple[str, bool]]  # `wb compare`'s lines, as stored, and whether the calls were paired again


@dataclass
class GroupOf(Message):
    """The heatmap row group of the selected node (to put the cursor on it)."""

    node_id: int
    group: int | None


@dataclass
class RanksReady(Message):
    entries: list[RankEntry]


@dataclass
class AdviceReady(Message):
    entries: list[PickerEntry[tuple[int, int]]]
    note: str


# precheck and re-dump (`p`, `d`)
@dataclass
class PrecheckReady(Message):
    node_id: int
    token: int
    results: list[PrecheckResult]  # one op, or the leaf ops of a group
    error: str | None = None


@dataclass
class RedumpPlanned(Message):
    label: str
    plan: RedumpPlan | None
    error: str | None = None


@dataclass
class RedumpStep(Message):
    progress: Progress


@dataclass
class RedumpFinished(Message):
    text: str
    error: bool


# the mapping editor
@dataclass
class MappingLists(Message):
    golden: list[Unmatched]
    test: list[Unmatched]
    pairs: list[NodePair]
    stale: list[StaleEntry]
    fingerprinted: bool


# the SQL console
@dataclass
class SavedQueries(Message):
    queries: dict[str, tuple[Path, str]]


@dataclass
class SqlDone(Message):
    sql: str
    result: ResultSet | None
    error: str | None
