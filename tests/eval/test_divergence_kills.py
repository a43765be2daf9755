"""Hand-computed checks of `eval.stop_rules.Divergence` (issue 31: they kill the mutants that survived mutmut's fast
selection; tests/mutation_equivalents_divergence.toml names which test kills which mutant).

Every expected value is worked out by hand from the docstrings: a least-squares slope over w equally spaced points
(integer evals here, so slopes are exact), its SE sigma / sqrt(sum (i - mean)^2) (5 for w = 4, 2 for w = 3), the
j-th test's bar raised by sqrt(1 + 2 ln j), and the run's own noise MAD(second differences) * 1.4826 / sqrt 6 (the
mean absolute deviation * sqrt(pi / 2) when the MAD is 0)."""

from __future__ import annotations

import math

import pytest

from eval.detector_base import Checkpoint
from eval.stop_rules import Divergence

NAN = float("nan")
MAD_TO_SD = 1.482602218505602
MEANABS_TO_SD = math.sqrt(math.pi / 2.0)


def mult(j: int) -> float:
    return math.sqrt(1.0 + 2.0 * math.log(j)) if j > 1 else 1.0


def feed(det: Divergence, evals, rewards=None, se=NAN):
    """Observe each checkpoint; returns the monitor and the list of observe() answers."""
    mon = det.start()
    rewards = [NAN] * len(evals) if rewards is None else rewards
    out = [mon.observe(Checkpoint(step=i, eval_score=e, reward=r, eval_se=se))
           for i, (e, r) in enumerate(zip(evals, rewards, strict=True))]
    return mon, out


# ------------------------------------------------------------------ constructor and params
DEFAULTS = {"window": 4, "z": 1.0, "short_ratio": 2.0, "z_own": 1.0, "min_drawdown": 0.0, "persist": 1,
            "gate_weight": math.inf, "z_proxy": 0.0, "hold": 0, "hold_drawdown": 0.5, "z_decline": 3.0}


def test_class_defaults_are_the_plain_signature_rule():
    """The class defaults (what NoisePatience's gate and make_detector without a config get): a 4-checkpoint test
    at z 1 plus the 3-checkpoint test at 2 z, z_own = z, no drawdown, persist 1, no pooling, no proxy bar, no
    decline rule (hold 0, its bars 0.5 and 3)."""
    det = Divergence()
    assert det.params() == DEFAULTS
    assert det.tests == [(4, 1.0), (3, 2.0)]


def test_the_default_divergence_is_labelled_by_its_title_alone():
    assert Divergence().label == "Divergence"
    assert Divergence(z=2.0).label == "Divergence(z=2)"
    assert Divergence(z=2.0, z_own=2.0).label == "Divergence(z=2)"  # z_own equal to z is its default
    assert Divergence(z_own=0.5).label == "Divergence(z_own=0.5)"
    assert Divergence(z=2.0, z_own=1.0).label == "Divergence(z=2,z_own=1)"


def test_explicit_parameters_are_kept():
    det = Divergence(window=6, z=1.5, short_ratio=3.0, z_own=2.5, min_drawdown=0.25, persist=3, gate_weight=4.0,
                     z_proxy=0.5, hold=2, hold_drawdown=0.75, z_decline=1.5)
    assert det.params() == {"window": 6, "z": 1.5, "short_ratio": 3.0, "z_own": 2.5, "min_drawdown": 0.25,
                            "persist": 3, "gate_weight": 4.0, "z_proxy": 0.5, "hold": 2, "hold_drawdown": 0.75,
                            "z_decline": 1.5}
    assert Divergence(z=2.0).z_own == 2.0  # z_own defaults to z
    assert Divergence(z=2.0, z_own=0.5).z_own == 0.5


MSG1 = "divergence: need window >= 2, z >= 0, z_own >= 0, short_ratio >= 0, 0 <= min_drawdown < 1"
MSG2 = "divergence: need gate_weight > 0, z_proxy >= 0, hold >= 0, 0 <= hold_drawdown < 1, z_decline >= 0"


