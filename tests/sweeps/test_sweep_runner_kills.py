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
    study = optuna.create_study(direction="minimize", pruner=ScriptedPruner(at={6}))  # prunes at the trial's step 6
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
    # its step 6 is the trial's 14: not pruned there
    assert observe(6, {"gold_eval": 0.4, "wall_s": 7.0}) is None
    assert runner._live_gpu_s == {1: 10.0 + 7.0 * 2}
    ckpt = trial.user_attrs[f"{CKPT_PREFIX}{14:09d}"]
    assert ckpt["prompts"] == {"a": 0.75, "b": -1.0} and (ckpt["score"], ckpt["series"]) == (0.4, 1)
    assert math.isnan(ckpt["se"]) and math.isnan(ckpt["reward"])  # not given: NaN
    assert trial.user_attrs["rlhfops.planned_checkpoints"] == 4

    # a first seed with nothing spent before, whose metrics give no wall time: nothing charged yet
    other = study.ask()  # trial 2
    assert runner._observer(other, 0, 8, None, 4)(2, {"gold_eval": 0.3}) is None
    assert runner._live_gpu_s == {1: 24.0, 2: 0.0}

    # a first seed's step 6: the pruner prunes; the reason names it, the step and its own evidence
    first = study.ask()  # trial 3
    assert runner._observer(first, 0, 8, None, 4)(6, {"gold_eval": 0.4}) == (
        "pruned by the scripted pruner at step 6: MINIMIZE trial 3 last at 6")

    # pruning off (--no-prune): the observer never stops a trial, even where the study's pruner would
    off = SweepRunner(spec, prune=False, report=False)
    late = study.ask()  # trial 4
    assert off._observer(late, 0, 8, None, 4)(6, {"gold_eval": 0.4, "wall_s": 1.0}) is None
    assert late.should_prune()  # the study's pruner would have pruned it at step 6


def test_a_later_seeds_stop_reason_names_the_trials_step_as_pruned_at_does(tmp_path):
    from sweeps.runner import SweepRunner

    runner = SweepRunner(make_spec(tmp_path, [0.2], seeds=2, pruning={"detector": "median"}), report=False)
    study = optuna.create_study(direction="minimize", pruner=ScriptedPruner(at={14}))
    trial = study.ask()
    # seed 1 of 8 steps: its step 6 is the trial's step 8 + 6 = 14, as _run_one's pruned_at counts it
    assert runner._observer(trial, 1, 8, None, 4)(6, {"gold_eval": 0.4}) == (
        "pruned by the scripted pruner at step 14: MINIMIZE trial 0 last at 14")


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


STEPS = 8  # make_spec's steps per seed


def scripted(number_of, seed_of=None):
    """A `trial_fn` that trains nothing: `number_of(number, seed index, request, observer)` returns the seed's
    TrialOutcome (or raises). The trial number and seed index are read off the request's run directory."""
    import re

    def trial_fn(request, observer, *, checked, ledger, run_id):
        m = re.search(r"trial-(\d+)[/\\]seed-(\d+)", str(request.out_dir))
        return number_of(int(m.group(1)), int(m.group(2)), request, observer)

    return trial_fn


