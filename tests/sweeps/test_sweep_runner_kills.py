"""The sweep runner's small decisions, each checked against a hand-built case (issue 31: mutation testing of
`sweeps/runner.py`; every test here kills survivors listed in tests/mutation_equivalents_sweeps.toml). No model is
trained: the runner's parts are called directly on in-memory Optuna studies, with a hand-written `trial_fn` where a
trial has to run, and every expected value is worked out in the comments from the case's own numbers."""

from __future__ import annotations

import math
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from optuna.distributions import CategoricalDistribution
from optuna.pruners import BasePruner
from optuna.trial import TrialState
from sweep_helpers import BASE
from test_sweep_oracles import make_spec

from common.errors import BadInput

KL = {"ppo.kl_coef": CategoricalDistribution([0.2])}


def spec_with_base_file(tmp_path, **kw):
    """A spec whose base config is a YAML file named relative to the spec's folder (`tmp_path/specs`), a name that
    does not exist relative to the working directory: it is found only through the runner's `base_dir`."""
    folder = tmp_path / "specs"
    folder.mkdir(parents=True)
    name = "m31-kills-base-config.yaml"
    assert not Path(name).exists()
    (folder / name).write_text(yaml.safe_dump(BASE))
    return make_spec(tmp_path, [0.2], base=name, **kw), folder


# ---- estimated_work: the scheduler's size of a trial ---------------------------------------------------------------


def test_estimated_work_is_seeds_x_steps_x_prompts_x_new_tokens_and_zero_for_a_setting_that_makes_no_job(tmp_path):
    from sweeps.runner import estimated_work

    spec, folder = spec_with_base_file(tmp_path / "file", seeds=3)
    # 3 seeds x 8 steps (the spec's override) x 4 prompts per step x 12 new tokens (BASE's ppo)
    assert estimated_work(spec, {"ppo.kl_coef": 0.2}, folder) == 3 * 8 * 4 * 12 == 1152.0
    # a setting that makes no valid job (a batch of 0 prompts is out of range) is estimated 0
    with pytest.raises(BadInput):
        from sweeps.spec import trial_config

        trial_config(spec, {"ppo.batch_size": 0}, 0, folder)
    assert estimated_work(spec, {"ppo.batch_size": 0}, folder) == 0.0
    # the estimate is seed 0's config: at the largest seed numpy takes (2**32 - 1) seed 1's would be out of range,
    # yet the trial is valid (one seed per trial) and estimated by its size: 1 x 8 x 4 x 12
    top = make_spec(tmp_path / "top", [0.2], overrides={"steps": 8, "seed": 2**32 - 1})
    assert estimated_work(top, {"ppo.kl_coef": 0.2}) == 1 * 8 * 4 * 12 == 384.0


# ---- finished: the trials that count towards the target ------------------------------------------------------------


def test_finished_counts_complete_pruned_and_failed_trials_but_not_interrupted_never_started_or_running_ones():
    from sweeps.runner import finished

    study = optuna.create_study()
    states = [TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.FAIL, TrialState.FAIL]
    attrs = [{}, {}, {}, {"interrupted": True}, {"never_started": True}]
    for state, attr in zip(states, attrs, strict=True):
        t = study.ask()
        for k, v in attr.items():
            t.set_user_attr(k, v)
        study.tell(t, 0.5 if state is TrialState.COMPLETE else None, state=state)
    study.ask()  # trial 5: RUNNING
    study.enqueue_trial({})  # trial 6: WAITING
    assert [t.number for t in finished(study)] == [0, 1, 2]


# ---- _budget_reached: the GPU-hours and wall-clock budgets, at their edges -----------------------------------------


