"""Which queued trial a sweep starts next (sweeps/runner.py on `scheduling.live.LiveRound` with the spec's
`scheduler`), on a real Optuna SQLite storage, with a scripted trial in place of training. The expected start orders
are re-derived here from the study's params with a plain re-implementation of the queue (ask order, lookahead,
rollout-token estimate), not by the runner's code. Wall about 25 s on 2 shared cores."""

from __future__ import annotations

import re
import sys

import optuna
import pytest
import yaml
from optuna.trial import TrialState
from sweep_helpers import BASE

from sweeps.runner import SweepRunner, TrialOutcome
from sweeps.spec import parse_spec

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]
BATCH = BASE["ppo"]["batch_size"]
# steps x new tokens: products 8..96 with ties (2 x 8 = 4 x 4, 4 x 12 = 8 x 6...), so ties by ask order are exercised
SPACE = {"steps": {"choice": [2, 4, 8]}, "ppo.max_new_tokens": {"choice": [4, 6, 8, 12]}}


class ScriptedTrial:
    """Stands in for `run_trial`: completes at once, one GPU-second per step, objective = 1 / steps; records the
    trial number (from its run directory) and the config it was given, in call order."""

    def __init__(self):
        self.calls: list[tuple[int, int, int]] = []  # (trial number, steps, max_new_tokens)

    def __call__(self, request, observer, *, checked, ledger, run_id):
        cfg, out_dir = checked.config, request.out_dir
        number = int(re.search(r"trial-(\d+)", str(out_dir)).group(1))
        self.calls.append((number, cfg.steps, cfg.ppo.max_new_tokens))
        return TrialOutcome("completed", steps=cfg.steps, gpu_seconds=float(cfg.steps), wall_s=0.0, best_step=cfg.steps,
                            best_score=1.0 / cfg.steps, best_se=0.01, best_checkpoint=None)


def make_spec(tmp_path, **kw):
    d = {"name": "order", "base": BASE, "space": SPACE, "sampler": {"kind": "random", "seed": 1}, "trials": 8,
         "concurrency": 1, "pruning": {"detector": "none"}, "out_dir": str(tmp_path / "sweep")}
    d.update(kw)
    return parse_spec(d)


def run(spec, fake, resume=False):
    events: list[tuple[str, dict]] = []
    runner = SweepRunner(spec, resume=resume, trial_fn=fake, report=False,
                         on_event=lambda kind, info: events.append((kind, info)))
    return runner.run(), events


def study_of(spec):
    return optuna.load_study(study_name=spec.name, storage=spec.storage_url)


def tokens(params) -> int:
    """The oracle's size of a trial: rollout tokens = steps x batch x new tokens (one seed)."""
    return params["steps"] * BATCH * params["ppo.max_new_tokens"]


def expected_one_slot_order(params_by_number: dict[int, dict], trials: int, depth: int, shortest_first: bool,
                            size=tokens):
    """One slot: before the k-th start the runner has asked trials 0 .. k + depth (ask order = trial number); the
    first free slot goes to the smallest queued trial (ties: asked first), or to the first asked under FIFO."""
    started: list[int] = []
    for k in range(trials):
        waiting = [n for n in range(min(k + 1 + depth, trials)) if n not in started]
        key = (lambda n: (size(params_by_number[n]), n)) if shortest_first else (lambda n: n)
        started.append(min(waiting, key=key))
    return started


def assert_ended_clean(spec, trials):
    states = [t.state for t in study_of(spec).trials]
    assert states.count(TrialState.COMPLETE) == trials
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states


def test_sjf_est_starts_the_smaller_queued_trials_first(tmp_path):
    spec = make_spec(tmp_path, scheduler="SJF-Est", queue_depth=3)
    fake = ScriptedTrial()
    summary, _ = run(spec, fake)
    params = {t.number: t.params for t in study_of(spec).trials}
    want = expected_one_slot_order(params, 8, depth=3, shortest_first=True)
    # the drawn settings must tell SJF from the ask order and the size (steps x tokens) from either factor alone
    assert want != sorted(want)
    for factor in ("steps", "ppo.max_new_tokens"):
        assert want != expected_one_slot_order(params, 8, 3, True, size=lambda p, f=factor: p[f])
    assert [c[0] for c in fake.calls] == want
    # each call trained the config of the trial it was placed for
    assert [(c[1], c[2]) for c in fake.calls] == [(params[n]["steps"], params[n]["ppo.max_new_tokens"]) for n in want]
    assert summary["start_order"] == want and summary["trials_done"] == 8
    assert_ended_clean(spec, 8)


@pytest.mark.parametrize("depth", [None, 3])
def test_fifo_keeps_the_ask_order_with_or_without_a_lookahead(tmp_path, depth):
    spec = make_spec(tmp_path, queue_depth=depth)  # scheduler: FIFO is the default
    assert spec.scheduler == "FIFO" and spec.lookahead == (depth or 0)
    fake = ScriptedTrial()
    summary, _ = run(spec, fake)
    assert [c[0] for c in fake.calls] == list(range(8))
    params = {t.number: t.params for t in study_of(spec).trials}
    assert expected_one_slot_order(params, 8, 3, shortest_first=True) != list(range(8))  # SJF would differ here
    assert summary["trials_done"] == 8
    assert_ended_clean(spec, 8)