@pytest.mark.parametrize("bad, msg", [
    ({"window": 1}, MSG1), ({"z": -0.1}, MSG1), ({"short_ratio": -0.1}, MSG1), ({"z_own": -0.1}, MSG1),
    ({"min_drawdown": 1.0}, MSG1), ({"min_drawdown": 1.5}, MSG1), ({"min_drawdown": -0.1}, MSG1),
    ({"gate_weight": 0.0}, MSG2), ({"z_proxy": -0.1}, MSG2), ({"hold": -1}, MSG2), ({"hold_drawdown": 1.0}, MSG2),
    ({"hold_drawdown": 1.5}, MSG2), ({"hold_drawdown": -0.1}, MSG2), ({"z_decline": -0.1}, MSG2),
    ({"persist": 0}, "divergence: need persist >= 1"),
])
def test_each_bad_parameter_alone_is_refused_with_the_rule(bad, msg):
    with pytest.raises(ValueError) as err:
        Divergence(**bad)
    assert str(err.value) == msg


@pytest.mark.parametrize("edge", [
    {"window": 2}, {"window": 3}, {"z": 0.0}, {"short_ratio": 0.0}, {"short_ratio": 0.5}, {"z_own": 0.0},
    {"min_drawdown": 0.0}, {"min_drawdown": 0.99}, {"gate_weight": 0.5}, {"z_proxy": 0.0}, {"hold": 0},
    {"hold_drawdown": 0.0}, {"z_decline": 0.0}, {"z_decline": 0.5}, {"persist": 1},
])
def test_values_on_the_edge_of_each_rule_are_accepted(edge):
    assert Divergence(**edge).params()[next(iter(edge))] == next(iter(edge.values()))


def test_the_short_test_needs_a_window_above_3_and_a_positive_ratio():
    assert Divergence(window=4, short_ratio=2.0).tests == [(4, 1.0), (3, 2.0)]
    assert Divergence(window=4, short_ratio=0.5).tests == [(4, 1.0), (3, 0.5)]
    assert Divergence(window=5, short_ratio=2.0).tests == [(5, 1.0), (3, 2.0)]
    assert Divergence(window=4, short_ratio=0.0).tests == [(4, 1.0)]
    assert Divergence(window=3, short_ratio=2.0).tests == [(3, 1.0)]
    assert Divergence(window=2, short_ratio=2.0).tests == [(2, 1.0)]


# ------------------------------------------------------------------ the gate phase (eval_se given, < 8 evals)
def test_gate_statistic_by_hand():
    """evals 10, 9, 8, 7 on a gate SE of 1, the proxy rising: the 4-test's slope is -1 exactly, so its
    significance is sqrt(5) at multiplicity 1; the 3-test's is sqrt(2) / (2 * sqrt(1 + 2 ln 2)). One more eval
    (6) is the 4-test's second draw: sqrt(5) / sqrt(1 + 2 ln 2)."""
    mon, out = feed(Divergence(), [10.0, 9.0, 8.0], [0.0, 1.0, 2.0], se=1.0)
    assert mon.statistic() == pytest.approx(math.sqrt(2.0) / 2.0, rel=1e-12)  # only the 3-test fits
    mon, out = feed(Divergence(), [10.0, 9.0, 8.0, 7.0], [0.0, 1.0, 2.0, 3.0], se=1.0)
    assert mon.statistic() == pytest.approx(math.sqrt(5.0), rel=1e-12)
    assert out == [False, False, False, True]  # sqrt 2 / 2 < 1 at the third, sqrt 5 > 1 at the fourth
    mon, out = feed(Divergence(), [10.0, 9.0, 8.0, 7.0, 6.0], [0.0, 1.0, 2.0, 3.0, 4.0], se=1.0)
    assert mon.statistic() == pytest.approx(math.sqrt(5.0) / mult(2), rel=1e-12)
    # the 3-test alone: sqrt(2) / (2 * mult(j)) at its j-th draw
    mon, _ = feed(Divergence(window=4, short_ratio=0.5), [10.0, 10.0, 10.0, 10.0, 9.0, 8.0], [0, 1, 2, 3, 4, 5],
                  se=1.0)
    # 4-test over 10, 10, 9, 8: slope -0.7 -> 0.7 sqrt 5 / mult(3); 3-test: sqrt 2 / (0.5 mult(4))
    assert mon.statistic() == pytest.approx(max(0.7 * math.sqrt(5.0) / mult(3), math.sqrt(2.0) / (0.5 * mult(4))),
                                            rel=1e-12)


