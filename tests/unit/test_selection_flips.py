"""A selection's flip, read from the golden input and both runs' indices (`analysis.verdicts.selection._flips`):
which picks differ, the golden values at both, and picks outside the input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workbench.analysis.verdicts.selection import _flips, _tie_line

SCORES = np.array([[0.1, 0.5, 0.3, 0.5000001], [0.9, 0.2, 0.1, 0.05]])


def test_topk_picks_that_differ_at_a_near_tie() -> None:
    golden = np.array([[3, 1], [0, 1]])
    test = np.array([[1, 3], [0, 1]])  # the tied pair swapped in the first row
    n, picks, g_pick, t_pick, g_value, t_value, gap, outside = _flips(SCORES, golden, test)  # type: ignore[misc]
    assert (n, picks, outside) == (2, 4, 0)
    assert {g_pick, t_pick} == {1, 3} and g_value != t_value and abs(gap - 1e-7) < 1e-9


def test_a_far_pick_is_the_widest_gap() -> None:
    golden = np.array([[3, 1], [0, 1]])
    test = np.array([[3, 1], [0, 3]])  # row 2 took 0.05 in place of 0.2
    n, _picks, g_pick, t_pick, g_value, t_value, gap, _outside = _flips(SCORES, golden, test)  # type: ignore[misc]
    assert (n, g_pick, t_pick, g_value, t_value) == (1, 1, 3, 0.2, 0.05) and abs(gap - 0.15) < 1e-12


def test_argmax_along_the_last_dimension_and_over_everything() -> None:
    assert _flips(SCORES, np.array([3, 0]), np.array([1, 0]))[:4] == (1, 2, 3, 1)  # type: ignore[index]
    whole = _flips(SCORES, np.array(4), np.array(3))  # flattened: 0.9 against 0.5000001
    assert whole is not None and whole[:4] == (1, 1, 4, 3) and abs(whole[6] - 0.4) < 1e-6


def test_nothing_flipped_a_shape_that_is_no_selection_and_picks_outside() -> None:
    same = np.array([[3, 1], [0, 1]])
    assert _flips(SCORES, same, same.copy()) is None
    assert _flips(SCORES, np.array([[1, 2, 3]]), np.array([[1, 2, 0]])) is None  # not along the last dimension
    outside = _flips(SCORES, same, np.array([[3, 4], [0, -1]]))
    assert outside is not None and outside[7] == 2


def test_the_line_from_a_saved_input(tmp_path: Path) -> None:
    """`_tie_line` reads the golden input from its file (`torch.save`, as the dumpers write it): a gap within twice
    the input's error is a near tie, a wider one a wrong pick, a position past the input's end a wrong pick too."""
    path = tmp_path / "scores.pt"
    torch.save(torch.tensor(SCORES, dtype=torch.float32), path)
    golden = np.array([[3, 1], [0, 1]])
    tie = _tie_line("topk.1", str(path), 1e-4, golden, np.array([[1, 3], [0, 1]]))
    assert tie is not None and tie.startswith("topk.1: a near tie flipped: at 2 of 4 picks the test run chose"), tie
    wrong = _tie_line("topk.1", str(path), 1e-4, golden, np.array([[3, 1], [0, 3]]))
    assert wrong is not None and wrong.startswith(
        "topk.1 selects wrongly: at 1 of 4 picks the test run chose "
        "position 3 where the golden chose 1 (golden values 0.2 and 0.05"
    ), wrong
    outside = _tie_line("topk.1", str(path), 1e-4, golden, np.array([[3, 4], [0, 1]]))
    assert outside == "topk.1 picked positions outside its input at 1 of 4 picks: the op selects wrongly", outside
    assert _tie_line("topk.1", str(tmp_path / "gone.pt"), 1e-4, golden, golden) is None  # unreadable: no line
