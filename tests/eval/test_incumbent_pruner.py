"""The incumbent pruner (eval/incumbent_pruner.py): what alpha bounds, by simulation with known truth (a trial whose
true curve reaches the reference's recorded score is pruned at most alpha of the time, the reference being the best
of several noisy finished trials as a sweep has it), its power against trials truly worse, the bound and the
allowance against hand computations, and the Optuna integration through real studies in both directions."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from scipy import stats

from eval.incumbent_pruner import IncumbentPruner, allowance, decide, look_level, make, mean_of, upper_bound
from eval.optuna_pruner import best_value, report_checkpoint

optuna.logging.set_verbosity(optuna.logging.WARNING)

STEPS = list(range(3, 37, 3))  # the example sweep's 12 checkpoints
N_PROMPTS = 32
NOISE = 0.6  # per-prompt sampling noise of a gate score (the example's paired per-prompt SD is 0.7-1.1)
ALPHA = 0.05


def rise(level: float, tau: float) -> np.ndarray:
    """A true held-out curve that climbs from about -0.4 to `level` with time constant `tau` steps."""
    s = np.array(STEPS, dtype=float)
    return -0.4 + (level + 0.4) * (1 - np.exp(-s / tau)) / (1 - np.exp(-STEPS[-1] / tau))


def hack(peak: float) -> np.ndarray:
    """Over-optimises the proxy: peaks at step 9, then falls."""
    s = np.array(STEPS, dtype=float)
    return peak - 0.002 * (s - 9) ** 2


def simulate(rng, difficulty: np.ndarray, q: np.ndarray) -> list[tuple[int, dict[str, float]]]:
    """One trial's per-prompt gate scores: prompt difficulty (the same prompts for every trial) + the trial's true
    quality at the step + sampling noise."""
    x = difficulty[None, :] + q[:, None] + rng.normal(0.0, NOISE, (len(STEPS), len(difficulty)))
    return [(step, {str(i): float(v) for i, v in enumerate(row)}) for step, row in zip(STEPS, x, strict=True)]


def first_prune(trial, reference, history, **kw) -> int | None:
    """The look at which the rule prunes `trial` (its checkpoints revealed one by one), or None."""
    for k in range(1, len(trial) + 1):
        if decide(trial[:k], reference, history, alpha=ALPHA, **kw).prune:
            return k
    return None


def boundary_rate(reps: int, seed: int, *, finished: int = 3, margin: float = 0.0, **kw) -> float:
    """How often a challenger is pruned whose true curve, drawn from the same family as the finished trials', ends
    exactly at the reference's recorded mean + `margin` (the boundary of 'able to beat the reference'). The finished
    trials have random levels and speeds; the reference is the best checkpoint they recorded (a maximum over noisy
    checkpoints, as in a sweep); the challenger's speed is drawn like theirs, so the allowance (the largest
    improvement they showed) is an estimate, which the rate includes."""
    rng = np.random.default_rng(seed)
    pruned = 0
    for _ in range(reps):
        difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
        history = [simulate(rng, difficulty, rise(rng.uniform(0.2, 0.6), rng.uniform(4, 16))) for _ in range(finished)]
        reference = max((c for h in history for c in h), key=lambda c: mean_of(c[1]))[1]
        target = mean_of(reference) - float(np.mean(difficulty)) + margin  # the challenger's true last-step mean
        trial = simulate(rng, difficulty, rise(target, rng.uniform(4, 16)))
        pruned += first_prune(trial, reference, history, margin=margin, planned=len(STEPS), **kw) is not None
    return pruned / reps


def same_speed_rate(reps: int, seed: int, *, margin: float = 0.0, finished: int = 3, **kw) -> float:
    """As `boundary_rate`, but every trial climbs the same amount at the same speed from its own level (the levels
    differ), so the challenger improves exactly as fast as its history: the condition under which alpha is a bound.
    Its true curve ends at the reference's recorded mean + `margin`."""
    rng = np.random.default_rng(seed)
    pruned = 0
    for _ in range(reps):
        difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
        tau = rng.uniform(4, 16)
        shape = rise(0.5, tau) - 0.5  # climbs 0.9, ending at 0
        history = [simulate(rng, difficulty, shape + rng.uniform(0.2, 0.6)) for _ in range(finished)]
        reference = max((c for h in history for c in h), key=lambda c: mean_of(c[1]))[1]
        target = mean_of(reference) - float(np.mean(difficulty)) + margin
        trial = simulate(rng, difficulty, shape + target)
        pruned += first_prune(trial, reference, history, margin=margin, planned=len(STEPS), **kw) is not None
    return pruned / reps


