"""The mapping editor: pair unmatched golden/test ops (with tensor selectors), unpair wrong pairs, save."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from workbench.analysis.explore import Explorer, NodePair, Unmatched
from workbench.app.actions import bindings
from workbench.app.footer import KeysFooter
from workbench.app.screens import EditRequested, Session, WorkbenchScreen
from workbench.compare.mapping import WB_MAPPING_NAME, MappingError, MappingFile, PairSpec, TensorSel


@dataclass
class MappingLists(Message):
    golden: list[Unmatched]
    test: list[Unmatched]
    pairs: list[NodePair]


class MappingScreen(WorkbenchScreen[None]):
    """Two filterable lists of unmatched ops (at any token) and the list of current pairs."""

    SCOPE = "mapping"
    BINDINGS = bindings("mapping")
    DEFAULT_CSS = """
    MappingScreen #columns { height: 1fr; }
    MappingScreen #columns > Vertical { width: 1fr; border: round $secondary 50%; }
    MappingScreen #columns > Vertical:focus-within { border: round $primary; }
    MappingScreen OptionList { height: 1fr; }
    MappingScreen Label { text-style: bold; padding: 0 1; }
    MappingScreen .sel-label { text-style: none; color: $text-muted; }
    MappingScreen #map-status { height: auto; max-height: 4; padding: 0 1; background: $panel; }
    """

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.golden: list[Unmatched] = []
        self.test: list[Unmatched] = []
        self.pairs: list[NodePair] = []
        self.mapping = MappingFile()
        self.target: Path = Path(WB_MAPPING_NAME)
        self.dirty = False

    def compose(self) -> ComposeResult:
        with Horizontal(id="columns"):
            with Vertical():
                yield Label("unmatched golden ops")
                yield Input(placeholder="filter golden", id="golden-filter")
                yield OptionList(id="golden-list")
                yield Label("golden tensors to pair (*, out, out:0, in:1)", classes="sel-label")
                yield Input(value="*", placeholder="*, out, out:0, in:1", id="golden-sel")
            with Vertical():
                yield Label("unmatched test ops")
                yield Input(placeholder="filter test", id="test-filter")
                yield OptionList(id="test-list")
                yield Label("test tensors to pair (*, out, out:0, in:1)", classes="sel-label")
                yield Input(value="*", placeholder="*, out, out:0, in:1", id="test-sel")
            with Vertical():
                yield Label("pairs (x unpairs)")
                yield Input(placeholder="filter pairs", id="pairs-filter")
                yield OptionList(id="pairs-list")
        yield Static("", id="map-status")
        yield KeysFooter()

    def on_mount(self) -> None:
        path, catalog = self.session.mapping, self.session.catalog
        self.target = Path(path) if path is not None else catalog.parent / WB_MAPPING_NAME
        if self.target.is_dir():
            self.target = self.target / WB_MAPPING_NAME
        if self.target.exists():
            try:
                self.mapping = MappingFile.load(self.target)
            except MappingError as exc:
                self.notify(str(exc), severity="error")
        self.query_one("#golden-filter").focus()
        self._status("")
        self.load_lists()

    def set_explorer(self, explorer: Explorer) -> None:
        """Reload after an edit reopened the catalog."""
        super().set_explorer(explorer)
        self.load_lists()

    @work(thread=True, exclusive=True, group="mapping", exit_on_error=False)
    def load_lists(self) -> None:
        ex = self.explorer
        self.post_message(MappingLists(ex.unmatched("golden"), ex.unmatched("test"), ex.node_pairs()))

    def on_mapping_lists(self, msg: MappingLists) -> None:
        self.golden, self.test, self.pairs = msg.golden, msg.test, msg.pairs
        self._fill_all()

    # ------------------------------------------------------------------ lists
    def _fill_all(self) -> None:
        self._fill("golden")
        self._fill("test")
        self._fill("pairs")
        self._status("")

    def _fill(self, which: str) -> None:
        text = self.query_one(f"#{which}-filter", Input).value.strip().lower()
        lst = self.query_one(f"#{which}-list", OptionList)
        highlighted = lst.highlighted
        lst.clear_options()
        options: list[Option] = []
        if which == "pairs":
            for i, p in enumerate(self.pairs):
                label = f"{p.golden}  ⇄  {p.test}  ({p.method})"
                if text in label.lower():
                    options.append(Option(label, id=str(i)))
        else:
            for u in self.golden if which == "golden" else self.test:
                when = f"token {u.first_token}" if u.tokens == 1 else f"{u.tokens} tokens from {u.first_token}"
                label = f"{u.name}  {u.type}  [{u.outs} out, {u.ins} in; {when}]"
                if text in label.lower():
                    options.append(Option(label, id=u.name))
        lst.add_options(options)
        if options:
            lst.highlighted = min(highlighted or 0, len(options) - 1)

    @on(Input.Submitted)
    def _filter_submitted(self, event: Input.Submitted) -> None:
        """Enter in a filter moves to its list."""
        if event.input.id and event.input.id.endswith("-filter"):
            self.query_one(f"#{event.input.id.removesuffix('-filter')}-list").focus()

    @on(Input.Changed)
    def _filter_changed(self, event: Input.Changed) -> None:
        if event.input.id and event.input.id.endswith("-filter"):
            self._fill(event.input.id.removesuffix("-filter"))

    def _highlighted(self, which: str) -> str | None:
        lst = self.query_one(f"#{which}-list", OptionList)
        if lst.highlighted is None or lst.option_count == 0:
            return None
        return lst.get_option_at_index(lst.highlighted).id

    def _status(self, text: str) -> None:
        state = "unsaved changes" if self.dirty else "saved" if self.target.exists() else "not saved yet"
        self.query_one("#map-status", Static).update(
            f"{len(self.golden)} golden and {len(self.test)} test ops unmatched, {len(self.pairs)} pairs · "
            f"mapping file: {self.target} ({state})\n"
            f"{text or 'type to filter, Enter (or Tab) to its list; there p pairs the highlighted ops, x unpairs'}"
        )

    # ------------------------------------------------------------------ actions
    def action_pair_selected(self) -> None:
        g, t = self._highlighted("golden"), self._highlighted("test")
        if g is None or t is None:
            self._status("highlight one golden op and one test op first")
            return
        try:
            gsel = TensorSel.parse(self.query_one("#golden-sel", Input).value)
            tsel = TensorSel.parse(self.query_one("#test-sel", Input).value)
        except ValueError as exc:
            self._status(str(exc))
            return
        spec = PairSpec(g, t, gsel, tsel)
        self.mapping.add_pair(spec)
        self.dirty = True
        note = self._size_note(g, t)
        self._status(f"pairing {g} ⇄ {t} ({gsel} / {tsel}); computing metrics ...{note}")
        self.post_message(EditRequested([spec], []))

    def _size_note(self, golden: str, test: str) -> str:
        """A warning when the first outputs of the two ops differ in size."""
        g = next((u for u in self.golden if u.name == golden), None)
        t = next((u for u in self.test if u.name == test), None)
        if g is None or t is None or g.out_numel is None or t.out_numel is None or g.out_numel == t.out_numel:
            return ""
        return f"  warning: their first outputs differ in size ({g.out_numel:,} vs {t.out_numel:,} elements)"

    def action_unpair_selected(self) -> None:
        idx = self._highlighted("pairs")
        if idx is None:
            self._status("highlight a pair first")
            return
        pair = self.pairs[int(idx)]
        self.mapping.remove_pair(pair.golden, pair.test)
        self.dirty = True
        self._status(f"unpairing {pair.golden} ⇄ {pair.test} ...")
        self.post_message(EditRequested([], [(pair.golden, pair.test)]))

    def action_save_mapping(self) -> None:
        try:
            self.target.parent.mkdir(parents=True, exist_ok=True)
            written = self.mapping.save(self.target)
        except OSError as exc:
            self._status(f"cannot save {self.target}: {exc.strerror or exc}")
            return
        self.dirty = False
        self._status(f"saved {written}; use it with: wb compare -mf {written}")
        self.notify(f"mapping saved to {written}")

    def action_close(self) -> None:
        self.app.pop_screen()
