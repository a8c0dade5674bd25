"""The workbench Textual app: opens a catalog (or compares two dumps first) and owns the connection."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider
from textual.worker import Worker, WorkerState

from workbench.analysis.explorer.explore import ExploreError, Explorer
from workbench.app.actions import ACTIONS, bindings
from workbench.app.main_screen import MainScreen
from workbench.app.messages import (
    CancelRequested,
    CatalogOpened,
    CompareDone,
    CompareProgress,
    ComparisonChosen,
    EditDone,
    EditRequested,
    OpenFailed,
)
from workbench.app.screens import (
    HelpScreen,
    MessageScreen,
    ProgressScreen,
    Session,
    WorkbenchModal,
    WorkbenchScreen,
)
from workbench.app.themes import DEFAULT_THEME, DOMAIN_DEFAULTS, THEMES_DIR, load_themes

if TYPE_CHECKING:
    from workbench.compare.pairing.mapping import PairSpec
    from workbench.jobs.compare_dumps import CompareRequest


class WorkbenchCommands(Provider):
    """Every action of the action table, plus one command per theme."""

    def _commands(self) -> list[tuple[str, Any, str]]:
        app = self.app
        assert isinstance(app, WorkbenchApp)
        screen = self.screen  # the screen the palette was opened on
        scope = screen.SCOPE if isinstance(screen, (WorkbenchScreen, WorkbenchModal)) else ""
        out: list[tuple[str, Any, str]] = []
        for a in ACTIONS:
            if not a.palette or a.scope not in ("app", scope):
                continue
            target = app if a.scope == "app" else screen
            out.append((a.description, partial(target.run_action, a.action), f"key: {a.label}"))
        for name in sorted(app.available_themes):
            out.append((f"Theme: {name}", partial(setattr, app, "theme", name), "switch the colours"))
        return out

    async def discover(self) -> Hits:
        for title, cb, help_text in self._commands():
            yield DiscoveryHit(title, cb, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, cb, help_text in self._commands():
            score = matcher.match(title)
            if score > 0:
                yield Hit(score, matcher.highlight(title), cb, help=help_text)
        screen = self.screen
        if isinstance(screen, MainScreen):  # an op by its name: selected everywhere, as a click in a tree would
            for row in screen.ops_named(query):
                title = f"Go to op: {row.name}"
                where = f"layer {row.layer}" if row.layer is not None else "no layer"
                # below every action that matches as well: a name holding the words is always offered
                score = max(matcher.match(title), 0.01) * 0.5
                yield Hit(
                    score, matcher.highlight(title), partial(screen.select, row.node_id), help=f"{row.type}, {where}"
                )


def start_selection(explorer: Explorer) -> tuple[int | None, int | None]:
    """(token, golden node) to show first: where the error is born at the first token that has such an op,
    else the advisor's first suspect where it stands out of its peers' noise, else nothing."""
    born = explorer.born_all()
    first_bad = next((t for t, name in born.items() if name is not None), None)
    if first_bad is not None:
        return first_bad, explorer.born(first_bad)[0]
    from workbench.analysis.verdicts.advisor import SIGNIFICANT  # the advisor only when nothing fails

    rows, _ = explorer.advice(top=1)
    standing_out = [r for r in rows if r.score >= SIGNIFICANT]
    if standing_out:
        first = min(standing_out, key=lambda r: r.token_id)
        return int(first.token_id), int(first.golden_node_id)
    return None, None


class WorkbenchApp(App[int]):
    """`wb open`: find where a model's inference goes numerically wrong."""

    TITLE = "wb workbench"
    BINDINGS = bindings("app")
    COMMANDS = App.COMMANDS | {WorkbenchCommands}
    CSS_PATH = "app.tcss"  # every screen's and widget's styles; shipped as package data

    def __init__(
        self,
        *,
        catalog: Path,
        golden: Path | None = None,
        test: Path | None = None,
        mapping: Path | None = None,
        theme: str | None = None,
        cmp_id: int | None = None,
        themes_dir: Path = THEMES_DIR,
        request: CompareRequest | None = None,
    ) -> None:
        super().__init__()
        self.catalog = Path(catalog)
        if request is None and golden is not None and test is not None:
            from workbench.jobs.compare_dumps import CompareRequest

            request = CompareRequest(golden, test, self.catalog, mapping=mapping)
        self.request = request  # the compare to run first (progress screen), if any
        self.mapping_path = request.mapping if request is not None else mapping
        self.cmp_id = cmp_id
        self.explorer: Explorer | None = None
        self.cancel_event = threading.Event()
        self.error_code = 0  # exit code: 2 once the app could only show an error
        self.theme_problems: list[str] = []
        themes, self.theme_problems = load_themes(themes_dir)
        for t in themes:
            self.register_theme(t)
        wanted = theme or (DEFAULT_THEME if any(t.name == DEFAULT_THEME for t in themes) else None)
        self.bad_theme: str | None = None
        if wanted is not None:
            if wanted in self.available_themes:
                self.theme = wanted
            elif f"wb-{wanted}" in self.available_themes:
                self.theme = f"wb-{wanted}"
            else:
                self.bad_theme = wanted

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(DOMAIN_DEFAULTS)

    # ------------------------------------------------------------------ start
    def on_mount(self) -> None:
        if self.bad_theme is not None:
            known = ", ".join(sorted(t for t in self.available_themes if t.startswith("wb-")))
            self.error_code = 2
            self.push_screen(
                MessageScreen(
                    "Unknown theme", f"--theme {self.bad_theme}: no such theme (themes/: {known or 'none found'})"
                )
            )
            return
        for p in self.theme_problems:
            self.notify(p, severity="warning")
        if self.request is not None:
            self.push_screen(ProgressScreen.comparing(str(self.request.golden), str(self.request.test)))
            self.run_compare_worker()
        else:
            self.open_catalog(self.cmp_id)

    @work(thread=True, exclusive=True, group="open", exit_on_error=False)
    def open_catalog(self, cmp_id: int | None, token: int | None = None, golden_node: str | None = None) -> None:
        try:
            explorer = Explorer(self.catalog, cmp_id)
        except ExploreError as exc:
            self.post_message(OpenFailed("Cannot open the catalog", str(exc)))
            return
        kept = explorer.golden_node_id(golden_node) if golden_node is not None else None
        if token is not None and token in explorer.info.tokens and (golden_node is None or kept is not None):
            self.post_message(CatalogOpened(explorer, token, kept))  # another rank, where the user was
            return
        token, node = start_selection(explorer)
        self.post_message(CatalogOpened(explorer, token, node))

    @work(thread=True, exclusive=True, group="compare", exit_on_error=False)
    def run_compare_worker(self) -> None:
        try:
            from workbench.jobs.compare import CompareCancelled
            from workbench.jobs.compare_dumps import compare_dumps
        except ImportError as exc:
            self.post_message(OpenFailed("Cannot compare", f"the compare pipeline is unavailable ({exc})"))
            return
        from workbench.catalog.store import CatalogError
        from workbench.compare.pairing.mapping import MappingError
        from workbench.formats.model import DumpError

        def progress(p: Any) -> None:
            self.post_message(CompareProgress(p))

        assert self.request is not None
        try:
            res = compare_dumps(self.request, progress=progress, cancel=self.cancel_event).result
        except CompareCancelled:
            self.post_message(
                OpenFailed(
                    "Cancelled", f"The compare was cancelled; everything committed so far is kept in {self.catalog}."
                )
            )
            return
        except (DumpError, CatalogError, MappingError, ValueError, OSError) as exc:
            self.post_message(OpenFailed("Cannot compare", str(exc).splitlines()[0] if str(exc) else repr(exc)))
            return
        if res.pairs == 0:
            self.post_message(
                OpenFailed(
                    "No pairs matched",
                    f"No golden op could be paired with a test op ({res.unmatched_golden} "
                    f"golden and {res.unmatched_test} test ops unmatched). Are these dumps of the same model? "
                    "A mapping file (-mf) can pair them.",
                )
            )
            return
        self.post_message(CompareDone(res.cmp_id))

    def on_compare_progress(self, msg: CompareProgress) -> None:
        if isinstance(self.screen, ProgressScreen):
            self.screen.show(msg.progress)

    def on_compare_done(self, msg: CompareDone) -> None:
        self.open_catalog(msg.cmp_id)

    def on_catalog_opened(self, msg: CatalogOpened) -> None:
        old = self.explorer
        self.explorer = msg.explorer
        self.cmp_id = msg.explorer.info.cmp_id
        screen = MainScreen(Session(self.catalog, self.mapping_path, msg.explorer), msg.token, msg.select)
        if isinstance(self.screen, (ProgressScreen, MainScreen)):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)
        if old is not None and old is not msg.explorer:
            old.close()

    def on_comparison_chosen(self, msg: ComparisonChosen) -> None:
        self.open_catalog(msg.cmp_id, msg.token, msg.golden_node)

    def on_cancel_requested(self, _msg: CancelRequested) -> None:
        self.cancel_event.set()

    def on_edit_requested(self, msg: EditRequested) -> None:
        self.apply_edit(msg.pairs, msg.remove)

    def on_open_failed(self, msg: OpenFailed) -> None:
        self.error_code = 2
        screen = MessageScreen(msg.title, msg.reason)
        if isinstance(self.screen, ProgressScreen):
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR and event.worker.error is not None:
            err = event.worker.error
            self.notify(
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                title=f"{event.worker.name} failed",
                severity="error",
                timeout=8,
            )

    # ------------------------------------------------------------------ edits (read-write, then reopen)
    def apply_edit(self, pairs: list[PairSpec], remove: list[tuple[str, str]]) -> None:
        """Close the read-only connection, write the pairs in a worker, reopen; posts EditDone."""
        if self.explorer is not None:
            self.explorer.close()
        self._edit_worker(pairs, remove)

    @work(thread=True, exclusive=True, group="edit", exit_on_error=False)
    def _edit_worker(self, pairs: list[PairSpec], remove: list[tuple[str, str]]) -> None:
        text, error = "", False
        try:
            from workbench.jobs.compare import add_node_pairs

            added = add_node_pairs(self.catalog, int(self.cmp_id or 0), pairs, remove)
            text = f"{added} tensor pair(s) added, {len(remove)} node pair(s) removed; metrics computed"
        except Exception as exc:  # shown to the user; the catalog is reopened either way
            text, error = f"edit failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", True
        try:
            explorer: Explorer | None = Explorer(self.catalog, self.cmp_id)
        except ExploreError as exc:
            explorer, text, error = None, f"{text}; cannot reopen: {exc}", True
        if explorer is not None and not error:
            for spec in pairs:
                for label, g, t in explorer.size_mismatches(spec.golden, spec.test):
                    text += (
                        f"; warning: {spec.golden} ⇄ {spec.test} {label} differ in size ({g:,} vs {t:,} elements): "
                        "not comparable"
                    )
                    error = True
        self.post_message(EditDone(explorer, text, error))

    def reopen_after_edit(self, text: str, error: bool) -> None:
        """Reopen the catalog after a job wrote it (a re-dump) and refresh every screen; posts EditDone."""
        self._reopen_worker(text, error)

    @work(thread=True, exclusive=True, group="edit", exit_on_error=False)
    def _reopen_worker(self, text: str, error: bool) -> None:
        try:
            explorer: Explorer | None = Explorer(self.catalog, self.cmp_id)
        except ExploreError as exc:
            explorer, text, error = None, f"{text}; cannot reopen: {exc}", True
        self.post_message(EditDone(explorer, text, error))

    def on_edit_done(self, msg: EditDone) -> None:
        if msg.explorer is not None:
            self.explorer = msg.explorer
            for screen in self.screen_stack:
                if isinstance(screen, WorkbenchScreen):
                    screen.set_explorer(msg.explorer)
        self.notify(msg.text, severity="warning" if msg.error else "information", timeout=10 if msg.error else 5)

    # ------------------------------------------------------------------ actions
    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_cycle_theme(self) -> None:
        names = sorted(t for t in self.available_themes if t.startswith("wb-")) or sorted(self.available_themes)
        i = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(i + 1) % len(names)]
        self.notify(f"theme: {self.theme}")

    async def action_quit(self) -> None:
        self.exit(self.error_code, return_code=self.error_code)

    def on_unmount(self) -> None:
        self.cancel_event.set()
        if self.explorer is not None:
            self.explorer.close()
