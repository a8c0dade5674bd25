"""Themes from `themes/*.toml`: Textual colours plus the workbench's domain colours as theme variables."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from textual.theme import Theme

from workbench.core.capped import THEME, FileRefused, read_text
from workbench.core.files import package_data

THEMES_DIR = package_data("themes")
DEFAULT_THEME = "wb-dark"
# Domain colours every theme provides (and the defaults for Textual's built-in themes).
DOMAIN_DEFAULTS: dict[str, str] = {
    "ok": "#3fb950",
    "warn": "#d29922",
    "fail": "#f85149",
    "nan": "#ff7bf2",
    "unmatched": "#6e7681",
    "born": "#ffa657",
    "heat-0": "#0f3d2a",
    "heat-1": "#1b6b3f",
    "heat-2": "#5a8f2e",
    "heat-3": "#a89a2a",
    "heat-4": "#c7612a",
    "heat-5": "#d63a35",
    "heat-6": "#ff5c8a",
    "heat-none": "#161b22",
}
_THEME_FIELDS = (
    "primary",
    "secondary",
    "warning",
    "error",
    "success",
    "accent",
    "foreground",
    "background",
    "surface",
    "panel",
    "boost",
)


class ThemeError(ValueError):
    """A theme file that cannot be used; the message names the file."""


def theme_from_toml(path: Path) -> Theme:
    """Read one theme file; raises ThemeError with the file name and the reason."""
    try:
        data: dict[str, Any] = tomllib.loads(read_text(path, THEME))
    except FileRefused as exc:
        raise ThemeError(str(exc)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ThemeError(f"{path}: cannot read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ThemeError(f"{path}: not valid TOML ({exc})") from None
    name = data.get("name") or path.stem
    if not isinstance(data.get("primary"), str):
        raise ThemeError(f"{path}: 'primary' colour is required")
    variables = data.get("variables", {})
    if not isinstance(variables, dict):
        raise ThemeError(f"{path}: [variables] must be a table")
    merged = {**DOMAIN_DEFAULTS, **{str(k): str(v) for k, v in variables.items()}}
    kwargs: dict[str, Any] = {k: str(data[k]) for k in _THEME_FIELDS if k in data}
    return Theme(name=str(name), dark=bool(data.get("dark", True)), variables=merged, **kwargs)


def load_themes(folder: Path = THEMES_DIR) -> tuple[list[Theme], list[str]]:
    """Every theme in `folder` and one problem line per file that could not be read."""
    themes: list[Theme] = []
    problems: list[str] = []
    if folder.is_dir():
        for f in sorted(folder.glob("*.toml")):
            try:
                themes.append(theme_from_toml(f))
            except ThemeError as exc:
                problems.append(str(exc))
    return themes, problems
