"""The one job lifecycle (`training/lifecycle.py`) with plain in-memory hooks: the per-checkpoint observer seam, and a
stop that is reversible (pause at the gate, resume from the kept checkpoint) on a real small PPO run.

Oracles are kept by the tests themselves: the steps the trainer actually executed (recorded by the hook), the
phase seconds summed from those records, and the state sequence written out by hand."""

from __future__ import annotations

import json
import math

import pytest

from training.metrics import StepRecord


class FakeTrainer:
    """Yields `total - step` records; a gate (gold_eval) every `gate_every` steps."""

    def __init__(self, gate_every: int = 2, start: int = 0):
        self.step, self.gate_every = start, gate_every

    def run(self, total):
        while self.step < total:
            self.step += 1
            gold = 1.0 - 0.1 * self.step if self.step % self.gate_every == 0 else math.nan
            yield StepRecord(step=self.step, policy_version=self.step, reward_mean=0.1 * self.step, gold_eval=gold,
                             gold_eval_se=0.01, kl=0.01, entropy=1.0, loss_policy=0.0,
                             phase_seconds={"rollout": 0.5, "optim": 0.25}, tokens_generated=10)


def _spec(steps, **kw):
    from types import SimpleNamespace

    from training.lifecycle import JobSpec

    return JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=steps), run_id="r1", **kw)


def _hooks(trainer, executed):
    from training.lifecycle import JobHooks

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return trainer

        def on_step(self, record, supervisor):
            executed.append(record)

    return Hooks()


def test_the_observer_sees_only_checkpoints_and_its_reason_stops_the_job():
    from training.lifecycle import run_job

    seen, executed = [], []

    def observe(step, metrics):
        seen.append((step, metrics["gold_eval"]))
        return "pruned: below the median" if step == 6 else None

    out = run_job(_spec(10), observe, hooks=_hooks(FakeTrainer(), executed))
    assert [s for s, _ in seen] == [2, 4, 6]  # checkpoints only, up to the stop
    assert [g for _, g in seen] == pytest.approx([0.8, 0.6, 0.4])  # the step's own metrics
    assert out.decision == "stopped" and out.stop_reason == "pruned: below the median"
    assert [r.step for r in executed] == [1, 2, 3, 4, 5, 6] and len(out.records) == 6
    assert out.status.label == "SUCCEEDED"  # not pausable: the job ends


def test_a_pausable_job_pauses_at_the_observers_checkpoint_with_the_reason():
    from training.lifecycle import run_job

    out = run_job(_spec(10, pausable=True), lambda step, m: "held-out score declining" if step == 4 else None,
                  hooks=_hooks(FakeTrainer(), []))
    assert out.supervisor.machine.labels() == ["QUEUED", "PROVISIONING", "RUNNING",
                                               "PAUSED_BY_GATE(held-out score declining)"]
    assert out.status.step == 4 and "paused at step 4" in out.supervisor.attribution.reason


