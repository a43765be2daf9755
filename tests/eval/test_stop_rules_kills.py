"""Hand-computed checks of eval/stop_rules.py (issue 31: the survivors of its mutation run).

Every expected value below is worked out by hand in the comments, or comes from an independent oracle (a plain
re-implementation of Adams & MacKay's BOCPD with a Normal-Gamma prior, written from the paper's formulas, with
Student-t densities from math.lgamma and scipy's t cdf). Noise-aware rules get a gate SE and at most 7 evals, so
their noise is the SE itself (eval/noise.py: fewer than MIN_DIFFS = 6 second differences).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from eval.detector_base import Checkpoint
from eval.detectors import Bocpd, Cusum, EvalStop, LossPlateau, MinDeltaPatience, StopAt

NAN = float("nan")
SQRT2 = math.sqrt(2.0)


def _verdicts(det, evals, se=NAN, **cols):
    """observe() of one fresh monitor at every checkpoint (not stopping at the first True)."""
    mon = det.start()
    out = []
    for i, e in enumerate(evals):
        extra = {k: v[i] for k, v in cols.items()}
        out.append(bool(mon.observe(Checkpoint(step=float(i), eval_score=e, eval_se=se, **extra))))
    return out


# ------------------------------------------------------------------ bad input: one-line errors naming the fix
@pytest.mark.parametrize("make, msg", [
    (lambda: EvalStop(k=0), "evalstop: k must be >= 1"),
    (lambda: StopAt(p=0.0), "stopat: p must be in (0, 1]"),
    (lambda: LossPlateau(window=1), "lossplateau: window must be >= 2 checkpoints"),
    (lambda: MinDeltaPatience(k=0), "patience: need k >= 1, z >= 0"),
    (lambda: Cusum(h=0.0), "cusum: need h > 0, drift >= 0"),
    (lambda: Bocpd(hazard=0.0), "bocpd: need 0 < hazard < 1, 0 < level < 1 and positive prior parameters"),
])
def test_bad_parameters_raise_the_exact_message(make, msg):
    with pytest.raises(ValueError, match="^" + re.escape(msg) + "$"):
        make()


@pytest.mark.parametrize("kwargs", [
    {"hazard": 0.0}, {"hazard": 1.0}, {"hazard": 1.5}, {"level": 0.0}, {"level": 1.0}, {"level": 1.5},
    {"kappa0": 0.0}, {"alpha0": 0.0}, {"beta0": 0.0},
])
def test_bocpd_rejects_each_bound_alone(kwargs):
    with pytest.raises(ValueError, match="^bocpd: "):
        Bocpd(**kwargs)


@pytest.mark.parametrize("make, bad", [
    (StopAt, {"p": 0.0}), (StopAt, {"p": 1.5}),
    (Cusum, {"h": 0.0}), (Cusum, {"drift": -0.1}),
    (MinDeltaPatience, {"k": 0}), (MinDeltaPatience, {"z": -0.1}),
    (LossPlateau, {"window": 1}),
])
def test_each_bad_bound_alone_raises(make, bad):
    with pytest.raises(ValueError):
        make(**bad)


def test_the_edges_of_the_valid_ranges_are_accepted():
    # documented ranges: k >= 1, z >= 0, h > 0, window >= 2, p in (0, 1], positive priors
    assert MinDeltaPatience(k=1, z=0.0).params() == {"k": 1, "z": 0.0}
    assert MinDeltaPatience(k=2, z=0.5).params() == {"k": 2, "z": 0.5}
    assert Cusum(h=0.5).params() == {"h": 0.5, "drift": 0.0}
    assert LossPlateau(window=2).params() == {"window": 2, "min_rel": 0.02}
    assert StopAt(p=1.0).p == 1.0
    assert Bocpd(alpha0=0.5).alpha0 == 0.5


def test_params_name_each_parameter():
    assert Cusum(h=1.5, drift=0.25).params() == {"h": 1.5, "drift": 0.25}
    assert LossPlateau(window=5, min_rel=0.1).params() == {"window": 5, "min_rel": 0.1}


# ------------------------------------------------------------------ EvalStop / StopAt vectorised scans
def test_evalstop_scan_returns_int64_indices_and_treats_none_as_a_missed_eval():
    # run 0: 3, 2 (decline 1), None (missed), 1 (decline 2) -> stops at t=3 with k=2; run 1 rises: never
    out = EvalStop(k=2).scan({"eval_score": [[3.0, 2.0, None, 1.0], [1.0, 2.0, 3.0, 4.0]]})
    assert out.dtype == np.int64
    assert out.tolist() == [3, -1]


def test_stopat_scan_without_progress_is_minus_one_per_run():
    out = StopAt(p=0.5).scan({"eval_score": np.zeros((3, 4))})
    assert out.dtype == np.int64
    assert out.tolist() == [-1, -1, -1]


def test_stopat_scan_first_checkpoint_at_p_per_run():
    p = 0.5
    edge = p - 1e-9  # the documented tolerance: exactly p - 1e-9 counts as "at p"
    prog = [[0.1, edge, 0.9], [0.1, 0.2, 0.3], [0.6, 0.7, 0.8], [0.2, None, 0.7]]
    out = StopAt(p=p).scan({"progress": prog})
    assert out.dtype == np.int64
    assert out.tolist() == [1, -1, 0, 2]


def test_stopat_monitor_fires_at_the_tolerance_edge_and_default_is_065():
    p = 0.5
    mon = StopAt(p=p).start()
    assert not mon.observe(Checkpoint(step=0.0, eval_score=1.0, progress=0.49))
    assert mon.observe(Checkpoint(step=1.0, eval_score=1.0, progress=p - 1e-9))
    det = StopAt()
    assert det.label == "StopAt0.65"
    assert [det.start().observe(Checkpoint(step=0.0, eval_score=1.0, progress=q)) for q in (0.6, 0.65)] == [
        False, True]


# ------------------------------------------------------------------ LossPlateau
def _loss_verdicts(det, losses):
    mon = det.start()
    return [bool(mon.observe(Checkpoint(step=float(i), eval_score=1.0, loss=v))) for i, v in enumerate(losses)]


def test_lossplateau_defaults_window_3_min_rel_002():
    # (1 - 0.985) / 1 = 0.015 < 0.02 at the 3rd loss -> stop; window 4 would wait for a 4th
    assert _loss_verdicts(LossPlateau(), [1.0, 0.99, 0.985]) == [False, False, True]
    # (1 - 0.8) / 1 = 0.2 >= 0.02: still improving, no stop
    assert _loss_verdicts(LossPlateau(), [1.0, 0.9, 0.8]) == [False, False, False]


def test_lossplateau_relative_to_the_old_loss_and_strict():
    # old 0.5, new 0.485: (0.5 - 0.485) / 0.5 = 0.03 >= 0.02 -> no stop (0.015 would be a plateau)
    assert _loss_verdicts(LossPlateau(window=2), [0.5, 0.485]) == [False, False]
    # exactly min_rel: (1 - 0.5) / 1 = 0.5, not < 0.5 -> no stop
    assert _loss_verdicts(LossPlateau(window=2, min_rel=0.5), [1.0, 0.5]) == [False, False]
    # a NaN loss is no evidence
    assert _loss_verdicts(LossPlateau(window=2), [1.0, NAN]) == [False, False]


# ------------------------------------------------------------------ MinDeltaPatience (sigma = the gate's SE)
def test_patience_default_z_is_1():
    # k 2, z 1, sigma 1: the bar is best before - sqrt 2 = 2 - 1.414 = 0.586; recent best 0.5 < 0.586 -> stop
    # (z 2 would need < 2 - 2.83)
    assert _verdicts(MinDeltaPatience(), [2.0, 0.5, 0.5], se=1.0) == [False, False, True]


def test_patience_bar_is_z_sigma_sqrt2_strictly():
    # k 1, z 1, sigma 1: drop 1.0: 0 < 1 - 1.414 is False (sigma / sqrt 2 = 0.707 would stop)
    assert _verdicts(MinDeltaPatience(k=1, z=1.0), [1.0, 0.0], se=1.0) == [False, False]
    # drop 1.5: -0.5 < 1 - 1.414 = -0.414 -> stop (sqrt 3: -0.732 would not)
    assert _verdicts(MinDeltaPatience(k=1, z=1.0), [1.0, -0.5], se=1.0) == [False, True]
    # z 0, flat: 1.0 < 1.0 is False
    assert _verdicts(MinDeltaPatience(k=1, z=0.0), [1.0, 1.0], se=1.0) == [False, False]


def test_patience_not_judged_without_noise_or_eval():
    # no SE and a short run: sigma NaN -> not judged
    assert _verdicts(MinDeltaPatience(k=1, z=0.0), [1.0, 0.0]) == [False, False]
    assert _verdicts(MinDeltaPatience(k=1, z=0.0), [1.0, NAN], se=1.0) == [False, False]


# ------------------------------------------------------------------ CUSUM: x_t = (e_t - e_{t-1}) / (sqrt 2 sigma)
def test_cusum_defaults_h2_drift0():
    # sigma = 1, drops of 1.25 sqrt 2 -> x = -1.25: S = 1.25, 2.5 > 2 -> stop at the 2nd drop
    # (h 3 would wait for S = 3.75; drift 1 gives S = 0.25, 0.5)
    e = [0.0, -1.25 * SQRT2, -2.5 * SQRT2]
    assert _verdicts(Cusum(), e, se=1.0) == [False, False, True]


def test_cusum_floor_drift_and_strict_bar():
    # S starts at 0 and is floored at 0: a flat step then a drop of x = -1.5 gives S = 1.5, not > 2
    assert _verdicts(Cusum(h=2.0), [0.0, 0.0, -1.5 * SQRT2], se=1.0) == [False, False, False]
    # drift 0.5, drops of x = -1.5: S = 1.0, 2.0 (not > 2), 3.0 -> stop at the 3rd drop only
    e = [0.0, -1.5 * SQRT2, -3.0 * SQRT2, -4.5 * SQRT2]
    assert _verdicts(Cusum(h=2.0, drift=0.5), e, se=1.0) == [False, False, False, True]
    # drops of exactly x = -1 (sqrt 2 / sqrt 2): S = 1, 2; 2 > 2 is False
    e = [0.0, -SQRT2, -2.0 * SQRT2]
    assert _verdicts(Cusum(h=2.0), e, se=1.0) == [False, False, False]
    # a missed eval is no evidence
    assert _verdicts(Cusum(h=2.0), [0.0, NAN], se=1.0) == [False, False]


# ------------------------------------------------------------------ BOCPD against a plain re-implementation
def _t_logpdf(x, df, loc, scale):
    z = (x - loc) / scale
    return (math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi) - math.log(scale)
            - (df + 1) / 2 * math.log1p(z * z / df))


def _normal_gamma(seg, mu0, kappa0, alpha0, beta0):
    """Posterior (mu_n, kappa_n, alpha_n, beta_n) after the observations `seg` (Murphy 2007, eqs. 85-89)."""
    n = len(seg)
    if n == 0:
        return mu0, kappa0, alpha0, beta0
    xbar = sum(seg) / n
    ss = sum((v - xbar) ** 2 for v in seg)
    kn = kappa0 + n
    return ((kappa0 * mu0 + n * xbar) / kn, kn, alpha0 + n / 2,
            beta0 + ss / 2 + kappa0 * n * (xbar - mu0) ** 2 / (2 * kn))


def _oracle_bocpd(xs, hazard, min_drop, mu0, kappa0, alpha0, beta0):
    """P(the current regime's mean < -min_drop | x_1..t) for each t (Adams & MacKay 2007)."""
    from scipy import stats

    segs, w = [[]], [1.0]  # run-length hypotheses: the segment since the last change, and its probability
    out = []
    for x in xs:
        pred = []
        for seg in segs:
            mu, k, a, b = _normal_gamma(seg, mu0, kappa0, alpha0, beta0)
            pred.append(math.exp(_t_logpdf(x, 2 * a, mu, math.sqrt(b * (k + 1) / (a * k)))))
        joint = [wi * pi for wi, pi in zip(w, pred, strict=True)]
        new = [hazard * sum(joint)] + [(1 - hazard) * j for j in joint]
        tot = sum(new)
        w = [v / tot for v in new]
        segs = [[x]] + [seg + [x] for seg in segs]
        p = 0.0
        for wi, seg in zip(w, segs, strict=True):
            mu, k, a, b = _normal_gamma(seg, mu0, kappa0, alpha0, beta0)
            p += wi * stats.t.cdf(-min_drop, 2 * a, loc=mu, scale=math.sqrt(b / (a * k)))
        out.append(p)
    return out


BOCPD_EVALS = [1.0, 1.05, 1.08, 1.0, 0.85, 0.7, 0.72]
BOCPD_SE = 0.1


@pytest.mark.parametrize("kw, prior", [
    # the documented defaults (eval/stop_rules.py Bocpd signature): min_drop 0.25, mu0 0, kappa0 0.5,
    # alpha0 2, beta0 1; hazard 0.3
    ({}, dict(hazard=0.3, min_drop=0.25, mu0=0.0, kappa0=0.5, alpha0=2.0, beta0=1.0)),
    (dict(hazard=0.2, min_drop=0.4, mu0=0.3, kappa0=1.3, alpha0=1.5, beta0=0.7),
     dict(hazard=0.2, min_drop=0.4, mu0=0.3, kappa0=1.3, alpha0=1.5, beta0=0.7)),
])
def test_bocpd_matches_a_plain_reimplementation(kw, prior):
    xs = [(b - a) / (BOCPD_SE * SQRT2) for a, b in zip(BOCPD_EVALS, BOCPD_EVALS[1:], strict=False)]
    ps = _oracle_bocpd(xs, **prior)
    assert all(1e-6 < p < 1 - 1e-6 for p in ps), ps
    for t, p in enumerate(ps, start=1):  # checkpoint t gives the t-th change
        below = _verdicts(Bocpd(level=p * (1 - 1e-7), **kw), BOCPD_EVALS, se=BOCPD_SE)
        above = _verdicts(Bocpd(level=p * (1 + 1e-7), **kw), BOCPD_EVALS, se=BOCPD_SE)
        assert below[0] is False and above[0] is False  # one eval: no change yet
        assert (below[t], above[t]) == (True, False), (t, p)


def test_bocpd_missed_eval_is_no_evidence():
    assert _verdicts(Bocpd(level=0.01), [1.0, NAN], se=0.1) == [False, False]


def test_bocpd_bar_is_strict():
    # one change x = -0.375 (sigma 1): both run lengths hold just x, posterior mean (0.5 * 0 + x) / (0.5 + 1)
    # = -0.25 = -min_drop, so each P(mean < -0.25) is the t cdf at its centre, 1/2, and so is their mixture:
    # 1/2 is not > level 1/2
    e = [0.0, -0.375 * SQRT2]
    assert _verdicts(Bocpd(level=0.5), e, se=1.0) == [False, False]
    assert _verdicts(Bocpd(level=0.5 - 1e-9), e, se=1.0) == [False, True]


def test_params_name_each_rules_parameters_as_its_constructor_takes_them():
    """`params()` is what a result table's label and a replay's config record: the constructor's own keyword names
    with the values given (a misspelled key would make `make_detector(name, **params)` refuse its own record)."""
    from eval.stop_rules import Bocpd, StopAt

    assert StopAt(p=0.4).params() == {"p": 0.4}
    assert Bocpd(hazard=0.2, level=0.7, min_drop=0.3).params() == {"hazard": 0.2, "level": 0.7, "min_drop": 0.3}
