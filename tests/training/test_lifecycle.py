"""The one job lifecycle (`training/job/lifecycle.py`) with plain in-memory hooks: the per-checkpoint observer seam,
and a stop that is reversible (pause at the gate, resume from the kept checkpoint) on a real small PPO run.

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


class StopAt4:
    """A gate detector that pauses a run at its step-4 checkpoint, whatever the scores."""

    label = name = "stop-at-4"

    def start(self):
        return self

    def observe(self, cp):
        return cp.step == 4


def _spec(steps, **kw):
    from types import SimpleNamespace

    from training.job.lifecycle import JobSpec

    return JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=steps), run_id="r1", **kw)


def _hooks(trainer, executed):
    from training.job.lifecycle import JobHooks

    class Hooks(JobHooks):
        def start_worker(self, spec):
            return trainer

        def on_step(self, record, supervisor):
            executed.append(record)

    return Hooks()


def test_the_observer_sees_only_checkpoints_and_its_reason_stops_the_job():
    from training.job.lifecycle import run_job

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
    from training.job.lifecycle import run_job

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
    from training.benches.canaries import base_config
    from training.job.config import TrainConfig
    from training.job.lifecycle import JOB_DONE, JobHooks, JobSpec, job_record, paused_run, rewind_to, run_job, step_of

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


# ------------------------------------------------------------------- pause, resume and retry on disk, in seconds
GOLD = {2: 0.7, 4: 0.5, 6: 0.6, 8: 0.8, 10: 0.9}  # the held-out score of each checkpoint (every 2 steps)
STEP_S = 0.75  # phase seconds per step (rollout 0.5 + optim 0.25) on one GPU


def _step(path) -> int:
    return int(str(path).rsplit("step-", 1)[1])


class DiskTrainer:
    """The worker as the lifecycle sees it on disk: resumes after the newest checkpoint in `out_dir`, writes a
    checkpoint every 2 steps and appends one `metrics.csv` row per step (`StepRecord.flat()`), and raises at
    `fail_at` (the process dying) before writing that step."""

    def __init__(self, out_dir, fail_at=None):
        self.out, self.fail_at = out_dir, fail_at
        self.step = max((_step(p) for p in (out_dir / "checkpoints").glob("step-*")), default=0)

    def run(self, total):
        import csv

        while self.step < total:
            if self.step + 1 == self.fail_at:
                raise RuntimeError("worker died")
            self.step += 1
            rec = StepRecord(step=self.step, policy_version=self.step, reward_mean=0.1 * self.step,
                             gold_eval=GOLD.get(self.step, math.nan), gold_eval_se=0.01, kl=0.01, entropy=1.0,
                             phase_seconds={"rollout": 0.5, "optim": 0.25}, tokens_generated=10, tokens_trained=7)
            if self.step % 2 == 0:
                (self.out / "checkpoints" / f"step-{self.step:06d}").mkdir(parents=True)
            path = self.out / "metrics.csv"
            new = not path.exists()
            with path.open("a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rec.flat()))
                if new:
                    w.writeheader()
                w.writerow(rec.flat())
            yield rec


def _disk_hooks(seg, executed, logged, fail_at=None):
    from training.job.lifecycle import JobHooks

    class Hooks(JobHooks):
        flush_every = 3

        def start_worker(self, spec):
            return DiskTrainer(spec.out_dir, fail_at)

        def on_step(self, record, supervisor):
            executed.setdefault(seg, []).append(record.step)

        def log_records(self, records):
            logged.setdefault(seg, []).append([r["step"] for r in records])

        def score(self, spec, ckpts):
            return [{"checkpoint": c, "step": _step(c), "eval_score": GOLD[_step(c)], "eval_se": 0.01} for c in ckpts]

    return Hooks()


def _disk_supervisor(run_id, ledger):
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor

    return RunSupervisor(run_id, "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"), ledger=ledger,
                         gpu_kind="cpu")


def _same(a: dict, b: dict) -> bool:
    """Equal flat records (NaN equals NaN)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (a[k] != a[k] and b[k] != b[k]) for k in a)


