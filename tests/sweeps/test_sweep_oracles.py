"""Which checkpoint a sweep trial keeps and registers, by hand: a multi-seed trial whose seeds have different bests
(and a tie between seeds), and a minimising sweep. The whole path is real (SweepRunner -> run_trial -> the job
lifecycle -> its best_of -> the trial's aggregate -> the summary whose `best` the tracker registers) except the
trainer and the gold scorer: a scripted trainer writes the checkpoints and a scripted scorer gives each its held-out
score from the tables below, so every expected pick is read off these tables."""

from __future__ import annotations

import math
import sys
import time
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
# what goes wrong, per test (empty here; tests fill them with monkeypatch.setitem / .setattr)
FAIL_AT: dict[tuple[float, int], int] = {}  # (kl, seed index) -> the step whose training raises
NO_CHECKPOINTS: set[tuple[float, int]] = set()  # (kl, seed index) whose trainer saves no checkpoint (gate still runs)
UNSCORABLE: set[tuple[float, int, int]] = set()  # (kl, seed index, step): the gold scorer cannot score that checkpoint
KL: dict[tuple[float, int], float] = {}  # (kl, seed index) -> the policy KL every step reports (default: not reported)


@pytest.fixture
def scripted(monkeypatch):
    """The lifecycle's worker and the gold scorer, scripted from CURVES. Returns the held-out score of each
    checkpoint path written."""
    from training import trainer as trainer_module
    from training.job.lifecycle import JobHooks

    score_of: dict[str, tuple[float, float]] = {}

    class Trainer:
        def __init__(self, spec):
            self.spec, self.step = spec, 0
            cfg = spec.config
            self.seed_index = cfg.seed - BASE["seed"]
            self.key = (cfg.ppo.kl_coef, self.seed_index)
            self.curve = CURVES[self.key]

        def run(self, total):
            while self.step < total:
                self.step += 1
                if FAIL_AT.get(self.key) == self.step:
                    raise RuntimeError(f"diverged at step {self.step}")
                gold, se = math.nan, math.nan
                if self.step % EVERY == 0:
                    gold, se = self.curve[self.step // EVERY - 1], SE[self.seed_index]
                    ckpt = Path(self.spec.out_dir) / "checkpoints" / f"step-{self.step:06d}"
                    if self.key not in NO_CHECKPOINTS:
                        ckpt.mkdir(parents=True)
                    score_of[str(ckpt)] = (gold, se) if (*self.key, self.step) not in UNSCORABLE else None
                yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.0, gold_eval=gold,
                                 gold_eval_se=se, phase_seconds={"rollout": 1.0, "optim": 0.5},
                                 kl=KL.get(self.key, math.nan))

    class Gold:
        def __init__(self, mean, se):
            self.mean, self.se, self.n, self.unparseable_rate = mean, se, 8, 0.0

    monkeypatch.setattr(JobHooks, "start_worker", lambda self, spec: Trainer(spec))
    def gold_eval(ckpt, *a, **k):
        if score_of[str(ckpt)] is None:
            raise ValueError(f"NaN weights in {Path(ckpt).name}")
        return Gold(*score_of[str(ckpt)])

    monkeypatch.setattr(trainer_module, "gold_eval", gold_eval)
    return score_of


def make_spec(tmp_path, kls, seeds=1, direction="maximize", **kw):
    from sweeps.spec import parse_spec

    return parse_spec({"name": "oracle", "base": BASE, "overrides": {"steps": STEPS},
                       "space": {"ppo.kl_coef": {"grid": kls}}, "sampler": {"kind": "grid", "seed": 0},
                       "trials": len(kls), "seeds_per_trial": seeds, "pruning": {"detector": "none"},
                       "objective": {"direction": direction}, "out_dir": str(tmp_path / "sweep"), **kw})


def sweep(tmp_path, kls, seeds=1, direction="maximize", runner_kw=None, **kw):
    from infra.ledger import Ledger
    from sweeps.runner import SweepRunner

    spec = make_spec(tmp_path, kls, seeds, direction, **kw)
    ledger = Ledger()
    summary = SweepRunner(spec, prune=False, ledger=ledger, report=False, **(runner_kw or {})).run()
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