def test_run_one_joins_the_seeds_records_and_curve_and_a_seed_that_raises_fails_the_trial(tmp_path):
    from sweeps.runner import SweepRunner, TrialOutcome

    spec = make_spec(tmp_path, [0.2], seeds=2)
    scores = {0: 0.5, 1: 0.25}  # each seed's one checkpoint (its step 2)

    def seed(number, i, request, observer):
        return TrialOutcome(state="completed", steps=STEPS, gpu_seconds=12.0 / (i + 1), wall_s=0.0, best_step=2,
                            best_score=scores[i], best_se=0.01, best_checkpoint=f"s{i}",
                            records=[{"step": 1}, {"step": 2, "gold_eval": scores[i]}])  # step 1: no gate ran

    runner = SweepRunner(spec, prune=False, report=False, trial_fn=scripted(seed))
    study = optuna.create_study()
    t0 = time.perf_counter()
    res, records = runner._run_one(study.ask(KL))
    elapsed = time.perf_counter() - t0
    # seed 1's steps follow seed 0's 8: its steps 1, 2 are the trial's 9, 10
    assert records == [{"step": 1}, {"step": 2, "gold_eval": 0.5}, {"step": 9}, {"step": 10, "gold_eval": 0.25}]
    assert res.curve == [(2, 0.5), (10, 0.25)]
    assert (res.state, res.objective, res.gpu_seconds, res.steps) == ("completed", (0.5 + 0.25) / 2, 12.0 + 6.0, 16)
    assert 0.0 <= res.wall_s <= elapsed

    # seed 1 raises: the trial fails with its error, keeps seed 0's GPU time and steps, and has no objective; the slot
    # it held is released as a plain `with` block would (no exception passed on)
    exits = []

    class Slot:
        def __enter__(self):
            return self

        def __exit__(self, exc_type, exc, tb):
            exits.append((exc_type, exc, tb))

    def breaks(number, i, request, observer):
        if i == 1:
            raise RuntimeError("seed 1 broke")
        return seed(number, i, request, observer)

    runner = SweepRunner(spec, prune=False, report=False, trial_fn=scripted(breaks), slot=Slot)
    res, records = runner._run_one(study.ask(KL))
    assert (res.state, res.error, res.gpu_seconds, res.steps) == ("failed", "RuntimeError: seed 1 broke", 12.0, STEPS)
    assert math.isnan(res.objective) and (res.best_step, res.best_checkpoint, res.stop_reason) == (None, None, None)
    assert exits == [(None, None, None)]


# ---- _view: what the scheduler sees of a queued trial ------------------------------------------------------------


def test_the_view_of_a_queued_trial_is_its_number_gpus_ask_order_and_estimated_size(tmp_path):
    from sweeps.runner import SweepRunner

    spec, folder = spec_with_base_file(tmp_path, seeds=3, concurrency=4, gpus_per_trial=2)
    runner = SweepRunner(spec, prune=False, report=False, base_dir=folder)
    study = optuna.create_study()
    study.ask(KL)
    view = runner._view(study.ask(KL), 3)  # trial 1, the 4th asked
    # 3 seeds x 8 steps x 4 prompts x 12 new tokens, from the base config found through base_dir
    assert (view.job_id, view.gpus, view.arrival, view.est_duration) == (1, 2, 3.0, 3 * 8 * 4 * 12)
    assert type(view.arrival) is float


# ---- _release_queued: trials asked ahead that never started -------------------------------------------------------


def test_released_trials_are_failed_as_never_started_and_queued_again_in_ask_order_without_a_warning(tmp_path):
    import warnings

    from sweeps.runner import SweepRunner, finished

    runner = SweepRunner(make_spec(tmp_path, [0.2]), prune=False, report=False)
    study = optuna.create_study()
    space = {"ppo.kl_coef": CategoricalDistribution([0.01, 0.2, 0.5])}
    asked = [study.ask(space) for _ in range(3)]
    params = [dict(t.params) for t in asked]
    queued = {7: asked[2], 5: asked[0], 6: asked[1]}  # LiveRound index -> trial, not in ask order
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runner._release_queued(study, queued)
    assert [str(w.message) for w in caught] == [] and queued == {}
    trials = study.get_trials()
    assert [(t.state, t.user_attrs) for t in trials[:3]] == [(TrialState.FAIL, {"never_started": True})] * 3
    again = trials[3:]
    assert [(t.state, t.user_attrs["requeued_from"], t.system_attrs["fixed_params"]) for t in again] == [
        (TrialState.WAITING, k, params[k]) for k in range(3)]
    assert finished(study) == []


# ---- run: the loop (tracker calls, the trial threads, the budget checks, the pruner) ------------------------------


def done(score=0.5, gpu_seconds=1.0, state="completed", **kw):
    from sweeps.runner import TrialOutcome

    return TrialOutcome(state=state, steps=STEPS, gpu_seconds=gpu_seconds, wall_s=0.0, best_step=2, best_score=score,
                        best_se=0.01, best_checkpoint=None, **kw)