def binomial_ceiling(reps: int, p: float) -> float:
    """The largest rate a true rate p gives in `reps` trials, but with probability 0.001."""
    return stats.binom.ppf(0.999, reps, p) / reps


def test_a_trial_that_would_reach_the_reference_is_pruned_at_most_alpha_of_the_time():
    # speeds drawn like the history's: measured on 2,000 runs, 2.5% at alpha 5% (window 3) and 0.25% (window 1)
    reps = 250
    assert boundary_rate(reps, seed=1) <= binomial_ceiling(reps, ALPHA)
    assert boundary_rate(150, seed=3, window=1) <= binomial_ceiling(150, ALPHA)


@pytest.mark.parametrize("margin", [0.0, 0.2])
def test_a_trial_improving_as_fast_as_its_history_is_pruned_at_most_alpha_of_the_time_at_any_margin(margin):
    # the condition alpha needs holds by construction: measured on 1,000 runs (see docs/sweeps.md)
    reps = 200
    assert same_speed_rate(reps, seed=10 + int(10 * margin), margin=margin) <= binomial_ceiling(reps, ALPHA)


def test_without_the_allowance_the_bound_alone_does_not_hold():
    # boundary trials judged against a history that never improved (allowance 0) are pruned far more often than
    # alpha: the allowance is what carries the statement to the trial's future
    rng = np.random.default_rng(4)
    pruned = 0
    for _ in range(200):
        difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
        reference = simulate(rng, difficulty, rise(0.5, 8))[-1][1]
        trial = simulate(rng, difficulty, rise(mean_of(reference) - float(np.mean(difficulty)), 8))
        flat = [[(s, reference) for s in STEPS]] * 2  # a history that never improves: allowance 0
        pruned += first_prune(trial, reference, flat, planned=len(STEPS)) is not None
    assert pruned / 200 > 3 * ALPHA


def test_power_trials_truly_worse_or_hacking_are_pruned_early():
    rng = np.random.default_rng(5)
    looks = []
    for kind in ("worse", "hack"):
        for _ in range(60):
            difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
            history = [simulate(rng, difficulty, rise(0.6, rng.uniform(4, 8))) for _ in range(3)]
            reference = max((c for h in history for c in h), key=lambda c: mean_of(c[1]))[1]
            q = rise(-0.3, 8) if kind == "worse" else hack(0.0)
            looks.append(first_prune(simulate(rng, difficulty, q), reference, history, planned=len(STEPS)))
    assert sum(k is not None for k in looks) / len(looks) >= 0.95
    assert np.median([k for k in looks if k is not None]) <= 6  # half of them by step 18 of 36


def test_allowance_against_a_hand_computation():
    def series(means):
        return [(s, {"a": m, "b": m}) for s, m in zip(STEPS, means, strict=False)]

    # window 1: trial A rises 0.1 -> 0.5 after step 6, trial B only falls after step 6
    a = series([0.0, 0.1, 0.3, 0.5, 0.2])
    b = series([0.4, 0.3, 0.2, 0.1])
    assert allowance([a, b], 6, window=1, min_history=2) == pytest.approx(0.4)
    # window 2: A's two-checkpoint means 0.0, 0.05, 0.2, 0.4, 0.35 -> from step 6 (0.05) at most 0.4: 0.35
    assert allowance([a, b], 6, window=2, min_history=2) == pytest.approx(0.35)
    # B has nothing after step 12, A has: one trial of history is too little at min_history 2
    assert allowance([a, b], 12, window=1, min_history=2) is None
    assert allowance([a, b], 12, window=1, min_history=1) == pytest.approx(0.0)  # A only falls after step 12