def test_two_slots_every_start_is_the_smallest_trial_then_queued(tmp_path):
    """Two trials at a time (finish order is up to the threads): replay the runner's queue events and check that
    every trial it started was the smallest one waiting at that moment, by the oracle's token count."""
    spec = make_spec(tmp_path, scheduler="SJF-Est", queue_depth=2, concurrency=2, trials=10)
    fake = ScriptedTrial()
    summary, events = run(spec, fake)
    waiting: dict[int, dict] = {}
    started = []
    for kind, info in events:
        if kind == "trial_queued":
            waiting[info["number"]] = info["params"]
        elif kind == "trial_started":
            n = info["number"]
            assert (tokens(waiting[n]), n) == min((tokens(p), m) for m, p in waiting.items()), (n, waiting)
            del waiting[n]
            started.append(n)
    assert not waiting and sorted(started) == list(range(10)) and sorted(c[0] for c in fake.calls) == sorted(started)
    assert started != sorted(started)
    assert_ended_clean(spec, 10)


def test_budget_stop_releases_the_queue_and_resume_runs_those_settings(tmp_path):
    # one slot, three asked ahead; after the first (smallest) trial the spent GPU time crosses the budget
    spec = make_spec(tmp_path, scheduler="SJF-Est", queue_depth=3, trials=6, budget={"gpu_hours": 1e-6})
    fake = ScriptedTrial()
    summary, events = run(spec, fake)
    assert summary["budget_stop"].startswith("budget.gpu_hours reached") and ("budget" in [k for k, _ in events])
    assert summary["trials_done"] == 1 and len(fake.calls) == 1
    trials = study_of(spec).trials
    by_state = {s: [t for t in trials if t.state is s] for s in TrialState}
    assert not by_state[TrialState.RUNNING] and len(by_state[TrialState.COMPLETE]) == 1
    never = by_state[TrialState.FAIL]
    assert len(never) == 3 and all(t.user_attrs.get("never_started") for t in never)
    waiting = by_state[TrialState.WAITING]  # their settings, queued again in the study
    assert sorted(t.user_attrs["requeued_from"] for t in waiting) == sorted(t.number for t in never)
    requeued_params = sorted(tuple(sorted(t.params.items())) for t in never)

    # resume without the budget: the three waiting settings run before anything new is drawn
    spec2 = make_spec(tmp_path, scheduler="SJF-Est", queue_depth=3, trials=4)
    summary2, _ = run(spec2, fake, resume=True)
    ran = sorted((("ppo.max_new_tokens", t), ("steps", s)) for _, s, t in fake.calls[1:])
    assert ran == requeued_params and summary2["trials_done"] == 4
    states = [t.state for t in study_of(spec2).trials]
    assert states.count(TrialState.COMPLETE) == 4 and TrialState.RUNNING not in states
    assert TrialState.WAITING not in states


def test_a_sweep_that_raises_leaves_only_its_started_trial_running(tmp_path):
    spec = make_spec(tmp_path, scheduler="SJF-Est", queue_depth=3)

    def boom(*a, **k):
        raise KeyboardInterrupt  # not an Exception: the trial does not record it, the sweep itself stops

    with pytest.raises(KeyboardInterrupt):
        SweepRunner(spec, trial_fn=boom, report=False).run()
    trials = study_of(spec).trials
    # the one trial that started stays RUNNING for --resume to requeue (as after a kill); the three asked ahead
    # are released
    assert len(trials) == 4 + 3
    assert len([t for t in trials if t.state is TrialState.RUNNING]) == 1
    never = [t for t in trials if t.user_attrs.get("never_started")]
    assert len(never) == 3 and all(t.state is TrialState.FAIL for t in never)
    assert len([t for t in trials if t.state is TrialState.WAITING]) == 3


def test_live_round_takes_jobs_submitted_after_it_began():
    """`LiveRound.submit` on a hand-worked schedule: 2 slots, jobs arriving while others run."""
    from scheduling.jobview import JobView
    from scheduling.live import LiveRound
    from scheduling.policies import SJFEst

    live = LiveRound(SJFEst(), [], [], slots=2)
    assert live.done and live.to_start() == []
    a = live.submit(JobView(0, "rlhf", 0, 1, 0.0, 30.0), 1)
    b = live.submit(JobView(1, "rlhf", 0, 2, 1.0, 5.0), 2)
    assert (a, b) == (0, 1)
    assert live.to_start() == [1] and live.free == 0  # the smaller job takes both slots
    c = live.submit(JobView(2, "rlhf", 0, 1, 2.0, 10.0), 1)
    live.finished(b)
    assert live.to_start() == [c, a] and live.free == 0  # 10 before 30
    live.finished(a)
    live.finished(c)
    assert live.done and live.order == [1, 2, 0]
    with pytest.raises(ValueError, match=r"jobs\[3\]\.gpus: 3 does not fit a pool of 2 slots"):
        live.submit(JobView(3, "rlhf", 0, 3, 3.0, 1.0), 3)


@pytest.mark.parametrize("name,expected", [
    ("SJF-Fast", "unknown scheduler 'SJF-Fast' (bases: EvalSched, FIFO, LossAware, SJF, SJF-Est, SRTF, SRTF-Est)"),
    ("EvalStop+SJF", "set pruning.detector to 'evalstop'"),
])
def test_a_bad_scheduler_exits_2_naming_the_field_before_anything_starts(name, expected, tmp_path, monkeypatch,
                                                                         capsys):
    from rlhfops.cli import main

    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump({"name": "bad", "base": "configs/ppo-tiny.yaml", "space": SPACE, "trials": 2,
                                 "scheduler": name, "out_dir": str(tmp_path / "sweep")}))
    monkeypatch.setattr(sys, "argv", ["rlhfops", "sweep", str(f)])
    with pytest.raises(SystemExit) as exc:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "field 'scheduler'" in err[0] and expected in err[0], err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "mlflow.db").exists()
