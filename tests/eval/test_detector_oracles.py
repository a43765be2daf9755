"""Hand-computed oracles for detector arithmetic that the behavioural tests let slip (surviving mutants):
the least-squares slope and EvalStop's notion of a decline."""

from __future__ import annotations

import numpy as np
import pytest

from eval.detectors import Checkpoint, EvalStop, _slope


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_slope_is_the_least_squares_slope(n):
    rng = np.random.default_rng(n)
    y = list(5.0 + rng.normal(size=n))  # a mean far from zero: a wrong centring constant shows
    assert _slope(y) == pytest.approx(np.polyfit(np.arange(n), y, 1)[0], rel=1e-12, abs=1e-12)


def test_slope_of_a_line_by_hand():
    assert _slope([3.0, 5.0, 7.0, 9.0]) == pytest.approx(2.0)
    assert _slope([1.0, 1.0, 1.0]) == 0.0


def _monitor_stop(k: int, scores: list[float]) -> int:
    mon = EvalStop(k).start()
    for t, s in enumerate(scores):
        if mon.observe(Checkpoint(step=float(t), eval_score=s)):
            return t
    return -1


# (scores, k, index of the checkpoint where EvalStop stops, -1 for never): counted by hand, a tie is no decline
CASES = [
    ([1.0, 0.9, 0.9, 0.8], 2, -1),       # decline, tie (resets), decline
    ([1.0, 0.9, 0.8], 2, 2),             # two declines in a row
    ([1.0, 1.0, 1.0, 1.0], 1, -1),       # a plateau never declines
    ([1.0, 0.9, float("nan"), 0.8], 2, 3),  # a missed eval leaves the count as it was
    ([0.5, 0.6, 0.4, 0.4, 0.3, 0.2], 2, 5),
]


@pytest.mark.parametrize(("scores", "k", "expected"), CASES)
def test_evalstop_counts_strict_declines(scores, k, expected):
    assert _monitor_stop(k, scores) == expected
    scanned = EvalStop(k).scan({"eval_score": np.array([scores])})
    assert int(scanned[0]) == expected