def test_upper_bound_against_a_hand_computation():
    d = np.array([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, sd sqrt(5/3) = 1.29099, t(0.95, 3) = 2.35336 (tables): 2.5 + 2.35336 * 1.29099 / 2 = 4.01907
    assert upper_bound(d, 0.05) == pytest.approx(4.01907, abs=1e-4)
    assert upper_bound(np.zeros(10), 0.01) == 0.0  # identical checkpoints: the bound is the (zero) difference
    assert upper_bound(np.array([1.0]), 0.05) == math.inf
    assert sum(look_level(ALPHA, k) for k in range(1, 100_000)) == pytest.approx(ALPHA, rel=1e-4)
    assert sum(look_level(ALPHA, k, planned=12) for k in range(1, 100)) == pytest.approx(ALPHA)
    assert upper_bound(d, 0.0) == math.inf  # no level left: never prune


def test_the_decision_is_the_bound_plus_the_allowance_below_the_margin():
    # 32 prompts whose differences alternate -1.0 and -0.6 (window 1): mean -0.8, the t bound at alpha / 12 recomputed
    # here with scipy; the allowance 0.3 from a history that rose 0.3 after step 3; the rule at both sides of the margin
    ref = {str(i): 1.0 for i in range(32)}
    trial = [(3, {str(i): (0.0 if i % 2 else 0.4) for i in range(32)})]
    hist = [[(3, {"x": 0.0}), (6, {"x": 0.3})]] * 2  # allowance 0.3
    d = decide(trial, ref, hist, alpha=ALPHA, window=1, planned=12)
    se = np.std([-1.0, -0.6] * 16, ddof=1) / math.sqrt(32)
    assert d.upper == pytest.approx(-0.8 + stats.t.ppf(1 - ALPHA / 12, 31) * se)
    assert d.allowance == pytest.approx(0.3) and d.prune == (d.upper + 0.3 < 0)
    edge = d.upper + 0.3
    assert decide(trial, ref, hist, alpha=ALPHA, window=1, planned=12, margin=edge - 1e-6).prune is False
    assert decide(trial, ref, hist, alpha=ALPHA, window=1, planned=12, margin=edge + 1e-6).prune is True
    assert decide(trial, ref, hist[:1], alpha=ALPHA, window=1).prune is False  # too little history: never


def test_identical_checkpoints_and_the_last_planned_checkpoint_are_never_pruned():
    rng = np.random.default_rng(8)
    difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
    inc = simulate(rng, difficulty, rise(0.5, 8))
    hist = [inc, simulate(rng, difficulty, rise(0.3, 8))]
    assert not any(decide(inc[:k], inc[-1][1], hist).prune for k in range(1, 13))
    worse = simulate(rng, difficulty, rise(-1.5, 8))
    assert first_prune(worse, inc[-1][1], hist, planned=12) is not None
    assert not decide(worse, inc[-1][1], hist, planned=12).prune  # its 12th of 12: nothing left to save


def test_warmup_defers_every_prune():
    rng = np.random.default_rng(7)
    difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
    hist = [simulate(rng, difficulty, rise(0.5, 6)) for _ in range(2)]
    bad = simulate(rng, difficulty, rise(-1.5, 6))
    firsts = [k for k in range(1, 13) if decide(bad[:k], hist[0][-1][1], hist, n_warmup_steps=18).prune]
    assert firsts and STEPS[firsts[0] - 1] == 18


# ---------------------------------------------------------------------------------------------- through Optuna
def run_trial(study, ckpts, seen: list[int] | None = None, keep: str | None = None):
    trial = study.ask()
    for step, scores in ckpts:
        report_checkpoint(trial, step, float(np.mean(list(scores.values()))), prompts=scores, keep=keep,
                          planned_checkpoints=len(STEPS))
        if seen is not None:
            seen.append(step)
        if study.pruner.prune(study, study._storage.get_trial(trial._trial_id)):
            study.tell(trial, state=TrialState.PRUNED)
            return trial
    study.tell(trial, best_value(trial))
    return trial


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_through_optuna_a_worse_trial_is_pruned_and_a_better_one_completes(tmp_path, direction):
    # a minimising study of losses (the trial keeps its lowest): the same trials with every score negated
    sign = 1.0 if direction == "maximize" else -1.0
    rng = np.random.default_rng(9)
    difficulty = rng.normal(0.0, 0.6, N_PROMPTS)

    def flip(ckpts):
        return [(s, {p: sign * v for p, v in c.items()}) for s, c in ckpts]

    pruner = IncumbentPruner(alpha=ALPHA)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", direction=direction, pruner=pruner)
    first = run_trial(study, flip(simulate(rng, difficulty, rise(0.5, 6))))
    second = run_trial(study, flip(simulate(rng, difficulty, rise(0.4, 6))))
    seen: list[int] = []
    worse = run_trial(study, flip(simulate(rng, difficulty, hack(-1.0))), seen)
    better = run_trial(study, flip(simulate(rng, difficulty, rise(0.8, 6))))
    states = {t.number: t.state for t in study.trials}
    assert states[first.number] is TrialState.COMPLETE  # nothing to compare with: nothing is pruned
    assert states[second.number] is TrialState.COMPLETE  # one trial of history is too little (min_history 2)
    assert states[worse.number] is TrialState.PRUNED and len(seen) < len(STEPS)
    assert states[better.number] is TrialState.COMPLETE
    assert pruner.incumbent(study).number == better.number
    reason = pruner.reason(study, study.trials[worse.number])
    assert "cannot beat the sweep's best checkpoint" in reason and f"{N_PROMPTS} prompts paired" in reason


def test_a_minimising_sweep_that_keeps_each_trials_highest_score_agrees_with_the_pruner(tmp_path):
    # sweep trials keep their highest held-out score in either direction (training.job.lifecycle.best_of); a minimising
    # study ranks trials by it. Optuna's value (best_value, the intermediate values) is that highest score, and a
    # trial whose highest so far is already no lower than a finished trial's can only get worse: pruned there
    study = optuna.create_study(direction="minimize", pruner=IncumbentPruner())
    scores = {"first": [0.1, 0.3, 0.2], "second": [0.0, 0.2, 0.4]}
    out = {}
    for name, curve_ in scores.items():
        seen: list[int] = []
        ckpts = [(s, {str(i): v for i in range(8)}) for s, v in zip(STEPS, curve_, strict=False)]
        out[name] = (run_trial(study, ckpts, seen, keep="highest"), seen)
    first, second = study.trials
    assert first.state is TrialState.COMPLETE and first.value == pytest.approx(0.3)  # its highest, not 0.1
    assert first.intermediate_values == pytest.approx({3: 0.1, 6: 0.3, 9: 0.3})
    # second: highest 0.0, 0.2 (still below 0.3), then 0.4 >= 0.3 at step 9: pruned there, valued 0.4
    assert second.state is TrialState.PRUNED and out["second"][1] == [3, 6, 9] and second.value == pytest.approx(0.4)
    assert "can only get worse" in study.pruner.reason(study, second)


def test_trials_without_per_prompt_records_are_never_pruned():
    study = optuna.create_study(direction="maximize", pruner=IncumbentPruner())
    for value in (0.9, 0.5, 0.1):
        t = study.ask()
        for step in STEPS:
            report_checkpoint(t, step, value)
            assert not t.should_prune()
        study.tell(t, value)


def test_spec_params_are_checked():
    assert make({"alpha": 0.1, "margin": 0.02, "window": 2}).window == 2
    with pytest.raises(ValueError, match="unknown parameter 'alhpa'"):
        make({"alhpa": 0.05})
    for bad in ({"alpha": 1.5}, {"window": 0}, {"min_history": 0}, {"min_prompts": 1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            IncumbentPruner(**bad)
    with pytest.raises(ValueError, match="keep"):
        report_checkpoint(optuna.create_study().ask(), 1, 0.0, keep="best")