def test_gate_bar_is_z_and_a_tie_does_not_stop():
    _, out = feed(Divergence(z=math.sqrt(5.0)), [10.0, 9.0, 8.0, 7.0], [0.0, 1.0, 2.0, 3.0], se=1.0)
    assert out == [False, False, False, False]  # statistic == z exactly: not above it
    _, out = feed(Divergence(z=1.0, z_own=5.0), [10.0, 9.0, 8.0, 7.0], [0.0, 1.0, 2.0, 3.0], se=1.0)
    assert out[-1] is True  # the gate's bar z (1), not z_own (5)


def test_a_proxy_that_does_not_rise_over_the_long_window_skips_only_that_test():
    """proxy 3, 0, 1, 2: its 4-slope is -0.2 (a collapse for that test), its 3-slope +1: the 3-test still counts."""
    mon, _ = feed(Divergence(), [10.0, 9.0, 8.0, 7.0], [3.0, 0.0, 1.0, 2.0], se=1.0)
    assert mon.statistic() == pytest.approx(math.sqrt(2.0) / (2.0 * mult(2)), rel=1e-12)


def test_a_missed_eval_is_no_evidence():
    mon = Divergence(z=0.0).start()
    assert mon.observe(Checkpoint(step=0, eval_score=NAN, reward=1.0, eval_se=1.0)) is False
    assert mon.noise.evals == [] and mon.rewards == []


def test_gate_weight_pools_the_runs_own_second_differences():
    """gate_weight 2, SE 0.1, evals 0, 1, 0, 1: second differences -2, 2 (MAD 2) give an own SD of
    2 * 1.4826 / sqrt 6, with nu = 2 of them: pooled = sqrt((2 * 0.01 + 2 own^2) / 4). With 3 evals no pooling."""
    own = 2.0 * MAD_TO_SD / math.sqrt(6.0)
    mon, _ = feed(Divergence(gate_weight=2.0), [0.0, 1.0, 0.0], se=0.1)
    assert mon.sigma() == 0.1
    mon, _ = feed(Divergence(gate_weight=2.0), [0.0, 1.0, 0.0, 1.0], se=0.1)
    assert mon.sigma() == pytest.approx(math.sqrt((2.0 * 0.01 + 2.0 * own * own) / 4.0), rel=1e-12)
    # a flat run: own 0, pooled sqrt(2 * 1 / 4) < SE 1: never below the SE
    mon, _ = feed(Divergence(gate_weight=2.0), [5.0, 5.0, 5.0, 5.0, 5.0], se=1.0)
    assert mon.sigma() == 1.0


# ------------------------------------------------------------------ proxy_rises
def test_proxy_rises_by_hand():
    """proxy 0, .2, .1, .3: slope 0.08 (exactly 0.8 / 10), second differences -.3, .3 (MAD .3), so its SD is
    0.3 * 1.4826 / sqrt 6 and the rise is 0.08 sqrt 5 / SD = 0.985 SEs: below a bar of 1, above 0.9."""
    rewards = [0.0, 0.2, 0.1, 0.3]
    t = 0.08 * math.sqrt(5.0) / (0.3 * MAD_TO_SD / math.sqrt(6.0))
    assert 0.98 < t < 0.99
    mon, _ = feed(Divergence(z_proxy=1.0), [1.0] * 4, rewards, se=1.0)
    assert mon.proxy_rises(4) is False
    mon, _ = feed(Divergence(z_proxy=0.9), [1.0] * 4, rewards, se=1.0)
    assert mon.proxy_rises(4) is True
    mon, _ = feed(Divergence(z_proxy=0.5), [1.0] * 4, [10 * r for r in rewards], se=1.0)
    assert mon.proxy_rises(4) is True
    # a perfectly straight proxy has no noise: any rise is significant
    mon, _ = feed(Divergence(z_proxy=1.0), [1.0] * 4, [0.0, 1.0, 2.0, 3.0], se=1.0)
    assert mon.proxy_rises(4) is True


