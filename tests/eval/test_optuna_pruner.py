"""The detectors as an Optuna pruner (eval/optuna_pruner.py), through Optuna's own API: study.optimize, ask/tell,
a real RDB storage. Expected stop steps are hand-computed (EvalStop k=2: the second consecutive decline) or a plain
replay of the detector the test writes itself."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from eval.detectors import Checkpoint, make_detector
from eval.optuna_pruner import DetectorPruner, best_value, report_checkpoint

optuna.logging.set_verbosity(optuna.logging.WARNING)

# held-out score per checkpoint (steps 10..60): peaks at step 20, then declines at 30 and 40 (EvalStop k=2 stops at
# 40: the second consecutive decline), recovers at 50
SCORES = [0.1, 0.5, 0.4, 0.3, 0.6, 0.7]
STEPS = [10, 20, 30, 40, 50, 60]


def objective_reporting(scores, rewards=None, se=0.05, log=None):
    def objective(trial):
        for i, (step, s) in enumerate(zip(STEPS, scores, strict=True)):
            report_checkpoint(trial, step, s, se=se, reward=rewards[i] if rewards else math.nan)
            if log is not None:
                log.append(step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return best_value(trial)

    return objective


def test_prunes_at_the_detectors_stop_and_values_the_best_checkpoint(tmp_path):
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    study = optuna.create_study(storage=storage, direction="maximize", pruner=DetectorPruner("evalstop", k=2))
    seen: list[int] = []
    study.optimize(objective_reporting(SCORES, log=seen), n_trials=1)
    t = optuna.load_study(study_name=study.study_name, storage=storage).trials[0]
    assert t.state is TrialState.PRUNED
    assert seen == [10, 20, 30, 40]  # stopped at the second consecutive decline, not later
    assert t.value == 0.5  # its best checkpoint (step 20), not the last reported score (0.3)
    assert t.intermediate_values == {10: 0.1, 20: 0.5, 30: 0.5, 40: 0.5}  # the kept checkpoint's score so far


def test_a_healthy_trial_completes_with_its_best():
    study = optuna.create_study(direction="maximize", pruner=DetectorPruner("evalstop", k=2))
    rising = [0.1, 0.2, 0.15, 0.3, 0.4, 0.35]  # single declines only
    study.optimize(objective_reporting(rising), n_trials=1)
    assert study.trials[0].state is TrialState.COMPLETE
    assert study.trials[0].value == 0.4


def test_plain_trial_report_works_on_the_values_alone():
    study = optuna.create_study(direction="maximize", pruner=DetectorPruner("evalstop", k=2))

    def objective(trial):
        for step, s in zip(STEPS, SCORES, strict=True):
            trial.report(s, step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return SCORES[-1]

    study.optimize(objective, n_trials=1)
    t = study.trials[0]
    assert t.state is TrialState.PRUNED and t.last_step == 40


def test_minimize_negates_scores_for_the_detector():
    # a loss that rises twice in a row is a decline of quality: pruned at the second rise
    study = optuna.create_study(direction="minimize", pruner=DetectorPruner("evalstop", k=2))
    losses = [-s for s in SCORES]
    seen: list[int] = []
    study.optimize(objective_reporting(losses, log=seen), n_trials=1)
    t = study.trials[0]
    assert t.state is TrialState.PRUNED and seen[-1] == 40
    assert t.value == -0.5  # the best (lowest) loss, at step 20


def test_warmup_steps_hold_off_the_stop():
    study = optuna.create_study(direction="maximize", pruner=DetectorPruner("evalstop", n_warmup_steps=45, k=1))
    seen: list[int] = []
    study.optimize(objective_reporting(SCORES, log=seen), n_trials=1)
    # k=1 fires at 30 (first decline) and 40, both before the warm-up; the run then rises: completes
    assert study.trials[0].state is TrialState.COMPLETE and seen == STEPS


def _replay(name: str, scores, rewards, se):
    """A plain replay of the detector, the oracle for what the pruner must decide."""
    mon = make_detector(name).start()
    for step, s, r in zip(STEPS, scores, rewards, strict=True):
        if mon.observe(Checkpoint(step=float(step), eval_score=s, eval_se=se, reward=r)):
            return step
    return None


def test_reward_hacking_awareness_uses_the_proxy_reward():
    # held-out falls steadily after step 10; in one run the proxy reward climbs meanwhile (over-optimisation), in the
    # other it falls with it
    scores = [0.40, 0.30, 0.20, 0.10, 0.00, -0.10]
    rising = [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    falling = [0.5, 0.4, 0.3, 0.2, 0.1, 0.0]
    stop_rising = _replay("divergence", scores, rising, 0.02)
    stop_falling = _replay("divergence", scores, falling, 0.02)
    assert stop_rising is not None and (stop_falling is None or stop_falling > stop_rising)
    for rewards, expected in ((rising, stop_rising), (falling, stop_falling)):
        study = optuna.create_study(direction="maximize", pruner=DetectorPruner("divergence"))
        seen: list[int] = []
        study.optimize(objective_reporting(scores, rewards, se=0.02, log=seen), n_trials=1)
        t = study.trials[0]
        if expected is None:
            assert t.state is TrialState.COMPLETE
        else:
            assert t.state is TrialState.PRUNED and seen[-1] == expected
            assert t.value == pytest.approx(0.40)  # the kept (first) checkpoint


def test_ask_tell_with_a_new_series_restarts_the_detector():
    # a second seed (series 1) starts fresh: the first seed's decline must not carry over into it. Carried over,
    # 0.6 -> 0.5 -> 0.4 would be EvalStop k=2's second consecutive decline at step 3
    study = optuna.create_study(direction="maximize", pruner=DetectorPruner("evalstop", k=2))
    trial = study.ask()
    for step, s in zip([1, 2], [0.6, 0.5], strict=True):
        report_checkpoint(trial, step, s, series=0)
    assert not trial.should_prune()
    report_checkpoint(trial, 3, 0.4, series=1)  # the new series' first point: no decline yet
    assert not trial.should_prune()
    report_checkpoint(trial, 4, 0.3, series=1)
    assert not trial.should_prune()
    report_checkpoint(trial, 5, 0.2, series=1)  # its second consecutive decline
    assert trial.should_prune()


def test_bad_detector_names_are_refused():
    with pytest.raises(ValueError, match="unknown detector"):
        DetectorPruner("nosuch")
    with pytest.raises(ValueError, match="n_warmup_steps"):
        DetectorPruner("evalstop", n_warmup_steps=-1)


# the paired rule as a sweep pruner: per-prompt scores built by hand. 64 prompts spread by difficulty (0..0.9); from
# step 30 every prompt scores 0.05 (+-0.001) below step 20: a decline beyond a margin of 0 by ~50 standard errors
# and well inside a margin of 0.1, so the rule with margin 0 stops at step 30 and with margin 0.1 never does.
PAIRED_PROMPTS = 64


def _paired_scores(step: int, sign: float = 1.0) -> dict[str, float]:
    drop = 0.05 if step >= 30 else 0.0
    wobble = 0.001 if step >= 30 else 0.0
    return {str(i): sign * (0.1 * (i % 10) - drop + (wobble if i % 2 else -wobble)) for i in range(PAIRED_PROMPTS)}


def _paired_objective(log, sign=1.0):
    def objective(trial):
        for step in (10, 20, 30, 40):
            scores = _paired_scores(step, sign)
            report_checkpoint(trial, step, sum(scores.values()) / PAIRED_PROMPTS, se=0.03, prompts=scores)
            log.append(step)
            if trial.should_prune():
                raise optuna.TrialPruned()
        return best_value(trial)

    return objective


@pytest.mark.parametrize(("params", "stops_at"), [({"margin": 0.0}, 30), ({"margin": 0.1}, None)])
def test_the_paired_rule_prunes_on_the_per_prompt_scores_a_trial_recorded(params, stops_at):
    """Before the pruner passed each checkpoint's per-prompt scores on, the paired rule saw none and never pruned."""
    log: list[int] = []
    study = optuna.create_study(direction="maximize", pruner=DetectorPruner("paired", **params))
    study.optimize(_paired_objective(log), n_trials=1)
    state = study.trials[0].state
    assert (state, log[-1]) == ((TrialState.PRUNED, 30) if stops_at else (TrialState.COMPLETE, 40))


def test_the_paired_rule_in_a_minimizing_study_reads_lower_as_better():
    """Scores and per-prompt scores negated: the same run in a minimizing study declines at step 30 and is pruned."""
    log: list[int] = []
    study = optuna.create_study(direction="minimize", pruner=DetectorPruner("paired", margin=0.0))
    study.optimize(_paired_objective(log, sign=-1.0), n_trials=1)
    assert study.trials[0].state is TrialState.PRUNED and log[-1] == 30


def test_a_sweep_specs_paired_pruner_gets_the_platforms_margin():
    """`pruning: {detector: paired}` without params gets the jobs' margin (0.1): the hand-built 0.05 decline is
    inside it; an explicit margin 0 is kept and prunes."""
    from sweeps.runner import make_pruner
    from sweeps.spec import PruningSpec

    for params, expected in (({}, TrialState.COMPLETE), ({"margin": 0}, TrialState.PRUNED)):
        spec = PruningSpec(detector="paired", params=params)
        pruner = make_pruner(type("Spec", (), {"pruning": spec})(), True)
        study = optuna.create_study(direction="maximize", pruner=pruner)
        study.optimize(_paired_objective([]), n_trials=1)
        assert study.trials[0].state is expected, params