def test_a_sweep_tells_its_tracker_the_spec_and_the_end_and_runs_trials_on_named_threads(tmp_path):
    import threading

    from sweeps.runner import NullTracker, SweepRunner

    calls = []

    class Tracker(NullTracker):
        def start(self, spec, resume):
            calls.append(("start", spec, resume))

        def finish(self, summary, report_files, failed=False):
            calls.append(("finish", summary["trials_done"], report_files, failed))
            return {"registered": "nothing"}

    names, events = [], []
    spec = make_spec(tmp_path, [0.01, 0.2])
    t0 = time.time()
    summary = SweepRunner(spec, prune=False, report=False, tracker=Tracker(), trial_fn=scripted(
        lambda n, i, request, observer: names.append(threading.current_thread().name) or done()),
        on_event=lambda kind, info: events.append((kind, info))).run()
    elapsed = time.time() - t0
    assert calls == [("start", spec, False), ("finish", 2, [], False)]
    assert summary["registry"] == {"registered": "nothing"} and summary["report_files"] == []
    assert not (spec.run_dir / "report").exists()  # report=False: none written
    assert len(names) == 2 and all(name.startswith("trial_") for name in names)
    # the summary's target and the sweep's wall time; the last event is "done" with the summary
    assert summary["target_trials"] == 2 and 0.0 <= summary["wall_s"] <= elapsed
    assert events[-1] == ("done", summary) and [kind for kind, _ in events].count("done") == 1


def test_every_parallel_trial_gets_a_thread_however_few_cores(tmp_path, monkeypatch):
    """6 slots, 6 trials that each wait for all 6 to be running: on a machine whose default thread pool would have
    fewer threads (os.cpu_count() 1: min(32, 1 + 4) = 5) the sixth would never start."""
    import os
    import threading

    from sweeps.runner import SweepRunner

    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    together = threading.Barrier(6, timeout=10)

    def trial(n, i, request, observer):
        together.wait()
        return done()

    spec = make_spec(tmp_path, [0.01 * k for k in range(1, 7)], concurrency=6)
    summary = SweepRunner(spec, prune=False, report=False, trial_fn=scripted(trial)).run()
    assert [t["state"] for t in summary["trials"]] == ["completed"] * 6


def test_the_budget_is_checked_only_when_a_trial_could_start_and_said_once(tmp_path):
    """Trial 0 spends 2 GPU-hours at once (the budget is 1); trial 1 waits for what the test names, then spends
    nothing. With 2 trials to run the budget is never checked once both have started (no budget stop); with 4 it is
    checked when trial 0 ends (a slot is free and 2 + 0 trials are short of 4) and reached, said once."""
    import threading

    from sweeps.runner import SweepRunner

    def run(target, release_on):
        go, events = threading.Event(), []

        def on_event(kind, info):
            events.append((kind, info))
            if kind == release_on:
                go.set()

        def trial(n, i, request, observer):
            if n == 0:
                return done(gpu_seconds=7200.0)
            assert go.wait(10), f"no {release_on} event"
            return done(gpu_seconds=0.0)

        spec = make_spec(tmp_path / str(target), [0.01 * k for k in range(1, target + 1)], concurrency=2,
                         budget={"gpu_hours": 1.0, "wall_s": 3600})
        summary = SweepRunner(spec, prune=False, report=False, trial_fn=scripted(trial), on_event=on_event).run()
        return summary, [info for kind, info in events if kind == "budget"]

    # (trial 1 completes only if trial 0's end was handled while it ran: the loop waits for the first trial to end)
    summary, said = run(2, "trial_finished")
    assert (summary["budget_stop"], said, summary["trials_done"]) == (None, [], 2)
    assert [t["state"] for t in summary["trials"]] == ["completed"] * 2
    summary, said = run(4, "budget")
    message = "budget.gpu_hours reached: 2.0000 of 1 GPU-hours spent"
    assert said == [{"message": message, "done": 1, "target": 4}]
    assert (summary["budget_stop"], summary["trials_done"]) == (message, 2)
    assert [t["state"] for t in summary["trials"]] == ["completed"] * 2


