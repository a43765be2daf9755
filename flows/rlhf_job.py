"""`rlhf_job`: one tenant's RL job (the config's `algorithm`: ppo, grpo or rloo) with OPPO overlap, end to end on
the platform's control path.

The flow takes one `training.job.request.JobRequest` (the run form is generated from it) and `JobInternals`:
validate the request (before anything is provisioned) -> take GPU worker slots -> start the worker ->
train, feeding every StepRecord to the supervisor (alert catalog, run state machine, eval-gate detector,
ledger, metrics) -> continue / pause / stop -> score the saved checkpoints on held-out prompts, keep and
register the best -> close the tenant's ledger -> final run state (MLflow tags, Prefect state).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml
from prefect import flow

from common.config import flatten
from flows import progress
from infra import tracking as T
from infra.job_run import outcome_tags
from infra.provision import check_slot_settings, gpu_slots
from tasks.retry import backoff
from tasks.timing import clock
from tasks.tracking import error_tags, parent_run
from tasks.training import PrefectJobHooks, register_checkpoint
from training.job.lifecycle import JOB_DONE, decided_by, ended_by, job_record, reopen_paused, run_job, tenant_examples
from training.job.request import JobInternals, JobRequest, build, parse_internals, parse_request
from training.job.rundir import locked_run_dir

#: the samples a tenant's code failed on (prompt, completion, error, traceback tail), beside job.json
TENANT_ERRORS = "tenant_code_errors.json"


class JobFailed(RuntimeError):
    """The job ended FAILED(class): the flow run fails too, after everything was recorded."""


def fresh_run_dir(out: Path) -> None:
    """Start a job over in `out`: the trainer resumes from any checkpoint it finds there."""
    import shutil

    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    shutil.rmtree(out / "ray-train", ignore_errors=True)  # Ray Train's own records of a runner: ray job
    for name in ("metrics.csv", "summary.json", "scores.json", "ledger.csv", JOB_DONE, TENANT_ERRORS):
        (out / name).unlink(missing_ok=True)
    for marker in out.glob(".fault-*"):  # a fault canary's record of the starts it fired on
        marker.unlink()


def job_run_name() -> str:
    """The flow run's name: `<tenant>/<name>` of its request."""
    from prefect.runtime import flow_run

    req = flow_run.parameters.get("request")
    get = req.get if isinstance(req, dict) else (lambda k, d=None: getattr(req, k, d))
    return f"{get('tenant', 'acme')}/{get('name', 'ppo-tiny')}"