def test_a_paused_job_resumes_from_its_kept_checkpoint_replaying_its_steps_uncharged(tmp_path):
    """10 steps, checkpoints every 2 (scores 0.7, 0.5, 0.6, 0.8, 0.9). Segment 1 is paused by the observer at step 6:
    kept checkpoint step 2 (0.7, the best of 2, 4, 6). Reopened, the checkpoints after step 2 go; segment 2 replays
    steps 1-2 from metrics.csv (not charged again: segment 1 paid for them), runs 3-10 and keeps step 10 (0.9).
    Records are logged in batches of 3 (`flush_every`), the replayed ones first in one batch."""
    from types import SimpleNamespace

    from infra.ledger import Ledger, PriceTable
    from training.job.lifecycle import JOB_DONE, PausedRun, job_record, paused_run, reopen_paused, run_job

    out = tmp_path / "job"
    out.mkdir()
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    executed, logged = {}, {}

    def spec(run_id, resume=None):
        from training.job.lifecycle import JobSpec

        return JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=10), run_id=run_id, out_dir=out,
                       pausable=True, resume=resume)

    first = run_job(spec("seg1"), lambda step, m: "declining" if step == 6 else None,
                    hooks=_disk_hooks("seg1", executed, logged), supervisor=_disk_supervisor("seg1", ledger))
    assert executed["seg1"] == [1, 2, 3, 4, 5, 6] and logged["seg1"] == [[1, 2, 3], [4, 5, 6]]
    assert (first.decision, first.stop_reason, first.replayed) == ("stopped", "declining", 0)
    assert [s["step"] for s in first.scores] == [2, 4, 6] and first.best["step"] == 2
    assert first.status.label == "PAUSED_BY_GATE(declining)"
    assert job_record(first) == {"run_id": "seg1", "state": "PAUSED_BY_GATE(declining)", "paused_step": 6,
                                 "reason": "declining", "best_step": 2, "decided_by": "gate", "decision": "stopped"}
    (out / JOB_DONE).write_text(json.dumps(job_record(first)))

    paused = paused_run(out)
    assert paused == PausedRun(run_id="seg1", paused_step=6, reason="declining", best_step=2)
    assert paused.tags() == {"resumed_from_run": "seg1", "resumed_from_step": 2, "paused_at_step": 6}
    reopen_paused(out, paused)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"] and not (out / JOB_DONE).exists()

    second = run_job(spec("seg2", resume=paused), hooks=_disk_hooks("seg2", executed, logged),
                     supervisor=_disk_supervisor("seg2", ledger))
    assert executed["seg2"] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert logged["seg2"] == [[1, 2], [3, 4, 5], [6, 7, 8], [9, 10]]
    assert second.replayed == 2 and [r["step"] for r in second.records] == list(range(1, 11))
    assert all(_same(a, b) for a, b in zip(second.records[:2], first.records[:2], strict=True))  # read back whole
    assert second.decision == "completed" and second.best["step"] == 10
    assert second.supervisor.machine.labels() == ["QUEUED", "PROVISIONING", "RUNNING", "PAUSED_BY_GATE(declining)",
                                                  "RUNNING", "SUCCEEDED"]
    assert job_record(second) == {"run_id": "seg2", "state": "SUCCEEDED", "decided_by": "none", "decision": "completed"}
    totals = ledger.run_totals()
    assert (totals["seg1"].steps, totals["seg2"].steps) == (6, 8)  # steps 1-2 charged once, by segment 1
    assert (totals["seg1"].tokens_generated, totals["seg2"].tokens_generated) == (60, 80)
    assert totals["seg2"].gpu_seconds == pytest.approx(8 * STEP_S)


def test_an_interrupted_job_is_retried_from_its_newest_checkpoint_and_its_lost_steps_charged_once(tmp_path):
    """The worker dies before step 5 (no job.json: an interrupted job). The retry resumes after checkpoint 4,
    replays steps 1-4 from metrics.csv and charges them to the retry's run (the run that paid for them died with
    its process), then runs 5-10: 10 steps charged to the retry."""
    from types import SimpleNamespace

    from infra.ledger import Ledger, PriceTable
    from training.job.lifecycle import JobSpec, paused_run, run_job

    out = tmp_path / "job"
    out.mkdir()
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    executed, logged = {}, {}
    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=10), run_id="try1", out_dir=out)
    first = run_job(spec, hooks=_disk_hooks("try1", executed, logged, fail_at=5),
                    supervisor=_disk_supervisor("try1", ledger))
    assert first.decision == "failed" and str(first.error) == "worker died" and executed["try1"] == [1, 2, 3, 4]
    assert paused_run(out) is None
    retry = run_job(spec, hooks=_disk_hooks("try2", executed, logged), supervisor=_disk_supervisor("try2", ledger))
    assert executed["try2"] == [5, 6, 7, 8, 9, 10] and retry.replayed == 4
    assert logged["try2"] == [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10]]
    assert retry.decision == "completed" and retry.best["step"] == 10
    assert ledger.run_totals()["try2"].steps == 10 and ledger.run_totals()["try2"].tokens_trained == 70