def test_the_sweeps_pruner_is_the_studys_when_pruning_is_on(tmp_path):
    """Median pruner, one startup trial, no warm-up: trial 0 reports 0.9 at step 2 and completes; trial 1 reports
    0.1 at step 2, below the median (0.9) of the completed trials there: pruned."""
    from sweeps.runner import SweepRunner

    def trial(n, i, request, observer):
        score = {0: 0.9, 1: 0.1}[n]
        reason = observer(2, {"gold_eval": score, "wall_s": 0.0})
        return done(score, state="pruned", stop_reason=reason, pruned_at=2) if reason else done(score)

    spec = make_spec(tmp_path, [0.01, 0.2], pruning={"detector": "median",
                                                     "params": {"n_startup_trials": 1, "n_warmup_steps": 0}})
    summary = SweepRunner(spec, prune=True, report=False, trial_fn=scripted(trial)).run()
    assert [(t["number"], t["state"], t["stop_reason"]) for t in summary["trials"]] == [
        (0, "completed", None), (1, "pruned", "pruned by the median pruner at step 2: its best score so far at step 2 "
                                              "is below the median of earlier trials' at the same step")]


def test_a_sweep_tells_its_tracker_and_listener_each_trial_and_stops_counting_a_finished_trial_as_live(tmp_path):
    """One slot, two trials of 1800 GPU-s each (half the 1-GPU-hour budget): trial 1 starts because trial 0's
    GPU time is counted once (its record) and no longer as live."""
    from sweeps.runner import NullTracker, SweepRunner

    told, events = [], []

    class Tracker(NullTracker):
        def trial_started(self, number, params):
            return f"run-{number}"

        def trial_finished(self, result, records):
            told.append((result.number, result.run_id, records))

    records = [{"step": 1}, {"step": 2, "gold_eval": 0.5}]

    def trial(n, i, request, observer):
        observer(2, {"gold_eval": 0.5, "wall_s": 900.0})
        return done(gpu_seconds=1800.0, records=records)

    spec = make_spec(tmp_path, [0.01, 0.2], budget={"gpu_hours": 1.0})
    runner = SweepRunner(spec, prune=False, report=False, tracker=Tracker(), trial_fn=scripted(trial),
                         on_event=lambda kind, info: events.append((kind, info)))
    summary = runner.run()
    assert (summary["budget_stop"], summary["trials_done"], summary["gpu_seconds"]) == (None, 2, 3600.0)
    assert told == [(0, "run-0", records), (1, "run-1", records)]
    params = {t["number"]: t["params"] for t in summary["trials"]}
    assert [info for kind, info in events if kind == "trial_started"] == [
        {"number": n, "params": params[n]} for n in (0, 1)]
    assert [(info["result"].number, info["running"]) for kind, info in events if kind == "trial_finished"] == [
        (0, 0), (1, 0)]
    assert (runner._live_gpu_s, runner._done_seeds_gpu_s) == ({}, {})  # nothing left counted for ended trials


def test_a_trial_that_never_ran_a_seed_and_a_tracker_that_cannot_record_it_do_not_stop_the_sweep(tmp_path):
    from sweeps.runner import NullTracker, SweepRunner

    class Tracker(NullTracker):
        def trial_finished(self, result, records):
            raise RuntimeError("tracking server down")

    def trial(n, i, request, observer):
        raise RuntimeError("no GPU")

    events = []
    summary = SweepRunner(make_spec(tmp_path, [0.01, 0.2]), prune=False, report=False, tracker=Tracker(),
                          trial_fn=scripted(trial), on_event=lambda kind, info: events.append((kind, info))).run()
    assert [(t["state"], t["error"]) for t in summary["trials"]] == [("failed", "RuntimeError: no GPU")] * 2
    assert [(kind, info) for kind, info in events if kind == "warning"] == [
        ("warning", {"message": f"trial {n}: tracking failed: tracking server down"}) for n in (0, 1)]


