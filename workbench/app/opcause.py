"""From op to cause in the app: `p` prechecks the selected op, `d` re-dumps it (a cancellable progress screen).

`OpCauseActions` is mixed into the main screen: each action runs one headless call in a thread worker
(`precheck_catalog`, `run_redump`) and posts a typed message; the verdict goes to a panel under the
detail pane and a badge in both trees, a re-dump reopens the catalog so every pane refreshes.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import work
from textual.screen import Screen
from textual.widgets import Static

from workbench.analysis.precheck import PrecheckResult
from workbench.app.messages import PrecheckReady, RedumpFinished, RedumpStep
from workbench.app.screens import ProgressScreen

if TYPE_CHECKING:
    from workbench.analysis.explore import Explorer
    from workbench.core.progress import Progress


def render_precheck(result: PrecheckResult | None, error: str | None, token: int) -> RenderableType:
    """The precheck section: verdict line, one row per judged output or stage, the reason."""
    if error is not None:
        return Text(f"precheck: {error}", style="bold")
    if result is None:
        return Text("precheck: p re-runs the selected test op alone in float64", style="dim")
    verdict = {True: ("PASS", "green"), False: ("FAIL", "red"), None: ("?", "yellow")}[result.passed]
    head = Text.assemble(
        ("precheck ", "bold"), (verdict[0], f"bold {verdict[1]}"), f"  {result.name} ({result.op_type}) token {token}"
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
                f"{rate:.3f}%" if rate is not None else ",".join(o.failed_metrics) or "-",
                f"{rel:.3g}" if rel is not None else "-",
                f"{cos:.6f}" if cos is not None else "-",
            )
        parts.append(table)
    if result.reason:
        parts.append(Text(result.reason, style="dim"))
    return Group(*parts)


class PrecheckPanel(Static):
    """The precheck section under the detail pane."""

    def show(self, result: PrecheckResult | None, error: str | None, token: int) -> None:
        self.display = True
        self.update(render_precheck(result, error, token))


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
        from workbench.analysis.precheck_torch import CannotRun, precheck_catalog
        from workbench.catalog.readonly import connect_read_only

        try:
            con = connect_read_only(self.explorer.catalog)
            try:
                result = precheck_catalog(con, self.explorer.info.cmp_id, node_id, token)
            finally:
                con.close()
        except CannotRun as exc:
            self.post_message(PrecheckReady(node_id, token, None, str(exc)))
            return
        self.post_message(PrecheckReady(node_id, token, result))

    def on_precheck_ready(self, msg: PrecheckReady) -> None:
        self.query_one(PrecheckPanel).show(msg.result, msg.error, msg.token)
        mark = {True: ("✓ precheck", "ok"), False: ("✗ precheck fails", "fail"), None: ("? precheck", "unmatched")}
        badge = mark[msg.result.passed if msg.result is not None else None]
        from workbench.app.trees import TopologyTree

        for tree in self.query(TopologyTree):
            tree.badges[(msg.node_id, msg.token)] = badge
            tree.token = msg.token
            tree.refresh()

    def action_redump(self) -> None:
        target = self._target()
        if target is None:
            return
        cancel = threading.Event()
        self._redump_cancel = cancel
        app: Any = self.app
        from workbench.app.trees import TopologyTree

        name = self.query_one("#golden-tree", TopologyTree).rows.get(target[0])
        label = f"{name.name if name else target[0]} at token {target[1]} (test side)"
        app.push_screen(
            ProgressScreen(
                "Re-dumping", label, cancel=cancel, cancelling=_REDUMP_CANCELLING, counts=False, total=REDUMP_STEPS
            )
        )
        if app.explorer is not None:
            app.explorer.close()  # the job writes the catalog; reopened when it ends
        self._redump_worker(target[0], target[1], cancel)

    @work(thread=True, exclusive=True, group="redump", exit_on_error=False)
    def _redump_worker(self, node_id: int, token: int, cancel: threading.Event) -> None:
        from workbench.jobs.redump import RedumpError, run_redump

        catalog, cmp_id = self.explorer.catalog, self.explorer.info.cmp_id

        def step(p: Progress) -> None:
            self.post_message(RedumpStep(p))

        try:
            res = run_redump(
                catalog,
                cmp_id,
                node_id,
                token,
                progress=step,
                cancel=cancel,
            )
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