# ---- one trial through run_trial: stopped, failed, unscorable (the outcome the runner aggregates and registers) --


def one_trial(tmp_path, kl, seed=0, gpus=1):
    """The spec and the JobRequest of trial 0's seed `seed` at `ppo.kl_coef = kl`, on `gpus` GPUs."""
    from sweeps.spec import trial_request

    spec = make_spec(tmp_path, [kl], concurrency=gpus, gpus_per_trial=gpus)
    return spec, trial_request(spec, {"ppo.kl_coef": kl}, 0, seed)


def kept_on_disk(spec) -> list[str]:
    return sorted(str(p) for p in spec.run_dir.glob("trial-*/seed-*/checkpoints/step-*"))


def test_run_trial_stopped_by_its_observer_keeps_the_best_so_far_and_says_where(tmp_path, scripted):
    from infra.ledger import Ledger
    from sweeps.runner import run_trial

    spec, request = one_trial(tmp_path, 0.2, gpus=2)
    # a re-run starts over: what an earlier run left in the trial's directory is gone (else step 10 would be scored)
    stale = request.out_dir / "checkpoints" / "step-000010"
    stale.mkdir(parents=True)
    (request.out_dir / "leftover.txt").write_text("x")
    seen = []

    def observer(step, metrics):
        seen.append((step, metrics["gold_eval"]))
        return "scripted stop" if step == 6 else None

    ledger = Ledger()
    t0 = time.perf_counter()
    o = run_trial(request, observer, ledger=ledger, run_id="t-7")  # no `checked`: run_trial checks the request
    elapsed = time.perf_counter() - t0
    # curve (0.2, 0): 0.30, 0.60, 0.50 at steps 2, 4, 6; stopped at 6, the best so far is step 4's 0.60
    assert seen == [(2, 0.30), (4, 0.60), (6, 0.50)]
    assert (o.state, o.steps, o.pruned_at, o.stop_reason, o.error) == ("pruned", 6, 6, "scripted stop", None)
    assert (o.best_step, o.best_score, o.best_se, o.best_checkpoint) == (4, 0.60, 0.01, ckpt(spec, 0, 0, 4))
    assert [r["step"] for r in o.records] == [1, 2, 3, 4, 5, 6]
    assert [(s["step"], s["eval_score"]) for s in o.scores] == [(2, 0.30), (4, 0.60), (6, 0.50)]
    assert kept_on_disk(spec) == [ckpt(spec, 0, 0, 4)] and not (request.out_dir / "leftover.txt").exists()
    # 6 steps x 1.5 phase-seconds x 2 GPUs, in the outcome and charged under the run id given
    assert o.gpu_seconds == pytest.approx(6 * GPU_S_PER_STEP * 2)
    assert {k: t.gpu_us for k, t in ledger.run_totals().items()} == {"t-7": round(6 * GPU_S_PER_STEP * 2 * 1e6)}
    assert 0.0 <= o.wall_s <= elapsed


def test_run_trial_whose_training_raises_is_failed_with_the_error_and_keeps_its_best(tmp_path, scripted, monkeypatch):
    from infra.ledger import Ledger
    from sweeps.runner import run_trial

    monkeypatch.setitem(FAIL_AT, (0.01, 0), 5)
    spec, request = one_trial(tmp_path, 0.01)
    ledger = Ledger()
    o = run_trial(request, None, ledger=ledger)  # no run id: charged as "trial"
    # steps 1-4 ran; curve (0.01, 0) at steps 2, 4: 0.30, 0.50 -> step 4 kept
    assert (o.state, o.steps, o.error) == ("failed", 4, "RuntimeError: diverged at step 5")
    assert (o.pruned_at, o.stop_reason) == (None, None)
    assert (o.best_step, o.best_score, o.best_checkpoint) == (4, 0.50, ckpt(spec, 0, 0, 4))
    assert o.gpu_seconds == pytest.approx(4 * GPU_S_PER_STEP)
    assert {k: t.gpu_us for k, t in ledger.run_totals().items()} == {"trial": round(4 * GPU_S_PER_STEP * 1e6)}
    # its checkpoints unscorable too: the error is still the training's (what went wrong first), not the scoring's
    monkeypatch.setattr(sys.modules[__name__], "UNSCORABLE", {(0.01, 0, 2), (0.01, 0, 4)})
    spec, request = one_trial(tmp_path / "unscorable", 0.01)
    o = run_trial(request, None)
    assert (o.state, o.steps, o.error, o.best_step) == ("failed", 4, "RuntimeError: diverged at step 5", None)


