"""The app tests' `snap_compare`: pytest-textual-snapshot's, comparing each screen with its stored SVG with the
figures of its text masked (`figures_masked`). The figures move with the CPU's own rounding (the demo's dumps come out
of torch's bfloat16 kernels differently on another CPU, and a float32 sum's last digit with the vector width of the
metric kernels); the layout, styles, colours and words of a screen do not, and are what a snapshot holds to. The
figures are checked by the tests that compute them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
from pytest_textual_snapshot import SVGImageExtension
from syrupy.assertion import SnapshotAssertion

_FIGURE = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?")
_TEXT = re.compile(r"(<text[^>]*>)([^<]*)(</text>)")


def figures_masked(svg: str) -> str:
    """`svg` with each figure in its text as `#` and each run of spaces as one (a figure's digits and its padding share
    a cell): the text's places, styles and words are kept, and every shape and colour."""

    def masked(m: re.Match[str]) -> str:
        body = re.sub(" +", " ", _FIGURE.sub("#", m.group(2).replace("&#160;", " ")))
        return m.group(1) + body + m.group(3)

    return _TEXT.sub(masked, svg)


class _FiguresMasked(SVGImageExtension):
    def matches(self, *, serialized_data: Any, snapshot_data: Any) -> bool:
        return figures_masked(str(serialized_data)) == figures_masked(str(snapshot_data))


@pytest.fixture
def snap_compare(snapshot: SnapshotAssertion) -> Callable[..., bool]:
    """pytest-textual-snapshot's `snap_compare`, comparing with `figures_masked`."""
    masked = snapshot.use_extension(_FiguresMasked)

    def compare(
        app: Any,
        press: Iterable[str] = (),
        terminal_size: tuple[int, int] = (80, 24),
        run_before: Callable[[Any], Awaitable[None] | None] | None = None,
    ) -> bool:
        from textual._doc import take_svg_screenshot

        shot = take_svg_screenshot(app=app, press=press, terminal_size=terminal_size, run_before=run_before)
        return bool(masked == shot)

    return compare
