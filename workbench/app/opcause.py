"""From op to cause in the app: `p` prechecks the selected op (a group: its leaf ops), `d` re-dumps it.

`d` shows a cancellable progress screen.

`OpCauseActions` is mixed into the main screen: each action runs one headless call in a thread worker
(`precheck_catalog`, `plan_redump`, `run_redump`) and posts a typed message; the verdict goes to a panel under
the detail pane and a badge in both trees. `d` first shows the recorded command it would run
(`ConfirmRedumpScreen`: argv, folder, environment, a warning when the record does not verify); only `y` there
starts the re-dump, which reopens the catalog so every pane refreshes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, ClassVar

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen, Screen
from textual.widgets import Static

from workbench.analysis.checks.precheck.result import (
    CANNOT_RUN,
    DISAGREE,
    NO_REFERENCE,
    NOT_CHECKED,
    OK,
    PrecheckResult,
    tally,
)
from workbench.app.footer import KeysFooter
from workbench.app.messages import PrecheckReady, RedumpFinished, RedumpPlanned, RedumpStep
from workbench.app.screens import ProgressScreen
from workbench.core.exits import EXIT_NOTHING, EXIT_OK

if TYPE_CHECKING:
    from pathlib import Path

    from workbench.analysis.explorer.explore import Explorer
    from workbench.core.progress import Progress
    from workbench.jobs.redump import RedumpPlan


_STYLE = {OK: "green", DISAGREE: "red", NOT_CHECKED: "yellow", CANNOT_RUN: "yellow", NO_REFERENCE: "dim"}
_MARK = {OK: "✓", DISAGREE: "✗", NOT_CHECKED: "?", CANNOT_RUN: "?", NO_REFERENCE: "-"}
# an op's precheck verdict in both trees (text, tree style key): short, as it stands before the op's name
PRECHECK_BADGES: dict[str, tuple[str, str]] = {
    OK: ("P✓", "ok"),
    DISAGREE: ("P✗", "fail"),
    NOT_CHECKED: ("P?", "unmatched"),
}


def group_verdict(results: list[PrecheckResult]) -> str:
    """One verdict for what `p` re-ran: `disagree` if any op does, `ok` if every op with a reference ran every
    stage and passed, else `not checked`."""
    code = tally(results).exit_code
    return DISAGREE if code == EXIT_NOTHING else OK if code == EXIT_OK else NOT_CHECKED


def render_precheck(results: list[PrecheckResult] | None, error: str | None, token: int) -> RenderableType:
    """The precheck section: verdict line, one row per judged output or stage (one op) or per op (a group)."""
    if error is not None:
        return Text(f"precheck: {error}", style="bold")
    if not results:
        return Text("precheck: p re-runs the selected test op alone in float64", style="dim")
    if len(results) > 1:
        return _render_group(results, token)
    result = results[0]
    verdict = result.verdict
    head = Text.assemble(
        ("precheck ", "bold"), (verdict, f"bold {_STYLE[verdict]}"), f"  {result.name} ({result.op_type}) token {token}"
    )
    parts: list[RenderableType] = [head]
    if result.outputs:
        table = Table(box=None, pad_edge=False, show_header=True, header_style="bold")
        for col in ("", "within tol.", "max rel err", "cosine"):
            table.add_column(col)
        for o in result.outputs:
            rate = o.values.get("rel_pass_rate")
            rel = o.values.get("max_relative_error")
            cos = o.values.get("cosine_similarity")
            mark = ("✓ " if o.passed else "✗ " if o.passed is False else "? ") + (o.label or f"out{o.index}")
            table.add_row(
                Text(mark, style="green" if o.passed else "red" if o.passed is False else "yellow"),
                _within(rate, o.passed, o.failed_metrics),
                f"{rel:.3g}" if rel is not None else "-",
                f"{cos:.6f}" if cos is not None else "-",
            )
        parts.append(table)
    if result.not_checked:
        parts.append(Text(result.unchecked_text, style="yellow"))
    if result.reason:
        parts.append(Text(result.reason, style="dim"))
    return Group(*parts)


def _render_group(results: list[PrecheckResult], token: int) -> RenderableType:
    verdict = group_verdict(results)
    counts = tally(results)
    first = next((r for r in results if r.verdict == DISAGREE), None)
    head = Text.assemble(
        ("precheck ", "bold"),
        (verdict, f"bold {_STYLE[verdict]}"),
        f"  {len(results)} ops re-run alone, token {token}: {counts.line()}",
    )
    parts: list[RenderableType] = [head]
    if first is not None:
        parts.append(Text(f"first to disagree: {first.name}", style="bold red"))
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column("")
    table.add_column("")
    for r in results:
        v = r.verdict
        why = r.unchecked_text if v == NOT_CHECKED else (r.reason or "") if v != OK else ""
        table.add_row(Text(f"{_MARK[v]} {r.name or r.op_dir}", style=_STYLE[v]), Text(f"{v}  {why}".strip()))
    parts.append(table)
    return Group(*parts)


def _within(rate: float | None, passed: bool | None, failed: list[str]) -> str:
    """The `within tol.` cell: the share of elements within tolerance, else whether the judged metrics pass."""
    if rate is not None:
        return f"{rate:.3f}%"
    if passed is None:
        return "-"
    return "yes" if passed else "no: " + (", ".join(failed) or "fails")


class PrecheckPanel(Static):
    """The precheck section under the detail pane."""

    _reveal = False

    def show(self, results: list[PrecheckResult] | None, error: str | None, token: int) -> None:
        """Draw the results and scroll them to the detail pane's top (the verdict and the judged outputs in view,
        not only the first line at the pane's bottom): once drawn, and again once laid out at their new height."""
        self.display = True
        self.update(render_precheck(results, error, token))
        self._reveal = True
        self.call_after_refresh(self._scroll_to_top)

    def on_resize(self) -> None:
        if self._reveal:
            self._reveal = False
            self._scroll_to_top()

    def _scroll_to_top(self) -> None:
        self.scroll_visible(animate=False, top=True)


