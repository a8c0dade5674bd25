"""Every action of the app, as data: key, description and where it applies.

The footer bindings, the help screen and the command palette are all generated from this
one table, so an action cannot exist without a key and a description.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


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


ACTIONS: tuple[ActionSpec, ...] = (
    ActionSpec("quit", "q", "q", "Quit", "app"),
    ActionSpec("help", "f1,question_mark", "F1 ?", "Help: every key", "app"),
    ActionSpec("command_palette", "ctrl+p", "^p", "Command palette", "app", show=False, palette=False),
    ActionSpec("cycle_theme", "f2", "F2", "Next theme", "app", show=False),
    ActionSpec("open_mapping", "e", "e", "Mapping editor", "main"),
    ActionSpec("open_sql", "s", "s", "SQL console", "main"),
    ActionSpec("next_token", "right_square_bracket", "]", "Next token", "main"),
    ActionSpec("prev_token", "left_square_bracket", "[", "Previous token", "main"),
    ActionSpec("next_failing", "n", "n", "Next failing node", "main"),
    ActionSpec("prev_failing", "N", "N", "Previous failing node", "main", show=False),
    ActionSpec("goto_born", "b", "b", "Go to where the error is born", "main"),
    ActionSpec("toggle_color", "a", "a", "Colour by worst metric / added error", "main"),
    ActionSpec("next_metric", "m", "m", "Next heatmap metric", "main"),
    ActionSpec("drill_up", "u,backspace", "u", "Back to the layer heatmap", "main"),
    ActionSpec("precheck", "p", "p", "Precheck: re-run the selected test op alone in float64", "main", show=False),
    ActionSpec("redump", "d", "d", "Re-dump the selected op and token with full tensors", "main", show=False),
    ActionSpec("focus_next_pane", "tab", "tab", "Next pane", "main", show=False, palette=False),
    ActionSpec(
        "select_cell",
        "enter",
        "enter",
        "Select this op and token everywhere (drill into a layer)",
        "heatmap",
        palette=False,
    ),
    ActionSpec("pair_selected", "p", "p", "Pair the highlighted golden and test ops", "mapping"),
    ActionSpec("unpair_selected", "x", "x", "Unpair the highlighted pair", "mapping"),
    ActionSpec("save_mapping", "ctrl+s", "^s", "Save the mapping file", "mapping"),
    ActionSpec("close", "escape", "esc", "Back", "mapping"),
    ActionSpec("run_sql", "ctrl+r,ctrl+j", "^r", "Run the SQL", "sql"),
    ActionSpec("history_prev", "ctrl+up", "^↑", "Previous query in history", "sql"),
    ActionSpec("history_next", "ctrl+down", "^↓", "Next query in history", "sql"),
    ActionSpec("close", "escape", "esc", "Back", "sql"),
    ActionSpec("close", "escape,q", "esc", "Close", "help"),
)


def bindings(scope: str) -> list[Binding]:
    """Textual bindings of one scope, generated from ACTIONS."""
    return [
        Binding(
            a.key,
            a.action,
            a.description if len(a.description) < 28 else _short(a),
            show=a.show,
            key_display=a.label,
            id=f"{scope}.{a.action}",
        )
        for a in ACTIONS
        if a.scope == scope
    ]


def _short(a: ActionSpec) -> str:
    return a.description.split(":")[0].split("(")[0].split("/")[0].strip()[:27]


def for_scope(scope: str) -> list[ActionSpec]:
    return [a for a in ACTIONS if a.scope == scope]
