"""Entry point for `wb open` / `wb demo`: build the app (one factory for the CLI and the tests) and run it."""

from __future__ import annotations

from workbench.app.app import WorkbenchApp

# The app, not yet running: with golden and test it compares first (progress screen), else opens `catalog`.
make_app = WorkbenchApp


def launch(app: WorkbenchApp) -> int:
    """Run the app in the terminal; returns the exit code (2 when it could only show an error)."""
    result = app.run()
    if isinstance(result, int):
        return result
    return app.error_code or (app.return_code or 0)
