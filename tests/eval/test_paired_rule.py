"""The paired, anytime-valid stop rule (eval/paired.py): its sequence's width against the formula worked by hand
and against an independent implementation, its time-uniform coverage by simulation, the false-stop bound on
simulated healthy runs (reference selection included) at 10, 30 and 100 checkpoints, its power and kept checkpoint
on a clear decline, and the monitor's verdicts (identical checkpoints, extra prompts, the live gate's EXTEND).

The coverage figures are printed with -s:
    .venv/bin/python -m pytest tests/eval/test_paired_rule.py -q -s -k "coverage or power"
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from eval.detector_base import Checkpoint
from eval.paired import PairedStop, Verdict, cs_radius, fixed_radius, look_weight, mixture_r, pair_alpha, paired_diff

# --------------------------------------------------------------------------- paired differences


def test_paired_diff_by_hand():
    a = {"p1": 1.0, "p2": 2.0, "p3": 4.0}
    b = {"p3": 3.0, "p1": 2.0, "p2": 2.0}  # any order: paired by prompt id
    got = paired_diff(a, b)
    # differences b - a: +1, 0, -1 -> mean 0, SD sqrt(((1)^2 + 0 + (-1)^2) / 2) = 1
    assert (got.n, got.mean, got.sd) == (3, 0.0, pytest.approx(1.0))
    got = paired_diff(np.array([0.0, 0.0, 1.0, 1.0]), np.array([1.0, 2.0, 1.0, 4.0]))
    # differences 1, 2, 0, 3: mean 1.5, squared deviations 0.25 + 0.25 + 2.25 + 2.25 = 5 over 3
    assert (got.n, got.mean, got.sd) == (4, 1.5, pytest.approx(math.sqrt(5.0 / 3.0)))


def test_paired_diff_refuses_different_prompt_sets():
    with pytest.raises(ValueError, match="prompt 'p9' is scored only in the second set"):
        paired_diff({"p1": 1.0, "p2": 1.0}, {"p1": 1.0, "p2": 1.0, "p9": 0.0})
    with pytest.raises(ValueError, match="same prompts"):
        paired_diff(np.zeros(3), np.zeros(4))


# --------------------------------------------------------------------------- the sequence's width


def _radius_by_hand(n: int, sd: float, a: float, r: float) -> float:
    """sd / n * sqrt((n + r) * (log(n + r) - log(r) + 2 log(1/a))), written out term by term."""
    log_term = math.log(n + r) - math.log(r) + 2.0 * math.log(1.0 / a)
    return sd / n * math.sqrt((n + r) * log_term)


@pytest.mark.parametrize(("n", "sd", "a", "r"), [(64, 1.0, 0.05, 10.0), (64, 0.3, 1.8e-5, 2.56), (10, 2.0, 0.02, 1.0),
                                                  (1000, 0.5, 1e-6, 30.0)])
def test_width_against_the_formula_by_hand(n, sd, a, r):
    assert float(cs_radius(n, sd, a, r)) == pytest.approx(_radius_by_hand(n, sd, a, r), rel=1e-12)


def test_width_against_the_authors_parametrisation_and_an_independent_implementation():
    # Waudby-Smith et al. (2024) write the same boundary for a unit-variance mean as
    # sqrt(2 (t rho^2 + 1) / (t^2 rho^2) * log(sqrt(t rho^2 + 1) / alpha)), rho^2 = 1 / r
    for t, rho2, alpha in [(64, 0.1, 0.05), (500, 0.01, 0.02), (12, 1.0, 1e-4)]:
        theirs = math.sqrt(2 * (t * rho2 + 1) / (t * t * rho2) * math.log(math.sqrt(t * rho2 + 1) / alpha))
        assert float(cs_radius(t, 1.0, alpha, 1.0 / rho2)) == pytest.approx(theirs, rel=1e-12)
    # the reference values of the paper's first author's library (confseq 0.0.11, Howard et al.:
    # test/uniform_boundaries_unittest.cpp, "from a reference implementation in R"): the two-sided normal mixture
    # tuned for v_opt = 100 at alpha 0.05 has rho = 12.60056 and boundary u(100) = 30.35209 (S_n scale, unit SD)
    assert mixture_r(100, 0.05) == pytest.approx(12.60056, abs=1e-5)
    assert float(cs_radius(100, 1.0, 0.05, mixture_r(100, 0.05))) * 100 == pytest.approx(30.35209, abs=1e-5)
    # the normal-mixture boundary u(v) of the `ville` package (0.1.0, _boundaries.normal_mixture, computed there):
    # u(64; alpha 0.05, rho 10) = 24.320318593750777, u(100; alpha 0.01, rho 5) = 35.87144539906998 (S_n scale)
    assert float(cs_radius(64, 1.0, 0.05, 10.0)) * 64 == pytest.approx(24.320318593750777, rel=1e-12)
    assert float(cs_radius(100, 1.0, 0.01, 5.0)) * 100 == pytest.approx(35.87144539906998, rel=1e-12)


@pytest.mark.parametrize(("n_opt", "a"), [(64, 0.05), (64, 1.8e-5), (256, 7e-7), (16, 0.02)])
def test_mixture_r_is_near_the_narrowest_width_at_n_opt(n_opt, a):
    grid = np.exp(np.linspace(math.log(n_opt) - 12, math.log(n_opt) + 6, 20001))
    best = min(_radius_by_hand(n_opt, 1.0, a, r) for r in grid[::20])
    assert float(cs_radius(n_opt, 1.0, a, mixture_r(n_opt, a))) <= best * 1.001


def test_alpha_spent_over_looks_and_references_sums_to_alpha():
    k = np.arange(1, 200001, dtype=float)
    spent = np.cumsum(k * pair_alpha(0.02, k))  # look k tests k references at pair_alpha each
    assert spent[-1] <= 0.02
    assert spent[-1] == pytest.approx(0.02 * (1 - 1 / 200001), rel=1e-9)  # sum 1/(k(k+1)) telescopes
    assert spent[0] == pytest.approx(0.01)
    # with a warm-up of 5 checkpoints the first judged look has 5 references and spends alpha / 2 over them
    j = k[:-5]
    spent = np.cumsum((j + 4) * pair_alpha(0.02, j + 4, j))
    assert spent[0] == pytest.approx(0.01) and spent[-1] <= 0.02
    assert float(pair_alpha(0.02, 5, 1)) == pytest.approx(0.02 / 2 / 5)


def test_a_planned_horizon_spends_evenly_then_keeps_a_tail():
    # horizon 20: looks 1..20 get 1/21 each (20/21 in all); looks 21, 22, ... get 1/(j (j + 1)), which telescopes to
    # 1/21: the shares still sum to 1 however long the run goes on
    j = np.arange(1, 400001, dtype=float)
    w = look_weight(j, 20)
    assert w[:20] == pytest.approx(np.full(20, 1 / 21)) and w[20] == pytest.approx(1 / (21 * 22))
    assert w.sum() == pytest.approx(1.0 - 1 / 400001, rel=1e-9) and w.sum() <= 1.0
    # the 15th look of 20 planned, 15 references: 0.02 / 21 / 15 (without a plan: 0.02 / (15 * 16) / 15)
    assert float(pair_alpha(0.02, 15, 15, 20)) == pytest.approx(0.02 / 21 / 15)
    assert float(pair_alpha(0.02, 15, 15, 0)) == pytest.approx(0.02 / 240 / 15)
    # a warm-up of 3 with 17 planned judged looks: the checkpoint with 5 earlier ones is the 3rd judged look
    assert float(pair_alpha(0.02, 5, 3, 17)) == pytest.approx(0.02 / 18 / 5)


def test_fixed_count_bound_by_hand():
    # one-sided t bound at a / looks: n 64, SD 0.8, a 3e-5, 3 looks -> t_{63} upper 1e-5 quantile x 0.8 / 8
    assert float(fixed_radius(64, 0.8, 3e-5, 3)) == pytest.approx(stats.t.isf(1e-5, 63) * 0.1, rel=1e-12)
    # it is about 4.6 SEs there, narrower than the sequence at the same level tuned for 64 prompts (about 5.2)
    se = 0.8 / 8
    assert 4.4 < float(fixed_radius(64, 0.8, 3e-5, 3)) / se < 4.8
    assert float(cs_radius(64, 0.8, 3e-5, mixture_r(64, 3e-5))) / se > 5.0


def test_the_sequence_holds_at_every_prompt_count_where_a_peeked_interval_does_not():
    """A single sequence, looked at after every prompt from 10 to 1000: it misses the true mean at some look in
    at most alpha of the streams; the fixed-n 90% interval, looked at as often, misses in far more."""
    rng = np.random.default_rng(7)
    alpha, streams, n_max, n_min = 0.1, 2000, 1000, 10
    x = rng.normal(0.3, 1.7, size=(streams, n_max))
    n = np.arange(1, n_max + 1)
    mean = np.cumsum(x, axis=1) / n
    sd = np.sqrt(np.maximum(np.cumsum(x * x, axis=1) / n - mean**2, 0.0) * n / np.maximum(n - 1, 1))
    looks = slice(n_min - 1, None)
    cs_miss = (np.abs(mean - 0.3) > cs_radius(n, sd, alpha, mixture_r(64, alpha)))[:, looks].any(axis=1)
    naive_miss = (np.abs(mean - 0.3) > 1.645 * sd / np.sqrt(n))[:, looks].any(axis=1)
    bound = stats.binom.isf(0.001, streams, alpha)
    print(f"\nsequence misses in {cs_miss.sum()}/{streams} streams, a peeked 90% interval in {naive_miss.sum()}")
    assert cs_miss.sum() <= bound
    assert cs_miss.sum() >= 1  # not vacuous: the sequence is tight enough to be crossed sometimes
    assert naive_miss.mean() > 4 * alpha


# --------------------------------------------------------------------------- healthy runs: the false-stop bound


def _runs(rng, runs: int, steps: int, prompts: int, mu: np.ndarray, noise: float = 0.3, tails: float = 0.0,
          binary: bool = False):
    """Scores[runs, steps, prompts]: a fixed difficulty per prompt (SD 1), the checkpoint's quality mu[t], and
    sampling noise (normal SD `noise`, or Student-t with `tails` degrees of freedom scaled to that SD); `binary`:
    pass/fail, 1 where that sum is > 0 (a pass@1 gate: most prompts pass or fail at every checkpoint alike)."""
    difficulty = rng.normal(0.0, 1.0, size=(runs, 1, prompts))
    if tails:
        e = rng.standard_t(tails, size=(runs, steps, prompts)) * noise / math.sqrt(tails / (tails - 2))
    else:
        e = rng.normal(0.0, noise, size=(runs, steps, prompts))
    y = difficulty + mu[None, :, None] + e
    return (y > 0).astype(float) if binary else y


def _healthy_curves(steps: int, margin: float) -> dict[str, tuple[float, np.ndarray]]:
    """name -> (margin the rule is run with, quality per checkpoint): healthy by that margin."""
    t = np.linspace(0.0, 1.0, steps)
    return {
        # no margin: any real decline would be a fair stop, so these are the tightest healthy runs
        "flat, margin 0": (0.0, np.zeros(steps)),
        "rise then plateau, margin 0": (0.0, np.minimum(t, 0.5)),
        # slides down by exactly the margin over the run: no pair is worse by more than the margin
        "decline of the margin": (margin, -margin * t),
        "rise, then fall by 0.9 margin": (margin, np.where(t < 0.5, t, 0.5 - 0.9 * margin * (t - 0.5) / 0.5)),
    }


# how the bound is built -> (PairedStop parameters, prompts per checkpoint, prompt counts every pair is judged at)
MECHANISMS = {
    # the confidence sequence over prompts, alpha / (j (j + 1)) over looks: valid at any number of prompt counts
    "sequence, no horizon": (lambda steps: {"prompt_looks": 0, "extend_factor": 0.0}, 64, None),
    # the defaults with the run's planned looks: a t bound over the gate's 3 counts, alpha / (horizon + 1) per look;
    # every pair judged at 64, 96 and 128 prompts at every look (the extension's worst case)
    "defaults, planned horizon, every pair extended": (lambda steps: {"horizon": steps - 1}, 128, (64, 96, 128)),
}


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("steps", [10, 30, 100])
def test_coverage_healthy_runs_are_stopped_at_most_alpha(steps, mechanism):
    """The rule at its default alpha 0.02, with no margin or a margin of 0.1, on healthy runs of 10, 30 and 100
    checkpoints: every earlier checkpoint is a candidate reference, the kept one is the best so far. Stops <= alpha
    within a binomial bound (one-sided, 0.1%)."""
    params, prompts, counts = MECHANISMS[mechanism]
    rng = np.random.default_rng(steps + (1000 if counts else 0))
    runs = {10: 1000, 30: 600, 100: 300}[steps]
    bound = stats.binom.isf(0.001, runs, 0.02)
    for case, (margin, mu) in _healthy_curves(steps, 0.1).items():
        det = PairedStop(alpha=0.02, margin=margin, **params(steps))
        for noise in ("normal", "t5", "pass/fail"):
            y = _runs(rng, runs, steps, prompts, mu, tails=5.0 if noise == "t5" else 0.0,
                      binary=noise == "pass/fail")
            stop, _ = det.scan_scores(y, counts)
            print(f"\n{mechanism}, {steps} checkpoints, {case}, {noise} noise: "
                  f"{int((stop >= 0).sum())}/{runs} healthy runs stopped (bound {bound:g})")
            assert (stop >= 0).sum() <= bound, case


@pytest.mark.parametrize("warmup", [0, 5])
def test_coverage_at_a_loose_alpha_is_still_bounded(warmup):
    """alpha 0.2, no margin, flat runs of 30 checkpoints with 16 prompts: the bound holds where it is nearer to
    being used (the sequence plugs in the SD of few prompts); with a warm-up too (its spending starts later)."""
    rng = np.random.default_rng(3 + warmup)
    det = PairedStop(alpha=0.2, margin=0.0, warmup=warmup)
    runs = 1500
    stop, _ = det.scan_scores(_runs(rng, runs, 30, 16, np.zeros(30)))
    print(f"\nalpha 0.2, warm-up {warmup}, 16 prompts, 30 flat checkpoints: {int((stop >= 0).sum())}/{runs} stopped")
    assert (stop >= 0).sum() <= stats.binom.isf(0.001, runs, 0.2)
    assert (stop < 0).all() or stop[stop >= 0].min() >= max(1, warmup)


@pytest.mark.parametrize(("horizon", "warmup"), [(9, 0), (5, 5)])
def test_a_run_longer_than_its_horizon_keeps_the_bound(horizon, warmup):
    """alpha 0.2, flat runs of 30 checkpoints planned for far fewer looks (and a warm-up): the looks past the plan
    spend the tail, so stops stay <= alpha; with every pair judged at 3 prompt counts (16, 24, 32 prompts)."""
    rng = np.random.default_rng(21 + horizon)
    det = PairedStop(alpha=0.2, horizon=horizon, warmup=warmup)
    runs = 1500
    stop, _ = det.scan_scores(_runs(rng, runs, 30, 32, np.zeros(30)), counts=(16, 24, 32))
    print(f"\nalpha 0.2, horizon {horizon}, warm-up {warmup}, 30 flat checkpoints: {int((stop >= 0).sum())}/{runs}")
    assert (stop >= 0).sum() <= stats.binom.isf(0.001, runs, 0.2)
    assert (stop >= 0).sum() >= 0.2 * runs / 4  # the planned looks do spend most of alpha: not vacuous
    assert (stop >= 0).any() and (stop[stop >= 0] > horizon + max(1, warmup) - 1).any()  # and the tail is used


# --------------------------------------------------------------------------- a margin relative to the run's gain
RHO = 0.3


def _relative_healthy_curves(steps: int, rho: float) -> dict[str, tuple[float, np.ndarray]]:
    """name -> (absolute margin m, quality per checkpoint), healthy at relative margin rho and margin m: no checkpoint
    falls below an earlier one s by more than rho x max(0, s's gain over the first checkpoint) + m. The first
    checkpoint sits at -1 or +1, not 0, so a contrast that forgot to subtract it would be off by rho x that level."""
    t = np.linspace(0.0, 1.0, steps)
    rise = np.minimum(t / 0.4, 1.0)  # gains 1 by 40% of the run
    fall = np.clip((t - 0.4) / 0.6, 0.0, 1.0)
    return {
        # rises by 1, then falls by exactly rho x the gain: the peak pair's contrast has mean 0 (the tightest case)
        "rise 1, fall rho x gain, from -1": (0.0, -1.0 + rise - rho * fall),
        "rise 1, fall 0.9 rho x gain, from +1": (0.0, 1.0 + rise - 0.9 * rho * fall),
        # never gains: slides m = 0.1 below its start (every reference's gain is negative; the pair (0, last) is
        # exactly at the margin, and the contrast with a reference below the start is no tighter than it)
        "slide 0.1 below the start, margin 0.1": (0.1, -1.0 - 0.1 * t),
    }


@pytest.mark.parametrize("mechanism", list(MECHANISMS))
@pytest.mark.parametrize("steps", [10, 30, 100])
def test_coverage_at_a_relative_margin(steps, mechanism):
    """relative_margin 0.3: healthy runs (no checkpoint below an earlier one by more than 0.3 x that one's gain over
    the first) are stopped at most alpha of the time (binomial bound, one-sided 0.1%), at 10, 30 and 100 checkpoints,
    every earlier checkpoint a candidate reference; the same runs at margin 0 (which they are not healthy for) are
    stopped far more often, so the relative margin is what keeps them."""
    params, prompts, counts = MECHANISMS[mechanism]
    rng = np.random.default_rng(500 + steps + (1000 if counts else 0))
    runs = {10: 600, 30: 400, 100: 200}[steps]
    bound = stats.binom.isf(0.001, runs, 0.02)
    plain = PairedStop(alpha=0.02, **params(steps))
    for case, (margin, mu) in _relative_healthy_curves(steps, RHO).items():
        det = PairedStop(alpha=0.02, margin=margin, relative_margin=RHO, **params(steps))
        for noise in ("normal", "t5"):
            y = _runs(rng, runs, steps, prompts, mu, noise=0.1, tails=5.0 if noise == "t5" else 0.0)
            stop, _ = det.scan_scores(y, counts)
            print(f"\nrelative margin {RHO}, {mechanism}, {steps} checkpoints, {case}, {noise} noise: "
                  f"{int((stop >= 0).sum())}/{runs} healthy runs stopped (bound {bound:g})")
            assert (stop >= 0).sum() <= bound, case
            if case.startswith("rise 1, fall rho"):
                assert (plain.scan_scores(y, counts)[0] >= 0).mean() > 0.5  # a real fall: margin 0 stops it


@pytest.mark.parametrize(("case", "mu"), [
    # flat at -1: every pair's contrast has mean exactly 0, so the whole alpha is at stake at every look
    ("flat at -1", np.full(30, -1.0)),
    # gains 1 at once, then sits exactly rho x that gain lower: the pair (1, k) is at its margin at every look
    ("jump 1, then rho x gain lower", np.concatenate([[1.0, 2.0], np.full(28, 2.0 - RHO)])),
])
def test_relative_margin_coverage_at_a_loose_alpha(case, mu):
    """alpha 0.2, relative margin 0.3, 16 prompts, 30 checkpoints: where the bound is near being used, stops stay
    <= alpha (binomial bound) and, on the flat run, are not vacuously rare."""
    rng = np.random.default_rng(17)
    runs = 1500
    stop, _ = PairedStop(alpha=0.2, relative_margin=RHO).scan_scores(_runs(rng, runs, 30, 16, mu))
    print(f"\nalpha 0.2, relative margin {RHO}, 16 prompts, {case}: {int((stop >= 0).sum())}/{runs} stopped")
    assert (stop >= 0).sum() <= stats.binom.isf(0.001, runs, 0.2)
    if case.startswith("flat"):
        assert (stop >= 0).sum() >= 0.2 * runs / 4


def test_relative_margin_power_a_fall_beyond_it_is_stopped():
    """A run that rises by 1 from +1 and then falls by 0.6 (twice rho x its gain) is stopped, after the fall passes
    rho x the gain, keeping the peak; the monitor agrees with the scan run by run."""
    rng = np.random.default_rng(31)
    mu = np.concatenate([1.0 + 0.125 * np.arange(9), 2.0 - 0.075 * np.arange(1, 9)])
    peak = int(np.argmax(mu))
    y = _runs(rng, 200, len(mu), 64, mu, noise=0.1)
    det = PairedStop(alpha=0.02, relative_margin=RHO)
    stop, kept = det.scan_scores(y)
    stopped = stop >= 0
    assert stopped.mean() >= 0.95 and (kept[stopped] == peak).all()
    assert (mu[peak] - mu[stop[stopped]] > RHO * (mu[peak] - mu[0])).all()  # never before the fall passed the margin
    for r in range(20):
        t, mon = _feed(det, y[r])
        assert t == stop[r] and (t < 0 or mon.kept_step == 5.0 * kept[r])


def _contrast_case(rho: float, margin: float):
    """Three checkpoints on 8 prompts (difficulty b): the first, a reference 1.0 above it, the current 0.4 below the
    reference, with small per-prompt wobbles e1, e2 (exactly mean 0)."""
    b = np.array([0.0, 1.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0])
    e1 = 0.01 * np.array([1, -1, 1, -1, 1, -1, 1, -1])
    e2 = 0.01 * np.array([1, 1, -1, -1, 1, 1, -1, -1])
    rows = np.array([b, b + 1.0 + e1, b + 0.6 + e2])
    return _feed(PairedStop(alpha=0.02, margin=margin, min_prompts=4, relative_margin=rho), rows)


def test_relative_margin_contrast_by_hand():
    """The contrast at rho 0.2 for the pair (reference step 5, current step 10), worked by hand: c = y2 - 0.8 y1 -
    0.2 y0 = -0.2 + e2 - 0.8 e1 per prompt = -0.2 + 0.01 x (0.2, 1.8, -1.8, -0.2, 0.2, 1.8, -1.8, -0.2): mean -0.2,
    sum of squared deviations 2 x (0.04 + 3.24 + 3.24 + 0.04) x 1e-4 = 13.12e-4 over 7. Its level at the third
    checkpoint (2 references, no horizon): 0.02 / (2^2 x 3), over 3 prompt counts: the t bound at 0.02 / 36."""
    c_sd = math.sqrt(13.12e-4 / 7)
    c_upper = -0.2 + stats.t.isf(0.02 / 36, 7) * c_sd / math.sqrt(8)
    assert -0.18 < c_upper < -0.16
    stop, mon = _contrast_case(0.2, 0.0)
    assert stop == 2 and mon.kept_step == 5.0
    pair = {c.reference_step: c for c in mon.comparisons}[5.0]
    assert pair.mean == pytest.approx(-0.4) and pair.c_mean == pytest.approx(-0.2)
    assert pair.c_upper == pytest.approx(c_upper, rel=1e-9)
    # against the first checkpoint the contrast is the plain difference: 0.6 + e2, mean 0.6
    first = {c.reference_step: c for c in mon.comparisons}[0.0]
    assert first.c_mean == pytest.approx(0.6) and first.c_upper == pytest.approx(first.upper)
    # margin 0.18: the contrast's bound (-0.17) is above -0.18, so no stop at rho 0.2, though the plain difference's
    # (-0.4 plus about 0.03) is far below it: at rho 0 the same margin stops
    assert _contrast_case(0.2, 0.18)[0] == -1
    assert _contrast_case(0.0, 0.18)[0] == 2
    # rho 0.5: the fall (0.4) is less than half the gain (1.0): the contrast's mean is +0.1, never a stop
    stop, mon = _contrast_case(0.5, 0.0)
    assert stop == -1 and {c.reference_step: c for c in mon.comparisons}[5.0].c_mean == pytest.approx(0.1)


def test_relative_margin_extend_names_the_first_checkpoint():
    """A close call at rho 0.2 asks for more prompts for the first checkpoint, the reference and the current one;
    the replay's budget arithmetic reads the steps it names."""
    rng = np.random.default_rng(13)
    b = rng.normal(size=64)
    noise = rng.normal(size=(3, 64))
    noise = (noise - noise.mean(axis=1, keepdims=True)) / noise.std(axis=1, ddof=1, keepdims=True)
    # the contrast y2 - 0.8 y1 - 0.2 y0 has mean 0.6 - 0.8 = -0.2 and per-prompt SD about 0.4 x sqrt(1 + 0.64 +
    # 0.04) = 0.52: about 3 SEs on 64 prompts (the bound needs about 4.5), about 6 on 4 x 64 (EXTEND)
    rows = np.array([b + 0.4 * noise[0], b + 1.0 + 0.4 * noise[1], b + 0.6 + 0.4 * noise[2]])
    mon = PairedStop(alpha=0.02, relative_margin=0.2).start()
    for t, row in enumerate(rows):
        stopped = mon.observe_scores(5.0 * t, row)
    assert not stopped and mon.verdict is Verdict.EXTEND
    assert mon.pair == (0.0, 5.0, 10.0)


# --------------------------------------------------------------------------- power and the kept checkpoint


def test_power_a_clear_decline_is_stopped_and_the_pre_decline_best_kept():
    rng = np.random.default_rng(11)
    margin = 0.1
    det = PairedStop(alpha=0.02, margin=margin)
    # rises by 0.25 a checkpoint to its peak at index 8, then falls by 0.25 a checkpoint (paired SE about 0.05)
    mu = np.concatenate([0.25 * np.arange(9), 2.0 - 0.25 * np.arange(1, 12)])
    peak = int(np.argmax(mu))
    runs = 1000
    stop, kept = det.scan_scores(_runs(rng, runs, len(mu), 64, mu))
    stopped = stop >= 0
    print(f"\npower: {int(stopped.sum())}/{runs} declining runs stopped, kept the peak in "
          f"{int((kept[stopped] == peak).sum())}, stop at {np.bincount(stop[stopped]).nonzero()[0].tolist()}")
    assert stopped.mean() >= 0.99
    assert (kept[stopped] == peak).mean() >= 0.99
    assert (stop[stopped] > peak).all()
    assert mu[peak] - mu[stop[stopped]].max() > margin  # it stopped past the margin, never before


# --------------------------------------------------------------------------- the monitor


def _feed(det: PairedStop, scores: np.ndarray, steps=None) -> tuple[int, object]:
    mon = det.start()
    steps = np.arange(len(scores)) * 5.0 if steps is None else steps
    for t, row in enumerate(scores):
        cp = Checkpoint(step=float(steps[t]), eval_score=float(row.mean()))
        if mon.observe(cp, {f"q{j:03d}": v for j, v in enumerate(row)}):
            return t, mon
    return -1, mon


def test_score_vectors_are_prompts_by_position():
    rng = np.random.default_rng(9)
    y = _runs(rng, 1, 12, 32, np.concatenate([np.linspace(0, 1, 6), 1 - np.linspace(0, 1.5, 7)[1:]]))[0]
    by_id, _ = _feed(PairedStop(), y)
    mon = PairedStop().start()
    by_vector = next((t for t, row in enumerate(y) if mon.observe(Checkpoint(step=5.0 * t, eval_score=0.0), row)), -1)
    assert by_id == by_vector == int(PairedStop().scan_scores(y[None])[0][0]) > 5


def test_identical_checkpoints_never_stop():
    rng = np.random.default_rng(0)
    row = rng.normal(size=64)
    for det in (PairedStop(), PairedStop(alpha=0.5, margin=0.0, min_prompts=2)):
        stop, mon = _feed(det, np.tile(row, (60, 1)))
        assert stop == -1 and mon.verdict is Verdict.CONTINUE
        assert all(c.n == 64 and c.mean == 0.0 and c.sd == 0.0 for c in mon.comparisons)
        s, _ = det.scan_scores(np.tile(row, (5, 60, 1)))
        assert (s == -1).all()


@pytest.mark.parametrize("warmup", [0, 4])
def test_monitor_and_scan_agree(warmup):
    rng = np.random.default_rng(5)
    det = PairedStop(alpha=0.05, margin=0.05, warmup=warmup)
    mu = np.concatenate([np.linspace(0, 1, 12), 1 - np.linspace(0, 0.8, 13)[1:]])
    y = np.concatenate([_runs(rng, 30, len(mu), 32, mu), _runs(rng, 30, len(mu), 32, np.zeros(len(mu)))])
    stop, kept = det.scan_scores(y)
    assert (stop[:30] >= 0).all()
    for r in range(len(y)):
        t, mon = _feed(det, y[r])
        assert t == stop[r]
        if t >= 0:
            assert mon.verdict is Verdict.STOP and mon.kept_step == 5.0 * kept[r]


def test_the_kept_checkpoint_is_the_one_the_current_is_furthest_below():
    det = PairedStop(alpha=0.02, margin=0.0, min_prompts=4)
    base = np.array([0.0, 1.0, 2.0, 3.0, 0.5, 1.5, 2.5, 3.5])
    wobble = np.array([0.01, -0.01, 0.02, -0.02, 0.0, 0.01, -0.01, 0.0])
    noisy = 0.3 * np.array([1.0, -1.0] * 4)
    rows = np.array([base, base + 0.5 + wobble, base + 0.45 + noisy, base - 1.0 + wobble])
    stop, mon = _feed(det, rows, steps=[10.0, 20.0, 30.0, 40.0])
    # step 30 is 0.05 below step 20 on average, far inside its noise: no stop there. The last checkpoint is
    # below all three; by most (1.5 a prompt, exactly) below step 20's, which is the one kept
    assert stop == 3 and mon.kept_step == 20.0
    assert {c.reference_step: round(c.mean, 6) for c in mon.comparisons} == {10.0: -1.0, 20.0: -1.5, 30.0: -1.45}


def test_extend_then_more_prompts_settle_it():
    """A decline the first 16 prompts cannot tell from noise: the verdict is EXTEND for (best, current); scoring
    the pool's next prompts for those two checkpoints makes the same decline certain (the confidence sequence:
    any number of prompt counts, extend on any decline)."""
    rng = np.random.default_rng(2)
    det = PairedStop(alpha=0.02, margin=0.0, min_prompts=10, prompt_looks=0, extend_factor=0.0, relative_margin=0.0)
    pool = 400
    difficulty = rng.normal(size=pool)
    y0 = difficulty + rng.normal(0.0, 0.3, pool)
    y1 = difficulty + 0.5 + rng.normal(0.0, 0.3, pool)  # the best
    y2 = difficulty + 0.35 + rng.normal(0.0, 0.3, pool)  # 0.15 below the best: about 1.4 SE on 16 prompts
    ids = [f"q{j:03d}" for j in range(pool)]
    mon = det.start()
    for step, y in ((0.0, y0), (10.0, y1), (20.0, y2)):
        cp = Checkpoint(step=step, eval_score=float(y[:16].mean()))
        stopped = mon.observe(cp, dict(zip(ids[:16], y[:16], strict=True)))
    assert not stopped and mon.verdict is Verdict.EXTEND and mon.wants_more_evidence()
    assert mon.pair == (10.0, 20.0)
    n = 16
    while not mon.recheck() and n < pool:
        ref, cur = mon.pair
        batch = slice(n, n + 16)
        mon.add_scores(ref, dict(zip(ids[batch], y1[batch], strict=True)))
        mon.add_scores(cur, dict(zip(ids[batch], y2[batch], strict=True)))
        n += 16
    assert mon.verdict is Verdict.STOP and mon.kept_step == 10.0
    assert 16 < n < pool


def _batches(y: np.ndarray, lo: int, hi: int) -> dict[str, float]:
    return {f"q{j:03d}": float(y[j]) for j in range(lo, hi)}


@pytest.mark.parametrize(("horizon", "rho"), [(0, 0.0), (23, 0.0), (23, 0.125)])
def test_monitor_with_every_pair_extended_agrees_with_scan(horizon, rho):
    """Each checkpoint observed on its 64 gate prompts, then given the pool's two batches of 32 with a recheck after
    each: every pair is judged at 64, 96 and 128 prompts, which `scan_scores(counts=(64, 96, 128))` computes at
    once; stops and kept checkpoints agree run by run (with the relative margin too: its contrast's SD from the
    cross-products in the scan, from the prompts in the monitor)."""
    rng = np.random.default_rng(8)
    mu = np.concatenate([np.linspace(0, 0.6, 12), 0.6 - np.linspace(0, 0.25, 13)[1:]])
    y = np.concatenate([_runs(rng, 20, len(mu), 128, mu, noise=0.5), _runs(rng, 10, len(mu), 128, np.zeros(len(mu)))])
    det = PairedStop(alpha=0.05, horizon=horizon, relative_margin=rho)
    stop, kept = det.scan_scores(y, counts=(64, 96, 128))
    assert 5 <= (stop[:20] >= 0).sum() < 20  # a mix of stopped and not: the comparison means something
    for r in range(len(y)):
        mon, got = det.start(), -1
        for t in range(len(mu)):
            done = mon.observe_scores(5.0 * t, _batches(y[r, t], 0, 64))
            for lo in (64, 96):
                if done:
                    break
                mon.add_scores(5.0 * t, _batches(y[r, t], lo, lo + 32))
                done = mon.recheck()
            if done:
                got = t
                break
        assert got == stop[r]
        if got >= 0:
            assert mon.kept_step == 5.0 * kept[r]


def test_a_pair_is_judged_at_no_more_than_prompt_looks_counts():
    """A decline of 0.3 with SD 1 per prompt: unclear on 16 prompts, certain on 400. With prompt_looks 2 the pair
    is judged at 16 and 32 prompts only: more prompts for it are ignored (the union covers 2 counts) and it never
    stops; with prompt_looks 0 (the sequence: any count) the same prompts stop it."""
    rng = np.random.default_rng(4)
    pool = 400
    y0 = rng.normal(size=pool)
    y1 = y0 - 0.3 + rng.normal(0.0, 1.0, pool)
    for looks, stops in ((2, False), (0, True)):
        mon = PairedStop(alpha=0.02, prompt_looks=looks, extend_factor=0.0).start()
        mon.observe_scores(0.0, _batches(y0, 0, 16))
        assert not mon.observe_scores(1.0, _batches(y1, 0, 16))
        counts = {c.n for c in mon.comparisons}
        for lo in range(16, pool, 16):
            mon.add_scores(0.0, _batches(y0, lo, lo + 16))
            mon.add_scores(1.0, _batches(y1, lo, lo + 16))
            if mon.recheck():
                break
            counts |= {c.n for c in mon.comparisons}
        assert mon.verdict is (Verdict.STOP if stops else Verdict.CONTINUE)
        if looks:
            assert counts == {16, 32}


def test_extend_only_where_more_prompts_could_settle_it():
    """extend_factor 4: EXTEND when the same mean and SD on 4x the prompts would put the bound below -margin, worked
    out by hand with the t bound; a small dip (there CONTINUE) still asks for more with extend_factor 0."""
    rng = np.random.default_rng(12)
    base = rng.normal(size=64)
    noise = rng.normal(size=64)
    noise = (noise - noise.mean()) / noise.std(ddof=1)  # exactly mean 0, SD 1
    for drop, sd in ((0.03, 0.3), (0.13, 0.5), (0.5, 0.5)):
        cur = base - drop + sd * noise  # d = cur - base: mean -drop, SD sd exactly
        a = 0.02 / 2  # the first judged look, one reference, no horizon: alpha / (1 * 2) / 1
        settled_now = bool(-drop + stats.t.isf(a / 3, 63) * sd / 8 < 0)
        settled_4x = bool(-drop + stats.t.isf(a / 3, 255) * sd / 16 < 0)
        for factor in (4.0, 0.0):
            mon = PairedStop(alpha=0.02, extend_factor=factor).start()
            mon.observe_scores(0.0, base)
            stopped = mon.observe_scores(1.0, cur)
            assert stopped is settled_now
            if not settled_now:
                want = settled_4x if factor else True
                assert mon.wants_more_evidence() is want, (drop, sd, factor)
                assert mon.verdict is (Verdict.EXTEND if want else Verdict.CONTINUE)
    # the cases above cover each branch: (0.03, 0.3) neither, (0.13, 0.5) only with 4x, (0.5, 0.5) settled now
    assert not (-0.03 + stats.t.isf(0.01 / 3, 255) * 0.3 / 16 < 0)
    assert -0.13 + stats.t.isf(0.01 / 3, 255) * 0.5 / 16 < 0 < -0.13 + stats.t.isf(0.01 / 3, 63) * 0.5 / 8
    assert -0.5 + stats.t.isf(0.01 / 3, 63) * 0.5 / 8 < 0


def test_means_alone_and_few_prompts_never_stop():
    det = PairedStop()
    mon = det.start()
    for t, e in enumerate([1.0, 0.0, -5.0, -10.0]):
        assert not mon.observe(Checkpoint(step=float(t), eval_score=e))
    stop, _ = _feed(det, np.array([[1.0] * 9, [0.0] * 9, [-1.0] * 9]))  # 9 prompts < min_prompts 10
    assert stop == -1


@pytest.mark.parametrize("bad", [{"alpha": 0.0}, {"alpha": 1.0}, {"margin": -0.1}, {"margin": math.inf},
                                 {"min_prompts": 1}, {"warmup": -1}, {"horizon": -1}, {"prompt_looks": -1},
                                 {"extend_factor": 1.0}, {"extend_factor": -2.0}, {"extend_factor": math.nan},
                                 {"relative_margin": -0.1}, {"relative_margin": 1.0},
                                 {"relative_margin": math.nan}])
def test_parameters_are_checked(bad):
    with pytest.raises(ValueError, match="paired"):
        PairedStop(**bad)
