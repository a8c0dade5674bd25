"""What a precheck says, with no torch: the result types, the verdict words, their tally and the exit code.

The app shows precheck results and must not import torch (docs/architecture.md), so the types the entry points
(`run_atb.py` for ATB ops, `run_torch.py` for torch modules, `run_catalog.py` for a compared node) return live here.

A result is `ok` only when every stage of the op ran and passed. `disagree`: a stage or output fails.
`not checked`: what ran passed, but some stages did not run (`not_checked` names them, `why` says why).
`cannot run`: the op has a reference but nothing could be judged. `no reference`: nothing here recomputes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workbench.core.exits import EXIT_NOTHING, EXIT_OK, EXIT_UNCHECKED

OK = "ok"
DISAGREE = "disagree"
NOT_CHECKED = "not checked"
CANNOT_RUN = "cannot run"
NO_REFERENCE = "no reference"
WEIGHTS_NOT_DUMPED = "weights not dumped: re-dump with --weights or press d"


@dataclass(slots=True)
class OutputCheck:
    """The verdict on one dumped output: `values` are `compare_tensors` metrics (reference = golden)."""

    index: int
    values: dict[str, float | None]
    passed: bool | None
    failed_metrics: list[str]
    reason: str | None = None
    label: str = ""  # what was judged when it is not a plain output (torch stages: "q_proj", "attention core")


@dataclass(slots=True)
class PrecheckResult:
    """The precheck of one op; `passed` is None when nothing could be judged (see `reason`).

    `not_checked` names the stages (or outputs) that did not run, `why` says why; `passed` is never True
    while `not_checked` holds anything.
    """

    op_dir: str
    op_type: str
    supported: bool
    passed: bool | None
    outputs: list[OutputCheck] = field(default_factory=list)
    reason: str | None = None
    name: str = ""  # the op path below the token folder, e.g. 3_Prefill_layer/1_Attention/1_RopeOperation
    param_issues: list[str] = field(default_factory=list)
    not_checked: list[str] = field(default_factory=list)
    why: str | None = None  # why the `not_checked` stages did not run

    @property
    def verdict(self) -> str:
        """One of `OK`, `DISAGREE`, `NOT_CHECKED`, `CANNOT_RUN`, `NO_REFERENCE`."""
        if self.passed is False:
            return DISAGREE
        if not self.supported:
            return NO_REFERENCE
        if self.passed and not self.not_checked:
            return OK
        if any(o.passed is not None for o in self.outputs):
            return NOT_CHECKED
        return CANNOT_RUN

    @property
    def unchecked_text(self) -> str:
        """`not checked: gate_proj, up_proj (weights not dumped: ...)`, or '' when every stage ran."""
        if not self.not_checked:
            return ""
        return f"not checked: {', '.join(self.not_checked)}" + (f" ({self.why})" if self.why else "")


@dataclass(frozen=True, slots=True)
class Tally:
    """How many prechecked ops ended in each verdict."""

    ok: int
    disagree: int
    not_checked: int
    cannot_run: int
    no_reference: int

    @property
    def ran(self) -> int:
        """Ops of which at least one stage was judged."""
        return self.ok + self.disagree + self.not_checked

    def line(self) -> str:
        """`5 ops ran: 3 ok, 1 disagree, 1 not checked; 2 cannot run; 4 have no reference`."""
        head = f"{self.ran} ops ran: {self.ok} ok, {self.disagree} disagree, {self.not_checked} not checked"
        return f"{head}; {self.cannot_run} cannot run; {self.no_reference} have no reference"

    @property
    def exit_code(self) -> int:
        """1 when an op disagrees; 4 when nothing disagrees but something was not checked (or nothing ran); 0
        when every op that has a reference ran every stage and passed (ops with no reference do not count)."""
        if self.disagree:
            return EXIT_NOTHING
        if self.not_checked or self.cannot_run or not self.ran:
            return EXIT_UNCHECKED
        return EXIT_OK


def tally(results: list[PrecheckResult]) -> Tally:
    """Count `results` by verdict."""
    verdicts = [r.verdict for r in results]
    return Tally(*(verdicts.count(v) for v in (OK, DISAGREE, NOT_CHECKED, CANNOT_RUN, NO_REFERENCE)))