def test_proxy_rises_edge_cases():
    mon, _ = feed(Divergence(), [1.0] * 4, [1.0, 1.0, 1.0, 1.0], se=1.0)
    assert mon.proxy_rises(4) is False  # a flat proxy does not rise
    mon, _ = feed(Divergence(), [1.0] * 4, None, se=1.0)
    assert mon.proxy_rises(4) is True  # no proxy: passes
    mon, _ = feed(Divergence(), [1.0] * 4, [3.0, 2.0, NAN, 0.0], se=1.0)
    assert mon.proxy_rises(4) is True  # a missed value in the window: no evidence against
    mon, _ = feed(Divergence(), [1.0] * 4, [3.0, 2.0, 1.0, 0.0], se=1.0)
    assert mon.proxy_rises(4) is False


def test_a_run_without_proxy_is_judged_on_the_eval_alone():
    _, out = feed(Divergence(), [10.0, 9.0, 8.0, 7.0], None, se=1.0)
    assert out == [False, False, False, True]
    _, out = feed(Divergence(), [10.0, 9.0, 8.0, 7.0], [0.0, 1.0, NAN, 3.0], se=1.0)
    assert out[-1] is True


# ------------------------------------------------------------------ own noise (8+ evals)
def test_a_straight_line_on_its_own_noise_has_zero_noise_and_is_not_judged():
    mon, out = feed(Divergence(z=0.0), [10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0], [0, 1, 2, 3, 4, 5, 6, 7])
    assert mon.sigma() == 0.0
    assert mon.statistic() == 0.0
    assert out == [False] * 8


def _own_stat_w3(sigma: float, last3_slope: float, n: int) -> float:
    return -last3_slope * math.sqrt(2.0) / sigma / (2.0 * mult(n - 2))


def test_min_drawdown_on_own_noise_by_hand():
    """evals 10..16 then a last value; range 6, min_drawdown 0.5: the fall from 16 must be >= 3."""
    rising = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0]
    proxy = [float(i) for i in range(8)]
    det = Divergence(min_drawdown=0.5)
    # last 14: fell 2 < 3 -> 0 (without the drawdown rule its 3-test would give ~0.65)
    mon, _ = feed(det, rising + [14.0], proxy)
    assert mon.statistic() == 0.0
    mon, _ = feed(Divergence(), rising + [14.0], proxy)
    sigma = MEANABS_TO_SD * (3.0 / 6.0) / math.sqrt(6.0)  # second differences 0 x5, -3
    assert mon.statistic() == pytest.approx(_own_stat_w3(sigma, -0.5, 8), rel=1e-12)
    # last 13: fell exactly 3 == 0.5 * 6: judged. 4-test over 14, 15, 16, 13: slope -0.2; 3-test slope -1
    mon, _ = feed(det, rising + [13.0], proxy)
    sigma = MEANABS_TO_SD * (4.0 / 6.0) / math.sqrt(6.0)
    w4 = 0.2 * math.sqrt(5.0) / sigma / mult(5)
    assert mon.statistic() == pytest.approx(max(w4, _own_stat_w3(sigma, -1.0, 8)), rel=1e-12)


def test_persist_looks_at_the_last_evals_only():
    """persist 2: the last two (13, 12) sit 3 below the peak 16 (range 6): judged. The peak is inside evals[2:]."""
    evals = [10.0, 11.0, 12.0, 16.0, 15.0, 14.0, 13.0, 12.0]
    mon, _ = feed(Divergence(min_drawdown=0.5, persist=2), evals, [float(i) for i in range(8)])
    # second differences 0, 3, -5, 0, 0, 0: MAD 0 -> mean abs dev 8/6
    sigma = MEANABS_TO_SD * (8.0 / 6.0) / math.sqrt(6.0)
    w4 = math.sqrt(5.0) / sigma / mult(5)
    w3 = _own_stat_w3(sigma, -1.0, 8)
    assert mon.statistic() == pytest.approx(max(w4, w3), rel=1e-12)