@pytest.mark.parametrize("through, steps, decision", [(False, [1, 2, 3, 4], "paused"),
                                                     (True, list(range(1, 11)), "completed")])
def test_a_gate_pause_ends_the_loop_unless_the_job_runs_through_it(through, steps, decision):
    """A gate detector that says stop at step 4: the run pauses there and the loop ends (`paused`, the gate's reason);
    with `run_through_pause` (the fault canaries) it trains on to step 10 but the observer, which saw step 2, is not
    asked again once the run is paused."""
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from training.job.lifecycle import run_job

    executed, seen = [], []
    sup = RunSupervisor("r1", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"),
                        gate_detector=StopAt4())
    out = run_job(_spec(10, pausable=True, run_through_pause=through),
                  lambda step, m: seen.append(step), hooks=_hooks(FakeTrainer(), executed), supervisor=sup)
    assert [r.step for r in executed] == steps and seen == [2]
    assert out.decision == decision and out.status.label.startswith("PAUSED_BY_GATE") and out.status.step == 4
    assert out.stop_reason == ("" if through else out.status.reason) and (through or out.stop_reason)


# ------------------------------------------------------------------------------------------- the small pieces
@pytest.mark.parametrize("gpus", [0, -1, 1.5, True, "2"])
def test_a_job_spec_refuses_gpus_that_are_not_a_whole_number_of_slots(gpus):
    with pytest.raises(ValueError) as err:
        _spec(3, gpus=gpus)
    assert str(err.value) == f"gpus: {gpus!r} must be a whole number of GPU slots >= 1"


def test_a_job_spec_names_its_job_counts_its_steps_and_types_its_run_directory():
    from pathlib import Path

    spec = _spec("7", out_dir="runs/x", gpus=2)
    assert (spec.job, spec.steps, spec.out_dir, spec.gpus) == ("acme/j", 7, Path("runs/x"), 2)
    assert _spec(3).out_dir is None


def test_step_of_reads_only_checkpoint_names_and_checkpoints_come_in_step_order(tmp_path):
    from training.job.lifecycle import checkpoints, step_of

    assert step_of("runs/a/checkpoints/step-000012") == 12 and step_of("step-7") == 7
    assert [step_of(n) for n in ("model", "step-12x", "xstep-12", "step-")] == [-1, -1, -1, -1]
    for step in (10, 2, 4):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").mkdir()
    assert checkpoints(tmp_path) == [str(tmp_path / "checkpoints" / f"step-{s:06d}") for s in (2, 4, 10)]
    assert checkpoints(None) == []


def test_read_history_types_each_field_orders_the_steps_and_stops_at_the_checkpoint(tmp_path):
    import csv

    from training.job.lifecycle import read_history

    assert read_history(tmp_path, 5) == []  # no metrics.csv
    cols = ["step", "policy_version", "reward_mean", "gold_eval", "tokens_generated", "phase_rollout_s", "phase_eval_s"]
    rows = [[3, 3, 0.3, "", 30, 0.5, ""], [1, 1, 0.1, 0.25, 10, 0.5, 2.0], [2, "2.0", 0.2, "", 20, 0.5, ""]]
    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerows(rows)
        w.writerow(["", "", "", "", "", "", ""])  # a blank row is no step
    assert read_history(tmp_path, 0) == []
    got = read_history(tmp_path, 2)
    assert [r.step for r in got] == [1, 2]
    first, second = got
    assert type(first.step) is int and type(second.policy_version) is int and second.policy_version == 2
    assert type(first.tokens_generated) is int and first.tokens_generated == 10
    assert first.reward_mean == 0.1 and first.gold_eval == 0.25 and math.isnan(second.gold_eval)
    assert math.isnan(first.kl)  # a column the file lacks keeps its default
    assert first.phase_seconds == {"rollout": 0.5, "score": 0.0, "sync": 0.0, "optim": 0.0, "eval": 2.0,
                                   "reward_fn": 0.0}
    assert second.phase_seconds["eval"] == 0.0
    assert [r.step for r in read_history(str(tmp_path), 9)] == [1, 2, 3]