@flow(name="rlhf-job", flow_run_name=job_run_name, log_prints=False)
def rlhf_job(request: JobRequest = JobRequest(), internals: JobInternals = JobInternals()) -> dict[str, Any]:
    """Train one tenant's RL job (PPO, GRPO or RLOO: the config's `algorithm`, or the form's; OPPO overlap) on GPU
    worker slots under the run-health catalog and a held-out eval gate; register the best checkpoint in the MLflow
    model registry. The MLflow run's params carry the resolved config (`algorithm`, `ppo.group_size`, ...) and its
    `algorithm` tag, so runs filter and compare by algorithm.

    `request.resume` (default): continue an interrupted job from the newest checkpoint in its run directory (a crash,
    an API outage that outlasted the retries: the retry keeps the work done); a directory whose job ended is started
    over. `request.resume_paused`: continue the run the eval gate paused there from its kept checkpoint. The run
    directory is locked while the job runs: a second job on the same directory fails at once (bad input, not
    retried).

    Args:
        request: the job (training/job/request.py: JobRequest): config and overrides, algorithm and group size,
            tenant, name, overlap, steps, GPUs, detector, alerts, output root; every field is checked before
            anything is provisioned.
        internals: knobs the nightly and the tests set (chaos injection, first retry delay, the MLflow parent
            run); the defaults are safe.
    """
    from eval.states import RunState
    from infra.ledger import Ledger, load_prices
    from infra.metrics import PlatformMetrics

    request, internals = parse_request(request), parse_internals(internals)
    checked = request.checked()  # everything, before the run directory is taken or a slot is asked for
    check_slot_settings()  # RLHFOPS_SLOTS, RLHFOPS_SLOTS_WAIT_S: a bad one is bad input, found here
    if request.runner == "ray":  # Ray Train and the ranks' placement, checked here too
        from infra.ray_train import check_ray_train, placement

        check_ray_train()
        placement()
    ledger = Ledger(load_prices(request.prices))
    tenant, name, job, out = request.tenant, request.name, request.job, request.out_dir
    paused = checked.paused
    cfg = checked.config
    resolved = cfg.model_dump(mode="json")
    sup = status = None

    def failure_tags(err: BaseException) -> dict[str, Any]:
        """A failure while the job runs gets the supervisor's verdict (run state, failure class); one after it has
        ended (registry, ledger) is a platform fault."""
        if sup is None or status is not None:
            return error_tags(err)
        verdict = sup.finish(completed=False, exception=err)
        return {"run_state": verdict.label, "failure_class": verdict.failure or "platform_fault",
                "reason": verdict.reason[:500]}

    # the run directory is taken before the MLflow run is opened: a second writer fails with nothing to clean up
    with locked_run_dir(out, "run_dir"), parent_run(
            "rlhf_job", job, request.mlflow_experiment, internals.parent_run_id, tenant=tenant,
            params={"config": request.config_label, "overlap": request.overlap, "gpus": request.gpus,
                    "runner": request.runner,
                    "gpu_kind": request.gpu_kind,
                    "detector": request.detector.label if request.detector is not None else "none",
                    **flatten(resolved)},
            fail_rate=internals.fail_rate, fault_seed=internals.fault_seed, retry_delay_s=internals.retry_delay_s,
            failure_tags=failure_tags) as run:
        if paused is not None:  # continue from the kept checkpoint
            reopen_paused(out, paused)
        elif not request.resume or (out / JOB_DONE).exists():
            fresh_run_dir(out)
        (out / "config.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
        run_id = run.run_id
        log_lineage(run_id, cfg)
        spec, sup = build(request, checked, run_id=run_id, ledger=ledger,
                          metrics=PlatformMetrics(tenants=[tenant]))
        slots = gpu_slots(request.cluster_gpus)
        progress.reporter.stage(f"rlhf job {job}: {cfg.steps} {cfg.algorithm.upper()} steps ({request.overlap})",
                                total=cfg.steps)
        hooks = PrefectJobHooks(run_id, slots, internals.retry_delay_s, internals.fail_rate, internals.fault_seed,
                                wait_api=True, after_step=lambda rec, _s: progress.reporter.advance())
        outcome = run_job(spec, hooks=hooks, supervisor=sup)
        status, scores, best = outcome.status, outcome.scores, outcome.best
        registry = None
        # a failed run registers nothing; a paused one registers its kept checkpoint
        if best is not None and status.state in (RunState.SUCCEEDED, RunState.PAUSED_BY_GATE):
            registry = register_checkpoint.with_options(retry_delay_seconds=backoff(internals.retry_delay_s))(
                run_id, request.model_name, best, tenant, job, internals.fail_rate, internals.fault_seed,
                run_state=status.label)
        # close the tenant's ledger: the run's totals become MLflow metrics and a CSV artifact (a resumed run's CSV
        # keeps the earlier segments' rows: each step is charged once, by the segment that ran it)
        totals = ledger.run_totals().get(run_id)
        ledger_csv = out / "ledger.csv"
        frame = ledger.frame()
        if paused is not None and ledger_csv.is_file():
            import pandas as pd

            earlier = pd.read_csv(ledger_csv)
            frame = pd.concat([earlier[earlier.run_id != run_id], frame], ignore_index=True)
        frame.to_csv(ledger_csv, index=False)
        records = outcome.records
        final = records[-1] if records else {}
        job_metrics = {
            "cost_usd": float(totals.cost) if totals else 0.0,
            "gpu_hours": totals.gpu_seconds / 3600 if totals else 0.0,
            "steps": len(records), "tokens_generated": totals.tokens_generated if totals else 0,
            "best_eval": best["eval_score"] if best else math.nan,
            "best_eval_se": best["eval_se"] if best else math.nan,
            "best_step": best["step"] if best else math.nan,
            "final_reward": final.get("reward_mean", math.nan), "slot_wait_s": outcome.slot_wait_s,
            "train_wall_s": outcome.train_wall_s, "alerts_paged": len(sup.machine.pages),
            "cost_usd_all_segments": float(frame["cost"].sum()) if len(frame) else 0.0,
        }
        failure = status.failure.value if status.failure else ""
        # a paused run's state keeps the gate's verdict; what a tenant reads is its attribution (step, verdict, and
        # that resuming continues from the kept checkpoint)
        reason = sup.attribution.reason if status.state is RunState.PAUSED_BY_GATE else status.reason
        # who ended the job and what it decided (docs/ARCHITECTURE.md "Who decided"): an alert that failed the run
        # reads `alert` / `failed: <alert> at step N`, not the loop's `paused`
        decider, decision = decided_by(outcome), ended_by(outcome)
        tags = {**outcome_tags(outcome), "slots_backend": slots.backend}  # the same tags as `rlhfops train`'s run
        if paused is not None:
            tags.update(paused.tags())
        if registry:  # the promotion decision on the job's run too: the nightly's report reads it from there
            tags.update(promotion_tags(registry))
        (out / "scores.json").write_text(json.dumps(scores, indent=2))
        examples = tenant_examples(outcome.error)
        if examples:  # what the tenant's code failed on: the run directory and an MLflow artifact
            (out / TENANT_ERRORS).write_text(json.dumps(examples, indent=2))
        log_job_plots(run_id, records, out, job)
        run.close(metrics=job_metrics, tags=tags,
                  artifacts=[str(out / "config.resolved.yaml"), str(ledger_csv), str(out / "scores.json"),
                             str(out / "metrics.csv")]
                  + [str(out / f) for f in ("gate_records.csv", TENANT_ERRORS) if (out / f).is_file()],
                  status="FAILED" if status.state is RunState.FAILED else "FINISHED")
        gate = request.detector.label if request.detector is not None else None
        (out / JOB_DONE).write_text(json.dumps({**job_record(outcome), "tenant": tenant, "name": name,
                                                "detector": gate, "overlap": request.overlap,
                                                "gpus": request.gpus}))
    summary = {"job": job, "tenant": tenant, "run_id": run_id, "state": status.label, "decision": decision,
               "decided_by": decider, "algorithm": cfg.algorithm, "group_size": cfg.ppo.group_size,
               "failure_class": failure, "reason": reason, "best": best, "registry": registry,
               "metrics": job_metrics, "out_dir": str(out), "history": sup.machine.labels(),
               "resumed_from": paused.__dict__ if paused is not None else None}
    job_artifact(summary, request.mlflow_experiment)
    if status.state is RunState.FAILED:
        raise JobFailed(f"{job}: {status.label}: {status.reason}")
    return summary


def promotion_tags(registry: dict[str, Any]) -> dict[str, str]:
    """The job run's tags of its registered version's promotion decision (`register_checkpoint`'s return): the
    version, promoted or not, the one-line reason and the gate identity parts that changed (none: empty)."""
    changed = ", ".join(registry.get("promotion_changed") or [])
    return {"promotion.version": f"{registry['model']}/{registry['version']}",
            "promotion.decision": "promoted" if registry.get("alias_best") else "kept holder",
            "promotion.reason": str(registry.get("promotion", ""))[:5000], **({"promotion.changed": changed}
                                                                            if changed else {})}


def log_lineage(run_id: str, cfg) -> None:
    """The job's data files as MLflow dataset inputs and its reward/gate kinds and code hashes as tags
    (training.inputs.job_inputs.job_lineage)."""
    from training.inputs.job_inputs import job_lineage

    lineage = job_lineage(cfg)
    with clock.span("tracking"):
        T.log_datasets(run_id, lineage["datasets"])
        T.set_tags(run_id, lineage["tags"])


def log_job_plots(run_id: str, records: list[dict], out: Path, job: str) -> None:
    """Reward, KL, entropy and eval-gate curves as PNGs in the run directory and under `plots/` in the MLflow run."""
    from training.plots import plot_training_curves

    with clock.span("work"):
        paths = plot_training_curves(records, out / "plots", title=job)
    with clock.span("tracking"):
        T.log_artifacts(run_id, paths, artifact_path="plots")


def mlflow_run_url(run_id: str, experiment: str) -> str:
    """Where the job's run opens in the MLflow UI (`MLFLOW_UI_URL`, default the `mlflow ui` address), in its "Model
    training" view (`infra.tracking.ui_url`)."""
    base = os.environ.get("MLFLOW_UI_URL")
    return T.ui_url(**({"base": base} if base else {}), experiment=experiment, run_id=run_id)


def job_artifact(summary: dict[str, Any], experiment: str) -> None:
    """A markdown artifact on the flow run: the job's end state, best checkpoint and a link to its MLflow run."""
    from prefect.artifacts import create_markdown_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:  # the flow's body called without a flow run (`.fn`): no run to attach to
        return
    url = mlflow_run_url(summary["run_id"], experiment)
    best = summary["best"] or {}
    reg = summary["registry"] or {}
    m = summary["metrics"]
    lines = [f"# {summary['job']}: {summary['state']}", "",
             f"MLflow run: [{summary['run_id']}]({url}) (`mlflow ui --backend-store-uri "
             f"{T.tracking_uri()}` serves it)", "",
             "| | |", "|---|---|",
             f"| algorithm | {summary.get('algorithm', 'ppo')} ({summary.get('group_size', 1)} completions per "
             "prompt) |",
             f"| decision | {summary['decision']} (decided by {summary['decided_by']}) after {m['steps']} steps |",
             f"| reason | {summary['reason'] or '—'} |",
             f"| best checkpoint | step {best.get('step', '—')}, held-out {best.get('eval_score', math.nan):+.3f} "
             f"± {best.get('eval_se', math.nan):.3f} |",
             f"| registry | {reg.get('model', '—')} v{reg.get('version', '—')}"
             f"{' (alias best)' if reg.get('alias_best') else ''} |",
             f"| cost | ${m['cost_usd']:.4f}, {m['gpu_hours']:.4f} GPU-hours |",
             f"| run directory | {summary['out_dir']} |"]
    slug = "".join(ch if ch.isalnum() else "-" for ch in summary["job"].lower())
    create_markdown_artifact(key=f"rlhf-job-{slug}", markdown="\n".join(lines) + "\n",
                             description=f"{summary['job']}: {summary['state']} (MLflow run {summary['run_id']})")