def test_persist_without_min_drawdown_does_nothing():
    """min_drawdown 0 switches the drawdown rule off, whatever persist says (persist 10 > the 8 evals)."""
    evals = [10.0, 11.0, 12.0, 16.0, 15.0, 14.0, 13.0, 12.0]
    mon, _ = feed(Divergence(persist=10), evals, [float(i) for i in range(8)])
    sigma = MEANABS_TO_SD * (8.0 / 6.0) / math.sqrt(6.0)
    assert mon.statistic() == pytest.approx(max(math.sqrt(5.0) / sigma / mult(5), _own_stat_w3(sigma, -1.0, 8)),
                                            rel=1e-12)


def test_min_drawdown_does_not_apply_on_the_gate():
    """On the gate's SE (7 evals, SE 1) a fall of 1 from a range of 6 is judged even with min_drawdown 0.5."""
    mon, _ = feed(Divergence(min_drawdown=0.5), [10.0, 11.0, 12.0, 13.0, 16.0, 16.0, 15.0],
                  [float(i) for i in range(7)], se=1.0)
    # 4-test over 13, 16, 16, 15: slope (-1.5*-2 + -.5*1 + .5*1 + 1.5*0) / 5 = 0.6 > 0 -> nothing; 3-test slope -0.5
    assert mon.statistic() == pytest.approx(0.5 * math.sqrt(2.0) / (2.0 * mult(5)), rel=1e-12)


def test_own_noise_bar_is_z_own():
    """No SE, no proxy, hold 0: evals 0..6 then 2. Second differences 0 x5, -5 -> sigma 1.2533 * 5/6 / sqrt 6;
    4-test over 4, 5, 6, 2: slope -0.5 -> 0.5 sqrt 5 / sigma / mult(5) = 1.277 > 1."""
    evals = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 2.0]
    sigma = MEANABS_TO_SD * (5.0 / 6.0) / math.sqrt(6.0)
    stat = max(0.5 * math.sqrt(5.0) / sigma / mult(5), _own_stat_w3(sigma, -1.5, 8))
    assert 1.2 < stat < 1.3
    mon, out = feed(Divergence(), evals)
    assert mon.statistic() == pytest.approx(stat, rel=1e-12)
    assert out == [False] * 7 + [True]
    _, out = feed(Divergence(z=5.0, z_own=1.0), evals)
    assert out[-1] is True
    _, out = feed(Divergence(z=1.0, z_own=1.3), evals)
    assert out[-1] is False


def test_decline_rule_for_runs_without_proxy():
    """hold 1, SE 1 (the floor of the own noise 0.43): evals 0..6 then 2 fall 4 from the top, more than 0.5 of
    the range 6, i.e. 4 SDs: stopped at a bar of 3, not at a bar of exactly 4. On the plain slope rule (the
    gate's first 7, or hold 0) the same run's statistic is 0.54 < 1: not stopped."""
    evals = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 2.0]
    mon, out = feed(Divergence(hold=1), evals, se=1.0)
    assert out == [False] * 7 + [True]
    assert mon.decline_statistic(1.0) == 4.0
    _, out = feed(Divergence(hold=1, z_decline=4.0), evals, se=1.0)
    assert out == [False] * 8
    _, out = feed(Divergence(hold=0), evals, se=1.0)
    assert out == [False] * 8
    # with a proxy the decline rule does not apply: the slope rule (0.54 < 1) keeps the run
    _, out = feed(Divergence(hold=1), evals, [float(i) for i in range(8)], se=1.0)
    assert out == [False] * 8