def test_make_supervisor_names_the_run_and_passes_on_gpus_steps_ledger_and_gate():
    from training.job.lifecycle import make_supervisor

    ledger = object()
    spec = _spec(7, gpus=2, gpu_kind="a100", detector="evalstop")
    sup = make_supervisor(spec, ledger=ledger)
    assert (sup.machine.run_id, sup.machine.tenant, sup.n_gpus, sup.gpu_kind) == ("r1", "acme", 2, "a100")
    assert sup.planned_steps == 7 and sup.ledger is ledger and sup.metrics is None
    assert sup.gate_detector is not None and sup.gate_monitor is not None
    assert make_supervisor(spec, run_id="other").machine.run_id == "other"
    from training.job.lifecycle import JobSpec

    unnamed = JobSpec(tenant="acme", name="j", config=spec.config)
    assert make_supervisor(unnamed).machine.run_id == "acme/j" and make_supervisor(unnamed).gate_detector is None


def test_gate_evidence_hands_the_gates_prompt_scores_and_an_extension_within_budget():
    from types import SimpleNamespace

    from training.job.lifecycle import gate_evidence

    def rec(prompt, score):
        return SimpleNamespace(prompt_id=prompt, gold_score=score)

    asked = []

    class Trainer:
        cfg = SimpleNamespace(eval_extra_budget=0)
        gate_records = {4: [rec(1, 0.5), rec(2, 1.0)]}

        def extend_gate(self, pair):
            asked.append(pair)
            return {pair[0]: [rec(3, 0.25)], pair[1]: [rec(3, 0.75)]}, 1.5

    at = lambda step, gold=0.5: SimpleNamespace(step=step, gold_eval=gold)  # noqa: E731
    t = Trainer()
    assert gate_evidence(t, at(4)) == {"prompts": {"1": 0.5, "2": 1.0}}
    assert gate_evidence(t, at(4, math.nan)) == {} and gate_evidence(t, at(6)) == {}
    assert gate_evidence(object(), at(4)) == {}
    t.cfg = SimpleNamespace(eval_extra_budget=2)
    ev = gate_evidence(t, at(4.0))
    assert ev["prompts"] == {"1": 0.5, "2": 1.0}
    assert ev["extend"](("2", 4.0)) == ({2: {"3": 0.25}, 4: {"3": 0.75}}, 1.5) and asked == [(2, 4)]
    assert all(type(s) is int for s in asked[0])


