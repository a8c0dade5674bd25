"""What opening a catalog costs the app process (issue 26 item 10): the first paint loads only what it draws.

Run in a fresh interpreter (the test process has pandas and torch already), the real app headless on a real
catalog where an error is born, up to its first paint: no pandas (the catalog writer's), no torch, no advisor (asked
only when no op fails).
"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import run_python

FIRST_PAINT = """
import sys
from pathlib import Path
from workbench.app.launch import make_app
from workbench.app.main_screen import MainScreen

app = make_app(catalog=Path({catalog!r}))
loaded = []

async def auto(pilot):
    while not (isinstance(app.screen, MainScreen) and app.screen.first_paint_at is not None):
        await pilot.pause(0.01)
    # a copy: the app's workers import modules in their threads meanwhile
    loaded.extend(sorted(m for m in list(sys.modules) if m.split('.')[0] in ('pandas', 'torch')))
    loaded.extend(m for m in ('workbench.analysis.verdicts.advisor',) if m in sys.modules)
    app.exit(0)

app.run(headless=True, auto_pilot=auto, size=(120, 30))
print('LOADED', loaded[:8])
sys.exit(1 if loaded else 0)
"""


def test_first_paint_loads_no_pandas_torch_or_advisor(small_catalog: Path) -> None:
    out = run_python(FIRST_PAINT.format(catalog=str(small_catalog)), timeout=300)
    assert "LOADED" in out.stdout, out.stdout + out.stderr  # the app reached its first paint
    assert out.returncode == 0, "the first paint loaded " + out.stdout + out.stderr
