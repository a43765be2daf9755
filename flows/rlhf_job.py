"""`rlhf_job`: one tenant's PPO job with OPPO overlap, end to end on the platform's control path.

validate the config (before anything is provisioned) -> take GPU worker slots -> start the worker ->
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
from common.errors import BadInput
from common.validate import check_out_dir
from flows import progress
from flows.params import AlertProfile, DetectorName, Overlap
from infra import tracking as T
from infra.provision import gpu_slots
from tasks.retry import backoff
from tasks.timing import clock
from tasks.tracking import error_tags, parent_run
from tasks.training import PrefectJobHooks, register_checkpoint, resolve_train_config
from training.lifecycle import JOB_DONE, JobSpec, job_record, paused_run, reopen_paused, run_job
from training.rundir import locked_run_dir


class JobFailed(RuntimeError):
    """The job ended FAILED(class): the flow run fails too, after everything was recorded."""


def fresh_run_dir(out: Path) -> None:
    """Start a job over in `out`: the trainer resumes from any checkpoint it finds there."""
    import shutil

    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    for name in ("metrics.csv", "summary.json", "scores.json", "ledger.csv", JOB_DONE):
        (out / name).unlink(missing_ok=True)


def validate_job(config: str | dict, overrides: dict | None, steps: int | None, overlap: str, detector: str,
                 gpus: int, cluster_gpus: int, gpu_kind: str, alerts: str | None, alert_profile: str | None,
                 prices: str | None):
    """Everything a job needs, checked before any slot is taken. Raises BadInput naming the field."""
    from eval.detectors import make_detector
    from eval.health import Catalog
    from infra.ledger import Ledger, load_prices
    from training.trainer import check_overlap

    cfg = resolve_train_config(config, overrides, steps)
    check_overlap(overlap)
    try:
        make_detector(detector)
    except (ValueError, KeyError) as err:
        raise BadInput(f"detector: {err}") from None
    if gpus < 1:
        raise BadInput("gpus: a job needs at least one GPU slot")
    if gpus > cluster_gpus:
        raise BadInput(f"gpus: the job asks for {gpus} slots but the cluster has {cluster_gpus} (cluster_gpus)")
    price_table = load_prices(prices)
    if gpu_kind not in price_table.gpu_hour:
        raise BadInput(f"gpu_kind: '{gpu_kind}' has no price (add it under gpu_hour in configs/prices.yaml)")
    catalog = Catalog.from_file(alerts, algorithm="ppo", profile=alert_profile)
    return cfg, catalog, Ledger(price_table)


@flow(name="rlhf-job", flow_run_name="{tenant}/{name}", log_prints=False)
def rlhf_job_internal(
    config: str | dict[str, Any] = "configs/ppo-tiny.yaml",
    overrides: dict[str, Any] | None = None,
    tenant: str = "acme",
    name: str = "ppo-tiny",
    overlap: str = "full",
    steps: int | None = None,
    gpus: int = 1,
    cluster_gpus: int = 4,
    gpu_kind: str = "cpu",
    detector: str = "noisepatience",
    alerts: str | None = None,
    alert_profile: str | None = None,
    prices: str | None = None,
    out_dir: str | None = None,
    registered_model: str | None = None,
    resume: bool = True,
    resume_paused: bool = False,
    fail_rate: float = 0.0,
    fault_seed: int = 0,
    retry_delay_s: float = 1.0,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """`rlhf_job` with the knobs the run form does not show: an inline `config` mapping (the nightly's job),
    `fail_rate`/`fault_seed` (chaos: injected transient failures), `retry_delay_s` (first backoff delay) and
    `parent_run_id` (the MLflow run to nest under). The nightly and the tests call this one; the deployment
    runs `rlhf_job`.

    `resume` (default): continue an interrupted job from the newest checkpoint in `out_dir` (a crash, an API
    outage that outlasted the retries: the retry keeps the work done); a directory whose job ended is started
    over. `resume=False` always starts over. `resume_paused`: continue the run the eval gate paused in `out_dir`
    from its kept checkpoint (the job's detector verdict pauses it: PAUSED_BY_GATE, the best checkpoint
    registered). `out_dir` is locked while the job runs: a second job on the same directory fails at once (bad
    input, not retried)."""
    from eval.detectors import make_detector
    from eval.states import RunState
    from eval.supervisor import RunSupervisor
    from infra.metrics import PlatformMetrics

    cfg, catalog, ledger = validate_job(config, overrides, steps, overlap, detector, gpus, cluster_gpus, gpu_kind,
                                        alerts, alert_profile, prices)
    job = f"{tenant}/{name}"
    out = Path(out_dir or Path("runs") / "jobs" / tenant / name)
    check_out_dir(out, "out_dir")
    paused = paused_run(out) if resume_paused else None
    if resume_paused and paused is None:
        raise BadInput(f"resume_paused: {out} holds no run paused by the eval gate (its {JOB_DONE} does not say "
                       "PAUSED_BY_GATE with a kept checkpoint); leave resume_paused off to start the job over")
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
    with locked_run_dir(out, "out_dir"), parent_run("rlhf_job", job, mlflow_experiment, parent_run_id, tenant=tenant,
                    params={"config": config if isinstance(config, str) else "inline", "overlap": overlap,
                            "gpus": gpus, "gpu_kind": gpu_kind, "detector": detector, **flatten(resolved)},
                    fail_rate=fail_rate, fault_seed=fault_seed, retry_delay_s=retry_delay_s,
                    failure_tags=failure_tags) as run:
        if paused is not None:  # continue from the kept checkpoint
            reopen_paused(out, paused)
        elif not resume or (out / JOB_DONE).exists():
            fresh_run_dir(out)
        (out / "config.resolved.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
        run_id = run.run_id
        spec = JobSpec(tenant=tenant, name=name, config=cfg, run_id=run_id, out_dir=out, overlap=overlap, gpus=gpus,
                       gpu_kind=gpu_kind, detector=detector, alerts=alerts, alert_profile=alert_profile,
                       pausable=True, resume=paused)
        sup = RunSupervisor(run_id, tenant, catalog.start(tenant=tenant), gate_detector=make_detector(detector),
                            ledger=ledger, metrics=PlatformMetrics(tenants=[tenant]), gpu_kind=gpu_kind, n_gpus=gpus)
        slots = gpu_slots(cluster_gpus)
        progress.reporter.stage(f"rlhf job {job}: {cfg.steps} PPO steps ({overlap})", total=cfg.steps)
        hooks = PrefectJobHooks(run_id, slots, retry_delay_s, fail_rate, fault_seed, wait_api=True,
                                after_step=lambda rec, _s: progress.reporter.advance())
        outcome = run_job(spec, hooks=hooks, supervisor=sup)
        status, scores, best = outcome.status, outcome.scores, outcome.best
        registry = None
        # a failed run registers nothing; a paused one registers its kept checkpoint
        if best is not None and status.state in (RunState.SUCCEEDED, RunState.PAUSED_BY_GATE):
            registry = register_checkpoint.with_options(retry_delay_seconds=backoff(retry_delay_s))(
                run_id, registered_model or f"{tenant}-policy", best, tenant, job, fail_rate, fault_seed,
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
        tags = {"run_state": status.label, "final_state": status.state.value, "failure_class": failure,
                "reason": reason[:500], "decision": outcome.decision,
                "alerts": json.dumps([e.alert for e in sup.events]),
                "slots_backend": slots.backend, "state_history": json.dumps(sup.machine.labels())[:5000]}
        if paused is not None:
            tags.update(paused.tags())
        (out / "scores.json").write_text(json.dumps(scores, indent=2))
        log_job_plots(run_id, records, out, job)
        run.close(metrics=job_metrics, tags=tags,
                  artifacts=[str(out / "config.resolved.yaml"), str(ledger_csv), str(out / "scores.json"),
                             str(out / "metrics.csv")],
                  status="FAILED" if status.state is RunState.FAILED else "FINISHED")
        (out / JOB_DONE).write_text(json.dumps({**job_record(outcome), "tenant": tenant, "name": name,
                                                "detector": detector, "overlap": overlap, "gpus": gpus}))
    summary = {"job": job, "tenant": tenant, "run_id": run_id, "state": status.label, "decision": outcome.decision,
               "failure_class": failure, "reason": reason, "best": best, "registry": registry,
               "metrics": job_metrics, "out_dir": str(out), "history": sup.machine.labels(),
               "resumed_from": paused.__dict__ if paused is not None else None}
    job_artifact(summary, mlflow_experiment)
    if status.state is RunState.FAILED:
        raise JobFailed(f"{job}: {status.label}: {status.reason}")
    return summary


@flow(name="rlhf-job", flow_run_name="{tenant}/{name}", log_prints=False)
def rlhf_job(
    config: str = "configs/ppo-tiny.yaml",
    tenant: str = "acme",
    name: str = "ppo-tiny",
    overlap: Overlap = "full",
    steps: int | None = None,
    overrides: dict[str, Any] | None = None,
    detector: DetectorName = "noisepatience",
    gpus: int = 1,
    cluster_gpus: int = 4,
    gpu_kind: str = "cpu",
    alerts: str | None = None,
    alert_profile: AlertProfile | None = None,
    prices: str | None = None,
    out_dir: str | None = None,
    registered_model: str | None = None,
    resume: bool = True,
    resume_paused: bool = False,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
) -> dict[str, Any]:
    """Train one tenant's PPO job (OPPO overlap) on GPU worker slots under the run-health catalog and a
    held-out eval gate; register the best checkpoint in the MLflow model registry.

    Args:
        config: PPO config YAML, relative to the repository root (configs/ppo-tiny.yaml: a healthy job;
            configs/ppo-hack.yaml over-optimises the proxy reward on purpose).
        tenant: the customer the job is charged to; its ledger, MLflow tag and `<tenant>-policy` model.
        name: the job's name within the tenant (run directory runs/jobs/<tenant>/<name>).
        overlap: OPPO overlap: none (sequential PPO), intra (stream chunks to the scorers while decoding),
            inter (start B+delta prompts, train on the first B), full (both).
        steps: PPO steps (empty: the config's `steps`).
        overrides: dotted config fields to change, e.g. {"ppo.kl_coef": 0.2, "seed": 1}.
        detector: the eval-gate early-stop detector that may pause the job at a checkpoint (eval/detectors.py;
            noisepatience, the platform default: held-out score well below its best for several checkpoints, by
            the run's own noise, while the proxy reward still rises; a short run is judged by the divergence
            slope test from half-way through its planned steps).
        gpus: GPU worker slots the job holds while it trains.
        cluster_gpus: size of the GPU slot pool (the Prefect global concurrency limit `gpu-slots`).
        gpu_kind: priced GPU kind for the tenant's ledger (a key of gpu_hour in configs/prices.yaml).
        alerts: alert catalog YAML (empty: configs/alerts.yaml).
        alert_profile: alert threshold profile (empty: production thresholds; canary: short test windows).
        prices: price table YAML (empty: configs/prices.yaml).
        out_dir: run directory (empty: runs/jobs/<tenant>/<name>).
        registered_model: model registry name for the best checkpoint (empty: <tenant>-policy).
        resume: continue an interrupted job from the newest checkpoint in its run directory (a crash, an API outage
            that outlasted the retries); a directory whose job ended is started over. Off: always start over.
        resume_paused: continue the run the eval gate paused in the run directory (PAUSED_BY_GATE) from its kept
            best checkpoint; the gate watches the continuation afresh. Off: a paused run is started over.
        mlflow_experiment: MLflow experiment the job's run goes to.
    """
    return rlhf_job_internal.fn(config=config, overrides=overrides, tenant=tenant, name=name, overlap=overlap,
                                steps=steps, gpus=gpus, cluster_gpus=cluster_gpus, gpu_kind=gpu_kind,
                                detector=detector, alerts=alerts, alert_profile=alert_profile, prices=prices,
                                out_dir=out_dir, registered_model=registered_model, resume=resume,
                                resume_paused=resume_paused, mlflow_experiment=mlflow_experiment)


def log_job_plots(run_id: str, records: list[dict], out: Path, job: str) -> None:
    """Reward, KL, entropy and eval-gate curves as PNGs in the run directory and under `plots/` in the MLflow run."""
    from training.plots import plot_training_curves

    with clock.span("work"):
        paths = plot_training_curves(records, out / "plots", title=job)
    with clock.span("tracking"):
        T.log_artifacts(run_id, paths, artifact_path="plots")


def mlflow_run_url(run_id: str, experiment: str) -> str:
    """Where the job's run opens in the MLflow UI (`MLFLOW_UI_URL`, default the `mlflow ui` address)."""
    base = os.environ.get("MLFLOW_UI_URL", "http://127.0.0.1:5000").rstrip("/")
    return f"{base}/#/experiments/{T.experiment_id(experiment)}/runs/{run_id}"


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
             f"| decision | {summary['decision']} after {m['steps']} steps |",
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
