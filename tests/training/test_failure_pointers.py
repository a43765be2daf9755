"""Every pointer a failure line makes holds: what a reason says is attached is in the run's `job.json`
(`training.job.lifecycle.job_record`), and a checkpoint is named only when one was saved. And a run that can only end
FAILED spends no more steps on any entry point's lifecycle (the canaries alone run through, for their proof).

Fake trainers with hand-set KL values; the oracles are the catalog's PPO KL ceiling (configs/alerts.yaml: 6.0 per
sequence, persist 2) and the reasons' own words."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from eval.attribution import RunEvidence, SampleError, SampleErrorSummary, TenantCodeError, attribute
from training.metrics import StepRecord


class KLTrainer:
    """A gate every 2 steps; the KL reads 10 (over the ceiling) from `spike_from` on; a checkpoint directory is written
    at each step in `saves` when there is a run directory."""

    def __init__(self, spike_from: int, out_dir=None, saves=(), start: int = 0):
        self.step, self.spike_from, self.out_dir, self.saves = start, spike_from, out_dir, set(saves)

    def run(self, total):
        while self.step < total:
            self.step += 1
            if self.out_dir is not None and self.step in self.saves:
                (self.out_dir / "checkpoints" / f"step-{self.step:06d}").mkdir(parents=True)
            gold = 0.5 if self.step % 2 == 0 else math.nan
            yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.1, gold_eval=gold,
                             gold_eval_se=0.01, kl=10.0 if self.step >= self.spike_from else 0.5, entropy=1.0,
                             loss_policy=0.0, phase_seconds={"rollout": 0.5}, tokens_generated=10)


def _run(trainer, steps=10, out_dir=None, **spec_kw):
    from training.job.lifecycle import JobHooks, JobSpec, make_supervisor, run_job

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return trainer

        def score(self, spec, checkpoints):
            return [{"checkpoint": c, "step": int(c[-6:]), "eval_score": 0.5, "eval_se": 0.1} for c in checkpoints]

    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=steps), run_id="r1", out_dir=out_dir,
                   **spec_kw)
    return run_job(spec, hooks=Hooks(), supervisor=make_supervisor(spec))


@pytest.mark.parametrize("pausable", [False, True])
def test_a_run_a_page_fails_stops_at_that_step_on_every_path(pausable):
    out = _run(KLTrainer(spike_from=4), pausable=pausable)
    assert [r["step"] for r in out.records] == [1, 2, 3, 4, 5]  # KL over 6.0 at 4 and 5: pages at 5 (persist 2)
    assert out.status.label == "FAILED(algorithmic_non_convergence)" and out.decision == "failed"


def test_the_canaries_run_through_a_page_for_their_proof():
    out = _run(KLTrainer(spike_from=4), run_through_pause=True)
    assert len(out.records) == 10 and out.status.label == "FAILED(algorithmic_non_convergence)"


def test_a_resumed_run_whose_replayed_steps_paged_trains_no_further(tmp_path):
    """Steps 1-5 of an interrupted run read back from its metrics.csv (KL 10 at 4 and 5: paged at 5, its pause still
    pending: no gate at step 5): the resumed worker, at step 5, runs no step at all; the run ends FAILED."""
    import csv

    first = list(KLTrainer(spike_from=4).run(5))
    rows = [r.flat() for r in first]
    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = _run(KLTrainer(spike_from=4, start=5), out_dir=tmp_path)
    assert out.replayed == 5 and len(out.records) == 5  # the five replayed, none trained
    assert out.status.label == "FAILED(algorithmic_non_convergence)"


@pytest.mark.parametrize("saves, named", [((2, 4), "step-000004"), ((), None)])
def test_job_json_holds_what_the_alert_reason_points_at(tmp_path, saves, named):
    from training.job.lifecycle import job_record

    out = _run(KLTrainer(spike_from=4, out_dir=tmp_path, saves=saves), out_dir=tmp_path)
    record = job_record(out)
    assert "the health history is attached" in record["reason"]
    assert record["alerts"] and record["alerts"][0].startswith("kl_blowup at step 5")
    assert record["history"][-1] == "FAILED(algorithmic_non_convergence)"
    last = record["last_checkpoint"]
    assert (last and last.endswith(named)) if named else last is None


def test_a_pause_names_its_kept_checkpoint_only_when_one_was_saved(tmp_path):
    from test_lifecycle import StopAt4  # the gate detector that pauses at step 4

    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from training.job.lifecycle import JobHooks, JobSpec, run_job

    def paused(saves, folder):
        folder.mkdir()
        trainer = KLTrainer(spike_from=99, out_dir=folder, saves=saves)

        class Hooks(JobHooks):
            def start_worker(self, spec):
                return trainer

            def score(self, spec, checkpoints):
                return [{"checkpoint": c, "step": int(c[-6:]), "eval_score": 0.5, "eval_se": 0.1}
                        for c in checkpoints]

        sup = RunSupervisor("r1", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"),
                            gate_detector=StopAt4())
        spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=10), run_id="r1", out_dir=folder,
                       pausable=True)
        return run_job(spec, hooks=Hooks(), supervisor=sup).supervisor.attribution.reason

    with_one = paused((2,), tmp_path / "a")
    assert "the best checkpoint (step 2) is kept; resume the run to continue from it" in with_one
    without = paused((), tmp_path / "b")
    assert "checkpoint is kept" not in without and "resume the run" not in without
    assert "no checkpoint was saved before it" in without


def _summary(n_examples):
    examples = tuple(SampleError(sample=f"s{i}", error="ValueError: x") for i in range(n_examples))
    return SampleErrorSummary(calls=10, failures=5, examples=examples, error_types=("ValueError",))


@pytest.mark.parametrize("n", [0, 1, 3])
def test_examples_are_said_attached_only_when_there_are_some(n):
    got = attribute(RunEvidence(completed=True, reward_errors=_summary(n)))
    assert len(got.examples) == n
    if n:
        assert f", {n} example{'s' * (n != 1)} attached;" in got.reason
    else:
        assert "attached" not in got.reason
    raised = attribute(RunEvidence(completed=False, exception=TenantCodeError("boom", _summary(n))))
    assert ("attached" in raised.reason) == bool(n) and len(raised.examples) == n


def test_the_traceback_a_reason_points_at_is_in_job_json():
    """A tenant's code raised (a frame in its file): "the traceback is attached" and job.json holds it, whole."""
    from training.job.lifecycle import job_record

    class Raises:
        step = 0

        def run(self, total):
            yield from KLTrainer(spike_from=99).run(1)
            exec(compile("raise KeyError('answer')", "/tenant/my_reward.py", "exec"))

    from training.job.lifecycle import JobHooks, JobSpec, make_supervisor, run_job

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return Raises()

    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=5), run_id="r1")
    sup = make_supervisor(spec)
    out = run_job(spec, hooks=Hooks(), supervisor=sup)
    # the lifecycle's finish has no tenant prefixes: a platform fault, whose reason points at nothing
    assert out.status.failure.value == "platform_fault" and "attached" not in out.status.reason
    assert "KeyError: 'answer'" in job_record(out)["traceback"]
    sup2 = make_supervisor(spec)
    sup2.begin()
    verdict = sup2.finish(completed=False, exception=out.error, tenant_code=("/tenant/",))
    assert "the traceback is attached" in verdict.reason
    out.supervisor, out.status, out.error = sup2, verdict, out.error
    record = job_record(out)
    assert record["failure_class"] == "tenant_code_fault"
    assert 'File "/tenant/my_reward.py"' in record["traceback"] and "KeyError: 'answer'" in record["traceback"]