def test_proxy_bar_tie_and_zero_bar():
    """proxy 0, 2, 1, 3: slope 4/5, second differences -3, 3 (MAD 3): a bar equal to 0.8 sqrt 5 / (3 * 1.4826 /
    sqrt 6) is not passed (the rise must be above it). With z_proxy 0 any positive slope counts, however small
    against the proxy's noise (slope 5e-324 on noise of ~1800: the ratio underflows to 0, still a rise)."""
    t = (4.0 / 5.0) * math.sqrt(5.0) / (MAD_TO_SD * 3.0 / math.sqrt(6.0))
    mon, _ = feed(Divergence(z_proxy=t), [1.0] * 4, [0.0, 2.0, 1.0, 3.0], se=1.0)
    assert mon.proxy_rises(4) is False
    mon, _ = feed(Divergence(z_proxy=t * 0.999), [1.0] * 4, [0.0, 2.0, 1.0, 3.0], se=1.0)
    assert mon.proxy_rises(4) is True
    rewards = [0.0, 1000.0, -1000.0, 1000.0, -1000.0, 0.0, 0.0, 0.0, 1e-323]
    mon, _ = feed(Divergence(z_proxy=0.0), [1.0] * 9, rewards, se=1.0)
    assert mon.proxy_rises(4) is True


def test_gate_weight_pools_nothing_on_the_runs_own_noise():
    """Pooling is for the gate phase only: with 9 evals and no SE the run is on its own noise and sigma() is
    exactly RunNoise's figure (the MAD estimate), whatever gate_weight says. (Pooling that figure with itself,
    sqrt((g s^2 + nu s^2) / (g + nu)), is s only up to rounding: for this run it comes out one ulp above.)"""
    evals = [18.0, 2.0, 8.0, 3.0, 15.0, 14.0, 15.0, 20.0, 12.0]
    mon, _ = feed(Divergence(gate_weight=2.0), evals, [float(i) for i in range(9)])
    own = mon.noise.sigma()
    assert mon.noise.from_gate is False
    assert own == pytest.approx(9.079047317142642, rel=1e-12)
    assert mon.sigma() == own


# ---- _DivergenceMonitor.decline_statistic by hand (the rule for runs without a proxy, on their own noise) ---------
def _decline(evals, sigma, hold=2, hold_drawdown=0.5):
    """decline_statistic of a monitor that has seen `evals`: (top - max(last hold)) / sigma when that fall exceeds
    hold_drawdown x (top - bottom), else 0 (0 also with no more than `hold` evals or sigma not > 0)."""
    from eval.detectors import Checkpoint
    from eval.stop_rules import Divergence

    mon = Divergence(hold=hold, hold_drawdown=hold_drawdown).start()
    for i, e in enumerate(evals):
        mon.noise.add(Checkpoint(step=float(i), eval_score=float(e)))
    return mon.decline_statistic(sigma)


def test_decline_statistic_by_hand():
    # top 1, bottom 0, last two at most 0.2: a fall of 0.8 > 0.5 x 1, in noise SDs of 0.4: 2.0
    assert _decline([0.0, 1.0, 0.2, 0.1], 0.4) == pytest.approx(2.0)
    # exactly at the drawdown bar (0.5 = 0.5 x 1): not beyond it, 0
    assert _decline([0.0, 1.0, 0.5, 0.5], 0.4) == 0.0
    # range 2: the bar is 0.5 x 2 = 1.0; a fall of 0.5 is inside it
    assert _decline([0.0, 2.0, 1.5, 1.4], 0.4) == 0.0
    # bottom 1, top 3 (range 2, bar 1.0): a fall of 1.5 is beyond it: 1.5 / 0.5 = 3.0
    assert _decline([1.0, 3.0, 1.5, 1.2], 0.5) == pytest.approx(3.0)
    # no more evals than `hold`: 0, whatever they show
    assert _decline([1.0, 0.0], 0.4) == 0.0
    # a noise figure of 0 (an exactly linear run) gives 0, not a division by zero
    assert _decline([0.0, 1.0, 0.2, 0.1], 0.0) == 0.0
    # the window is the LAST `hold` evals: of five, the last two (0.2, 0.1), not those from the third on (0.9 ...)
    assert _decline([0.0, 1.0, 0.9, 0.2, 0.1], 0.4) == pytest.approx(2.0)
    # hold 1: the last eval alone (0.2) is 0.8 below the top
    assert _decline([0.0, 1.0, 0.2], 0.4, hold=1) == pytest.approx(2.0)
