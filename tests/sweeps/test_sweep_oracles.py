"""Which checkpoint a sweep trial keeps and registers, by hand: a multi-seed trial whose seeds have different bests
(and a tie between seeds), and a minimising sweep. The whole path is real (SweepRunner -> run_trial -> the job
lifecycle -> its best_of -> the trial's aggregate -> the summary whose `best` the tracker registers) except the
trainer and the gold scorer: a scripted trainer writes the checkpoints and a scripted scorer gives each its held-out
score from the tables below, so every expected pick is read off these tables."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from sweep_helpers import BASE

from training.metrics import StepRecord

STEPS, EVERY = 8, 2
GPU_S_PER_STEP = 1.5  # phase seconds per step: rollout 1.0 + optim 0.5, on one GPU

# (ppo.kl_coef, seed index) -> held-out score at steps 2, 4, 6, 8
CURVES = {
    # one trial, three seeds: bests 0.60 at step 4, 0.80 at step 2 (tied with step 6: the earlier), 0.80 at step 8
    # (tied with seed 1's 0.80: the earlier seed)
    (0.2, 0): [0.30, 0.60, 0.50, 0.40],
    (0.2, 1): [0.80, 0.20, 0.80, 0.10],
    (0.2, 2): [0.10, 0.20, 0.30, 0.80],
    # one seed each (with (0.2, 0) above): kept (best) checkpoints 0.50 at step 4 and 0.40 at step 2
    (0.01, 0): [0.30, 0.50, 0.40, 0.20],
    (0.5, 0): [0.40, 0.10, 0.10, 0.10],
}
SE = {0: 0.01, 1: 0.02, 2: 0.03}  # the scorer's standard error per seed index


@pytest.fixture
def scripted(monkeypatch):
    """The lifecycle's worker and the gold scorer, scripted from CURVES. Returns the held-out score of each
    checkpoint path written."""
    from training import trainer as trainer_module
    from training.lifecycle import JobHooks

    score_of: dict[str, tuple[float, float]] = {}

    class Trainer:
        def __init__(self, spec):
            self.spec, self.step = spec, 0
            cfg = spec.config
            self.seed_index = cfg.seed - BASE["seed"]
            self.curve = CURVES[(cfg.ppo.kl_coef, self.seed_index)]

        def run(self, total):
            while self.step < total:
                self.step += 1
                gold, se = math.nan, math.nan
                if self.step % EVERY == 0:
                    gold, se = self.curve[self.step // EVERY - 1], SE[self.seed_index]
                    ckpt = Path(self.spec.out_dir) / "checkpoints" / f"step-{self.step:06d}"
                    ckpt.mkdir(parents=True)
                    score_of[str(ckpt)] = (gold, se)
                yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.0, gold_eval=gold,
                                 gold_eval_se=se, phase_seconds={"rollout": 1.0, "optim": 0.5})

    class Gold:
        def __init__(self, mean, se):
            self.mean, self.se, self.n, self.unparseable_rate = mean, se, 8, 0.0

    monkeypatch.setattr(JobHooks, "start_worker", lambda self, spec: Trainer(spec))
    monkeypatch.setattr(trainer_module, "gold_eval", lambda ckpt, *a, **k: Gold(*score_of[str(ckpt)]))
    return score_of


def sweep(tmp_path, kls, seeds=1, direction="maximize"):
    from infra.ledger import Ledger
    from sweeps.runner import SweepRunner
    from sweeps.spec import parse_spec

    spec = parse_spec({"name": "oracle", "base": BASE, "overrides": {"steps": STEPS},
                       "space": {"ppo.kl_coef": {"grid": kls}}, "sampler": {"kind": "grid", "seed": 0},
                       "trials": len(kls), "seeds_per_trial": seeds, "pruning": {"detector": "none"},
                       "objective": {"direction": direction}, "out_dir": str(tmp_path / "sweep")})
    ledger = Ledger()
    summary = SweepRunner(spec, prune=False, ledger=ledger, report=False).run()
    return summary, spec, ledger


def ckpt(spec, trial: int, seed: int, step: int) -> str:
    return str(spec.run_dir / f"trial-{trial:04d}" / f"seed-{seed}" / "checkpoints" / f"step-{step:06d}")


def test_a_multi_seed_trial_keeps_each_seeds_best_and_registers_the_best_seeds(tmp_path, scripted):
    summary, spec, ledger = sweep(tmp_path, [0.2], seeds=3)
    (trial,) = summary["trials"]
    assert trial["state"] == "completed" and trial["steps"] == 3 * STEPS
    # objective: the mean of the seeds' kept scores; its SE: the mean's (root of the summed variances / n)
    assert trial["objective"] == pytest.approx((0.60 + 0.80 + 0.80) / 3)
    assert trial["objective_se"] == pytest.approx(math.sqrt(0.01**2 + 0.02**2 + 0.03**2) / 3)
    # registered: seed 1's step 2 (0.80; seed 2's 0.80 ties it and comes later; seed 1's step 6 ties and is later)
    assert (trial["best_step"], trial["best_checkpoint"]) == (2, ckpt(spec, 0, 1, 2))
    assert summary["best"]["best_checkpoint"] == ckpt(spec, 0, 1, 2)
    # each seed keeps its own best checkpoint on disk, and only that one
    kept = sorted(str(p) for p in spec.run_dir.glob("trial-*/seed-*/checkpoints/step-*"))
    assert kept == sorted([ckpt(spec, 0, 0, 4), ckpt(spec, 0, 1, 2), ckpt(spec, 0, 2, 8)])
    # the held-out curve runs on across seeds (seed i's step s is step i * STEPS + s)
    want = [(i * STEPS + EVERY * (k + 1), CURVES[(0.2, i)][k]) for i in range(3) for k in range(4)]
    assert [tuple(p) for p in trial["curve"]] == want
    # GPU time: 24 steps of 1.5 GPU-s, in the summary and charged to the sweep's tenant
    assert trial["gpu_seconds"] == pytest.approx(3 * STEPS * GPU_S_PER_STEP)
    assert ledger.tenant_totals()["acme"].gpu_us == round(3 * STEPS * GPU_S_PER_STEP * 1e6)
    study = optuna.load_study(study_name="oracle", storage=spec.storage_url)
    assert study.trials[0].value == pytest.approx((0.60 + 0.80 + 0.80) / 3)


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_the_sweeps_best_trial_in_either_direction_ties_to_the_earlier_trial(tmp_path, scripted, direction):
    # one seed each, kept scores: kl 0.01 -> 0.50 (step 4), kl 0.2 -> 0.60 (step 4), kl 0.5 -> 0.40 (step 2).
    # Maximising: kl 0.2's 0.60 wins. Minimising: kl 0.5's 0.40 wins.
    summary, spec, _ = sweep(tmp_path, [0.01, 0.2, 0.5], direction=direction)
    by_kl = {t["params"]["ppo.kl_coef"]: t for t in summary["trials"]}
    assert {k: t["objective"] for k, t in by_kl.items()} == {0.01: 0.5, 0.2: 0.6, 0.5: 0.4}
    assert {k: t["best_step"] for k, t in by_kl.items()} == {0.01: 4, 0.2: 4, 0.5: 2}
    winner = by_kl[0.2 if direction == "maximize" else 0.5]
    assert summary["best"]["number"] == winner["number"]
    assert summary["best"]["best_checkpoint"] == ckpt(spec, winner["number"], 0, winner["best_step"])
    study = optuna.load_study(study_name="oracle", storage=spec.storage_url)
    assert study.best_trial.number == winner["number"]


def test_a_tie_between_trials_goes_to_the_earlier_trial(tmp_path, scripted, monkeypatch):
    # two settings whose kept scores tie (0.8: kl 0.2's seed 1 curve for both): the earlier trial number wins
    monkeypatch.setitem(CURVES, (0.01, 0), CURVES[(0.2, 1)])
    monkeypatch.setitem(CURVES, (0.5, 0), CURVES[(0.2, 1)])
    for direction in ("maximize", "minimize"):
        summary, _, _ = sweep(tmp_path / direction, [0.01, 0.5], direction=direction)
        assert [t["objective"] for t in summary["trials"]] == [0.8, 0.8]
        assert summary["best"]["number"] == min(t["number"] for t in summary["trials"])