def test_rewind_drops_and_names_the_checkpoints_after_the_kept_one(tmp_path):
    from training.job.lifecycle import rewind_to

    for step in (2, 4, 6):
        (tmp_path / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    dropped = rewind_to(tmp_path, 2)
    assert dropped == [str(tmp_path / "checkpoints" / f"step-{s:06d}") for s in (4, 6)]
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-000002"]
    assert rewind_to(tmp_path, 2) == []


def test_a_paused_run_without_a_scored_checkpoint_records_no_kept_step_and_is_not_resumable(tmp_path):
    """No run directory: nothing is scored, so there is no best checkpoint; its job.json says so and `paused_run`
    finds nothing to resume."""
    from training.job.lifecycle import JOB_DONE, job_record, paused_run, run_job

    out = run_job(_spec(10, pausable=True), lambda step, m: "declining" if step == 4 else None,
                  hooks=_hooks(FakeTrainer(), []))
    assert out.best is None and out.scores == []
    record = job_record(out)
    assert record == {"run_id": "r1", "state": "PAUSED_BY_GATE(declining)", "paused_step": 4, "reason": "declining",
                      "best_step": None, "decided_by": "gate", "decision": "stopped"}
    (tmp_path / JOB_DONE).write_text(json.dumps(record))
    assert paused_run(tmp_path) is None


def test_a_paused_runs_job_json_without_its_run_reason_or_step_reads_back_empty(tmp_path):
    from training.job.lifecycle import JOB_DONE, PausedRun, paused_run

    (tmp_path / JOB_DONE).write_text(json.dumps({"state": "PAUSED_BY_GATE(x)", "best_step": 2.0}))
    assert paused_run(tmp_path) == PausedRun(run_id="", paused_step=None, reason="", best_step=2)
    assert type(paused_run(tmp_path).best_step) is int
    (tmp_path / JOB_DONE).write_text(json.dumps({"best_step": 2}))  # no state: not a paused run
    assert paused_run(tmp_path) is None


# ------------------------------------------------------------- the gate a job runs, its catalog, its evidence
def _cfg_spec(config):
    from training.job.lifecycle import JobSpec

    return JobSpec(tenant="acme", name="gate", config=config)


@pytest.mark.parametrize(("config", "warmup", "horizon"), [
    (dict(steps=24, eval_every=2), 0, 11),  # 12 checkpoints, the first a reference only
    (dict(steps=24, eval_every=2), 3, 9),   # a warm-up of 3: the first 3 are references only
    (dict(steps=25, eval_every=4), 0, 5),   # 6 checkpoints (steps 4..24)
    (dict(steps=24, eval_every=1), 0, 23),  # a gate at every step
    (dict(steps=4, eval_every=2), 0, 1),    # exactly one judged look
    (dict(steps=2, eval_every=2), 0, None),  # one checkpoint: nothing to judge, left as it is
    (dict(steps=24, eval_every=0), 0, None),  # no gate planned
    (dict(steps=24), 0, None),              # a config that plans no gate
])
def test_planned_gate_gives_a_paired_rule_its_judged_looks_by_hand(config, warmup, horizon):
    """`steps // eval_every` checkpoints less the unjudged first (or the warm-up), on a copy; left alone (the same
    object) when no look would be judged or no gate is planned."""
    from types import SimpleNamespace

    from eval.paired import PairedStop
    from training.job.lifecycle import planned_gate

    shared = PairedStop(warmup=warmup)
    fitted = planned_gate(shared, _cfg_spec(SimpleNamespace(**config)))
    if horizon is None:
        assert fitted is shared and shared.horizon == 0
    else:
        assert fitted is not shared and fitted.horizon == horizon and shared.horizon == 0


def test_planned_gate_reads_a_rule_without_a_warmup_as_judging_from_the_second_checkpoint():
    """Any detector with `horizon` 0 is fitted, a warm-up it does not have counts as none: 12 checkpoints, 11 looks."""
    from types import SimpleNamespace

    from training.job.lifecycle import planned_gate

    rule = SimpleNamespace(horizon=0)
    fitted = planned_gate(rule, _cfg_spec(SimpleNamespace(steps=24, eval_every=2)))
    assert fitted.horizon == 11 and rule.horizon == 0


def test_planned_gate_leaves_a_rule_with_its_own_horizon_or_without_one_as_it_is():
    from types import SimpleNamespace

    from eval.paired import PairedStop
    from eval.stop_rules import EvalStop
    from training.job.lifecycle import planned_gate

    spec = _cfg_spec(SimpleNamespace(steps=24, eval_every=2))
    own, evalstop = PairedStop(horizon=7), EvalStop(k=2)
    assert planned_gate(own, spec) is own and own.horizon == 7
    assert planned_gate(evalstop, spec) is evalstop and planned_gate(None, spec) is None


def test_make_supervisor_reads_the_specs_alert_file_and_profile_for_ppo_and_watches_the_tenant(tmp_path):
    """An alerts file of its own (sync_stall's persist 6 instead of the shipped 5), the canary profile (reward_band's
    window 10 instead of 30), PPO's own KL ceiling (6.0 instead of 1.0), the tenant's alert routing and the given
    metrics."""
    from pathlib import Path
    from types import SimpleNamespace

    from training.job.lifecycle import JobSpec, make_supervisor

    shipped = (Path(__file__).resolve().parents[2] / "configs" / "alerts.yaml").read_text()
    assert "params: {max_lag: 4.0, persist: 5}" in shipped
    own = tmp_path / "alerts.yaml"
    own.write_text(shipped.replace("params: {max_lag: 4.0, persist: 5}", "params: {max_lag: 4.0, persist: 6}"))
    metrics = object()
    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=5), alerts=str(own), alert_profile="canary")
    sup = make_supervisor(spec, metrics=metrics)
    alerts = sup.monitor.catalog.alerts
    assert alerts["sync_stall"].persist == 6 and alerts["reward_band"].window == 10
    assert alerts["kl_blowup"].ceiling == 6.0 and sup.monitor.catalog.algorithm == "ppo"
    assert sup.monitor.tenant == "acme" and sup.metrics is metrics


def test_make_supervisor_runs_a_given_gate_whatever_detector_the_spec_names():
    from eval.stop_rules import EvalStop
    from training.job.lifecycle import make_supervisor

    gate = EvalStop(k=2)  # no planned horizon: run as it is
    assert make_supervisor(_spec(7), gate=gate).gate_detector is gate
    assert make_supervisor(_spec(7, detector="paired"), gate=gate).gate_detector is gate


