"""The SQL console: read-only connection, results table, saved queries from `queries/`, history, inline errors."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import DataTable, Label, OptionList, Static, TextArea
from textual.widgets.option_list import Option

from workbench.analysis.explorer.explore import Explorer
from workbench.app.actions import bindings
from workbench.app.footer import KeysFooter
from workbench.app.messages import SavedQueries, SqlDone
from workbench.app.screens import Session, WorkbenchScreen
from workbench.core.text import printable

ROW_LIMIT = 1000
MAX_CELL = 60


class SqlScreen(WorkbenchScreen[None]):
    """Type SQL (Ctrl+R runs it) or pick a saved query; `getvariable('cmp_id')` is the shown comparison."""

    SCOPE = "sql"
    BINDINGS = bindings("sql")

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.saved: dict[str, tuple[Path, str]] = {}
        self.history: list[str] = []
        self._hist_pos = -1

    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="side"):
                yield Label("saved queries")
                yield OptionList(id="saved")
                yield Label("history")
                yield OptionList(id="history")
            with Vertical():
                yield TextArea(
                    "SELECT * FROM comparison WHERE cmp_id = getvariable('cmp_id') LIMIT 20;",
                    language=None,
                    id="editor",
                )
                yield Static("", id="sql-error")
                yield DataTable(id="results", zebra_stripes=True)
                yield Static("Ctrl+R runs; read-only connection", id="sql-info")
        yield KeysFooter()

    def on_mount(self) -> None:
        self.query_one("#editor", TextArea).focus()
        self.load_saved()

    @work(thread=True, exclusive=True, group="sql-saved", exit_on_error=False)
    def load_saved(self) -> None:
        # imported here: the saved queries are read only once the console opens
        from workbench.analysis.queries import saved_queries

        self.post_message(SavedQueries(saved_queries()))

    def on_saved_queries(self, msg: SavedQueries) -> None:
        self.saved = msg.queries
        saved = self.query_one("#saved", OptionList)
        saved.clear_options()
        if self.saved:
            saved.add_options([Option(f"{name}", id=name) for name in self.saved])
        else:
            saved.add_option(Option("(no queries/*.sql found)", disabled=True))

    def set_explorer(self, explorer: Explorer) -> None:
        """Nothing cached here: the next query uses the reopened catalog."""
        super().set_explorer(explorer)

    # ------------------------------------------------------------------ running
    def action_run_sql(self) -> None:
        sql = self.query_one("#editor", TextArea).text.strip()
        if not sql:
            return
        self.query_one("#sql-info", Static).update("running ...")
        self.execute(sql)

    @work(thread=True, exclusive=True, group="sql", exit_on_error=False)
    def execute(self, sql: str) -> None:
        try:
            self.post_message(SqlDone(sql, self.explorer.run_sql(sql, ROW_LIMIT), None))
        except ValueError as exc:
            self.post_message(SqlDone(sql, None, str(exc)))

    def on_sql_done(self, msg: SqlDone) -> None:
        if not self.history or self.history[0] != msg.sql:
            self.history.insert(0, msg.sql)
            hist = self.query_one("#history", OptionList)
            hist.clear_options()
            hist.add_options([Option(_one_line(s), id=str(i)) for i, s in enumerate(self.history)])
        self._hist_pos = -1
        err = self.query_one("#sql-error", Static)
        info = self.query_one("#sql-info", Static)
        table = self.query_one("#results", DataTable)
        if msg.error is not None:
            err.update(Text(f"error: {msg.error}"))
            table.clear(columns=True)  # an earlier result under this error would read as this query's
            info.update("the query failed; the catalog is unchanged (read-only)")
            return
        err.update("")
        res = msg.result
        assert res is not None
        table.clear(columns=True)
        table.add_columns(*res.columns)
        table.add_rows([tuple(_cell(v) for v in row) for row in res.rows])
        more = f" (first {ROW_LIMIT}; more exist)" if res.truncated else ""
        info.update(f"{len(res.rows):,} row(s){more} x {len(res.columns)} column(s); read-only connection")

    # ------------------------------------------------------------------ saved queries and history
    @on(OptionList.OptionSelected, "#saved")
    def _saved_selected(self, event: OptionList.OptionSelected) -> None:
        name = event.option.id
        if name is None or name not in self.saved:
            return
        from workbench.analysis.queries import read_sql

        try:
            text = read_sql(self.saved[name][0])
        except ValueError as exc:
            self.notify(printable(exc), severity="error")
            return
        self.query_one("#editor", TextArea).text = text
        self.execute(text.strip())

    @on(OptionList.OptionSelected, "#history")
    def _history_selected(self, event: OptionList.OptionSelected) -> None:
        if event.option.id is not None:
            self.query_one("#editor", TextArea).text = self.history[int(event.option.id)]

    def _recall(self, step: int) -> None:
        if not self.history:
            return
        self._hist_pos = min(max(self._hist_pos + step, 0), len(self.history) - 1)
        self.query_one("#editor", TextArea).text = self.history[self._hist_pos]

    def action_history_prev(self) -> None:
        self._recall(1)

    def action_history_next(self) -> None:
        self._recall(-1)

    def action_close(self) -> None:
        self.app.pop_screen()


def _one_line(sql: str) -> str:
    text = " ".join(sql.split())
    return text if len(text) <= 60 else text[:57] + "..."


def _cell(v: object) -> str | Text:
    if v is None:
        return Text("∅", style="dim")
    text = str(v)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"
