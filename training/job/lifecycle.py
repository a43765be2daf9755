"""One job's lifecycle, written once: take slots, start the worker, supervise every step, stop or pause at a
checkpoint, score the checkpoints and keep the best, end the run state. Plain Python (no Prefect, no MLflow):
the canaries (`training/benches/canaries.py`), `flows/rlhf_job.py` and the platform round (`flows/platform_round.py`)
all call `run_job`; what differs between them is injected.

- `JobSpec`: what the job is (typed; replaces the flows' loose argument lists).
- `JobHooks`: the platform's side effects, each a method with a plain in-process default: holding GPU slots,
  starting the worker (a retried Prefect task on the platform), running the training loop (a Prefect task),
  timing spans, logging step records (MLflow), a per-step callback (progress, the canaries' early proof), scoring
  checkpoints. Tests pass a `JobHooks()` or a small subclass with in-memory lists.
- The ledger and Prometheus metrics are charged by the supervisor (`eval/supervisor.py`), given to `run_job`
  through `make_supervisor(spec, ledger=..., metrics=...)` or a supervisor the caller built.

A stop is reversible on the live paths (`JobSpec.pausable`): a detector verdict leaves the run PAUSED_BY_GATE at a
checkpoint with its best checkpoint kept; `paused_run(out_dir)` reads what the pause left and
`JobSpec(resume=...)` continues from the kept checkpoint (`rewind_to` drops the later ones first).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: written into the run directory when a job has ended (any final state, PAUSED_BY_GATE included): a directory
#: without it holds an interrupted job, which a resumed job continues; one with it is started over (or, if it holds
#: a paused run and the job asks to resume it, continued from the kept checkpoint)
JOB_DONE = "job.json"

#: per-checkpoint observer: called at every step whose eval gate ran with (step, the step's flat metrics:
#: `StepRecord.flat()`, e.g. `gold_eval`, `gold_eval_se`, `reward_mean`, `kl`, `loss_policy`); returns a stop
#: reason (the job stops there) or None (it goes on)
Observer = Callable[[int, Mapping[str, float]], "str | None"]

#: who decided how a job ended (`decided_by`, docs/ARCHITECTURE.md "Who decided"): `gate` the job's eval-gate stop
#: rule, whoever runs it (its supervisor, or the platform scheduler's early-stop wrapper as the observer); `alert`
#: the run-health catalog (a paging alert failed the run, or a hook stopped it on one); `pruner` a sweep's pruner;
#: `budget` and `user` a hook that stopped the job for a budget or at a person's request (`JobHooks.stop_by`);
#: `error` nobody: the run failed (its failure class says why); `none` nobody: it ran to the end
DECIDERS = ("gate", "alert", "pruner", "budget", "user", "error", "none")


@dataclass(frozen=True)
class PausedRun:
    """What a run the eval gate paused left behind: the step it paused at, the reason a tenant reads, the kept
    (best) checkpoint's step it resumes from, and the run it was (MLflow run id)."""

    run_id: str
    paused_step: int | None
    reason: str
    best_step: int

    def tags(self) -> dict[str, Any]:
        """The MLflow tags of the run that continues this one."""
        return {"resumed_from_run": self.run_id, "resumed_from_step": self.best_step,
                "paused_at_step": self.paused_step}


