"""The mapping editor: pair unmatched golden/test ops (with tensor selectors) one by one or in every layer at
once (a layer rule, `l`), unpair wrong pairs, save.

Pairs of the loaded file that no longer fit these dumps (its fingerprint, `compare.pairing.fingerprint`) are listed
as stale with the reason: `x` drops one, `p` on it keeps it as the dumps are now, and pairing its golden or
test op anew replaces it. Saving writes the fingerprint of the current dumps.
"""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from workbench.analysis.explorer.explore import Explorer, NodePair, Unmatched
from workbench.app.actions import bindings
from workbench.app.footer import KeysFooter
from workbench.app.messages import EditRequested, MappingLists
from workbench.app.screens import Session, WorkbenchScreen
from workbench.app.themes import DOMAIN_DEFAULTS
from workbench.compare.pairing.fingerprint import StaleEntry
from workbench.compare.pairing.mapping import (
    WB_MAPPING_NAME,
    MappingError,
    MappingFile,
    PairSpec,
    RuleSpec,
    TensorSel,
    expand_rule,
    rule_across_layers,
    save_path,
)


class MappingScreen(WorkbenchScreen[None]):
    """Two filterable lists of unmatched ops (at any token) and the list of current pairs."""

    SCOPE = "mapping"
    BINDINGS = bindings("mapping")

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self.golden: list[Unmatched] = []
        self.test: list[Unmatched] = []
        self.pairs: list[NodePair] = []
        self.stale: list[StaleEntry] = []  # pairs of the file that no longer fit these dumps
        self.kept: set[tuple[str, str]] = set()  # stale pairs the user kept as they are now (re-printed on save)
        self.fingerprinted = True
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

    def load_lists(self) -> None:
        """Reload the three lists and check the file's pairs against the dumps (in a worker)."""
        snapshot = MappingFile(list(self.mapping.pairs))
        snapshot.pair_prints = dict(self.mapping.pair_prints)
        snapshot.fingerprint = self.mapping.fingerprint
        self._load_lists(snapshot)

    @work(thread=True, exclusive=True, group="mapping", exit_on_error=False)
    def _load_lists(self, mapping: MappingFile) -> None:
        ex = self.explorer
        check = ex.check_mapping(mapping)
        fingerprinted = check.fingerprinted or not mapping.pairs
        self.post_message(
            MappingLists(ex.unmatched("golden"), ex.unmatched("test"), ex.node_pairs(), check.stale, fingerprinted)
        )

    def on_mapping_lists(self, msg: MappingLists) -> None:
        self.golden, self.test, self.pairs = msg.golden, msg.test, msg.pairs
        # a pair dropped or kept while the check ran stays as the user left it
        keys = {(p.golden, p.test) for p in self.mapping.pairs}
        self.stale = [s for s in msg.stale if (s.golden, s.test) in keys and (s.golden, s.test) not in self.kept]
        self.fingerprinted = msg.fingerprinted
        self._fill_all()
        if self.stale:
            self.notify(
                f"{len(self.stale)} pairs of {self.target.name} no longer fit these dumps (marked stale; not used)",
                severity="warning",
            )

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
            stale_style = Style(color=self._var("fail"), bold=True)
            for i, s in enumerate(self.stale):
                plain = f"STALE {s.golden}  ⇄  {s.test}  ({s.reason})"
                if text in plain.lower():
                    marked = Text.assemble(
                        ("STALE ", stale_style), f"{s.golden}  ⇄  {s.test}  ", (f"({s.reason})", Style(dim=True))
                    )
                    options.append(Option(marked, id=f"s{i}"))
            rule_style = Style(color=self._var("accent"), bold=True)
            for i, r in enumerate(self.mapping.rules):
                plain = f"RULE {r.golden}  ⇄  {r.test}"
                if text in plain.lower():
                    options.append(Option(Text.assemble(("RULE ", rule_style), f"{r.golden}  ⇄  {r.test}"), id=f"r{i}"))
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

    def _var(self, name: str) -> str:
        return {**DOMAIN_DEFAULTS, **self.app.get_css_variables()}[name]

    def _highlighted(self, which: str) -> str | None:
        lst = self.query_one(f"#{which}-list", OptionList)
        if lst.highlighted is None or lst.option_count == 0:
            return None
        return lst.get_option_at_index(lst.highlighted).id

    def _status(self, text: str) -> None:
        state = "unsaved changes" if self.dirty else "saved" if self.target.exists() else "not saved yet"
        stale = (
            f", {len(self.stale)} STALE (not used: x drops one, p on it keeps it as it is now)" if self.stale else ""
        )
        unchecked = "" if self.fingerprinted else "; no fingerprint: pairs not checked (saving adds one)"
        self.query_one("#map-status", Static).update(
            f"{len(self.golden)} golden and {len(self.test)} test ops unmatched, {len(self.pairs)} pairs"
            f"{_count(len(self.mapping.rules), 'layer rule')}{stale} · "
            f"mapping file: {self.target} ({state}){unchecked}\n"
            f"{text or 'type to filter, Enter (or Tab) to its list; p pairs the highlighted ops, l in every layer'}"
        )

    # ------------------------------------------------------------------ actions
    def action_pair_selected(self) -> None:
        plist = self.query_one("#pairs-list", OptionList)
        chosen = self._highlighted("pairs")
        if plist.has_focus and chosen is not None and chosen.startswith("s"):
            self._keep_stale(self.stale[int(chosen[1:])])
            return
        chosen_pair = self._chosen_pair()
        if chosen_pair is None:
            return
        g, t, gsel, tsel = chosen_pair
        spec = PairSpec(g, t, gsel, tsel)
        replaced = [s for s in self.stale if s.golden == g or s.test == t]
        for s in replaced:  # re-pairing an op of a stale pair replaces that pair
            self.mapping.drop_pair(s.golden, s.test)
        self.stale = [s for s in self.stale if s not in replaced]
        self.mapping.add_pair(spec)
        self.dirty = True
        note = self._size_note(g, t)
        if replaced:
            note += f"  (replaces {len(replaced)} stale pair{'s' if len(replaced) > 1 else ''})"
        self._status(f"pairing {g} ⇄ {t} ({gsel} / {tsel}); computing metrics ...{note}")
        self.post_message(EditRequested([spec], []))

    def _chosen_pair(self) -> tuple[str, str, TensorSel, TensorSel] | None:
        """The highlighted golden and test ops with the tensors chosen for each; None (said in the status) when
        an op is not highlighted or a tensor choice does not parse."""
        g, t = self._highlighted("golden"), self._highlighted("test")
        if g is None or t is None:
            self._status("highlight one golden op and one test op first")
            return None
        try:
            gsel = TensorSel.parse(self.query_one("#golden-sel", Input).value)
            tsel = TensorSel.parse(self.query_one("#test-sel", Input).value)
        except ValueError as exc:
            self._status(str(exc))
            return None
        return g, t, gsel, tsel

    def action_pair_rule(self) -> None:
        """Pair the highlighted ops' kinds in every layer through one layer rule (`layers.*.act_fn` ⇄ `layers.*.act`):
        each layer's unmatched golden op of the first kind with its one unmatched test op of the second."""
        chosen_pair = self._chosen_pair()
        if chosen_pair is None:
            return
        g, t, gsel, tsel = chosen_pair
        g_nodes, t_nodes = [(u.name, u.layer) for u in self.golden], [(u.name, u.layer) for u in self.test]
        rule = rule_across_layers(g, t, g_nodes, t_nodes, gsel, tsel)
        if rule is None:
            self._status(f"no number in {g} or {t} reaches the same op in another layer: pair them alone with p")
            return
        found = expand_rule(rule, g_nodes, t_nodes)  # the two highlighted ops need not share a layer: they name kinds
        if not found:
            self._status(f"{rule.golden} ⇄ {rule.test} pairs nothing: no layer has one unmatched op of each")
            return
        self.mapping.add_rule(rule)
        self.dirty = True
        self._status(f"rule {rule.golden} ⇄ {rule.test} pairs {len(found)} layers' ops; computing metrics ...")
        self.post_message(EditRequested([PairSpec(a, b, gsel, tsel) for a, b in found], []))

    def _size_note(self, golden: str, test: str) -> str:
        """A warning when the first outputs of the two ops differ in size."""
        g = next((u for u in self.golden if u.name == golden), None)
        t = next((u for u in self.test if u.name == test), None)
        if g is None or t is None or g.out_numel is None or t.out_numel is None or g.out_numel == t.out_numel:
            return ""
        return f"  warning: their first outputs differ in size ({g.out_numel:,} vs {t.out_numel:,} elements)"

    def _keep_stale(self, stale: StaleEntry) -> None:
        """Keep a stale pair as the dumps are now: compared from now on, fingerprinted anew when saved."""
        if "not in the golden dump" in stale.reason or "not in the test dump" in stale.reason:
            self._status(
                f"{stale.reason.split('; ')[0]}: drop it (x), or pair its other op with one from the lists (p)"
            )
            return
        self.stale = [s for s in self.stale if s != stale]
        self.kept.add((stale.golden, stale.test))
        self.dirty = True
        spec = next(
            (p for p in self.mapping.pairs if (p.golden, p.test) == (stale.golden, stale.test)),
            PairSpec(stale.golden, stale.test),
        )
        self._fill("pairs")
        self._status(f"keeping {stale.golden} ⇄ {stale.test} as it is now; computing metrics ...")
        self.post_message(EditRequested([spec], []))

    def action_unpair_selected(self) -> None:
        idx = self._highlighted("pairs")
        if idx is None:
            self._status("highlight a pair first")
            return
        if idx.startswith("r"):
            self._drop_rule(self.mapping.rules[int(idx[1:])])
            return
        if idx.startswith("s"):
            stale = self.stale.pop(int(idx[1:]))
            self.mapping.drop_pair(stale.golden, stale.test)
            self.dirty = True
            self._fill("pairs")
            self._status(f"dropped the stale pair {stale.golden} ⇄ {stale.test} (save to write the file)")
            return
        pair = self.pairs[int(idx)]
        self.mapping.remove_pair(pair.golden, pair.test)
        self.dirty = True
        self._status(f"unpairing {pair.golden} ⇄ {pair.test} ...")
        self.post_message(EditRequested([], [(pair.golden, pair.test)]))

    def _drop_rule(self, rule: RuleSpec) -> None:
        """Forget a layer rule and unpair the pairs it made (they were unmatched before it: nothing is rejected)."""
        self.mapping.drop_rule(rule)
        gre, tre = rule.golden_regex(), rule.test_regex()
        made = [(p.golden, p.test) for p in self.pairs if gre.match(p.golden) and tre.match(p.test)]
        self.dirty = True
        self._fill("pairs")
        self._status(f"dropped the rule {rule.golden} ⇄ {rule.test}; unpairing {len(made)} pairs ...")
        if made:
            self.post_message(EditRequested([], made))

    def action_save_mapping(self) -> None:
        """Save, with the fingerprint of the current dumps (stale pairs left in keep their old one)."""
        import duckdb

        try:
            self.explorer.stamp_mapping(self.mapping, {(s.golden, s.test) for s in self.stale})
        except duckdb.Error:
            self._status("the catalog is being updated: save again in a moment")
            return
        dest = save_path(self.target)
        moved = "" if dest == self.target else f"{self.target} is not a wb mapping file and stays as it is; "
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            written = self.mapping.save(dest)
        except OSError as exc:
            self._status(f"cannot save {dest}: {exc.strerror or exc}")
            return
        self.target = written  # the next save goes to the same file
        self.dirty = False
        self.fingerprinted = True
        kept = f"; {len(self.stale)} stale pairs kept as stale" if self.stale else ""
        self._status(f"{moved}saved {written} with the dumps' fingerprint{kept}; use it with: wb compare -mf {written}")
        self.notify(f"mapping saved to {written}")

    def action_close(self) -> None:
        self.app.pop_screen()


def _count(n: int, noun: str) -> str:
    """`, 1 layer rule` / `, 3 layer rules`; nothing for none."""
    return f", {n} {noun}{'s' if n != 1 else ''}" if n else ""