def test_run_trial_whose_worker_cannot_start_is_failed_at_zero_steps(tmp_path, scripted, monkeypatch):
    from sweeps.runner import run_trial
    from training.job.lifecycle import JobHooks

    def no_worker(self, spec):
        raise RuntimeError("no GPU free")

    monkeypatch.setattr(JobHooks, "start_worker", no_worker)
    spec, request = one_trial(tmp_path, 0.2)
    t0 = time.perf_counter()
    o = run_trial(request, None)
    elapsed = time.perf_counter() - t0
    assert (o.state, o.steps, o.gpu_seconds, o.error) == ("failed", 0, 0.0, "RuntimeError: no GPU free")
    assert (o.best_step, o.best_checkpoint, o.records, o.scores) == (None, None, [], [])
    assert math.isnan(o.best_score) and 0.0 <= o.wall_s <= elapsed


def test_run_trial_skips_an_unscorable_checkpoint_and_fails_when_none_scores(tmp_path, scripted, monkeypatch):
    from sweeps.runner import run_trial

    # one diverged checkpoint (step 4, the best by the curve): skipped, recorded with its error; step 6's 0.50 kept
    monkeypatch.setattr(sys.modules[__name__], "UNSCORABLE", {(0.2, 0, 4)})
    spec, request = one_trial(tmp_path / "one", 0.2)
    o = run_trial(request, None)
    assert (o.state, o.error, o.best_step, o.best_score) == ("completed", None, 6, 0.50)
    bad = o.scores[1]
    assert (bad["checkpoint"], bad["step"], bad["error"]) == (ckpt(spec, 0, 0, 4), 4, "ValueError: NaN weights in "
                                                                                        "step-000004")
    assert math.isnan(bad["eval_score"]) and math.isnan(bad["eval_se"])
    assert kept_on_disk(spec) == [ckpt(spec, 0, 0, 6)]

    # every checkpoint diverged: failed, naming the last checkpoint's error; nothing kept
    monkeypatch.setattr(sys.modules[__name__], "UNSCORABLE", {(0.5, 0, s) for s in (2, 4, 6, 8)})
    spec, request = one_trial(tmp_path / "all", 0.5)
    o = run_trial(request, None)
    assert (o.state, o.steps) == ("failed", 8)
    assert o.error == "scoring: no checkpoint could be scored (ValueError: NaN weights in step-000008)"
    assert (o.best_step, o.best_checkpoint) == (None, None) and math.isnan(o.best_score) and math.isnan(o.best_se)
    assert [(s["checkpoint"], s["step"], s["error"]) for s in o.scores] == [
        (ckpt(spec, 0, 0, k), k, f"ValueError: NaN weights in step-{k:06d}") for k in (2, 4, 6, 8)]
    assert all(math.isnan(s["eval_score"]) and math.isnan(s["eval_se"]) for s in o.scores)
    assert kept_on_disk(spec) == []