def test_gate_evidence_without_a_config_or_a_budget_extends_nothing_and_a_budget_of_one_does():
    from types import SimpleNamespace

    from training.job.lifecycle import gate_evidence

    class Bare:
        gate_records = {4: [SimpleNamespace(prompt_id=1, gold_score=0.5)]}

        def extend_gate(self, pair):
            return {}, 0.0

    at4 = SimpleNamespace(step=4, gold_eval=0.5)
    assert gate_evidence(Bare(), at4) == {"prompts": {"1": 0.5}}  # no `cfg` at all
    no_budget = Bare()
    no_budget.cfg = SimpleNamespace()
    assert gate_evidence(no_budget, at4) == {"prompts": {"1": 0.5}}  # a config without a budget
    one = Bare()
    one.cfg = SimpleNamespace(eval_extra_budget=1)
    assert sorted(gate_evidence(one, at4)) == ["extend", "prompts"]


def test_read_history_up_to_step_one_reads_step_one(tmp_path):
    import csv

    from training.job.lifecycle import read_history

    with (tmp_path / "metrics.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerows([["step", "policy_version", "reward_mean"], [1, 1, 0.1], [2, 2, 0.2]])
    assert [(r.step, r.reward_mean) for r in read_history(tmp_path, 1)] == [(1, 0.1)]


# ----------------------------------------------------------------------- replay, and what run_job hands on
def test_replay_charges_by_default_and_stops_at_a_gate_pause():
    """Replayed steps are charged unless told otherwise (5 steps at 0.75 s on one CPU); a gate that pauses at step 4
    ends the replay there, steps 1-4 returned."""
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from infra.ledger import Ledger, PriceTable
    from training.job.lifecycle import replay

    records = list(FakeTrainer().run(5))
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    sup = RunSupervisor("r1", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"), ledger=ledger,
                        gpu_kind="cpu")
    sup.provision()
    sup.start()
    assert [r["step"] for r in replay(records, sup)] == [1, 2, 3, 4, 5]
    assert ledger.run_totals()["r1"].steps == 5 and ledger.run_totals()["r1"].gpu_seconds == pytest.approx(5 * 0.75)
    gated = RunSupervisor("r2", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"),
                          gate_detector=StopAt4())
    gated.provision()
    gated.start()
    assert [r["step"] for r in replay(records, gated)] == [1, 2, 3, 4]
    assert gated.machine.status.label.startswith("PAUSED_BY_GATE")


def test_a_retry_whose_replay_reaches_a_gate_pause_ends_paused_without_training(tmp_path):
    """The worker dies before step 5; the retry's gate stops at checkpoint 4, which the replay of steps 1-4 reaches:
    the job is paused there with the gate's reason and no step is trained again."""
    from types import SimpleNamespace

    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from infra.ledger import Ledger, PriceTable
    from training.job.lifecycle import JobSpec, run_job

    out = tmp_path / "job"
    out.mkdir()
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    executed, logged = {}, {}
    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=10), run_id="try1", out_dir=out,
                   pausable=True)
    run_job(spec, hooks=_disk_hooks("try1", executed, logged, fail_at=5), supervisor=_disk_supervisor("try1", ledger))
    gated = RunSupervisor("try2", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"),
                          gate_detector=StopAt4())
    retry = run_job(spec, hooks=_disk_hooks("try2", executed, logged), supervisor=gated)
    assert "try2" not in executed and retry.replayed == 4 and [r["step"] for r in retry.records] == [1, 2, 3, 4]
    assert retry.decision == "paused" and retry.stop_reason == gated.machine.status.reason and retry.stop_reason
    assert retry.status.label.startswith("PAUSED_BY_GATE") and retry.status.step == 4


class RecordingHooks:
    """JobHooks that record what run_job hands each hook: the spec, span kinds, the supervisor, calls to score."""

    def __new__(cls, trainer, waited=0.0):
        from contextlib import contextmanager

        from training.job.lifecycle import JobHooks

        calls: list = []

        class Hooks(JobHooks):
            @contextmanager
            def hold_slots(self, spec):
                calls.append(("hold_slots", spec))
                yield waited

            def start_worker(self, spec):
                return trainer

            def supervise(self, spec, loop):
                calls.append(("supervise", spec))
                return loop()

            @contextmanager
            def span(self, kind):
                calls.append(("span", kind))
                yield

            def on_step(self, record, supervisor):
                calls.append(("on_step", supervisor))

            def score(self, spec, ckpts):
                calls.append(("score", spec, list(ckpts)))
                return []

        hooks = Hooks()
        hooks.calls = calls
        return hooks


