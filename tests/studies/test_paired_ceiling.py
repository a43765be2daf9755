"""studies/paired_ceiling.py against hand-computed statistics and a brute-force threshold search: the paired z of
three checkpoints worked out on paper, the hindsight threshold of a hand-made case, and, on random paths, the best
threshold found by trying every t of a fine grid with a plain loop."""

import math

import numpy as np
import pytest

from studies.paired_ceiling import decline_z, hindsight_threshold


def test_decline_z_matches_the_paired_t_worked_by_hand():
    y = np.array([[0, 0, 0, 0], [1, 1, 2, 2], [0, 1, 0, 1]], dtype=float)
    z = decline_z(y, 4, 0.0)
    # k=1: y0 - y1 = (-1, -1, -2, -2): mean -1.5, sd sqrt(1/3), t = -1.5 / (sqrt(1/3) / 2) = -3 sqrt(3)
    # k=2: against s=1, y1 - y2 = (1, 0, 2, 1): mean 1, sd sqrt(2/3), t = sqrt(6); against s=0, -sqrt(3)
    assert z[0] == -math.inf
    assert z[1] == pytest.approx(-3 * math.sqrt(3))
    assert z[2] == pytest.approx(math.sqrt(6))
    # rho 0.5 at k=2, s=1: 0.5 y1 + 0.5 y0 - y2 = (0.5, -0.5, 1, 0): mean 0.25, var 1.25/3, t = sqrt(0.6)
    assert decline_z(y, 4, 0.5)[2] == pytest.approx(math.sqrt(0.6))
    # only the first `prompts` prompts count: on prompts 0-1, y1 - y2 = (1, 0) -> t = 0.5 / (sqrt(0.5) / sqrt(2)) = 1
    assert decline_z(y, 2, 0.0)[2] == pytest.approx(1.0)


def test_identical_checkpoints_have_no_decline():
    y = np.tile(np.arange(8.0), (5, 1))
    assert np.all(decline_z(y, 8, 0.125) == -math.inf)


def test_hindsight_threshold_of_a_hand_made_case():
    healthy = [np.array([-np.inf, 1.0]), np.array([-np.inf, 2.0]), np.array([-np.inf, 3.0])]
    # peak at 2: useful when the first crossing is at 2 or 3 (4 is the last checkpoint); z > t first at 1 for t < 0.5
    hacking = [(np.array([-np.inf, 0.5, 2.5, 4.0, 1.0]), 2)]
    assert hindsight_threshold(healthy, hacking, 0.0) == (1, 3.0, 0)  # t >= 3 keeps every healthy run; 3 < 4 stops
    assert hindsight_threshold(healthy, [(np.array([-np.inf, 0.5, 2.5, 2.9, 1.0]), 2)], 0.0) == (0, math.inf, 0)
    # one false stop allowed (t >= 2): t in [2, 2.9) stops the hacking run at 2 or 3; the largest such value is 2.5
    assert hindsight_threshold(healthy, [(np.array([-np.inf, 0.5, 2.5, 2.9, 1.0]), 2)], 1 / 3) == (1, 2.5, 1)


def _brute(healthy, hacking, cap, grid):
    best = None
    for t in grid:
        false = sum(1 for z in healthy if any(v > t for v in z))
        if false > cap * len(healthy):
            continue
        useful = 0
        for z, peak in hacking:
            first = next((k for k, v in enumerate(z) if v > t), None)
            useful += first is not None and peak <= first <= len(z) - 2
        if best is None or useful > best[0]:
            best = (useful, false)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_hindsight_threshold_finds_what_a_grid_search_finds(seed):
    rng = np.random.default_rng(seed)
    n = 12
    healthy = [np.concatenate([[-np.inf], np.round(rng.normal(0, 1.5, n - 1), 2)]) for _ in range(40)]
    hacking = []
    for _ in range(20):
        z = np.concatenate([[-np.inf], np.round(rng.normal(0, 1.5, n - 1) + np.linspace(0, 4, n - 1), 2)])
        hacking.append((z, int(rng.integers(2, n))))
    for cap in (0.0, 0.025, 0.1):
        useful, t, false = hindsight_threshold(healthy, hacking, cap)
        grid = np.arange(-6.0, 12.0, 0.005)  # scores are on a 0.01 lattice: every distinct t is on this grid
        b_useful, _ = _brute(healthy, hacking, cap, grid)
        assert useful == b_useful
        assert false == sum(1 for z in healthy if z.max() > t) and false <= cap * len(healthy)
        assert useful == sum(1 for z, p in hacking if (c := np.flatnonzero(z > t)).size and p <= c[0] <= n - 2)
