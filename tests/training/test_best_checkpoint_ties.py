"""Every best-checkpoint rule on ties: "ties go to the earlier checkpoint" (less optimisation pressure). The live
lifecycle's `best_of` (and the checkpoint a paused run keeps and resumes from), the trace replay's kept checkpoint
(`rlhfops detect`), the Optuna pruner's value of a trial, the incumbent pruner's reference checkpoint. (The
simulator's rule is in tests/scheduling/test_policy_oracles.py, the sweep's in tests/sweeps/test_sweep_oracles.py,
the registry's `best` alias on ties in tests/flows/test_crash_safety.py.) Expected picks are written by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.job.lifecycle import best_of
from training.metrics import StepRecord


def score(step: int, value: float) -> dict:
    return {"checkpoint": f"ckpt/step-{step:06d}", "step": step, "eval_score": value, "eval_se": 0.01}


@pytest.mark.parametrize("scores, step", [
    ([score(2, 0.5), score(4, 0.7), score(6, 0.7), score(8, 0.4)], 4),  # tie in the middle
    ([score(6, 0.7), score(4, 0.7), score(2, 0.5)], 4),  # order of the list does not matter: the step does
    ([score(2, 0.7), score(4, 0.7), score(6, 0.7)], 2),  # all tied: the first
    ([score(2, 0.5), score(4, math.nan), score(6, 0.6)], 6),  # a checkpoint that could not be scored is skipped
    ([score(2, 0.5), score(4, 0.5 + 1e-12)], 4),  # full precision: higher by any margin is higher
])
def test_lifecycle_best_of_ties_go_to_the_earlier_checkpoint(scores, step):
    assert best_of(scores)["step"] == step


def test_lifecycle_best_of_without_a_finite_score_is_none():
    assert best_of([]) is None
    assert best_of([score(2, math.nan), score(4, math.inf)]) is None


def test_a_paused_run_keeps_and_records_the_earlier_of_tied_checkpoints(tmp_path):
    """run_job's outcome and the `job.json` it leaves (what `rlhfops resume` continues from) name the earlier of two
    checkpoints with the same held-out score."""
    from types import SimpleNamespace

    from training.job.lifecycle import JobHooks, JobSpec, job_record, paused_run, run_job

    held_out = {2: 0.4, 4: 0.6, 6: 0.6, 8: 0.5}

    class Trainer:
        step = 0

        def run(self, total):
            while self.step < total:
                self.step += 1
                (tmp_path / "checkpoints" / f"step-{self.step:06d}").mkdir(parents=True)
                gold = held_out.get(self.step, math.nan)
                yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.0, gold_eval=gold,
                                 gold_eval_se=0.01, phase_seconds={"rollout": 0.1})

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return Trainer()

        def score(self, spec, checkpoints):
            from training.job.lifecycle import step_of

            return [score(step_of(c), held_out.get(step_of(c), math.nan)) | {"checkpoint": c} for c in checkpoints]

    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=8), run_id="r1", out_dir=tmp_path,
                   pausable=True)
    out = run_job(spec, lambda step, m: "declining" if step == 8 else None, hooks=Hooks())
    assert out.best["step"] == 4
    (tmp_path / "job.json").write_text(__import__("json").dumps(job_record(out)))
    assert paused_run(tmp_path).best_step == 4


def test_trace_replay_keeps_the_earlier_of_tied_checkpoints():
    from eval.detector_base import Checkpoint
    from eval.detectors import make_detector
    from eval.traces import Run, verdicts

    evals = [0.5, 0.7, 0.7, 0.4]
    steps = np.array([10, 20, 30, 40])
    run = Run("r", steps, [Checkpoint(step=float(s), eval_score=e, progress=s / 40) for s, e in zip(steps, evals,
                                                                                                   strict=True)],
              label=None, tenant=None)
    never = verdicts(make_detector("stopat", p=1.0), [run]).iloc[0]  # stops at the last checkpoint
    assert never["best_step"] == 20 and never["best_eval_score"] == 0.7
    at_third = verdicts(make_detector("stopat", p=0.75), [run]).iloc[0]
    assert at_third["stop_step"] == 30 and at_third["best_step"] == 20


@pytest.mark.parametrize("direction, step", [("MAXIMIZE", 20), ("MINIMIZE", 10)])
def test_optuna_pruner_values_a_trial_at_the_earlier_of_tied_checkpoints(direction, step):
    from optuna.study import StudyDirection

    from eval.optuna_pruner import best_checkpoint_of

    # scores by step: 0.4, 0.7, 0.7, 0.4 -> highest 0.7 first at 20; lowest 0.4 first at 10
    cps = [(s, {"score": v, "se": 0.01 * s}) for s, v in [(10, 0.4), (20, 0.7), (30, 0.7), (40, 0.4)]]
    best = best_checkpoint_of(getattr(StudyDirection, direction), cps)
    assert best[0] == step and best[2] == pytest.approx(0.01 * step)


def test_optuna_pruner_best_of_one_series_and_non_finite_scores():
    from optuna.study import StudyDirection

    from eval.optuna_pruner import best_checkpoint_of

    cps = [(2, {"score": math.nan, "series": 0}), (4, {"score": 0.3, "series": 0}), (6, {"score": 0.9, "series": 1}),
           (8, {"score": 0.3, "series": 0})]
    assert best_checkpoint_of(StudyDirection.MAXIMIZE, cps, series=0)[0] == 4
    assert best_checkpoint_of(StudyDirection.MAXIMIZE, cps)[0] == 6
    assert best_checkpoint_of(StudyDirection.MAXIMIZE, cps[:1]) is None


def test_incumbent_pruner_compares_against_the_earlier_of_tied_incumbent_checkpoints():
    from eval.incumbent_pruner import decide

    prompts = {f"p{i}": 0.5 for i in range(10)}
    # the incumbent's checkpoints at 2, 4 and 6 have per-prompt means 0.5, 0.8, 0.8: its best is step 4
    incumbent = [(2, dict(prompts)), (4, {k: 0.8 for k in prompts}), (6, {k: 0.8 for k in prompts})]
    trial = [(2, {k: 0.3 for k in prompts})]
    assert decide(trial, incumbent).incumbent_step == 4