def test_run_job_hands_each_hook_the_spec_times_its_slots_and_scores_nothing_without_a_run_directory():
    import time

    from training.job.lifecycle import run_job

    spec = _spec(3)
    hooks = RecordingHooks(FakeTrainer(), waited=1.5)
    before = time.time()
    out = run_job(spec, hooks=hooks)
    after = time.time()
    calls = hooks.calls
    assert calls[0] == ("hold_slots", spec) and calls[1] == ("supervise", spec)
    assert [c[1] for c in calls if c[0] == "span"] == ["work"] * 4  # three steps and the end of the run
    assert [c[1] for c in calls if c[0] == "on_step"] == [out.supervisor] * 3
    assert not [c for c in calls if c[0] == "score"]  # no run directory: nothing to score
    assert out.spec is spec and out.slot_wait_s == 1.5
    assert before <= out.slot_start <= out.slot_end <= after and 0.0 <= out.train_wall_s <= after - before
    plain = run_job(spec, hooks=_hooks(FakeTrainer(), []))
    assert plain.slot_wait_s == 0.0  # the default slots are held at once


def test_run_job_scores_the_run_directorys_checkpoints_with_its_spec_and_spans_the_replay(tmp_path):
    """An interrupted job (died before step 3) retried: the replay of steps 1-2 is logged in a `tracking` span; the
    retry's checkpoints go to `score` with the job's spec."""
    from types import SimpleNamespace

    from infra.ledger import Ledger, PriceTable
    from training.job.lifecycle import JobSpec, run_job

    out = tmp_path / "job"
    out.mkdir()
    spec = JobSpec(tenant="acme", name="j", config=SimpleNamespace(steps=4), run_id="try1", out_dir=out)
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    run_job(spec, hooks=_disk_hooks("try1", {}, {}, fail_at=3), supervisor=_disk_supervisor("try1", ledger))
    hooks = RecordingHooks(DiskTrainer(out))
    run_job(spec, hooks=hooks, supervisor=_disk_supervisor("try2", ledger))
    spans = [c[1] for c in hooks.calls if c[0] == "span"]
    assert spans[0] == "tracking" and spans[1:] == ["work"] * 3
    assert [c for c in hooks.calls if c[0] == "score"] == [
        ("score", spec, [str(out / "checkpoints" / f"step-{s:06d}") for s in (2, 4)])]


def test_a_resumed_job_records_the_step_it_was_paused_at():
    """Resuming a run paused at step 6 (kept checkpoint 6, reason 'declining'): the supervisor records the pause with
    its step and reason, and the step it resumed from."""
    from training.job.lifecycle import PausedRun, run_job

    paused = PausedRun(run_id="seg1", paused_step=6, reason="declining", best_step=6)
    out = run_job(_spec(8, pausable=True, resume=paused), hooks=_hooks(FakeTrainer(start=6), []))
    assert out.supervisor.pauses == [(6, "declining", 6)] and out.decision == "completed"


def test_a_failed_job_keeps_its_error_in_the_attribution():
    from training.job.lifecycle import run_job

    class Dies(FakeTrainer):
        def run(self, total):
            yield from super().run(2)
            raise RuntimeError("worker died")

    out = run_job(_spec(10), hooks=_hooks(Dies(), []))
    assert out.decision == "failed" and out.status.label.startswith("FAILED")
    assert "(RuntimeError: worker died)" in out.status.reason


def test_supervise_called_alone_neither_pauses_nor_runs_through_and_hands_the_gate_its_prompts():
    """`supervise` with its defaults: an observer's stop ends the loop `stopped` without pausing the run, and a gate
    pause ends the loop `paused`; each step goes to the supervisor with the trainer's gate evidence."""
    from types import SimpleNamespace

    from eval.states import RunState
    from training.job.lifecycle import supervise

    class FakeSupervisor:
        def __init__(self, pause_at=None):
            self.pause_at, self.seen, self.paused = pause_at, [], []
            self.machine = SimpleNamespace(state=RunState.RUNNING, status=SimpleNamespace(reason="gate"))

        def observe(self, rec, **evidence):
            self.seen.append((rec.step, evidence))
            if rec.step == self.pause_at:
                self.machine.state = RunState.PAUSED_BY_GATE

        def pause(self, step, reason):
            self.paused.append((step, reason))

    trainer = FakeTrainer()
    trainer.gate_records = {2: [SimpleNamespace(prompt_id=7, gold_score=1.0)]}
    sup = FakeSupervisor()
    res = supervise(trainer, sup, 10, observe=lambda step, m: "enough" if step == 4 else None)
    assert (res.decision, res.stop_reason, sup.paused) == ("stopped", "enough", [])
    assert [s for s, _ in sup.seen] == [1, 2, 3, 4] and sup.seen[1][1] == {"prompts": {"7": 1.0}}
    assert sup.seen[0][1] == {} and 0.0 <= res.wall_s < 60.0
    gated = supervise(FakeTrainer(), FakeSupervisor(pause_at=2), 10)
    assert (gated.decision, gated.stop_reason, len(gated.records)) == ("paused", "gate", 2)