def test_a_failed_sweep_says_so_and_a_failure_to_release_queued_trials_never_hides_the_first_error(tmp_path):
    from sweeps.runner import NullTracker, SweepRunner

    def sweep(name, listener_breaks, release_breaks):
        finished_with, events = [], []

        class Tracker(NullTracker):
            def finish(self, summary, report_files, failed=False):
                finished_with.append(failed)
                return {}

        def on_event(kind, info):
            events.append((kind, info))
            if listener_breaks and kind == "trial_finished":
                raise RuntimeError("listener broke")

        runner = SweepRunner(make_spec(tmp_path / name, [0.01]), prune=False, report=False, tracker=Tracker(),
                             trial_fn=scripted(lambda n, i, request, observer: done()), on_event=on_event)
        if release_breaks:
            def release(study, queued):
                raise RuntimeError("database is locked")

            runner._release_queued = release
        return runner, finished_with, events

    # the sweep fails: the tracker hears failed=True, the error propagates
    runner, finished_with, _ = sweep("a", True, False)
    with pytest.raises(RuntimeError, match="listener broke"):
        runner.run()
    assert finished_with == [True]
    # the sweep went well but its queued trials could not be released: that error is raised
    runner, finished_with, _ = sweep("b", False, True)
    with pytest.raises(RuntimeError, match="database is locked"):
        runner.run()
    # both: the sweep's own error is raised, the release failure is a warning, the tracker still hears failed=True
    runner, finished_with, events = sweep("c", True, True)
    with pytest.raises(RuntimeError, match="listener broke"):
        runner.run()
    assert [(kind, info) for kind, info in events if kind == "warning"] == [
        ("warning", {"message": "queued trials left RUNNING for --resume: database is locked"})]
    assert finished_with == [True]


# ---- _tell: what the study records of a finished trial -------------------------------------------------------------


def test_tell_records_each_result_and_gives_optuna_its_state_without_a_warning(tmp_path):
    import warnings

    from sweeps.runner import SweepRunner, TrialResult

    runner = SweepRunner(make_spec(tmp_path, [0.2]), prune=False, report=False)
    study = optuna.create_study()
    nan = math.nan
    cases = [  # (state, objective, error) -> (Optuna state, value, recorded state, recorded error)
        (("completed", 0.5, None), (TrialState.COMPLETE, 0.5, "completed", None)),
        (("completed", nan, None), (TrialState.FAIL, None, "failed", "no checkpoint scored")),  # nothing scored
        (("completed", nan, "ValueError: NaN weights"), (TrialState.FAIL, None, "failed", "ValueError: NaN weights")),
        (("failed", nan, "RuntimeError: diverged"), (TrialState.FAIL, None, "failed", "RuntimeError: diverged")),
        (("failed", 0.7, "RuntimeError: late"), (TrialState.FAIL, None, "failed", "RuntimeError: late")),
        (("pruned", 0.3, None), (TrialState.PRUNED, None, "pruned", None)),  # no intermediate value: no value
    ]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for (state, objective, error), _ in cases:
            trial = study.ask()
            res = TrialResult(number=trial.number, params={}, state=state, objective=objective, error=error,
                              gpu_seconds=2.5, steps=8, curve=[(2, 0.5)])
            runner._tell(study, trial, res)
    assert [str(w.message) for w in caught] == []
    got = [(t.state, t.value, t.user_attrs["result.state"], t.user_attrs["result.error"]) for t in study.trials]
    assert got == [want for _, want in cases]
    for t in study.trials:
        assert (t.user_attrs["result.gpu_seconds"], t.user_attrs["result.steps"]) == (2.5, 8)
        assert [tuple(p) for p in t.user_attrs["result.curve"]] == [(2, 0.5)]


# ---- summary: what the sweep reports ---------------------------------------------------------------------------------