@dataclass(frozen=True)
class JobSpec:
    """One job. `config` is a validated `training.job.config.TrainConfig`; `out_dir` None trains without a run
    directory (no checkpoints: nothing to score). `detector`: the eval-gate detector (a
    `training.job.request.DetectorSpec`, or its text: `evalstop`, `paired(margin=0.1)`; None: no gate);
    `alerts`/`alert_profile`: the alert catalog. `pausable`: a detector verdict pauses the run (PAUSED_BY_GATE,
    resumable) instead of ending it SUCCEEDED. `resume`: continue the paused run from its kept checkpoint."""

    tenant: str
    name: str
    config: Any
    run_id: str = ""
    out_dir: Path | None = None
    overlap: str = "full"
    gpus: int = 1
    gpu_kind: str = "cpu"
    detector: Any = None
    alerts: str | None = None
    alert_profile: str | None = None
    pausable: bool = False
    resume: PausedRun | None = None
    #: train on past a pause and past a paging alert that fails the run (the fault canaries: they run until their
    #: expected alert fires, the proof they want); every other job stops once its run can only end FAILED
    run_through_pause: bool = False
    #: where a job on several ranks runs them: `thread` (the worker's machine: rank 0 is the worker, ranks 1..N-1
    #: spawned processes) or `ray` (Ray Train workers on the Ray cluster: the platform's hooks, infra/ray_train.py)
    runner: str = "thread"
    #: a job on several ranks whose rank fails (died, hung, raised) is restarted from its last checkpoint this many
    #: times, then FAILED naming the rank (training.distributed.launch.RankRestarts)
    max_rank_restarts: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"gpus: {self.gpus!r} must be a whole number of GPU slots >= 1")
        if isinstance(self.max_rank_restarts, bool) or not isinstance(self.max_rank_restarts, int) \
                or self.max_rank_restarts < 0:
            raise ValueError(f"max_rank_restarts: {self.max_rank_restarts!r} must be a whole number >= 0")
        if self.out_dir is not None and not isinstance(self.out_dir, Path):
            object.__setattr__(self, "out_dir", Path(self.out_dir))

    @property
    def job(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def steps(self) -> int:
        return int(self.config.steps)


@dataclass
class TrainingResult:
    """How the training loop ended: `completed`, `paused` by the supervisor, `stopped` (an observer or the per-step
    hook gave `stop_reason`), `failed` (`error`; or, with no error, a paging alert made the run one that can only end
    FAILED: `stop_reason` is the supervisor's reason, `stopped_by` `alert`)."""

    decision: str
    error: BaseException | None = None
    records: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    stop_reason: str = ""
    #: who gave `stop_reason` (DECIDERS): the observer's role or the hook's `stop_by`; "" when nobody stopped it
    stopped_by: str = ""


@dataclass
class JobOutcome:
    """What `run_job` returns: the run's state and attribution (`supervisor`), the records (replayed ones first),
    the checkpoints' scores, the best one, and the times the job held its slots."""

    spec: JobSpec
    supervisor: Any
    status: Any
    decision: str
    error: BaseException | None
    records: list[dict]
    scores: list[dict]
    best: dict | None
    train_wall_s: float
    slot_wait_s: float
    slot_start: float
    slot_end: float
    stop_reason: str = ""
    replayed: int = 0
    stopped_by: str = ""


class JobHooks:
    """The platform's side effects around one job; every default is plain and in-process."""

    #: step records are handed to `log_records` in batches of this many
    flush_every = 25
    #: who decided when `on_step` returns a stop reason (DECIDERS: `user`, `budget`, `alert`)
    stop_by = "user"

    def hold_slots(self, spec: JobSpec) -> AbstractContextManager[float]:
        """Hold the job's GPU slots while it trains; yields the seconds waited."""
        return nullcontext(0.0)

    def start_worker(self, spec: JobSpec) -> Any:
        """The training worker (resumes from the newest checkpoint in the run directory)."""
        from training.trainer import Trainer

        if spec.runner != "thread":
            raise ValueError(f"runner: '{spec.runner}' needs the platform's hooks (tasks.training.PrefectJobHooks)")
        return Trainer(spec.config, spec.overlap, spec.out_dir, resume=True, gpus=spec.gpus)

    def restarting(self, spec: JobSpec, error: BaseException) -> None:
        """A rank failed and the job restarts from its last checkpoint (`JobSpec.max_rank_restarts`): a log line."""
        import logging

        logging.getLogger("rlhfops.job").warning("%s: %s; restarting from the last checkpoint", spec.job, error)

    def supervise(self, spec: JobSpec, loop: Callable[[], TrainingResult]) -> TrainingResult:
        """Run the training loop (the platform runs it as a task)."""
        return loop()

    def span(self, kind: str) -> AbstractContextManager[Any]:
        """Time a stretch of `work` or `tracking` (the nightly's overhead accounting)."""
        return nullcontext()

    def log_records(self, records: list[dict]) -> None:
        """A batch of step records (flat dicts) to the tracking store."""

    def on_step(self, record: Any, supervisor: Any) -> str | None:
        """After every step: progress; return a reason to stop the job here."""
        return None

    def score(self, spec: JobSpec, checkpoints: list[str]) -> list[dict[str, Any]]:
        """Held-out (gold) score of each saved checkpoint."""
        from training.trainer import gold_eval

        out = []
        for ckpt in checkpoints:
            g = gold_eval(ckpt)
            out.append({"checkpoint": ckpt, "step": step_of(ckpt), "eval_score": g.mean, "eval_se": g.se, "n": g.n,
                        "unparseable_rate": g.unparseable_rate})
        return out


def step_of(checkpoint: str | Path) -> int:
    """The step in a `checkpoints/step-NNNNNN` name (-1 for other names, e.g. a registry download)."""
    m = re.fullmatch(r"step-(\d+)", Path(checkpoint).name)
    return int(m.group(1)) if m else -1


def best_of(scores: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Highest held-out score; ties go to the earlier checkpoint (less optimisation pressure)."""
    finite = [s for s in scores if math.isfinite(s["eval_score"])]
    if not finite:
        return None
    return max(finite, key=lambda s: (s["eval_score"], -s["step"]))


def checkpoints(out_dir: Path | None) -> list[str]:
    return [str(p) for p in sorted((out_dir / "checkpoints").glob("step-*"))] if out_dir else []


def planned_gate(detector: Any, spec: JobSpec) -> Any:
    """The gate detector as this job runs it: a rule that spends its error budget over a planned number of looks
    (a `horizon` attribute, 0 = not known: the paired rule) gets the job's own, fixed before any score: its
    checkpoints (`steps // eval_every`) less those never judged (the first, or the warm-up), on a copy (the detector
    given may be shared by a round's jobs). Any other detector is returned as it is."""
    import copy

    every = int(getattr(spec.config, "eval_every", 0) or 0)
    if detector is None or getattr(detector, "horizon", None) != 0 or every <= 0:
        return detector
    looks = spec.steps // every - max(1, int(getattr(detector, "warmup", 0)))
    if looks < 1:
        return detector
    fitted = copy.copy(detector)
    fitted.horizon = looks
    return fitted


def make_supervisor(spec: JobSpec, ledger: Any = None, metrics: Any = None, run_id: str | None = None,
                    catalog: Any = None, gate: Any = None):
    """The job's `eval.supervisor.RunSupervisor`, the one place one is made: the alert catalog (`catalog`, default
    the file `spec.alerts` with `spec.alert_profile`, built for the config's `algorithm`), the gate detector (`gate`,
    a detector object, else the one `spec.detector` specifies: a `training.job.request.DetectorSpec`, its text or a
    name; `planned_gate` fits it to the job's planned looks), the planned steps (`spec.steps`: the gate's short-run
    phase needs them), the ledger and metrics to charge.
    A job asked for as a `training.job.request.JobRequest` gets its spec and supervisor from
    `training.job.request.build`."""
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from training.job.detector_spec import build_detector

    if catalog is None:
        # the job's algorithm picks its thresholds and leaves out the alerts that do not apply to it (no critic alert
        # on grpo/rloo, no group alert on ppo: `Catalog.not_evaluated`)
        algorithm = getattr(spec.config, "algorithm", "ppo")  # TrainConfig's default
        catalog = Catalog.from_file(spec.alerts, algorithm=algorithm, profile=spec.alert_profile)
    if gate is None and spec.detector:
        gate = build_detector(spec.detector)
    gate = planned_gate(gate, spec)
    rid = run_id or spec.run_id or spec.job
    if ledger is not None and hasattr(ledger, "describe"):  # the run's ledger row names its algorithm
        ledger.describe(rid, algorithm=getattr(spec.config, "algorithm", None))
    return RunSupervisor(rid, spec.tenant, catalog.start(tenant=spec.tenant),
                         gate_detector=gate, ledger=ledger, metrics=metrics, gpu_kind=spec.gpu_kind, n_gpus=spec.gpus,
                         planned_steps=spec.steps)


def read_history(out_dir: str | Path, upto_step: int) -> list[Any]:
    """Steps 1..`upto_step` of a run, read back from its `metrics.csv` as `StepRecord`s in step order."""
    import csv
    from dataclasses import fields

    from training.metrics import PHASES, StepRecord

    path = Path(out_dir) / "metrics.csv"
    if upto_step < 1 or not path.is_file():
        return []
    with path.open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("step") and int(r["step"]) <= upto_step]
    out = []
    for row in sorted(rows, key=lambda r: int(r["step"])):
        kw: dict[str, Any] = {}
        for fld in fields(StepRecord):
            text = row.get(fld.name, "")
            if fld.name == "phase_seconds" or text in ("", None):
                continue
            kw[fld.name] = int(float(text)) if fld.type in ("int", int) else float(text)
        kw["phase_seconds"] = {n: float(row.get(f"phase_{n}_s") or 0.0) for n in PHASES}
        out.append(StepRecord(**kw))
    return out


def replay(records: list[Any], supervisor: Any, charge: bool = True) -> list[dict]:
    """Feed a resumed job's earlier steps to the supervisor in order, so its verdict (alerts, run state, eval gate)
    covers the whole run: a job whose KL alert fired before a crash must not register its checkpoint after the
    retry. `charge=False`: the steps were charged by the segment that ran them (a paused run being resumed)."""
    from eval.states import RunState

    out = []
    for rec in records:
        if charge:
            supervisor.observe(rec)
        else:
            supervisor.observe(rec, charge=False)
        out.append(rec.flat())
        if supervisor.machine.state is RunState.PAUSED_BY_GATE:
            break
    return out


def gate_evidence(trainer: Any, rec: Any) -> dict[str, Any]:
    """What the supervisor's gate detector may read at a step besides its means: the gate's per-prompt gold scores
    (`prompts`) and, when the config sets an extension budget, `extend` (the trainer scores the next held-out batch
    for the two checkpoints of a close decision: `Trainer.extend_gate`). Empty between gates."""
    records = getattr(trainer, "gate_records", {}).get(int(rec.step)) if math.isfinite(float(rec.gold_eval)) else None
    if not records:
        return {}
    out: dict[str, Any] = {"prompts": {str(r.prompt_id): r.gold_score for r in records}}
    if getattr(getattr(trainer, "cfg", None), "eval_extra_budget", 0) > 0:
        def extend(pair):
            got, seconds = trainer.extend_gate(tuple(int(s) for s in pair))
            return {s: {str(r.prompt_id): r.gold_score for r in rs} for s, rs in got.items()}, seconds
        out["extend"] = extend
    return out


def supervise(trainer: Any, supervisor: Any, steps: int | None, hooks: JobHooks | None = None,
              observe: Observer | None = None, pausable: bool = False,
              run_through_pause: bool = False, observer_role: str = "gate") -> TrainingResult:
    """The training loop: every step goes to the supervisor, then `hooks.on_step`, then (at checkpoints)
    `observe`; a stop reason from either ends the job there (`stopped`, by `hooks.stop_by` or `observer_role`; on a
    `pausable` job the run pauses at that checkpoint), a supervisor pause ends it `paused`, an error `failed`. A step
    after which the run can only end FAILED (a paging alert: `supervisor.failing()`) ends it `failed` at that step,
    whatever the entry point, unless `run_through_pause` (the fault canaries). Step records go to
    `hooks.log_records`."""
    from eval.states import RunState

    hooks = hooks or JobHooks()
    records: list[dict] = []
    pending: list[dict] = []
    result = TrainingResult("completed")
    t0 = time.time()
    run = trainer.run(steps)
    while True:
        try:
            with hooks.span("work"):
                rec = next(run, None)
                if rec is None:
                    break
                supervisor.observe(rec, **gate_evidence(trainer, rec))
        except Exception as err:  # a training error ends the run; attribution decides whose fault it is
            result.decision, result.error = "failed", err
            break
        flat = rec.flat()
        records.append(flat)
        pending.append(flat)
        reason, by = hooks.on_step(rec, supervisor), getattr(hooks, "stop_by", "user")
        failing = "" if run_through_pause else run_failing(supervisor)
        if failing:  # the run can only end FAILED: no step after this one is worth its slots
            result.decision, result.stop_reason, result.stopped_by = "failed", failing, "alert"
            break
        paused = supervisor.machine.state is RunState.PAUSED_BY_GATE
        if not reason and observe is not None and not paused and math.isfinite(float(rec.gold_eval)):
            reason, by = observe(int(rec.step), flat), observer_role
        if reason:
            result.decision, result.stop_reason, result.stopped_by = "stopped", str(reason), by
            if pausable:
                supervisor.pause(int(rec.step), str(reason))
            break
        if len(pending) >= hooks.flush_every:
            hooks.log_records(pending)
            pending = []
        if paused and not run_through_pause:
            result.decision = "paused"
            result.stop_reason = supervisor.machine.status.reason
            break
    run.close()
    if pending:
        hooks.log_records(pending)
    result.records, result.wall_s = records, time.time() - t0
    return result


def run_failing(supervisor: Any) -> str:
    """`supervisor.failing()` (the reason its run can only end FAILED, or ""); "" for a supervisor without it."""
    failing = getattr(supervisor, "failing", None)
    return failing() if callable(failing) else ""


def run_job(spec: JobSpec, observe: Observer | None = None, *, hooks: JobHooks | None = None,
            supervisor: Any = None, observer_role: str = "gate") -> JobOutcome:
    """Run one job through its whole lifecycle and return its outcome. THE SEAM for anything that runs a job and
    wants a say at its checkpoints (a sweep trial's pruner, the platform scheduler's early-stop wrapper):

        outcome = run_job(spec, observe=lambda step, metrics: "pruned" if bad(metrics) else None)

    `observe(step, metrics) -> stop reason | None` is called at every checkpoint (a step whose eval gate ran;
    `metrics` is the step's `StepRecord.flat()`); a reason stops the job there (decision `stopped`, the reason in
    `outcome.stop_reason`; a `pausable` job pauses at that checkpoint, resumable; `observer_role` says who the
    observer is, `gate` or `pruner`, for `decided_by`). The job's scores and best
    checkpoint are in the outcome whichever way it ended. `hooks` carries the platform's side effects (default:
    none, in-process); `supervisor` a caller-built `RunSupervisor` (default `make_supervisor(spec)`: no ledger).

    Order: provision -> hold slots (start worker, RUNNING, replay a resumed job's earlier steps, train) -> release
    slots -> score checkpoints -> attribute and end the run state. A worker that cannot start raises (after the
    hook's own retries) with the run left PROVISIONING for the caller to fail."""
    hooks = hooks or JobHooks()
    sup = supervisor if supervisor is not None else make_supervisor(spec)
    sup.provision()
    with hooks.hold_slots(spec) as waited:
        slot_start = time.time()
        trainer = hooks.start_worker(spec)
        if spec.gpus > 1 and spec.max_rank_restarts > 0:  # a failed rank: restarted from the last checkpoint
            from training.distributed.launch import RankRestarts

            trainer = RankRestarts(lambda: hooks.start_worker(spec), trainer, spec.max_rank_restarts,
                                   on_restart=lambda err: hooks.restarting(spec, err))
        sup.start()
        history = read_history(spec.out_dir, trainer.step) if spec.out_dir else []
        # a paused run's earlier steps were charged by the segment that ran them; an interrupted run's were lost
        # with the process that ran them and are charged again here, once
        replayed = replay(history, sup, charge=spec.resume is None)
        if replayed:
            with hooks.span("tracking"):
                hooks.log_records(replayed)
        if spec.resume is not None:
            sup.resume_after_pause(spec.resume.paused_step, spec.resume.reason, trainer.step)
        from eval.states import RunState

        failing = "" if spec.run_through_pause else run_failing(sup)
        if sup.machine.state is RunState.PAUSED_BY_GATE:
            result = TrainingResult("paused", stop_reason=sup.machine.status.reason)
        elif failing:  # a resumed run whose earlier steps paged: it can only end FAILED, so it trains no further
            result = TrainingResult("failed", stop_reason=failing, stopped_by="alert")
        else:
            result = hooks.supervise(spec, lambda: supervise(trainer, sup, spec.steps, hooks, observe, spec.pausable,
                                                          spec.run_through_pause, observer_role))
        slot_end = time.time()
    saved = checkpoints(spec.out_dir)
    scores = hooks.score(spec, saved) if spec.out_dir else []
    best = best_of(scores)
    # a pause names the checkpoint it keeps only when one was saved (the best scored one's step; none saved: it says
    # so); a job without a run directory leaves the supervisor's own words
    kept = best["step"] if best else (None if spec.out_dir is not None and not saved else True)
    status = sup.finish(completed=result.decision != "failed", exception=result.error, keep_paused=spec.pausable,
                        kept=kept)
    return JobOutcome(spec, sup, status, result.decision, result.error, replayed + result.records, scores,
                      best, result.wall_s, float(waited or 0.0), slot_start, slot_end, result.stop_reason,
                      len(replayed), result.stopped_by)


def decided_by(outcome: JobOutcome) -> str:
    """Who decided how the job ended (one of DECIDERS): a FAILED run with a paging alert was failed by the health
    catalog (`alert`), one without failed on its own (`error`); a stop at a checkpoint names who gave it (the
    observer's role, or the hook's `stop_by`); a pause the supervisor made is its gate detector's (`gate`); a run
    that went to the end was decided by nobody (`none`)."""
    status = outcome.status
    if status.state.value == "FAILED":
        return "alert" if list(getattr(outcome.supervisor.machine, "pages", [])) else "error"
    if outcome.decision == "stopped" and outcome.stopped_by:
        return outcome.stopped_by
    if outcome.decision == "paused" or status.state.value == "PAUSED_BY_GATE":
        return "gate"
    return "none"


def ended_by(outcome: JobOutcome) -> str:
    """What ended a job, as a platform round's `jobs.csv` states it: `failed: <alert> at step N` for a run that ended
    FAILED with a paging alert (the first one to page, and the step it paged at), `failed: <failure class> at step N`
    for one that failed without (N: its last step); `stopped` for a run its gate or an observer stopped at a
    checkpoint (on a pausable job: PAUSED_BY_GATE, resumable); else how the training loop ended (`completed`)."""
    status = outcome.status
    if status.state.value == "FAILED":
        pages = list(getattr(outcome.supervisor.machine, "pages", []))
        if pages:
            step = getattr(pages[0], "step", None)
            return f"failed: {pages[0].alert} at step {int(step)}" if step is not None else f"failed: {pages[0].alert}"
        what = status.failure.value if status.failure else "error"
        last = outcome.records[-1]["step"] if outcome.records else 0
        return f"failed: {what} at step {int(last)}"
    if outcome.decision == "stopped" or (outcome.decision == "paused" and status.state.value == "PAUSED_BY_GATE"):
        return "stopped"
    return outcome.decision


# ---------------------------------------------------------------------------------------------- pause and resume
def paused_run(out_dir: str | Path) -> PausedRun | None:
    """The paused run `out_dir` holds (its `job.json` says PAUSED_BY_GATE), or None."""
    path = Path(out_dir) / JOB_DONE
    if not path.is_file():
        return None
    done = json.loads(path.read_text())
    if not str(done.get("state", "")).startswith("PAUSED_BY_GATE") or done.get("best_step") is None:
        return None
    return PausedRun(run_id=str(done.get("run_id", "")), paused_step=done.get("paused_step"),
                     reason=str(done.get("reason", "")), best_step=int(done["best_step"]))


def rewind_to(out_dir: str | Path, step: int) -> list[str]:
    """Drop the checkpoints after `step` (the kept one), so the worker resumes from it; returns what was dropped.
    The trainer keeps `metrics.csv` rows up to the checkpoint it resumes from."""
    dropped = []
    for ckpt in checkpoints(Path(out_dir)):
        if step_of(ckpt) > step:
            shutil.rmtree(ckpt)
            dropped.append(ckpt)
    return dropped


def reopen_paused(out_dir: str | Path, paused: PausedRun) -> None:
    """Make the paused run in `out_dir` resumable: the checkpoints after the kept one go (`rewind_to`) and its
    `job.json` with them; the ledger and the steps up to the kept checkpoint stay (they are replayed, not charged)."""
    rewind_to(out_dir, paused.best_step)
    (Path(out_dir) / JOB_DONE).unlink()


def job_record(outcome: JobOutcome) -> dict[str, Any]:
    """The `job.json` a job leaves in its run directory when it ends: its run and state; for a paused run also the
    step it paused at, the reason, and the kept checkpoint's step (what `paused_run` reads back)."""
    status = outcome.status
    out: dict[str, Any] = {"run_id": outcome.supervisor.machine.run_id, "state": status.label,
                           "decided_by": decided_by(outcome), "decision": ended_by(outcome)}
    config = getattr(getattr(outcome, "spec", None), "config", None)
    if hasattr(config, "reward") and hasattr(config, "gate"):
        from training.inputs import rewards, sandbox

        refs = [*(config.reward.refs if config.reward.kind == "function" else []),
                *([config.gate.ref] if config.gate.kind == "function" else [])]
        if any(rewards.builtin(r) is None for r in refs):
            out["tenant_code_sandbox"] = sandbox.describe()  # bwrap, or none (the operator's switch)
    if status.state.value == "PAUSED_BY_GATE":
        out.update(paused_step=status.step, reason=status.reason,
                   best_step=outcome.best["step"] if outcome.best else None)
    if status.state.value == "FAILED":
        out.update(failure_class=status.failure.value if status.failure else None, reason=status.reason)
        out.update(attachments(outcome))
    return out


def attachments(outcome: JobOutcome) -> dict[str, Any]:
    """What a FAILED run's reason says is attached, so that every pointer it makes holds in `job.json`: `examples`
    (the samples the tenant's code failed on: prompt, completion, error, traceback tail; or the attribution's sample
    lines), `traceback` (the error that ended the run, whoever raised it), `alerts` and `history` (the paging
    alerts with their steps, and the run's states: "the health history is attached"), and `last_checkpoint` (the
    newest saved checkpoint, only when one was saved)."""
    import traceback as tb

    out: dict[str, Any] = {}
    attribution = getattr(outcome.supervisor, "attribution", None)
    lines = [str(x) for x in (getattr(attribution, "examples", None) or ())]
    failure = getattr(outcome.status.failure, "value", None)
    examples = tenant_examples(outcome.error)
    if examples:
        out["examples"] = examples
    elif lines and failure == "tenant_code_fault" and outcome.error is None:
        out["examples"] = lines  # the reward guard's samples (`sample -> error`)
    if outcome.error is not None:
        out["traceback"] = "".join(tb.format_exception(outcome.error))[-8000:]
    pages = list(getattr(outcome.supervisor.machine, "pages", []))
    if pages:
        out["alerts"] = lines or [f"{p.alert} at step {p.step}" for p in pages]
    labels = getattr(outcome.supervisor.machine, "labels", None)
    if callable(labels):
        out["history"] = labels()
    saved = checkpoints(outcome.spec.out_dir)
    out["last_checkpoint"] = saved[-1] if saved else None
    return out


def tenant_examples(error: BaseException | None) -> list[dict[str, str]]:
    """The samples the tenant's code failed on (prompt, completion, error, traceback tail), when it did."""
    return list(getattr(error, "examples", None) or [])