def test_the_budget_is_reached_at_exactly_its_gpu_hours_and_its_wall_seconds(tmp_path, monkeypatch):
    import sweeps.runner as runner_module
    from sweeps.runner import SweepRunner

    study = optuna.create_study()  # no finished trial: what is spent is the running trials' live GPU-seconds
    runner = SweepRunner(make_spec(tmp_path / "gpu", [0.2], budget={"gpu_hours": 1.0}), report=False)
    runner._live_gpu_s = {0: 1000.0, 1: 800.0}  # 1800 GPU-s = 0.5 of 1 GPU-hour
    assert runner._budget_reached(study, time.time()) is None
    runner._live_gpu_s = {0: 2000.0, 1: 1600.0}  # 3600 GPU-s = exactly 1 GPU-hour: reached
    assert runner._budget_reached(study, time.time()) == "budget.gpu_hours reached: 1.0000 of 1 GPU-hours spent"

    clock = SimpleNamespace(time=lambda: 1000.0, perf_counter=time.perf_counter)  # the wall clock reads 1000 s
    monkeypatch.setattr(runner_module, "time", clock)
    runner = SweepRunner(make_spec(tmp_path / "wall", [0.2], budget={"wall_s": 100}), report=False)
    assert runner._budget_reached(study, 901.0) is None  # 99 s of 100
    assert runner._budget_reached(study, 900.0) == "budget.wall_s reached: 100 of 100 s"  # exactly 100 s: reached


# ---- _observer: what the pruner sees of each checkpoint, the live GPU time, the stop reason ------------------------


class ScriptedPruner(BasePruner):
    """Prunes a trial whose last reported step is in `at`, and explains itself from the study and the trial."""

    name = "scripted"

    def __init__(self, at):
        self.at = set(at)

    def prune(self, study, trial) -> bool:
        return trial.last_step in self.at

    def reason(self, study, frozen) -> str:
        return f"{study.direction.name} trial {frozen.number} last at {frozen.last_step}"


def write_gate_records(out_dir: Path, rows) -> None:
    from training.gate import GATE_RECORDS, write_records

    out_dir.mkdir(parents=True, exist_ok=True)
    write_records(out_dir / GATE_RECORDS, [{"run_id": "r", "step": s, "prompt_id": p, "gold_score": g, "seed": 0,
                                            "proxy_score": 0.0, "response_len": 3} for s, p, g in rows])


def test_the_observer_reports_each_checkpoint_charges_the_live_trial_and_stops_with_the_pruners_reason(tmp_path):
    from eval.optuna_pruner import CKPT_PREFIX
    from sweeps.runner import SweepRunner

    spec = make_spec(tmp_path, [0.2], concurrency=2, gpus_per_trial=2, pruning={"detector": "median"})
    runner = SweepRunner(spec, prune=True, report=False)
    study = optuna.create_study(direction="minimize", pruner=ScriptedPruner(at={14}))
    study.ask()  # trial 0: not the one observed
    trial = study.ask()  # trial 1
    out = tmp_path / "seed-1"
    write_gate_records(out, [(2, "a", 0.25), (2, "b", 0.5), (6, "a", 0.75), (6, "b", -1.0)])
    runner._done_seeds_gpu_s[1] = 10.0  # the trial's seed 0 spent 10 GPU-s
    # seed 1 of 8 steps, 4 planned checkpoints: its step s is the trial's step 8 + s
    observe = runner._observer(trial, 1, 8, out, 4)
    assert observe(2, {"gold_eval": 0.5, "gold_eval_se": 0.01, "reward_mean": 1.5, "wall_s": 3.0}) is None
    # live GPU time: seed 0's 10 GPU-s + 3 s of wall on 2 GPUs
    assert runner._live_gpu_s == {1: 10.0 + 3.0 * 2}
    ckpt = trial.user_attrs[f"{CKPT_PREFIX}{10:09d}"]
    assert ckpt == {"score": 0.5, "se": 0.01, "reward": 1.5, "series": 1, "prompts": {"a": 0.25, "b": 0.5}}
    # step 6 (the trial's 14): the pruner prunes; the reason names it, the seed's step and its own evidence
    assert observe(6, {"gold_eval": 0.4, "wall_s": 7.0}) == ("pruned by the scripted pruner at step 6: MINIMIZE "
                                                             "trial 1 last at 14")
    assert runner._live_gpu_s == {1: 10.0 + 7.0 * 2}
    ckpt = trial.user_attrs[f"{CKPT_PREFIX}{14:09d}"]
    assert ckpt["prompts"] == {"a": 0.75, "b": -1.0} and (ckpt["score"], ckpt["series"]) == (0.4, 1)
    assert math.isnan(ckpt["se"]) and math.isnan(ckpt["reward"])  # not given: NaN
    assert trial.user_attrs["rlhfops.planned_checkpoints"] == 4

    # a first seed with nothing spent before, whose metrics give no wall time: nothing charged yet
    other = study.ask()  # trial 2
    assert runner._observer(other, 0, 8, None, 4)(2, {"gold_eval": 0.3}) is None
    assert runner._live_gpu_s == {1: 24.0, 2: 0.0}

    # pruning off (--no-prune): the observer never stops a trial, even where the study's pruner would
    off = SweepRunner(spec, prune=False, report=False)
    late = study.ask()  # trial 3
    assert off._observer(late, 1, 8, None, 4)(6, {"gold_eval": 0.4, "wall_s": 1.0}) is None
    assert late.should_prune()  # the study's pruner would have pruned it at the trial's step 14