class ConfirmRedumpScreen(ModalScreen[bool]):
    """The recorded command `d` would run, exactly; `y` runs it, `n` or Escape runs nothing (a transient
    question, like the progress screens: its keys are its own, not the app's action table)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "Run it", key_display="y"),
        Binding("n,escape", "close", "Cancel", key_display="n esc"),
    ]

    def __init__(self, what: str, plan: RedumpPlan) -> None:
        super().__init__()
        self.what = what
        self.plan = plan

    def compose(self) -> ComposeResult:
        from workbench.jobs.redump import describe

        lines = describe(self.plan)
        warning = [ln for ln in lines if ln.startswith("warning:")]
        with Vertical():
            yield Static(Text(f"Re-dump {self.what}: run this recorded command?"), id="confirm-title")
            if warning:
                yield Static(Text(warning[0]), id="confirm-warning")
            yield Static(Text("\n".join(ln for ln in lines if not ln.startswith("warning:"))), id="confirm-command")
            yield Static(Text("y runs it; n or Escape cancels (nothing runs).", style="dim"))
        yield KeysFooter()

    def action_confirm(self) -> None:
        self.dismiss(True)

    def action_close(self) -> None:
        self.dismiss(False)


REDUMP_STEPS = 4  # the stages `run_redump` reports
_REDUMP_CANCELLING = "cancelling (the catalog stays as it was) ..."

if TYPE_CHECKING:
    _MixinBase = Screen[None]  # the mixin is only ever mixed into a screen: type it as one
else:
    _MixinBase = object


class OpCauseActions(_MixinBase):
    """`p` and `d` on the main screen (mixed into `MainScreen`)."""

    explorer: Explorer
    selected: int | None
    token: int
    _redump_cancel: threading.Event | None = None

    def _target(self) -> tuple[int, int] | None:
        if self.selected is None:
            self.notify("select an op first (trees, or Enter on the heatmap)")
            return None
        return self.selected, self.token

    def action_precheck(self) -> None:
        target = self._target()
        if target is not None:
            panel = self.query_one(PrecheckPanel)
            panel.display = True
            panel.update(Text("precheck: re-running the op ...", style="dim"))
            self._precheck_worker(*target)

    @work(thread=True, exclusive=True, group="precheck", exit_on_error=False)
    def _precheck_worker(self, node_id: int, token: int) -> None:
        from workbench.analysis.checks.precheck.run_catalog import precheck_catalog
        from workbench.analysis.checks.precheck.torch_inputs import CannotRun
        from workbench.catalog.readonly import connect_read_only

        try:
            con = connect_read_only(self.explorer.catalog)
            try:
                results = precheck_catalog(con, self.explorer.info.cmp_id, node_id, token)
            finally:
                con.close()
        except CannotRun as exc:
            self.post_message(PrecheckReady(node_id, token, [], str(exc)))
            return
        self.post_message(PrecheckReady(node_id, token, results))

    def on_precheck_ready(self, msg: PrecheckReady) -> None:
        panel = self.query_one(PrecheckPanel)
        panel.show(msg.results, msg.error, msg.token)
        # the panel scrolls itself into view under the detail; say the verdict where it is seen at once too
        verdict = group_verdict(msg.results) if msg.results and msg.error is None else NOT_CHECKED
        if msg.error is not None:
            self.notify(f"precheck: {msg.error}", severity="warning", markup=False)
        else:
            what = msg.results[0].name if len(msg.results) == 1 else f"{len(msg.results)} ops"
            word = {OK: "passes", DISAGREE: "FAILS"}.get(verdict, verdict)
            self.notify(f"precheck {word}: {what} (token {msg.token})", markup=False)
        badge = PRECHECK_BADGES.get(verdict, PRECHECK_BADGES[NOT_CHECKED])
        from workbench.app.trees import TopologyTree

        for tree in self.query(TopologyTree):
            tree.set_badge(msg.node_id, msg.token, badge)

    def action_redump(self) -> None:
        target = self._target()
        if target is None:
            return
        from workbench.app.trees import TopologyTree

        name = self.query_one("#golden-tree", TopologyTree).rows.get(target[0])
        label = f"{name.name if name else target[0]} at token {target[1]} (test side)"
        self._plan_worker(target[0], target[1], label)

    @work(thread=True, exclusive=True, group="redump", exit_on_error=False)
    def _plan_worker(self, node_id: int, token: int, label: str) -> None:
        from workbench.catalog import CatalogError
        from workbench.catalog.readonly import connect_read_only
        from workbench.jobs.redump import RedumpError, plan_redump

        try:
            con = connect_read_only(self.explorer.catalog)
            try:
                plan = plan_redump(con, self.explorer.info.cmp_id, node_id, token, self.explorer.catalog)
            finally:
                con.close()
        except (RedumpError, CatalogError) as exc:
            self.post_message(RedumpPlanned(label, None, str(exc)))
            return
        self.post_message(RedumpPlanned(label, plan))

    def on_redump_planned(self, msg: RedumpPlanned) -> None:
        if msg.plan is None:
            self.notify(f"re-dump: {msg.error}", severity="error", markup=False)  # may quote a recorded command
            return
        plan, label = msg.plan, msg.label

        def answered(ok: bool | None) -> None:
            if ok:
                self._start_redump(label, plan)
            else:
                self.notify("re-dump cancelled: nothing was run")

        self.app.push_screen(ConfirmRedumpScreen(label, plan), answered)

    def _start_redump(self, label: str, plan: RedumpPlan) -> None:
        cancel = threading.Event()
        self._redump_cancel = cancel
        app: Any = self.app
        catalog = self.explorer.catalog
        app.push_screen(
            ProgressScreen(
                "Re-dumping", label, cancel=cancel, cancelling=_REDUMP_CANCELLING, counts=False, total=REDUMP_STEPS
            )
        )
        if app.explorer is not None:
            app.explorer.close()  # the job writes the catalog; reopened when it ends
        self._redump_worker(catalog, plan, cancel)

    @work(thread=True, exclusive=True, group="redump", exit_on_error=False)
    def _redump_worker(self, catalog: Path, plan: RedumpPlan, cancel: threading.Event) -> None:
        from workbench.jobs.redump import RedumpError, run_redump

        def step(p: Progress) -> None:
            self.post_message(RedumpStep(p))

        try:
            # confirmed: only ever started from the confirmation screen's `y`
            res = run_redump(catalog, plan, confirmed=True, progress=step, cancel=cancel)
            text = f"re-dumped: {res.tensors_updated} tensors now full, {res.pairs_recomputed} pairs recomputed"
            text += "".join(f"; {n}" for n in res.notes)
            error = False
        except RedumpError as exc:
            text, error = str(exc), True
        except Exception as exc:  # shown to the user; the catalog is reopened either way
            text, error = f"re-dump failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", True
        self.post_message(RedumpFinished(text, error))

    def on_redump_step(self, msg: RedumpStep) -> None:
        screen = self.app.screen
        if isinstance(screen, ProgressScreen):
            screen.show(msg.progress)

    def on_redump_finished(self, msg: RedumpFinished) -> None:
        app: Any = self.app
        if isinstance(app.screen, ProgressScreen):
            app.pop_screen()
        app.reopen_after_edit(msg.text, msg.error)