def test_the_default_score_hook_reports_each_checkpoints_gold_mean_se_n_and_unparseable_rate(monkeypatch):
    """`JobHooks.score` with `training.trainer.gold_eval` replaced (no torch): one row per checkpoint, named fields."""
    import sys
    import types
    from types import SimpleNamespace

    from training.job.lifecycle import JobHooks

    fake = types.ModuleType("training.trainer")
    fake.gold_eval = lambda ckpt: SimpleNamespace(mean=0.5, se=0.02, n=64, unparseable_rate=0.25)
    monkeypatch.setitem(sys.modules, "training.trainer", fake)
    rows = JobHooks().score(_spec(4), ["runs/x/checkpoints/step-000004"])
    assert rows == [{"checkpoint": "runs/x/checkpoints/step-000004", "step": 4, "eval_score": 0.5, "eval_se": 0.02,
                     "n": 64, "unparseable_rate": 0.25}]


# ------------------------------------------------------------------ what a platform round's jobs.csv says ended a job
def _outcome(state, decision="completed", pages=None, failure=None, records=()):
    from types import SimpleNamespace

    machine = SimpleNamespace() if pages is None else SimpleNamespace(pages=pages)
    status = SimpleNamespace(state=SimpleNamespace(value=state),
                             failure=None if failure is None else SimpleNamespace(value=failure))
    return SimpleNamespace(status=status, supervisor=SimpleNamespace(machine=machine), decision=decision,
                           records=list(records))


@pytest.mark.parametrize(("outcome", "said"), [
    # FAILED with paging alerts: the first to page, at the step it paged (a float step read as a whole number)
    (dict(state="FAILED", decision="paused", pages=[("kl_blowup", 5.0), ("reward_band", 3)]),
     "failed: kl_blowup at step 5"),
    (dict(state="FAILED", pages=[("dead_run", None)]), "failed: dead_run"),  # an alert that names no step
    # FAILED without a page: the failure class (or 'error') at the last step recorded (0 without records)
    (dict(state="FAILED", decision="failed", pages=[], failure="platform_fault", records=[{"step": 1}, {"step": 7.0}]),
     "failed: platform_fault at step 7"),
    (dict(state="FAILED", decision="failed", records=[{"step": 3}]), "failed: error at step 3"),
    (dict(state="FAILED", decision="failed", failure="tenant_code_fault"), "failed: tenant_code_fault at step 0"),
    # not failed: a gate or observer stop says 'stopped', else the loop's own word
    (dict(state="PAUSED_BY_GATE", decision="paused"), "stopped"),
    (dict(state="PAUSED_BY_GATE", decision="stopped"), "stopped"),
    (dict(state="SUCCEEDED", decision="stopped"), "stopped"),
    (dict(state="SUCCEEDED", decision="paused"), "paused"),  # a gate pause on a job that is not pausable
    (dict(state="DEGRADED", decision="paused"), "paused"),
    (dict(state="SUCCEEDED", decision="completed"), "completed"),
])
def test_ended_by_names_the_first_paging_alert_the_failure_or_the_stop_by_hand(outcome, said):
    from types import SimpleNamespace

    from training.job.lifecycle import ended_by

    pages = outcome.pop("pages", None)
    if pages is not None:
        pages = [SimpleNamespace(alert=a) if s is None else SimpleNamespace(alert=a, step=s) for a, s in pages]
    assert ended_by(_outcome(pages=pages, **outcome)) == said


def test_ended_by_a_real_failed_job_states_its_failure_class_and_last_step():
    """A worker that dies after step 2: FAILED as a platform fault, no alert paged: 'failed: platform_fault at step
    2'."""
    from training.job.lifecycle import ended_by, run_job

    class Dies(FakeTrainer):
        def run(self, total):
            yield from super().run(2)
            raise RuntimeError("worker died")

    out = run_job(_spec(10), hooks=_hooks(Dies(), []))
    assert ended_by(out) == "failed: platform_fault at step 2"