def test_failed_pruned_and_unscored_trials_are_told_recorded_and_charged_by_hand(tmp_path, scripted, monkeypatch):
    """Three settings, two seeds each, two GPUs per trial: kl 0.01's first seed raises at step 5 (its second never
    runs); kl 0.2's first seed completes and its second is stopped at step 6; kl 0.5 saves no checkpoint at all."""
    from optuna.trial import TrialState

    from sweeps.runner import run_trial

    monkeypatch.setitem(FAIL_AT, (0.01, 0), 5)
    monkeypatch.setattr(sys.modules[__name__], "NO_CHECKPOINTS", {(0.5, 0), (0.5, 1)})
    monkeypatch.setitem(CURVES, (0.5, 1), CURVES[(0.5, 0)])

    def stopping(request, observer, **kw):
        cfg = kw["checked"].config
        key = (cfg.ppo.kl_coef, cfg.seed - BASE["seed"])

        def observe(step, metrics):
            return observer(step, metrics) or ("scripted stop" if key == (0.2, 1) and step == 6 else None)

        return run_trial(request, observe, **kw)

    told = []
    summary, spec, ledger = sweep(
        tmp_path, [0.01, 0.2, 0.5], seeds=2, concurrency=2, gpus_per_trial=2,
        runner_kw={"trial_fn": stopping,
                   "on_event": lambda kind, info: told.append(info["result"]) if kind == "trial_finished" else None})
    by_kl = {t["params"]["ppo.kl_coef"]: t for t in summary["trials"]}
    failed, pruned, unscored = by_kl[0.01], by_kl[0.2], by_kl[0.5]
    # kl 0.01: steps 1-4 of seed 0 (checkpoints 2, 4: 0.30, 0.50), then the error; no objective
    assert (failed["state"], failed["error"], failed["steps"]) == ("failed", "RuntimeError: diverged at step 5", 4)
    assert (failed["best_step"], failed["pruned_at"], failed["stop_reason"]) == (None, None, None)
    assert math.isnan(failed["objective"]) and [tuple(p) for p in failed["curve"]] == [(2, 0.30), (4, 0.50)]
    # kl 0.2: seed 0 all 8 steps (best 0.60), seed 1 stopped at its step 6 = the trial's step 8 + 6 (best 0.80 at 2)
    assert (pruned["state"], pruned["stop_reason"], pruned["error"]) == ("pruned", "scripted stop", None)
    assert (pruned["pruned_at"], pruned["steps"]) == (STEPS + 6, STEPS + 6)
    assert pruned["objective"] == pytest.approx((0.60 + 0.80) / 2)
    assert pruned["objective_se"] == pytest.approx(math.sqrt(0.01**2 + 0.02**2) / 2)
    assert (pruned["best_step"], pruned["best_checkpoint"]) == (2, ckpt(spec, pruned["number"], 1, 2))
    # kl 0.5: both seeds complete, nothing to score: told FAIL, recorded failed
    assert (unscored["state"], unscored["steps"]) == ("failed", 2 * STEPS) and math.isnan(unscored["objective"])
    assert unscored["error"] == "no checkpoint scored"  # the study's record says why, as the tracker is told
    res_of = {r.params["ppo.kl_coef"]: r for r in told}
    assert (res_of[0.5].state, res_of[0.5].error) == ("failed", "no checkpoint scored")
    assert (res_of[0.01].state, res_of[0.01].error) == ("failed", "RuntimeError: diverged at step 5")
    # GPU time: (4 + 14 + 16) steps x 1.5 s x 2 GPUs, per trial, in the summary and charged to the tenant
    gpu = {0.01: 4 * 3.0, 0.2: 14 * 3.0, 0.5: 16 * 3.0}
    assert {k: t["gpu_seconds"] for k, t in by_kl.items()} == pytest.approx(gpu)
    assert summary["gpu_seconds"] == pytest.approx(102.0)
    assert ledger.tenant_totals()["acme"].gpu_us == round(102.0 * 1e6)
    assert (summary["trials_done"], summary["trials_failed"], summary["trials_pruned"]) == (3, 2, 1)
    assert summary["best"]["number"] == pruned["number"]
    study = optuna.load_study(study_name="oracle", storage=spec.storage_url)
    states = {t.params["ppo.kl_coef"]: t.state for t in study.trials}
    assert states == {0.01: TrialState.FAIL, 0.2: TrialState.PRUNED, 0.5: TrialState.FAIL}
    # what the pruner saw of kl 0.2: each checkpoint at the trial's step (seed i's step s is i * 8 + s), its held-out
    # score, SE and reward, its seed as the series; 4 planned checkpoints per seed; the kept checkpoint is the highest
    (t02,) = [t for t in study.trials if t.params["ppo.kl_coef"] == 0.2]
    seen = {k: v for k, v in t02.user_attrs.items() if k.startswith("rlhfops.ckpt.")}
    want = [(0, s, CURVES[(0.2, 0)][s // EVERY - 1]) for s in (2, 4, 6, 8)]
    want += [(1, s, CURVES[(0.2, 1)][s // EVERY - 1]) for s in (2, 4, 6)]
    assert seen == {f"rlhfops.ckpt.{i * STEPS + s:09d}": {"score": g, "se": SE[i], "reward": 0.0, "series": i}
                    for i, s, g in want}
    assert (t02.user_attrs["rlhfops.planned_checkpoints"], t02.user_attrs["rlhfops.keep"]) == (4, "highest")
    # Optuna's intermediate value: the best kept so far within the seed (0.30, 0.60, 0.60, 0.60; 0.80, 0.80, 0.80)
    assert t02.intermediate_values == {2: 0.30, 4: 0.60, 6: 0.60, 8: 0.60, 10: 0.80, 12: 0.80, 14: 0.80}


# ---- the runner's small parts: search space, sampler, gate records, the study's owner, the spent budget ----------


def test_distributions_per_kind_by_hand(tmp_path):
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from sweeps.runner import distributions

    spec = make_spec(tmp_path, [0.1], sampler={"kind": "random"}, space={
        "ppo.kl_coef": {"log_uniform": [0.01, 0.3]}, "ppo.actor_lr": {"uniform": [1e-4, 2e-3]},
        "steps": {"uniform": [4, 12]}, "ppo.max_new_tokens": {"log_uniform": [4, 16]},
        "ppo.num_ppo_epochs": {"choice": [1, 2]}, "eval_every": {"grid": [2, 4]}})
    assert distributions(spec) == {
        "ppo.kl_coef": FloatDistribution(0.01, 0.3, log=True), "ppo.actor_lr": FloatDistribution(1e-4, 2e-3),
        # integers on both ends draw integers (docs/sweeps.md), log or not
        "steps": IntDistribution(4, 12), "ppo.max_new_tokens": IntDistribution(4, 16, log=True),
        "ppo.num_ppo_epochs": CategoricalDistribution([1, 2]), "eval_every": CategoricalDistribution([2, 4])}


def test_make_sampler_per_kind_seeded(tmp_path):
    from optuna.samplers import GridSampler, RandomSampler, TPESampler

    from sweeps.runner import distributions, make_sampler

    grid = [0.01 * k for k in range(1, 9)]  # 8 points: an unseeded grid repeats an order 1 time in 40320

    def draws(kind, n, seed=7, **sampler):
        space = {"ppo.kl_coef": {"grid": grid} if kind == "grid" else {"uniform": [0.01, 0.3]}}
        spec = make_spec(tmp_path, grid, space=space, sampler={"kind": kind, "seed": seed, **sampler})
        s = make_sampler(spec)
        study = optuna.create_study(sampler=s)
        out = []
        for _ in range(n):
            t = study.ask(distributions(spec))
            out.append(t.params["ppo.kl_coef"])
            study.tell(t, 0.5)
        return s, out

    # the spec's seed decides the order: the same seed repeats it, another seed gives another (Optuna's grid treats
    # a missing seed as 0, so the seeds compared here are 7 and 8)
    s, a = draws("grid", 8)
    assert isinstance(s, GridSampler) and sorted(a) == grid and draws("grid", 8)[1] == a != draws("grid", 8, 8)[1]
    s, a = draws("random", 4)
    assert type(s) is RandomSampler and draws("random", 4)[1] == a != draws("random", 4, 8)[1]
    s, a = draws("tpe", 4, startup_trials=3)
    assert isinstance(s, TPESampler) and draws("tpe", 4, startup_trials=3)[1] == a
    # the TPE settings the runner relies on (Optuna keeps them private): 3 random trials first, and trials asked
    # ahead (RUNNING) count as a pessimistic value so parallel asks spread out
    assert (s._n_startup_trials, s._constant_liar) == (3, True)


def test_gate_scores_are_one_steps_per_prompt_gold_scores(tmp_path):
    from sweeps.runner import gate_scores
    from training.gate import GATE_RECORDS, write_records

    rows = [{"run_id": "r", "step": s, "prompt_id": p, "gold_score": g, "seed": 0, "proxy_score": 0.0,
             "response_len": 3} for s, p, g in [(2, "a", 0.25), (2, "b", 0.5), (4, "a", 0.75), (4, "b", -1.0)]]
    write_records(tmp_path / GATE_RECORDS, rows)
    assert gate_scores(tmp_path, 4) == {"a": 0.75, "b": -1.0}
    assert gate_scores(str(tmp_path), 2) == {"a": 0.25, "b": 0.5}
    assert gate_scores(tmp_path, 6) == {}
    assert gate_scores(None, 4) == {} and gate_scores(tmp_path / "missing", 4) == {}


def test_the_study_owner_is_alive_only_as_this_hosts_process_with_its_start_time():
    import subprocess

    from sweeps.runner import _owner, _owner_alive

    me = _owner()
    assert _owner_alive(me) is True
    assert _owner_alive(None) is False and _owner_alive({}) is False
    assert _owner_alive({**me, "host": me["host"] + "-elsewhere"}) is False
    # the pid reused by a process started half a second later or earlier is not the owner
    assert _owner_alive({**me, "start": me["start"] + 0.5}) is False
    assert _owner_alive({**me, "start": me["start"] - 0.5}) is False
    assert _owner_alive({k: v for k, v in me.items() if k != "pid"}) is False
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert _owner_alive({**me, "pid": gone.pid}) is False


def test_spent_gpu_seconds_are_the_finished_trials_plus_the_running_ones(tmp_path):
    from sweeps.runner import SweepRunner

    class Trial:
        def __init__(self, attrs):
            self.user_attrs = attrs

    class Study:
        def get_trials(self, deepcopy=True):
            # two finished trials, and one asked ahead that records nothing yet (counts 0)
            return [Trial({"result.gpu_seconds": 3.0}), Trial({}), Trial({"result.gpu_seconds": 4.5})]

    runner = SweepRunner(make_spec(tmp_path, [0.1]), report=False)
    runner._live_gpu_s = {7: 2.0, 8: 0.25}
    assert runner.spent_gpu_seconds(Study()) == 3.0 + 4.5 + 2.0 + 0.25


def test_only_the_observer_stops_a_trial_not_the_alert_catalog(tmp_path, scripted, monkeypatch):
    """A KL of 50 on every step is far over the shipped catalog's kl_blowup ceiling (6 per sequence for PPO: it pages
    at step 2 and pauses the run, configs/alerts.yaml); a sweep trial runs with an empty catalog, so the pruner (the
    observer) still judges all four checkpoints and the trial completes."""
    from sweeps.runner import run_trial

    monkeypatch.setitem(KL, (0.2, 0), 50.0)
    spec, request = one_trial(tmp_path, 0.2)
    seen = []
    o = run_trial(request, lambda step, m: seen.append(step), checked=request.checked())
    assert seen == [2, 4, 6, 8]
    assert (o.state, o.steps, o.stop_reason, o.best_step) == ("completed", 8, None, 4)
    assert [r["kl"] for r in o.records] == [50.0] * 8


def test_open_study_refuses_a_used_name_a_bad_storage_and_a_live_owner(tmp_path):
    import os
    import socket
    import subprocess

    import psutil
    from optuna.trial import TrialState

    from common.errors import BadInput
    from eval.optuna_pruner import DetectorPruner
    from sweeps.runner import distributions, finished, open_study

    spec = make_spec(tmp_path, [0.01, 0.2])
    study = open_study(spec, prune=False, resume=False)
    assert isinstance(study.sampler, optuna.samplers.GridSampler)  # the spec's sampler, not Optuna's default
    assert isinstance(study.pruner, optuna.pruners.NopPruner)
    # the owner record: this host, this process and its start time (a pid alone may be reused)
    assert study.user_attrs["owner"] == {"host": socket.gethostname(), "pid": os.getpid(),
                                         "start": psutil.Process().create_time()}
    study.tell(study.ask(), 0.5)
    url = spec.storage_url
    optuna.create_study(study_name="another-sweep", storage=url)  # a shared database holds other sweeps' studies
    with pytest.raises(BadInput) as err:
        open_study(spec, prune=False, resume=False)
    assert str(err.value) == (f"name: sweep 'oracle' already has 1 trials in {url} (pass --resume to continue or "
                              "extend it, or give the sweep another name)")
    # resumed by this process: fine; while another live process owns it: refused, naming that process
    assert len(open_study(spec, prune=False, resume=True).trials) == 1
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        owner = {"host": socket.gethostname(), "pid": other.pid, "start": psutil.Process(other.pid).create_time()}
        study.set_user_attr("owner", owner)
        with pytest.raises(BadInput) as err:
            open_study(spec, prune=False, resume=True)
        assert str(err.value) == f"name: sweep 'oracle' is being run by process {other.pid} (wait for it or stop it)"
    finally:
        other.kill()
        other.wait()
    # a trial the dead owner left RUNNING: failed as interrupted (it does not count), its setting queued again
    running = study.ask(distributions(spec))
    resumed = open_study(spec, prune=False, resume=True)
    left = next(t for t in resumed.trials if t.number == running.number)
    assert left.state is TrialState.FAIL and left.user_attrs["interrupted"] is True
    (again,) = [t for t in resumed.trials if t.state is TrialState.WAITING]
    assert again.user_attrs["requeued_from"] == running.number
    assert again.system_attrs["fixed_params"] == running.params
    assert [t.number for t in finished(resumed)] == [0]
    # pruning on: the spec's detector as the study's pruner
    spec2 = make_spec(tmp_path / "p", [0.01], pruning={"detector": "patience"})
    assert isinstance(open_study(spec2, prune=True, resume=False).pruner, DetectorPruner)
    bad = make_spec(tmp_path / "b", [0.01], storage="nosuchdb://x/y")
    with pytest.raises(BadInput) as err:
        open_study(bad, prune=False, resume=False)
    assert str(err.value).startswith("storage: cannot open 'nosuchdb://x/y' (NoSuchModuleError: Can't load plugin")


def test_make_pruner_and_the_pruning_check(tmp_path):
    from common.errors import BadInput
    from sweeps.runner import SweepRunner, make_pruner

    spec = make_spec(tmp_path, [0.01], pruning={"detector": "median", "params": {"n_startup_trials": 3}})
    assert isinstance(make_pruner(spec, False), optuna.pruners.NopPruner)
    median = make_pruner(spec, True)
    assert isinstance(median, optuna.pruners.MedianPruner) and median._n_startup_trials == 3  # the spec's params
    wrong = make_spec(tmp_path, [0.01], pruning={"detector": "median", "params": {"no_such": 1}})
    with pytest.raises(BadInput) as err:
        SweepRunner(wrong, report=False)
    assert str(err.value).startswith("pruning.detector: median pruner: ") and "no_such" in str(err.value)


def test_open_study_waits_for_another_writer_longer_than_sqlites_5_s_default(tmp_path):
    """Several processes (and the trial threads) share one SQLite study: a connection waits up to 60 s for another
    writer's lock (sqlite3's default is 5 s, after which 'database is locked' would stop the sweep). Here another
    connection holds an exclusive lock for 6 s while the sweep is resumed."""
    import sqlite3
    import threading

    from sweeps.runner import open_study

    spec = make_spec(tmp_path, [0.01])
    open_study(spec, prune=False, resume=False)
    lock = sqlite3.connect(spec.storage_url[len("sqlite:///"):], isolation_level=None, check_same_thread=False)
    lock.execute("BEGIN EXCLUSIVE")
    release = threading.Timer(6.0, lambda: lock.execute("COMMIT"))
    release.start()
    try:
        t0 = time.perf_counter()
        study = open_study(spec, prune=False, resume=True)
        assert time.perf_counter() - t0 >= 5.5 and study.study_name == "oracle"
    finally:
        release.join()
        lock.close()
