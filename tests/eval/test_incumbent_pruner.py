"""The incumbent pruner (eval/incumbent_pruner.py): its error rate by simulation with known truth (the incumbent
chosen as the best of several finished trials, as a sweep chooses it), its power against trials that are truly
worse, its bound against a hand computation, and the Optuna integration through a real study."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from scipy import stats

from eval.incumbent_pruner import IncumbentPruner, decide, look_level, make, upper_bound
from eval.optuna_pruner import best_value, report_checkpoint

optuna.logging.set_verbosity(optuna.logging.WARNING)

STEPS = list(range(3, 37, 3))  # the example sweep's 12 checkpoints
N_PROMPTS = 32
ALPHA = 0.02


def curve(kind: str, shift: float = 0.0) -> np.ndarray:
    s = np.array(STEPS, dtype=float)
    if kind == "rise":  # a healthy run: held-out quality climbs and levels off
        q = 0.6 * (1 - np.exp(-s / 12))
    elif kind == "hack":  # over-optimises the proxy: peaks at step 6, then falls
        q = 0.35 - 0.02 * (s - 6) ** 2 / 3
    else:
        raise ValueError(kind)
    return q + shift


def simulate(rng, difficulty: np.ndarray, q: np.ndarray, noise: float) -> list[tuple[int, dict[str, float]]]:
    """One trial's per-prompt gate scores: prompt difficulty (shared by every trial: the same prompts) + the trial's
    true quality at the step + sampling noise."""
    x = difficulty[None, :] + q[:, None] + rng.normal(0.0, noise, (len(STEPS), len(difficulty)))
    return [(step, {str(i): float(v) for i, v in enumerate(row)}) for step, row in zip(STEPS, x, strict=True)]


def prune_rate(challenger: np.ndarray, reps: int, *, finished: int = 4, noise: float = 0.25, seed: int = 0,
               **kw) -> float:
    """How often a challenger with true curve `challenger` is pruned at some checkpoint, against the best of
    `finished` completed trials that all have the true curve `rise` (the incumbent: chosen by its best checkpoint's
    mean, so the selection the sweep makes is part of what is simulated)."""
    rng = np.random.default_rng(seed)
    pruned = 0
    for _ in range(reps):
        difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
        done = [simulate(rng, difficulty, curve("rise"), noise) for _ in range(finished)]
        incumbent = max(done, key=lambda t: max(np.mean(list(c.values())) for _, c in t))
        trial = simulate(rng, difficulty, challenger, noise)
        pruned += any(decide(trial[:k], incumbent, alpha=ALPHA, **kw).prune for k in range(1, len(trial) + 1))
    return pruned / reps


def binomial_ceiling(reps: int, p: float) -> float:
    """The largest rate a true rate p gives in `reps` trials, but with probability 0.001."""
    return stats.binom.ppf(0.999, reps, p) / reps


@pytest.mark.parametrize("planned", [None, len(STEPS)])
def test_a_trial_as_good_as_the_incumbent_is_pruned_at_most_alpha_of_the_time(planned):
    # the boundary case: the challenger's true curve equals the incumbent's at every step; 12 looks, alpha spent over
    # them (open-ended, or over the 12 planned). Without the spending (alpha at every look) the rate is ~2.5 alpha
    reps = 400
    rate = prune_rate(curve("rise"), reps, seed=1, planned=planned, finished=1)
    assert rate <= binomial_ceiling(reps, ALPHA), rate


@pytest.mark.parametrize("planned", [None, len(STEPS)])
def test_with_the_incumbent_chosen_as_the_best_of_four_the_rate_stays_near_alpha(planned):
    # the incumbent is the best of 4 finished trials with the same true curve: its measured scores are inflated by the
    # selection (winner's curse), which the per-look bounds do not know about. Measured on 1,500 runs: 1.8%
    # (open-ended) and 2.3% (planned) at alpha 2%; the docstring states it, this bounds it by 1.5 alpha
    reps = 300
    rate = prune_rate(curve("rise"), reps, seed=21, planned=planned)
    assert rate <= binomial_ceiling(reps, 1.5 * ALPHA), rate


def test_a_trial_better_than_the_incumbent_is_almost_never_pruned():
    assert prune_rate(curve("rise", +0.05), 200, seed=2) <= binomial_ceiling(200, ALPHA / 4)


def test_power_trials_truly_worse_or_hacking_are_pruned():
    assert prune_rate(curve("rise", -0.2), 100, seed=3) >= 0.95
    assert prune_rate(curve("hack"), 100, seed=4) >= 0.95


def test_the_margin_sets_the_improvement_a_trial_must_be_able_to_reach():
    # with margin 0.25, a trial that truly beats the incumbent by 0.25 is protected at level alpha; one that ties it
    # (cannot beat it by 0.25) is pruned most of the time
    assert prune_rate(curve("rise", +0.25), 200, seed=5, margin=0.25) <= binomial_ceiling(200, ALPHA)
    assert prune_rate(curve("rise"), 100, seed=6, margin=0.25) >= 0.8


def test_warmup_defers_every_prune():
    rng = np.random.default_rng(7)
    difficulty = rng.normal(0.0, 0.6, N_PROMPTS)
    inc = simulate(rng, difficulty, curve("rise"), 0.25)
    bad = simulate(rng, difficulty, curve("rise", -0.5), 0.25)
    firsts = [k for k in range(1, 13) if decide(bad[:k], inc, n_warmup_steps=18).prune]
    assert firsts and STEPS[firsts[0] - 1] == 18


def test_upper_bound_against_a_hand_computation():
    d = np.array([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, sd sqrt(5/3) = 1.29099, t(0.95, 3) = 2.35336 (tables): 2.5 + 2.35336 * 1.29099 / 2 = 4.01907
    assert upper_bound(d, 0.05) == pytest.approx(4.01907, abs=1e-4)
    assert upper_bound(np.zeros(10), 0.01) == 0.0  # identical checkpoints: the bound is the (zero) difference
    assert upper_bound(np.array([1.0]), 0.05) == math.inf
    assert sum(look_level(ALPHA, k) for k in range(1, 100_000)) == pytest.approx(ALPHA, rel=1e-4)
    assert sum(look_level(ALPHA, k, planned=12) for k in range(1, 100)) == pytest.approx(ALPHA)
    assert upper_bound(d, 0.0) == math.inf  # no level left: never prune


def test_identical_checkpoints_are_never_pruned():
    rng = np.random.default_rng(8)
    inc = simulate(rng, rng.normal(0.0, 0.6, N_PROMPTS), curve("rise"), 0.25)
    assert not any(decide(inc[:k], inc).prune for k in range(1, 13))


# ---------------------------------------------------------------------------------------------- through Optuna
def run_trial(study, ckpts, seen: list[int] | None = None):
    trial = study.ask()
    for step, scores in ckpts:
        report_checkpoint(trial, step, float(np.mean(list(scores.values()))), prompts=scores)
        if seen is not None:
            seen.append(step)
        if study.pruner.prune(study, study._storage.get_trial(trial._trial_id)):
            study.tell(trial, state=TrialState.PRUNED)
            return trial
    study.tell(trial, best_value(trial))
    return trial


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_through_optuna_a_worse_trial_is_pruned_and_a_better_one_completes(tmp_path, direction):
    sign = 1.0 if direction == "maximize" else -1.0
    rng = np.random.default_rng(9)
    difficulty = rng.normal(0.0, 0.6, N_PROMPTS)

    def flip(ckpts):
        return [(s, {p: sign * v for p, v in c.items()}) for s, c in ckpts]

    pruner = IncumbentPruner(alpha=ALPHA)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'o.db'}", direction=direction, pruner=pruner)
    first = run_trial(study, flip(simulate(rng, difficulty, curve("rise"), 0.25)))
    seen: list[int] = []
    worse = run_trial(study, flip(simulate(rng, difficulty, curve("hack"), 0.25)), seen)
    better = run_trial(study, flip(simulate(rng, difficulty, curve("rise", +0.1), 0.25)))
    states = {t.number: t.state for t in study.trials}
    assert states[first.number] is TrialState.COMPLETE  # no incumbent yet: nothing is pruned
    assert states[worse.number] is TrialState.PRUNED and len(seen) < len(STEPS)
    assert states[better.number] is TrialState.COMPLETE
    assert pruner.incumbent(study).number == better.number  # the incumbent moves to the best finished trial
    reason = pruner.reason(study, study.trials[worse.number])
    assert "cannot beat the incumbent" in reason and "prompts paired" in reason


def test_trials_without_per_prompt_records_are_never_pruned():
    study = optuna.create_study(direction="maximize", pruner=IncumbentPruner())
    for value in (0.9, 0.1):
        t = study.ask()
        for step in STEPS:
            report_checkpoint(t, step, value)
            assert not t.should_prune()
        study.tell(t, value)


def test_spec_params_are_checked():
    assert make({"alpha": 0.05, "margin": 0.02}).alpha == 0.05
    with pytest.raises(ValueError, match="unknown parameter 'alhpa'"):
        make({"alhpa": 0.05})
    with pytest.raises(ValueError, match="alpha"):
        IncumbentPruner(alpha=1.5)