def nan_free(x):
    """`x` with every float NaN replaced by the string 'nan' (NaN != NaN would fail an equality check)."""
    if isinstance(x, dict):
        return {k: nan_free(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return type(x)(nan_free(v) for v in x)
    return "nan" if isinstance(x, float) and math.isnan(x) else x


@pytest.mark.parametrize("direction", ["maximize", "minimize"])
def test_the_summary_by_hand_in_either_direction(tmp_path, direction):
    from dataclasses import asdict

    from sweeps.runner import SweepRunner, TrialResult

    spec = make_spec(tmp_path, [0.2], direction=direction, tenant="beta", scheduler="SJF-Est", queue_depth=3,
                     concurrency=2, pruning={"detector": "median"})
    runner = SweepRunner(spec, prune=True, report=False)
    study = optuna.create_study(direction=direction)
    # (state, objective, GPU-s) of trials 0-4; the best: maximising, 0.8, tied by trials 1 and 3: the earlier, 1;
    # minimising, 0.5, tied by trials 0 and 4: 0
    rows = [("completed", 0.5, 10.0), ("pruned", 0.8, 5.0), ("failed", math.nan, 2.0), ("completed", 0.8, 1.0),
            ("completed", 0.5, 7.0)]
    results = []
    for state, objective, gpu in rows:
        t = study.ask(KL)
        r = TrialResult(number=t.number, params=dict(t.params), state=state, objective=objective, objective_se=0.01,
                        gpu_seconds=gpu, error="RuntimeError: x" if state == "failed" else None, steps=8,
                        run_id=f"run-{t.number}", curve=[(2, 0.1)])
        runner._tell(study, t, r)
        results.append(r)
    study.tell(study.ask(KL), state=TrialState.FAIL)  # trial 5: failed before anything was recorded: not reported
    study.ask(KL)  # trial 6: running
    runner.budget_stop = "budget.wall_s reached: 100 of 100 s"
    runner.start_order = [0, 1, 3, 2, 4]
    summary = runner.summary(study, results[3:], 12.5, 7)  # this session ran trials 3 and 4
    best = {"maximize": 1, "minimize": 0}[direction]
    assert nan_free(summary) == nan_free({
        "name": "oracle", "tenant": "beta", "storage": spec.storage_url, "direction": direction, "prune": True,
        "pruner": "median", "target_trials": 7, "trials": [asdict(r) for r in results],
        "trials_done": 5, "trials_pruned": 1, "trials_failed": 1, "trials_this_session": 2,
        "gpu_seconds": 10.0 + 5.0 + 2.0 + 1.0 + 7.0, "gpu_seconds_this_session": 1.0 + 7.0, "wall_s": 12.5,
        "budget_stop": "budget.wall_s reached: 100 of 100 s", "scheduler": "SJF-Est", "queue_depth": 3,
        "start_order": [0, 1, 3, 2, 4], "best": asdict(results[best])})

    # a runner that has not run (no start order) with pruning off; nothing scored: no best
    off = SweepRunner(spec, prune=False, report=False)
    summary = off.summary(study, [], 0.0, 7)
    assert (summary["prune"], summary["pruner"], summary["start_order"], summary["budget_stop"]) == (
        False, "none", [], None)
    empty = optuna.create_study(direction=direction)
    t = empty.ask(KL)
    runner._tell(empty, t, TrialResult(number=0, params={}, state="failed"))
    assert runner.summary(empty, [], 0.0, 1)["best"] is None


# ---- the runner's defaults -----------------------------------------------------------------------------------------


def test_a_runner_prunes_and_writes_its_report_by_default_and_a_pruner_named_none_is_no_pruning(tmp_path):
    from sweeps.runner import SweepRunner

    trial = scripted(lambda n, i, request, observer: done())
    spec = make_spec(tmp_path / "median", [0.2], pruning={"detector": "median"})
    summary = SweepRunner(spec, trial_fn=trial).run()
    assert (summary["prune"], summary["pruner"]) == (True, "median")
    report = spec.run_dir / "report"
    assert summary["report_files"] and all(Path(f).parent == report and Path(f).is_file()
                                           for f in summary["report_files"])
    for name in ("none", "None", "NONE"):
        spec = make_spec(tmp_path / name, [0.2], pruning={"detector": name})
        summary = SweepRunner(spec, prune=True, report=False, trial_fn=trial).run()
        assert (summary["prune"], summary["pruner"]) == (False, "none")


# ---- open_study --resume: trials a dead process left RUNNING ---------------------------------------------------------


def test_resuming_fails_a_trial_left_running_as_interrupted_without_a_warning(tmp_path):
    import warnings

    from sweeps.runner import distributions, finished, open_study

    spec = make_spec(tmp_path, [0.01, 0.2])
    study = open_study(spec, prune=False, resume=False)
    left = study.ask(distributions(spec))  # RUNNING when "the process died"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = open_study(spec, prune=False, resume=True)
    assert [str(w.message) for w in caught] == []
    (t,) = [t for t in resumed.trials if t.number == left.number]
    assert (t.state, t.user_attrs) == (TrialState.FAIL, {"interrupted": True}) and finished(resumed) == []
