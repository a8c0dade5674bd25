"""The typed screen base and the small screens: message (bad input), progress, help, pickers.

Screens never reach into the app: they get a `Session` (catalog, mapping file, the current
explorer) when built and post messages (`EditRequested`, `CancelRequested`, `ComparisonChosen`)
that the app handles; the app tells them of a reopened catalog through `WorkbenchScreen.set_explorer`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Center, Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from workbench.analysis.explorer.explore import Explorer
from workbench.app.actions import ACTIONS, bindings
from workbench.app.footer import KeysFooter
from workbench.app.messages import CancelRequested

if TYPE_CHECKING:
    from workbench.core.progress import Progress

SCOPE_TITLES = {
    "app": "Everywhere",
    "main": "Main screen",
    "heatmap": "Heatmap",
    "tree": "Trees",
    "mapping": "Mapping editor",
    "sql": "SQL console",
    "help": "Help",
    "picker": "Lists (advisor, comparisons)",
    "mouse": "Mouse",
}
# keys the widgets carry themselves (not in the action table): shown in the help under their scope
BUILT_IN_KEYS = (
    ("heatmap", "arrows PgUp PgDn Home End", "Move the cell cursor (columns are tokens)"),
    ("tree", "arrows enter space", "Move, expand/collapse; the other side follows"),
    ("mouse", "click", "Focus, move the cursor; double-click a heatmap cell selects it"),
)
R = TypeVar("R")


@dataclass
class Session:
    """What every screen may use: the catalog, the mapping file, and the current read-only explorer."""

    catalog: Path
    mapping: Path | None
    explorer: Explorer


class WorkbenchScreen(Screen[R], Generic[R]):
    """A screen of the workbench: its action scope (bindings, help, palette) and the session it shows."""

    SCOPE: ClassVar[str] = ""

    def __init__(self, session: Session | None = None) -> None:
        super().__init__()
        self._session = session

    @property
    def session(self) -> Session:
        assert self._session is not None, f"{type(self).__name__} was built without a session"
        return self._session

    @property
    def explorer(self) -> Explorer:
        return self.session.explorer

    def set_explorer(self, explorer: Explorer) -> None:
        """The catalog was reopened (after an edit): reload what the screen shows."""
        self.session.explorer = explorer


class WorkbenchModal(ModalScreen[R], Generic[R]):
    """A modal screen of the workbench with an action scope."""

    SCOPE: ClassVar[str] = ""


@dataclass(frozen=True, slots=True)
class PickerEntry(Generic[R]):
    """One line of a picker and the value it returns."""

    label: str
    value: R


class PickerScreen(WorkbenchModal[R | None], Generic[R]):
    """A titled list; Enter returns the highlighted entry's value, Escape returns None."""

    SCOPE = "picker"
    BINDINGS = bindings("picker")

    def __init__(self, title: str, entries: list[PickerEntry[R]], empty: str = "nothing to show") -> None:
        super().__init__()
        self.title_text = title
        self.entries = entries
        self.empty = empty

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="picker-title")
            if self.entries:
                yield OptionList(*[Option(Text(e.label), id=str(i)) for i, e in enumerate(self.entries)], id="picker")
            else:
                yield Static(Text(self.empty, style="dim"))
        yield KeysFooter()

    def on_mount(self) -> None:
        if self.entries:
            lst = self.query_one(OptionList)
            lst.highlighted = 0
            lst.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.action_choose()

    def action_choose(self) -> None:
        if not self.entries:
            self.dismiss(None)
            return
        i = self.query_one(OptionList).highlighted
        self.dismiss(None if i is None else self.entries[i].value)

    def action_close(self) -> None:
        self.dismiss(None)


class MessageScreen(Screen[None]):
    """A clear message instead of a traceback: what went wrong and what to do; any key quits."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("q,escape,enter", "app.quit", "Quit", key_display="q")]

    def __init__(self, title: str, message: str) -> None:
        super().__init__()
        self.title_text = title
        self.message = message

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(self.title_text, id="title")
            yield Static(Text(self.message), id="message")
            yield Static(Text("Press q, Escape or Enter to quit.", style="dim"))
        yield KeysFooter()


class ProgressScreen(Screen[None]):
    """A long operation's progress (a compare, a re-dump): what runs, stage, bar, counts; Escape cancels it,
    by setting `cancel` when given, else by posting `CancelRequested` to the app."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", key_display="esc")]

    def __init__(
        self,
        title: str,
        subject: str,
        *,
        cancel: threading.Event | None = None,
        cancelling: str = "cancelling (keeping what is committed) ...",
        counts: bool = True,
        total: int | None = None,
    ) -> None:
        super().__init__()
        self.title_text = title
        self.subject = subject
        self.cancel = cancel
        self.cancelling = cancelling
        self.counts = counts  # "done / total rate message" under the bar, else the message alone
        self.total = total

    @classmethod
    def comparing(cls, golden: str, test: str) -> ProgressScreen:
        """The compare's screen (the app runs the compare first when given two dumps)."""
        return cls("Comparing", f"golden: {golden}\ntest:   {test}")

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Static(Text.assemble((f"{self.title_text}\n", "bold"), self.subject))
            yield Static("starting ...", id="stage")
            with Center():
                yield ProgressBar(total=self.total, id="bar", show_eta=False)
            yield Static("", id="counts")
        yield KeysFooter()

    def show(self, p: Progress) -> None:
        """Show one progress report (called on the UI thread from a message handler)."""
        self.query_one("#stage", Static).update(p.stage)
        bar = self.query_one("#bar", ProgressBar)
        bar.update(total=p.total or None, progress=p.done)
        if self.counts:
            rate_text = f"  {p.rate:,.0f}/s" if p.rate else ""
            self.query_one("#counts", Static).update(f"{p.done:,} / {p.total:,}{rate_text}  {p.message}".rstrip())
        else:
            self.query_one("#counts", Static).update(p.message)

    def action_cancel(self) -> None:
        if self.cancel is not None:
            self.cancel.set()
        else:
            self.post_message(CancelRequested())
        self.query_one("#stage", Static).update(self.cancelling)


def help_table() -> Table:
    """Every key of every screen, from the action table."""
    table = Table(box=None, header_style="bold", expand=True)
    # the action takes the width; the scope and the key wrap at a few words (a narrow terminal keeps room for it)
    table.add_column("where", max_width=15)
    table.add_column("key", style="bold", max_width=10)
    table.add_column("action", ratio=1)
    rows: dict[str, list[tuple[str, str]]] = {}  # scope -> (key, action), in the table's order
    for a in ACTIONS:
        rows.setdefault(a.scope, []).append((a.label, a.description))
    for scope, key, action in BUILT_IN_KEYS:  # each under its own scope's title, after the scope's actions
        rows.setdefault(scope, []).append((key, action))
    for scope, entries in rows.items():
        for i, (key, action) in enumerate(entries):
            table.add_row(SCOPE_TITLES.get(scope, scope) if i == 0 else "", key, action)
    return table


class HelpScreen(WorkbenchModal[None]):
    """All keys, generated from the action table (the footer and the command palette use it too)."""

    SCOPE = "help"
    BINDINGS = bindings("help")

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
