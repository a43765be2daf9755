"""The divergence detector's decline rule for runs that record no proxy reward, and its per-kind calibration.

Oracles: a plain re-implementation of the rule in the test (numpy MAD of second differences, a running best and
worst), hand-built curves whose stop checkpoint is known, and hand-computed threshold fits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from eval.calibrate import calibrate, calibration_groups, critical_threshold, fit_threshold
from eval.detectors import Checkpoint, make_detector

NAN = float("nan")
RULE = {"hold": 4, "hold_drawdown": 0.5, "z_decline": 3.0, "z_own": 2.0}


def first_stop(det, evals, rewards=None, se=NAN) -> int:
    m = det.start()
    for i, e in enumerate(evals):
        r = NAN if rewards is None else rewards[i]
        if m.observe(Checkpoint(step=float(i), eval_score=float(e), reward=r, eval_se=se)):
            return i
    return -1


def oracle_decline_stop(evals, hold, share, z) -> int:
    """The rule written out plainly: from 8 evals on (6 second differences), stop when the last `hold` evals
    are all more than `share` of the range below the best so far and their best is more than z noise SDs below it."""
    for t in range(7, len(evals)):
        seen = np.asarray(evals[: t + 1], dtype=float)
        d2 = np.diff(seen, n=2)
        mad = np.median(np.abs(d2 - np.median(d2)))
        sd = (1.482602218505602 * mad if mad > 0 else math.sqrt(math.pi / 2) * np.mean(np.abs(d2 - np.median(d2))))
        sigma = sd / math.sqrt(6.0)
        top, bottom, recent = seen.max(), seen.min(), seen[-hold:].max()
        if len(seen) > hold and top - recent > share * (top - bottom) and (top - recent) / sigma > z:
            return t
    return -1


def noisy_curve(seed: int, collapse_at: int, collapse_len: int | None, n: int = 30) -> list[float]:
    rng = np.random.default_rng(seed)
    y = np.minimum(np.arange(n) / 8.0, 1.0) + rng.normal(0.0, 0.02, n)
    end = n if collapse_len is None else collapse_at + collapse_len
    y[collapse_at:end] -= 0.9
    return y.tolist()


@pytest.mark.parametrize("seed", [3, 4, 5])
def test_a_held_collapse_stops_where_the_plain_rule_says(seed):
    evals = noisy_curve(seed, collapse_at=14, collapse_len=None)
    det = make_detector("divergence", **RULE)
    want = oracle_decline_stop(evals, 4, 0.5, 3.0)
    assert want == 14 + 4 - 1  # the 4th checkpoint of the collapse: the hand-built curve's known answer
    assert first_stop(det, evals) == want


def test_a_collapse_that_recovers_within_hold_is_not_stopped():
    evals = noisy_curve(7, collapse_at=14, collapse_len=3)  # 3 checkpoints down, hold is 4
    assert oracle_decline_stop(evals, 4, 0.5, 3.0) == -1
    assert first_stop(make_detector("divergence", **RULE), evals) == -1
    # the same curve held one checkpoint longer is stopped
    assert first_stop(make_detector("divergence", **RULE), noisy_curve(7, 14, 4)) == 17


def test_the_decline_rule_is_scale_free():
    evals = noisy_curve(11, collapse_at=12, collapse_len=None)
    det = make_detector("divergence", **RULE)
    assert first_stop(det, evals) == first_stop(det, [250.0 * e - 37.0 for e in evals]) != -1


def test_a_run_with_a_proxy_is_judged_on_the_signature_not_the_decline_rule():
    evals = noisy_curve(5, collapse_at=14, collapse_len=None)
    det = make_detector("divergence", **RULE)
    falling_proxy = [1.0 - 0.05 * i for i in range(len(evals))]  # the proxy falls too: a collapse, not hacking
    assert first_stop(det, evals) != -1
    assert first_stop(det, evals, rewards=falling_proxy) == -1


def test_fit_threshold_when_a_run_is_stopped_whatever_the_threshold():
    # target 1/4 of 4 runs allows one stop; that one is the run no threshold saves (inf): the others all stay
    assert fit_threshold(np.array([math.inf, 2.0, 5.0, 1.0]), 0.25) == 5.0
    assert fit_threshold(np.array([7.0, 2.0, 5.0, 1.0]), 0.25) == 5.0  # one allowed: the largest may stop
    assert fit_threshold(np.array([math.inf, math.inf, 5.0, 1.0]), 0.25) == 5.0


def test_each_kind_of_run_calibrates_its_own_bar():
    plain = [[Checkpoint(step=float(i), eval_score=e) for i, e in enumerate(noisy_curve(s, 14, 4 + s % 3))]
             for s in range(20, 30)]
    proxied = [[Checkpoint(step=float(i), eval_score=e, reward=0.1 * i) for i, e in enumerate(noisy_curve(s, 14, 3))]
               for s in range(30, 40)]
    det = make_detector("divergence", **RULE)
    groups = calibration_groups(det, plain + proxied)
    assert [(key, len(runs)) for key, runs in groups] == [("z_own", 10), ("z_decline", 10)]
    fitted = calibrate("divergence", plain + proxied, target=0.0, base=det.params())
    # z_decline: just above the largest critical value among the runs without a proxy (oracle: each run's own
    # bisection), untouched by the proxied runs; z_own fitted on the proxied runs alone gives the same value
    crit = max(critical_threshold("divergence", det.params(), cps, key="z_decline") for cps in plain)
    assert fitted["z_decline"] == pytest.approx(max(crit, 3.0), abs=1e-5)
    assert fitted["z_own"] == calibrate("divergence", proxied, target=0.0, base=det.params())["z_own"]
    again = make_detector("divergence", **fitted)
    assert all(first_stop(again, [c.eval_score for c in cps]) == -1 for cps in plain)
