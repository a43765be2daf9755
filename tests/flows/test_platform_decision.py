"""What a platform round's jobs.csv says ended each job (`training.job.lifecycle.ended_by`, the `decision` column that
`flows/platform_round.py: platform_job` writes): a job a paging alert failed states the alert and the step it paged
at (the lifecycle stops a run at the step a paging alert makes it one that can only end FAILED).

The oracle is written by hand from the records the fake trainer yields and the alert catalog's PPO KL ceiling
(configs/alerts.yaml: 6.0 per sequence, persist 2): KL 10 at steps 4 and 5, so `kl_blowup` pages at step 5."""

from __future__ import annotations

import math

from training.metrics import StepRecord

#: steps whose KL is above the PPO ceiling (6.0); persist 2: the alert pages at the second of them
KL_SPIKE = {4: 10.0, 5: 10.0}


class KLTrainer:
    """A healthy-looking run (gate every 2 steps, scores rising slowly) whose KL jumps past the ceiling at
    `KL_SPIKE`'s steps."""

    def __init__(self, spike: dict[int, float]):
        self.step, self.spike = 0, spike

    def run(self, total):
        while self.step < total:
            self.step += 1
            gold = 0.1 + 0.01 * self.step if self.step % 2 == 0 else math.nan
            yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.1 + 0.01 * self.step,
                             gold_eval=gold, gold_eval_se=0.01, kl=self.spike.get(self.step, 0.5), entropy=1.0,
                             loss_policy=0.0, phase_seconds={"rollout": 0.5, "optim": 0.25}, tokens_generated=10)


def _run(spike, pausable=True, observe=None, steps=10):
    from types import SimpleNamespace

    from training.job.lifecycle import JobHooks, JobSpec, make_supervisor, run_job

    trainer = KLTrainer(spike)

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return trainer

    spec = JobSpec(tenant="umbrella", name="weak-kl", config=SimpleNamespace(steps=steps), run_id="r1",
                   pausable=pausable)
    return run_job(spec, observe, hooks=Hooks(), supervisor=make_supervisor(spec))


def test_a_job_a_paging_alert_failed_states_the_alert_and_its_step_not_paused():
    from training.job.lifecycle import decided_by, ended_by

    out = _run(KL_SPIKE)
    assert [e.alert for e in out.supervisor.machine.pages] == ["kl_blowup"]  # the only alert that paged
    assert out.status.state.value == "FAILED"
    assert out.decision == "failed"  # the loop's own word: the run could only end FAILED from step 5 on
    assert ended_by(out) == "failed: kl_blowup at step 5"  # second step above the ceiling (persist 2)
    assert decided_by(out) == "alert" and out.stopped_by == "alert"
    # it stopped at the step that paged: a run that can only fail spends no more steps (it used to run on to its next
    # checkpoint, step 6, where the alert's pause took it; without a gate, `rlhfops train` ran on to the last step)
    assert len(out.records) == 5 and out.stop_reason == out.status.reason


def test_a_gate_stop_and_a_healthy_run_keep_their_words():
    from training.job.lifecycle import decided_by, ended_by

    healthy = _run({})
    assert healthy.status.state.value == "SUCCEEDED" and ended_by(healthy) == "completed"
    assert decided_by(healthy) == "none"
    stopped = _run({}, observe=lambda step, m: "declining" if step == 4 else None)
    assert stopped.status.state.value == "PAUSED_BY_GATE" and ended_by(stopped) == "stopped"
    assert decided_by(stopped) == "gate"


def test_decided_by_names_the_pruner_a_hooks_stopper_the_supervisors_gate_and_a_failure():
    """Who stopped the job, by hand: an observer in the pruner's role (a sweep trial, not pausable), a hook that stops
    at a person's request or for a budget, the supervisor's own gate detector, a worker that dies."""
    from types import SimpleNamespace

    from training.job.lifecycle import JobHooks, JobSpec, decided_by, job_record, make_supervisor, run_job

    pruned = _run({}, pausable=False, observe=lambda step, m: "pruned" if step == 4 else None)
    assert pruned.status.state.value == "SUCCEEDED" and pruned.decision == "stopped"
    assert decided_by(pruned) == "gate"  # the observer's default role
    def run(hooks_cls, observe=None, role="gate", detector=None, pausable=True):
        spec = JobSpec(tenant="t", name="j", config=SimpleNamespace(steps=10), run_id="r", pausable=pausable,
                       detector=detector)
        return run_job(spec, observe, hooks=hooks_cls(), supervisor=make_supervisor(spec), observer_role=role)

    class Plain(JobHooks):
        def start_worker(self, spec):
            return KLTrainer({})

    assert decided_by(run(Plain, lambda s, m: "pruned" if s == 4 else None, role="pruner")) == "pruner"

    class ByHand(Plain):
        def on_step(self, record, supervisor):
            return "cancelled by the tenant" if record.step == 3 else None

    class OverBudget(ByHand):
        stop_by = "budget"

    by_hand = run(ByHand)
    assert by_hand.decision == "stopped" and decided_by(by_hand) == "user"
    assert job_record(by_hand)["decided_by"] == "user" and len(by_hand.records) == 3
    assert decided_by(run(OverBudget)) == "budget"

    class Dies(Plain):
        def start_worker(self, spec):
            class Dying(KLTrainer):
                def run(self, total):
                    yield from super().run(2)
                    raise RuntimeError("worker died")
            return Dying({})

    died = run(Dies)
    assert died.status.state.value == "FAILED" and decided_by(died) == "error"
    record = job_record(died)
    traceback = record.pop("traceback")
    assert record | {"run_id": ""} == {"run_id": "", "state": died.status.label, "decided_by": "error",
                                       "decision": "failed: platform_fault at step 2",
                                       "failure_class": "platform_fault", "reason": died.status.reason,
                                       "history": ["QUEUED", "PROVISIONING", "RUNNING", "FAILED(platform_fault)"],
                                       "last_checkpoint": None}  # no run directory: no checkpoint to name
    assert "worker died" in died.status.reason
    # the error that ended it, with where it was raised: the run's record holds what a reader needs to find it
    assert traceback.startswith("Traceback (most recent call last):")
    assert traceback.rstrip().endswith("RuntimeError: worker died") and "in run" in traceback
