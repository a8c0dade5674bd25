"""Every action of the app, as data: key, description and where it applies.

The footer bindings, the help screen and the command palette are all generated from this
one table, so an action cannot exist without a key and a description.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True, slots=True)
class ActionSpec:
    """One action: `scope` is the screen (or widget) whose bindings carry it."""

    action: str  # Textual action string, e.g. "next_token"
    key: str  # Textual key list, e.g. "right_square_bracket"
    label: str  # key as shown to people
    description: str
    scope: str  # app | main | heatmap | tree | mapping | sql
    show: bool = True  # shown in the footer (the help screen shows all)
    palette: bool = True  # offered by the command palette
    footer: str = ""  # the footer's label when the description is too long for it (whole words)
    priority: bool = False  # before the focused widget's own binding of the key (and so shown in the footer)

    @property
    def footer_label(self) -> str:
        """What the footer shows: the description, or its short form (never a word cut in two)."""
        return self.footer or self.description


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("quit", "q", "q", "Quit", "app"),
    ActionSpec("help", "f1,question_mark", "F1 ?", "Help: every key", "app", footer="Help"),
    ActionSpec(
        "command_palette", "ctrl+p", "^p", "Command palette", "app", show=False, palette=False, footer="Palette"
    ),
    ActionSpec("cycle_theme", "f2", "F2", "Next theme", "app", footer="Theme"),
    ActionSpec("open_mapping", "e", "e", "Mapping editor", "main", footer="Map"),
    ActionSpec("open_sql", "s", "s", "SQL console", "main", footer="SQL"),
    ActionSpec("next_token", "right_square_bracket", "]", "Next token", "main", footer="Next tok"),
    ActionSpec("prev_token", "left_square_bracket", "[", "Previous token", "main", footer="Prev tok"),
    ActionSpec("next_failing", "n", "n", "Next failing node", "main", footer="Next fail"),
    ActionSpec("prev_failing", "N", "N", "Previous failing node", "main", footer="Prev fail"),
    ActionSpec("goto_born", "b", "b", "Go to where the error is born", "main", footer="Born"),
    ActionSpec(
        "toggle_color",
        "a",
        "a",
        "Colour the trees by the heatmap's colouring / added error / beyond int8 noise (quantized)",
        "main",
        footer="Added err",
    ),
    ActionSpec("next_metric", "m", "m", "Next heatmap colouring (verdict, then each metric)", "main", footer="Colour"),
    ActionSpec("open_advice", "v", "v", "Suspects ranked by the advisor", "main", footer="Advisor"),
    ActionSpec("pick_comparison", "c", "c", "Choose the comparison shown", "main", footer="Runs"),
    ActionSpec("next_rank", "r", "r", "Next rank of a multi-rank comparison", "main", footer="Rank"),
    ActionSpec("prev_rank", "R", "R", "Previous rank of a multi-rank comparison", "main", show=False),
    ActionSpec("drill_up", "u,backspace", "u", "Back to the layer heatmap", "main", footer="Layers"),
    ActionSpec(
        "precheck", "p", "p", "Precheck: re-run the selected test op alone in float64", "main", footer="Precheck"
    ),
    ActionSpec("redump", "d", "d", "Re-dump the selected op and token with full tensors", "main", footer="Re-dump"),
    ActionSpec("focus_next_pane", "tab", "tab", "Next pane", "main", palette=False, footer="Pane"),
    ActionSpec(
        "select_cell",
        "enter",
        "enter",
        "Select this op and token everywhere (drill into a layer)",
        "heatmap",
        palette=False,
        footer="Select",
    ),
    ActionSpec("pair_selected", "p", "p", "Pair the highlighted golden and test ops", "mapping", footer="Pair"),
    ActionSpec(
        "pair_rule", "l", "l", "Pair the highlighted ops in every layer (a layer rule)", "mapping", footer="All layers"
    ),
    ActionSpec("unpair_selected", "x", "x", "Unpair the highlighted pair (or rule)", "mapping", footer="Unpair"),
    ActionSpec("save_mapping", "ctrl+s", "^s", "Save the mapping file", "mapping", footer="Save"),
    ActionSpec("close", "escape", "esc", "Back", "mapping"),
    ActionSpec("run_sql", "ctrl+r,ctrl+j", "^r", "Run the SQL", "sql"),
    ActionSpec("history_prev", "ctrl+up", "^↑", "Previous query in history", "sql", footer="Prev query"),
    ActionSpec("history_next", "ctrl+down", "^↓", "Next query in history", "sql", footer="Next query"),
    ActionSpec("close", "escape", "esc", "Back", "sql"),
    ActionSpec("close", "escape,q", "esc", "Close", "help"),
    ActionSpec(
        "choose", "enter", "enter", "Go to the highlighted entry", "picker", palette=False, footer="Go", priority=True
    ),
    ActionSpec("close", "escape", "esc", "Back", "picker"),
)


def bindings(scope: str) -> list[BindingType]:
    """Textual bindings of one scope, generated from ACTIONS."""
    return [
        Binding(
            a.key,
            a.action,
            a.footer_label,
            show=a.show,
            key_display=a.label,
            priority=a.priority,
            id=f"{scope}.{a.action}",
        )
        for a in ACTIONS
        if a.scope == scope
    ]


def for_scope(scope: str) -> list[ActionSpec]:
    return [a for a in ACTIONS if a.scope == scope]