# ---- _run_one: one trial's seeds, its tracker run, its GPU slot --------------------------------------------------


def outcome(steps=8, gpu_seconds=12.0, score=0.5):
    from sweeps.runner import TrialOutcome

    return TrialOutcome(state="completed", steps=steps, gpu_seconds=gpu_seconds, wall_s=1.0, best_step=2,
                        best_score=score, best_se=0.01, best_checkpoint="ckpt")


def test_run_one_starts_the_tracker_run_holds_the_slot_and_gives_each_seed_its_request_run_id_and_observer(tmp_path):
    from eval.optuna_pruner import CKPT_PREFIX
    from sweeps.runner import NullTracker, SweepRunner

    spec, folder = spec_with_base_file(tmp_path, seeds=2)
    events: list = []

    class Tracker(NullTracker):
        def trial_started(self, number, params):
            events.append(("tracker", number, params))
            return "run-abc"

    class Slot:
        def __enter__(self):
            events.append("slot held")

        def __exit__(self, *exc):
            events.append("slot freed")

    def trial_fn(request, observer, *, checked, ledger, run_id):
        events.append(("trial", request.out_dir, run_id, checked.config.seed))
        write_gate_records(request.out_dir, [(2, "p", 0.125)])
        assert observer(2, {"gold_eval": 0.5, "wall_s": 1.0}) is None
        return outcome()

    runner = SweepRunner(spec, prune=False, report=False, tracker=Tracker(), trial_fn=trial_fn, base_dir=folder,
                         slot=Slot)
    study = optuna.create_study()
    study.ask(KL)  # trial 0: not run
    trial = study.ask(KL)  # trial 1
    res, _ = runner._run_one(trial)
    assert (res.number, res.state, res.error, res.run_id) == (1, "completed", None, "run-abc")
    seeds = [spec.run_dir / "trial-0001" / f"seed-{i}" for i in (0, 1)]
    # the tracker's run first, then both seeds (seed i: base seed + i) in the trial's folders inside the slot
    assert events == [("tracker", 1, {"ppo.kl_coef": 0.2}), "slot held", ("trial", seeds[0], "run-abc", BASE["seed"]),
                      ("trial", seeds[1], "run-abc", BASE["seed"] + 1), "slot freed"]
    # each seed's checkpoint at step 2 (the trial's 2 and 10) carries that seed's per-prompt gate scores
    assert [trial.user_attrs[f"{CKPT_PREFIX}{s:09d}"].get("prompts") for s in (2, 10)] == [{"p": 0.125}] * 2

    # no tracker run id: the trial runs (and is charged) as "<sweep>/trial-<n>"
    seen = []
    runner = SweepRunner(spec, prune=False, report=False, base_dir=folder,
                         trial_fn=lambda request, observer, **kw: seen.append(kw["run_id"]) or outcome())
    res, _ = runner._run_one(study.ask(KL))  # trial 2
    assert (res.state, res.run_id, seen) == ("completed", None, ["oracle/trial-2", "oracle/trial-2"])


def test_run_one_whose_tracker_cannot_start_the_run_is_failed_without_training(tmp_path):
    from sweeps.runner import NullTracker, SweepRunner

    class Broken(NullTracker):
        def trial_started(self, number, params):
            raise RuntimeError("tracking server down")

    ran = []
    runner = SweepRunner(make_spec(tmp_path, [0.2]), prune=False, report=False, tracker=Broken(),
                         trial_fn=lambda *a, **kw: ran.append(1) or outcome())
    res, records = runner._run_one(optuna.create_study().ask(KL))
    assert (res.state, res.error, records, ran) == ("failed", "tracking: RuntimeError: tracking server down", [], [])
