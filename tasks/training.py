"""Prefect tasks around the trainer: start a worker, train under supervision, score and register checkpoints, and
`PrefectJobHooks`, the platform's side effects that `training.job.lifecycle.run_job` calls.

The supervision loop (`training.job.lifecycle.supervise`) is the platform's control path: every `StepRecord` the
trainer yields goes through `eval.supervisor.RunSupervisor` (alert catalog, run state machine, eval-gate detector,
ledger, Prometheus metrics). The run continues while it is RUNNING or DEGRADED, pauses at a checkpoint when a
paging alert with the `pause` action or the gate detector says so (PAUSED_BY_GATE: training stops, slots are
freed, the best checkpoint is kept), and stops on an error (FAILED with the class `eval.attribution` assigns).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

# the trainer (torch, transformers) is imported with this module, not inside the first task that needs it: a flow
# module loads before its flow run starts (`rlhfops nightly` loads it while the temporary Prefect server starts),
# so the 3-5 s import is paid at start-up instead of stalling the nightly's job stage
from infra import tracking as T
from infra.slot_cards import claim_cards
from tasks.retry import RETRIES, backoff, maybe_fail, retry_transient
from tasks.timing import clock
from training.job.lifecycle import (  # noqa: F401 - step_of, best_of: re-exported for the flows
    JobHooks,
    JobSpec,
    TrainingResult,
    best_of,
    read_history,
    replay,
    step_of,
)
from training.trainer import Trainer, gold_eval

_RETRY = dict(retries=RETRIES, retry_delay_seconds=backoff(1.0), retry_jitter_factor=0.5,
              retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
METRIC_FLUSH_STEPS = 25
#: a progress line in the run's log (the Prefect UI) every this many steps, and at the last one
PROGRESS_EVERY = 5


def progress_line(rec, total: int | None, supervisor, score_word: str = "held-out gold") -> str:
    """One step's progress as the run's log shows it (`score_word`: what the gate's score is called: a tenant's
    dataset job is scored by its own gate, `gate score`, not the synthetic task's held-out gold)."""
    gold = "" if math.isnan(rec.gold_eval) else f", {score_word} {rec.gold_eval:+.3f}"
    of = f"/{total}" if total else ""
    return (f"step {rec.step}{of}: reward {rec.reward_mean:+.3f}, KL {rec.kl:.2f}, entropy {rec.entropy:.2f}{gold}; "
            f"run state {supervisor.machine.status.label}")


def score_word(config) -> str:
    """What a job's gate score is called in its lines: `gate score` for a tenant's dataset job (its own gate), the
    synthetic task's `held-out gold` otherwise."""
    return "gate score" if config.task.kind == "dataset" else "held-out gold"


def _run_logger():
    import logging

    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow or task run (tests calling .fn)
        return logging.getLogger("rlhfops.train")


@task(name="start-worker", task_run_name="start worker {job}", **_RETRY)
def start_worker(job: str, config, overlap: str, out_dir: str, fail_rate: float = 0.0, fault_seed: int = 0,
                 card: int | None = None, gpus: int = 1, runner: str = "thread"):
    """Bring up the training worker: tokenizer, base policy, reference, the reward model (a job with one), optimisers
    (cached warm starts after the first job), on the GPU of the slot card `card` when the config says `device: auto`.
    Resumes from the newest checkpoint in `out_dir` if any. On `gpus` ranks: this worker is rank 0 and spawns the
    others when it trains (`runner` thread), or the ranks are Ray Train workers (`runner` ray: `infra.ray_train`)."""
    maybe_fail("worker-start", job, fail_rate, fault_seed)
    with clock.span("work"):
        if runner == "ray":
            from infra.ray_train import RayRanks

            return RayRanks(config, overlap, out_dir, gpus, name=job.replace("/", "-"))
        return Trainer(config, overlap, out_dir, resume=True, slot=card, gpus=gpus)


@task(name="train", task_run_name="train {job}", cache_policy=NO_CACHE)
def train_task(job: str, loop: Callable[[], Any]) -> Any:
    """The training loop (`training.job.lifecycle.supervise`) as one task run: the job's steps, supervised."""
    return loop()


class PrefectJobHooks(JobHooks):
    """The platform's side effects around `training.job.lifecycle.run_job`: GPU slots from `slots`
    (`infra.provision.gpu_slots`), the worker started by the retried `start_worker` task, the loop as the `train`
    task, step records to the MLflow run `run_id`, a progress line in the run's log every `PROGRESS_EVERY` steps,
    the checkpoints scored by the retried `score_checkpoints` task (after waiting out an API outage, when
    `wait_api`). `after_step(record, supervisor)` runs after each step (the flow's progress bar)."""

    flush_every = METRIC_FLUSH_STEPS

    def __init__(self, run_id: str | None, slots: Any = None, retry_delay_s: float = 1.0, fail_rate: float = 0.0,
                 fault_seed: int = 0, after_step: Callable[[Any, Any], None] | None = None, wait_api: bool = False):
        self.run_id, self.slots, self.delays = run_id, slots, backoff(retry_delay_s)
        self.fail_rate, self.fault_seed, self.after_step, self.wait_api = fail_rate, fault_seed, after_step, wait_api
        self.logger = _run_logger()
        self.total: int | None = None
        self.score_word = "held-out gold"
        self.card: int | None = None  # the slot card this job holds (`hold_slots`), while it holds it

    @contextmanager
    def hold_slots(self, spec: JobSpec):
        """The job's slots, then as many card numbers of this host (`infra.slot_cards`): the first is the GPU its
        trainer uses with `device: auto`."""
        if spec.runner == "ray":  # Ray for the whole job (a restart from the checkpoint finds it running)
            from infra.ray_train import ray_session

            with ray_session():
                yield from self._slots(spec)
            return
        yield from self._slots(spec)

    def _slots(self, spec: JobSpec):
        if self.slots is None:
            with super().hold_slots(spec) as waited:
                yield waited
            return
        with self.slots.take(spec.gpus) as waited, claim_cards(self.slots.name, self.slots.size, spec.gpus) as cards:
            self.card = cards[0]
            try:
                yield waited
            finally:
                self.card = None

    def start_worker(self, spec: JobSpec):
        self.total = spec.steps
        self.score_word = score_word(spec.config)
        return start_worker.with_options(retry_delay_seconds=self.delays)(
            spec.job, spec.config, spec.overlap, str(spec.out_dir), self.fail_rate, self.fault_seed, self.card,
            spec.gpus, spec.runner)

    def restarting(self, spec: JobSpec, error: BaseException) -> None:
        self.logger.warning("%s: %s; restarting from the last checkpoint", spec.job, error)

    def supervise(self, spec: JobSpec, loop: Callable[[], TrainingResult]) -> TrainingResult:
        result = train_task(spec.job, loop)
        self.logger.info("training %s after %d steps%s", result.decision, len(result.records),
                         f": {type(result.error).__name__}: {result.error}" if result.error is not None else "")
        return result

    def span(self, kind: str):
        return clock.span(kind)

    def log_records(self, records: list[dict]) -> None:
        if self.run_id and records:
            with clock.span("tracking"):
                T.log_step_records(self.run_id, records)

    def on_step(self, record: Any, supervisor: Any) -> str | None:
        if record.step % PROGRESS_EVERY == 0 or record.step == self.total:
            self.logger.info(progress_line(record, self.total, supervisor, self.score_word))
        if self.after_step is not None:
            self.after_step(record, supervisor)
        return None

    def score(self, spec: JobSpec, checkpoints: list[str]) -> list[dict[str, Any]]:
        if self.wait_api:
            from infra.provision import wait_for_api

            wait_for_api()  # an outage during training: wait it out here rather than fail with the work done
        return score_checkpoints.with_options(retry_delay_seconds=self.delays)(spec.job, checkpoints)


@task(name="score-checkpoints", task_run_name="score checkpoints {job}", **_RETRY)
def score_checkpoints(job: str, checkpoints: list[str]) -> list[dict[str, Any]]:
    """Gold (held-out) score of every saved checkpoint: the eval gate the best checkpoint is chosen by."""
    out = []
    with clock.span("work"):
        for ckpt in checkpoints:
            g = gold_eval(ckpt)
            out.append({"checkpoint": ckpt, "step": step_of(ckpt), "eval_score": g.mean,
                        "eval_se": g.se, "n": g.n, "unparseable_rate": g.unparseable_rate})
    return out


@task(name="register-checkpoint", task_run_name="register {model_name}", **_RETRY)
def register_checkpoint(run_id: str, model_name: str, best: dict[str, Any], tenant: str, job: str,
                        fail_rate: float = 0.0, fault_seed: int = 0, run_state: str = "") -> dict[str, Any]:
    """Write the best checkpoint to the job's MLflow run (`best_checkpoint/`) and register it as a model
    version tagged with its eval score (at full precision) and the run's final state; the `best` alias moves to
    it only when the run ended well (`run_state` SUCCEEDED, or PAUSED_BY_GATE: paused by the gate with its best
    checkpoint kept) and it beats the current holder by the paired test on the same prompts (`infra.promotion`:
    the checkpoint's gate records are its evidence; the decision and the evidence become version tags).
    Idempotent: a version already registered for this run is returned, not made again."""
    from mlflow.exceptions import MlflowException

    c = T.client()
    with clock.span("tracking"):
        maybe_fail("checkpoint-write", f"{job}/{best['step']}", fail_rate, fault_seed)
        c.log_artifacts(run_id, best["checkpoint"], artifact_path="best_checkpoint")
        try:
            c.create_registered_model(model_name, tags={"tenant": tenant},
                                      description="Best held-out checkpoints of rlhf-job runs")
        except MlflowException:
            pass  # exists
        found = c.search_model_versions(f"name = '{model_name}' and run_id = '{run_id}'")
        if found:
            mv = found[0]
        else:
            source = f"{c.get_run(run_id).info.artifact_uri}/best_checkpoint"
            # repr: the shortest text that reads back as the same float; rounded to 6 decimals, an equal score
            # from a rerun compared higher than its own rounding and moved the alias
            tags = {"eval_score": repr(float(best["eval_score"])), "eval_se": repr(float(best["eval_se"])),
                    "step": str(best["step"]), "tenant": tenant, "job": job, "run_state": run_state,
                    **rescoring_tags(best["checkpoint"])}
            mv = c.create_model_version(model_name, source, run_id=run_id, tags=tags,
                                        description=f"{job}: step {best['step']}, held-out score "
                                                    f"{best['eval_score']:.4f} ± {best['eval_se']:.4f}")
        from infra.promotion import checkpoint_evidence, promote

        decision = promote(c, model_name, mv, checkpoint_evidence(best["checkpoint"], best["step"]),
                           run_state=run_state)
    return {"model": model_name, "version": int(mv.version), "alias_best": decision.promote,
            "promotion": decision.reason, "promotion_changed": list(decision.changed), "source": mv.source}


def replay_history(out_dir: str | Path, upto_step: int, supervisor, run_id: str | None = None) -> list[dict[str, Any]]:
    """A resumed job's steps 1..`upto_step` read back from the run directory and fed to the supervisor
    (`training.job.lifecycle.read_history`, `replay`); logged to the MLflow run `run_id` if given."""
    out = replay(read_history(out_dir, upto_step), supervisor)
    if run_id and out:
        with clock.span("tracking"):
            T.log_step_records(run_id, out)
    return out


def rescoring_tags(checkpoint: str) -> dict[str, str]:
    """What re-scoring a registered checkpoint needs, as version tags: the gate's kind and code hash (or model path),
    the held-out file's digest, the task kind (training.inputs.job_inputs.job_lineage on the checkpoint's own config);
    and the algorithm that trained it (ppo, grpo, rloo), so the registry tells which versions came from which."""
    import yaml

    from training.inputs.job_inputs import ALGORITHM_TAG, job_lineage
    from training.job.config import TrainConfig

    path = Path(checkpoint) / "config.yaml"
    if not path.is_file():
        return {}
    tags = job_lineage(TrainConfig.model_validate(yaml.safe_load(path.read_text())))["tags"]
    return {k: v for k, v in tags.items() if k == ALGORITHM_TAG or k.startswith(("gate.", "heldout.", "task."))}
