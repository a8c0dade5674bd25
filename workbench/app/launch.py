"""Entry point for `wb open` / `wb demo`: build the app (one factory for the CLI and the tests) and run it."""

from __future__ import annotations

from pathlib import Path

from workbench.app.app import WorkbenchApp


def make_app(
    *,
    catalog: Path,
    golden: Path | None = None,
    test: Path | None = None,
    mapping: Path | None = None,
    theme: str | None = None,
    cmp_id: int | None = None,
) -> WorkbenchApp:
    """The app, not yet running: with golden and test it compares first (progress screen), else opens `catalog`."""
    return WorkbenchApp(
        catalog=Path(catalog),
        golden=None if golden is None else Path(golden),
        test=None if test is None else Path(test),
        mapping=None if mapping is None else Path(mapping),
        theme=theme,
        cmp_id=cmp_id,
    )


def launch(
    *,
    catalog: Path,
    golden: Path | None = None,
    test: Path | None = None,
    mapping: Path | None = None,
    theme: str | None = None,
    cmp_id: int | None = None,
) -> int:
    """Run the app in the terminal; returns the exit code (2 when it could only show an error)."""
    app = make_app(catalog=catalog, golden=golden, test=test, mapping=mapping, theme=theme, cmp_id=cmp_id)
    result = app.run()
    if isinstance(result, int):
        return result
    return app.error_code or (app.return_code or 0)
