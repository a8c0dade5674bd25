"""Small screens: a message (bad input), compare progress, and help (generated from the action table)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Center, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, ProgressBar, Static

from workbench.analysis.explore import Explorer
from workbench.app.actions import ACTIONS, bindings
from workbench.compare.mapping import PairSpec

SCOPE_TITLES = {
    "app": "Everywhere",
    "main": "Main screen",
    "heatmap": "Heatmap",
    "tree": "Trees",
    "mapping": "Mapping editor",
    "sql": "SQL console",
    "help": "Help",
}


@dataclass
class EditRequested(Message):
    """A screen asks the app to pair (`pairs`) and unpair (`remove`: golden, test node names) nodes."""

    pairs: list[PairSpec]
    remove: list[tuple[str, str]]


class UsesAppExplorer(Screen[None]):
    """For screens that query the app's current (read-only) catalog explorer, reopened after edits; they ask
    the app for edits by message (`EditRequested`)."""

    @property
    def explorer(self) -> Explorer:
        ex = getattr(self.app, "explorer", None)
        assert isinstance(ex, Explorer)
        return ex


class MessageScreen(Screen[None]):
    """A clear message instead of a traceback: what went wrong and what to do; any key quits."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("q,escape,enter", "app.quit", "Quit", key_display="q")]
    DEFAULT_CSS = """
    MessageScreen { align: center middle; }
    MessageScreen > Vertical { width: 90%; max-width: 100; height: auto; border: heavy $error;
                               padding: 1 2; background: $surface; }
    MessageScreen #title { text-style: bold; color: $error; }
    """

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="title")
            yield Static(Text(self.message), id="message")
            yield Static(Text("Press q, Escape or Enter to quit.", style="dim"))
        yield Footer()


class ProgressScreen(Screen[None]):
    """Ingest and compare progress: stage, counts, rate; Escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", key_display="esc")]
    DEFAULT_CSS = """
    ProgressScreen { align: center middle; }
    ProgressScreen > Vertical { width: 80%; max-width: 100; height: auto; border: round $primary; padding: 1 2; }
    ProgressScreen #stage { text-style: bold; }
    """

    def __init__(self, golden: str, test: str) -> None:
        super().__init__()
        self.golden = golden
        self.test = test

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text.assemble(("Comparing\n", "bold"), f"golden: {self.golden}\ntest:   {self.test}"))
            yield Static("starting ...", id="stage")
            with Center():
                yield ProgressBar(total=None, id="bar", show_eta=False)
            yield Static("", id="counts")
        yield Footer()

    def update(self, stage: str, done: int, total: int, rate: float, message: str) -> None:
        """Show one progress report (called on the UI thread from a message handler)."""
        self.query_one("#stage", Static).update(stage)
        bar = self.query_one("#bar", ProgressBar)
        bar.update(total=total or None, progress=done)
        rate_text = f"  {rate:,.0f}/s" if rate else ""
        self.query_one("#counts", Static).update(f"{done:,} / {total:,}{rate_text}  {message}".rstrip())

    def action_cancel(self) -> None:
        cancel = getattr(self.app, "cancel_event", None)
        if cancel is not None:
            cancel.set()
        self.query_one("#stage", Static).update("cancelling (keeping what is committed) ...")


def help_table() -> Table:
    """Every key of every screen, from the action table."""
    table = Table(box=None, header_style="bold", expand=True)
    table.add_column("where")
    table.add_column("key", style="bold")
    table.add_column("action")
    last = ""
    for a in ACTIONS:
        where = SCOPE_TITLES.get(a.scope, a.scope) if a.scope != last else ""
        last = a.scope
        table.add_row(where, a.label, a.description)
    table.add_row("Heatmap", "arrows PgUp PgDn Home End", "Move the cell cursor (columns are tokens)")
    table.add_row("Trees", "arrows enter space", "Move, expand/collapse; the other side follows")
    table.add_row("Mouse", "click", "Focus, move the cursor; double-click a heatmap cell selects it")
    return table


class HelpScreen(ModalScreen[None]):
    """All keys, generated from the action table (the footer and the command palette use it too)."""

    BINDINGS = bindings("help")
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll { width: 90%; max-width: 110; height: 85%; border: round $primary;
                                  background: $surface; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(
                Text.assemble(
                    ("wb workbench: keys\n", "bold"),
                    "Find where the error is born: the heatmap shows tokens (columns) x layers (rows); "
                    "Enter drills into a layer's ops and selects an op everywhere; the trees follow; the "
                    "detail pane shows the pair. Ctrl+P finds every action.\n",
                )
            )
            yield Static(help_table())

    def action_close(self) -> None:
        self.dismiss()