@pytest.mark.slow
def test_pause_then_resume_continues_from_the_kept_checkpoint_and_charges_each_step_once(tmp_path,
                                                                                        warm_start_cache,
                                                                                        stop_third_early):
    """A real 10-step PPO run (gate and checkpoint every 2 steps) paused by its gate at step 6, the best checkpoint
    (step 2, by the scores the test gives) kept; resumed from step 2 it runs steps 3-10 and succeeds. About 40 s."""
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from infra.ledger import Ledger, PriceTable
    from training.canaries import base_config
    from training.config import TrainConfig
    from training.lifecycle import JOB_DONE, JobHooks, JobSpec, job_record, paused_run, rewind_to, run_job, step_of

    raw = base_config(10, 0, str(warm_start_cache))
    raw.update(eval_every=2, checkpoint_every=2)
    raw["task"].update(n_pairs=200, sft_steps=60)
    raw["ppo"].update(batch_size=16, max_new_tokens=24)
    raw["oppo"] = {"torch_threads": 1}
    cfg = TrainConfig.model_validate(raw)
    out = tmp_path / "job"
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    executed: dict[str, list] = {"seg1": [], "seg2": []}

    class Hooks(JobHooks):
        def __init__(self, seg):
            self.seg = seg

        def on_step(self, record, supervisor):
            executed[self.seg].append(record)

        def score(self, spec, checkpoints):  # earlier is better: the kept checkpoint is step 2
            return [{"checkpoint": c, "step": step_of(c), "eval_score": -step_of(c), "eval_se": 0.0}
                    for c in checkpoints]

    def supervisor(run_id):
        monitor = Catalog.from_file(None, algorithm="ppo").start(tenant="acme")
        return RunSupervisor(run_id, "acme", monitor, gate_detector=stop_third_early(), ledger=ledger, gpu_kind="cpu")

    spec1 = JobSpec(tenant="acme", name="j", config=cfg, run_id="seg1", out_dir=out, overlap="none", pausable=True)
    first = run_job(spec1, hooks=Hooks("seg1"), supervisor=supervisor("seg1"))
    reason = first.status.reason
    assert first.decision == "paused" and first.status.step == 6 and first.best["step"] == 2
    assert first.supervisor.machine.labels() == ["QUEUED", "PROVISIONING", "RUNNING", f"PAUSED_BY_GATE({reason})"]
    assert [r.step for r in executed["seg1"]] == [1, 2, 3, 4, 5, 6]
    (out / JOB_DONE).write_text(json.dumps(job_record(first)))

    paused = paused_run(out)
    assert (paused.run_id, paused.paused_step, paused.best_step, paused.reason) == ("seg1", 6, 2, reason)
    assert sorted(step_of(c) for c in rewind_to(out, paused.best_step)) == [4, 6]
    spec2 = JobSpec(tenant="acme", name="j", config=cfg, run_id="seg2", out_dir=out, overlap="none", pausable=True,
                    resume=paused)
    second = run_job(spec2, hooks=Hooks("seg2"), supervisor=supervisor("seg2"))
    assert [r.step for r in executed["seg2"]] == [3, 4, 5, 6, 7, 8, 9, 10]  # from the kept checkpoint's step
    assert [r["step"] for r in second.records] == list(range(1, 11))  # steps 1-2 replayed, not re-run
    assert second.supervisor.machine.labels() == ["QUEUED", "PROVISIONING", "RUNNING", f"PAUSED_BY_GATE({reason})",
                                                  "RUNNING", "SUCCEEDED"]
    assert "paused at step 6" in second.status.reason
    assert "resumed from the checkpoint at step 2" in second.status.reason

    # the ledger: each segment charged for the steps it executed, the replayed ones not again
    totals = ledger.run_totals()
    for seg in ("seg1", "seg2"):
        want_s = sum(sum(r.phase_seconds.values()) for r in executed[seg])
        assert totals[seg].steps == len(executed[seg])
        assert totals[seg].gpu_seconds == pytest.approx(want_s, abs=1e-5)
        assert totals[seg].tokens_generated == sum(r.tokens_generated for r in executed[seg])
    assert ledger.cluster_total().steps == 6 + 8


@pytest.mark.parametrize("job_json, names", [
    (None, ["run_dir:", "job.json missing"]),
    ({"state": "SUCCEEDED", "run_id": "x"}, ["run_dir:", "not paused", "'SUCCEEDED'"]),
    ({"state": "PAUSED_BY_GATE(x)", "run_id": "x", "best_step": None}, ["run_dir:", "not paused"]),
])
def test_resume_refuses_a_run_directory_without_a_paused_run_exit_2(tmp_path, capsys, monkeypatch, job_json, names):
    import sys

    from rlhfops import cli

    if job_json is not None:
        (tmp_path / "job.json").write_text(json.dumps(job_json))
    monkeypatch.setattr(sys, "argv", ["rlhfops", "resume", str(tmp_path)])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    assert all(n in err for n in names), err
