"""`platform_round`: a live multi-tenant round. Real small PPO jobs from several tenants share a fixed pool of
GPU worker slots; the same scheduler names the simulator uses (`scheduling.policies.parse_scheduler`: a
base policy inside the EarlyStop wrapper with a detector) decide which queued job starts next (the base policy)
and whether a running job stops at its eval-gate checkpoints (the detector, carried by each job's request and built
into its supervisor by `training.job.request.build`, as for every entry point).

What the scheduler sees is a `scheduling.jobview.JobView` filled from the live run (progress, attained
service in steps, the eval gate's score and standard error, the proxy reward and the policy loss at each
checkpoint) and nothing else. Jobs are not preempted here: a running PPO job keeps its slots until it
completes or is stopped (preemptive bases rank the queue the same way; resuming a preempted job from its
checkpoint is left to the deployment path).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from common.errors import BadInput
from common.validate import check_out_dir
from flows import progress
from flows.params import (  # noqa: F401 - re-exported
    DEFAULT_JOBS,
    check_round,
    platform_job_config,
    round_requests,
    scheduler_gate,
)
from infra import tracking as T
from infra.provision import gpu_slots, task_runner
from scheduling.live import LiveRound
from tasks.timing import clock
from tasks.tracking import parent_run
from tasks.training import PrefectJobHooks
from training.job.config import default_cache_dir
from training.job.lifecycle import (
    JOB_DONE,
    decided_by,
    ended_by,
    job_record,
    paused_run,
    reopen_paused,
    run_job,
    tenant_examples,
)
from training.job.request import JobRequest, build


@dataclass(frozen=True)
class RoundContext:
    """What every job of one round shares: where it writes, its MLflow parent, the ledger, the slot pool, the first
    retry delay, the round's start time."""

    out_dir: str
    flow_run_id: str
    mlflow_experiment: str
    parent_run_id: str
    ledger: Any
    slots: Any
    retry_delay_s: float
    round_start: float


def warm_starts(cfgs: list[Any]) -> None:
    """Build (or load) each job's base policy and proxy reward model here, one job after another, before the jobs'
    threads start. Building one seeds torch's global generator and draws the initial weights from it; two jobs
    building the same warm start at once in two threads would interleave those draws, and each would train from a
    base that depends on thread timing (the first round on a clean cache). Each is built with the job's own torch
    thread count (`oppo.torch_threads`, as its trainer would): the fitted weights depend on it (the summation order),
    so a clean cache gets the same warm start on any machine. Cached ones are only loaded."""
    import torch

    from training.inputs.job_inputs import job_inputs
    from training.inputs.tokenizer import tokenizer_for
    from training.job.device import resolve_device
    from training.models import base_policy, proxy_reward_model

    threads = torch.get_num_threads()
    try:
        for cfg in cfgs:
            torch.set_num_threads(cfg.oppo.torch_threads)
            tok = tokenizer_for(cfg)
            device = resolve_device(cfg.device)  # the device the job's trainer builds on: the same cache key
            # a tenant's data set: its reference completions are the warm start, as the trainer builds it
            inputs = job_inputs(cfg, tok, warn=lambda _m: None) if cfg.task.kind == "dataset" else None
            base_policy(cfg, tok, device, inputs)
            if cfg.reward.kind != "function":  # a function has no model to fit
                proxy_reward_model(cfg, tok, device)
    finally:
        torch.set_num_threads(threads)


@task(name="platform-job", task_run_name="job {request.tenant}/{request.name}", cache_policy=NO_CACHE)
def platform_job(request: JobRequest, checked: Any, observe, rc: RoundContext, paused: Any = None) -> dict:
    """One tenant job on its slots (`training.job.lifecycle.run_job`): worker start, supervised training, the
    scheduler's checkpoint decisions (`observe`; a stop pauses the run, resumable), the best checkpoint kept; a
    child MLflow run with the tenant's cost. `paused` (`training.job.lifecycle.PausedRun`): continue the run the
    scheduler paused in the job's directory from its kept checkpoint instead of starting over."""
    from flows.rlhf_job import TENANT_ERRORS, fresh_run_dir, log_lineage
    from training.inputs.job_inputs import algorithm_params

    job, tenant, out, cfg = request.job, request.tenant, request.out_dir, checked.config
    if paused is not None:  # continue from the kept checkpoint
        reopen_paused(out, paused)
    else:
        fresh_run_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.resolved.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    with clock.span("tracking"):
        run_id, _ = T.open_run(f"{rc.flow_run_id}/{job}", job, rc.mlflow_experiment, rc.parent_run_id,
                               tags={T.KIND_TAG: "platform_job", T.TENANT_TAG: tenant})
    log_lineage(run_id, cfg)  # a tenant's data files and code hashes, as for a job of its own
    with clock.span("tracking"):  # the training algorithm as the job's own run has it (params.algorithm, ...)
        T.log_params(run_id, algorithm_params(cfg))
    # the job's gate is its request's detector (the round scheduler's rule), fitted to its planned looks by the one
    # builder, as for every other entry point
    jspec, sup = build(request, checked, run_id=run_id, ledger=rc.ledger, resume=paused)
    if hasattr(observe, "attach"):  # the round reads this supervisor's verdicts
        observe.attach(sup)
    started = time.time()
    outcome = run_job(jspec, observe, hooks=PrefectJobHooks(run_id, rc.slots, rc.retry_delay_s), supervisor=sup)
    status, best = outcome.status, outcome.best
    verdict = observe.verdict() if hasattr(observe, "verdict") else {}
    gate = request.detector.label if request.detector is not None else None
    (out / JOB_DONE).write_text(json.dumps({**job_record(outcome), "tenant": tenant, "name": request.name,
                                            "detector": gate, "evidence": verdict.get("evidence"),
                                            "overlap": request.overlap, "gpus": request.gpus}, default=float))
    examples = tenant_examples(outcome.error)
    if examples:  # what the tenant's code failed on: the run directory and an MLflow artifact
        (out / TENANT_ERRORS).write_text(json.dumps(examples, indent=2))
        with clock.span("tracking"):
            T.log_artifacts(run_id, [out / TENANT_ERRORS])
    totals = rc.ledger.run_totals().get(run_id)
    metrics = {"cost_usd": float(totals.cost) if totals else 0.0,
               "gpu_hours": totals.gpu_seconds / 3600 if totals else 0.0, "steps": len(outcome.records),
               "tokens_generated": totals.tokens_generated if totals else 0,
               "best_eval": best["eval_score"] if best else float("nan"),
               "jct_s": outcome.slot_end - rc.round_start, "run_s": outcome.slot_end - started}
    # what ended the job: completed, stopped at a checkpoint (paused, resumable), or failed by a paging alert at a step
    decision, decider = ended_by(outcome), decided_by(outcome)
    with clock.span("tracking"):
        T.log_metrics(run_id, metrics)
        T.set_tags(run_id, {**(paused.tags() if paused is not None else {}),
                            "run_state": status.label, "decision": decision, "decided_by": decider,
                            "alerts": json.dumps([e.alert for e in sup.events]),
                            "failure_class": status.failure.value if status.failure else "",
                            "best_checkpoint": best["checkpoint"] if best else "",
                            "state_history": json.dumps(sup.machine.labels())[:5000],
                            "pause_evidence": json.dumps(verdict.get("evidence"), default=float)[:5000]
                            if verdict.get("evidence") else ""})
        T.finish(run_id, "FAILED" if status.failure else "FINISHED")
    stopped_at = outcome.records[-1]["step"] if decision == "stopped" and outcome.records else None
    return {"tenant": tenant, "job": request.name, "algorithm": cfg.algorithm, "gpus": request.gpus,
            "decision": decision, "decided_by": decider,
            "pause_evidence": json.dumps(verdict.get("evidence"), default=float) if verdict.get("evidence") else "",
            "state": status.label, "alerts": ",".join(e.alert for e in sup.events),
            "resumed_from_step": paused.best_step if paused is not None else None,
            "stopped_at": float(stopped_at) if stopped_at is not None else None,
            "best_step": best["step"] if best else None, **metrics, "slot_start": outcome.slot_start,
            "slot_end": outcome.slot_end, "run_id": run_id}


@flow(name="platform-round", task_runner=task_runner("thread", 8), log_prints=False)
def platform_round(
    jobs: list[dict[str, Any]] | None = None,
    scheduler: str = "Paired+SRTF",
    slots: int = 2,
    steps: int = 24,
    gpu_kind: str = "cpu",
    alerts: str | None = None,
    alert_profile: str | None = None,
    out_dir: str = "results/platform",
    cache_dir: str | None = None,
    retry_delay_s: float = 1.0,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    parent_run_id: str | None = None,
    slot_limit: str = "gpu-slots-platform",
    resume_paused: bool = False,
    seed: int = 0,
) -> dict[str, Any]:
    """Run a live round: `jobs` ({tenant, name, config?, overrides, gpus?, steps_factor?}; `config`: a tenant's own
    PPO config, e.g. a dataset config, default the round's small config; default: five tenants) are
    queued at once and placed on `slots` GPU worker slots by `scheduler` (any simulator name, e.g.
    `Paired+SRTF`, `Paired(margin=0.05)+SRTF`, `NoisePatience+SRTF`, `EvalStop+SJF`, `FIFO`): its base policy places
    them, its detector is each job's eval gate (the `detector` of the job's request, so with the platform's settings
    for what the name leaves out: `training.job.request.DETECTOR_DEFAULTS`; default the paired rule on the gate's
    per-prompt scores, pausing only for a decline beyond its margin of 0.1 in gold units), run by the job's
    supervisor; a job the gate stops is paused (PAUSED_BY_GATE) with its best checkpoint kept and the evidence in its
    record; jobs.csv's `decision` says what ended each job (`completed`, `stopped`, `failed: kl_blowup at step 9`).
    `resume_paused`: run only the jobs of `jobs` that an earlier round in `out_dir` paused, each continued from its
    kept checkpoint (the scheduler's detector watches the continuation afresh); the others are left as they are.
    `seed`: the jobs' config seed (warm starts, prompts and training change with it)."""
    from infra.ledger import Ledger, load_prices
    from scheduling.jobview import JobView
    from scheduling.policies import parse_base

    # the scheduler's base policy places the jobs; its stop rule is each job's gate, carried by the job's request with
    # the platform's settings and run by the job's supervisor (no round-level detector is built)
    gate = scheduler_gate(scheduler)
    try:
        base = parse_base(scheduler)
    except ValueError as err:
        raise BadInput(f"scheduler: {err}") from None
    check_out_dir(out_dir, "out_dir")
    cache_dir = cache_dir or default_cache_dir()
    requests = round_requests(jobs or DEFAULT_JOBS, steps=steps, slots=slots, gpu_kind=gpu_kind, alerts=alerts,
                              alert_profile=alert_profile, out_dir=out_dir, cache_dir=cache_dir, detector=gate,
                              seed=seed)
    checked = check_round(requests)
    paused = [paused_run(r.out_dir) if resume_paused else None for r in requests]
    if resume_paused:
        keep = [i for i, p in enumerate(paused) if p is not None]
        if not keep:
            raise BadInput(f"resume_paused: no job of this round is paused under {out_dir} (no <tenant>/<name>/"
                           f"{JOB_DONE} says PAUSED_BY_GATE with a kept checkpoint); leave resume_paused off to run "
                           "the round")
        requests, checked, paused = [requests[i] for i in keep], [checked[i] for i in keep], [paused[i] for i in keep]
    cfgs = [c.config for c in checked]
    prices = load_prices()
    with parent_run("platform", f"platform round ({scheduler})", mlflow_experiment, parent_run_id, tenant="platform",
                    params={"scheduler": scheduler, "detector": gate.label if gate is not None else "none",
                            "slots": slots, "steps": steps, "jobs": len(requests), "resume_paused": resume_paused,
                            "seed": seed},
                    retry_delay_s=retry_delay_s) as run:
        tenants = list(dict.fromkeys(r.tenant for r in requests))
        views = [JobView(i, "rlhf", tenants.index(r.tenant), r.gpus, 0.0, float(c.steps))
                 for i, (r, c) in enumerate(zip(requests, cfgs, strict=True))]
        rc = RoundContext(out_dir=out_dir, flow_run_id=run.ctx[T.FLOW_RUN_TAG], mlflow_experiment=mlflow_experiment,
                          parent_run_id=run.run_id, ledger=Ledger(prices), slots=gpu_slots(slots, slot_limit),
                          retry_delay_s=retry_delay_s, round_start=time.time())
        # the base policy places the jobs; the early-stop rule is each job's gate, built from its request
        live = LiveRound(base, views, [r.gpus for r in requests], slots)
        warm_starts(cfgs)
        progress.reporter.stage(f"platform round: {len(requests)} jobs on {slots} slots ({scheduler})",
                                total=len(requests))
        running, rows = {}, []
        while not live.done:
            for i in live.to_start():
                running[platform_job.submit(requests[i], checked[i], live.observer(i, cfgs[i].steps), rc,
                                            paused[i])] = i
            fut = next(as_completed(list(running)))  # the first job to end frees its slots
            live.finished(running.pop(fut))
            rows.append(fut.result())
            progress.reporter.advance()
        table = pd.DataFrame(rows)
        index_of = {(r.tenant, r.name): i for i, r in enumerate(requests)}
        table.insert(0, "start_order", [live.order.index(index_of[(r["tenant"], r["job"])]) for r in rows])
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        ledger = rc.ledger.frame()
        jobs_csv, ledger_csv = out / "jobs.csv", out / "ledger.csv"
        jobs_out = table
        if resume_paused:  # the round's files keep the earlier round's rows: each job's latest row, every charge
            if jobs_csv.is_file():
                earlier = pd.read_csv(jobs_csv)
                resumed = set(zip(table.tenant, table.job, strict=True))
                earlier = earlier[[(t, j) not in resumed for t, j in zip(earlier.tenant, earlier.job, strict=True)]]
                jobs_out = pd.concat([earlier, table], ignore_index=True)
            if ledger_csv.is_file():
                ledger = pd.concat([pd.read_csv(ledger_csv), ledger], ignore_index=True)
        jobs_out.to_csv(jobs_csv, index=False)
        ledger.to_csv(ledger_csv, index=False)
        per_tenant = table.groupby("tenant")[["cost_usd", "gpu_hours", "steps"]].sum()
        metrics = {"jobs": len(table), "stopped": int((table.decision == "stopped").sum()),
                   "mean_jct_s": float(table.jct_s.mean()), "makespan_s": float(table.jct_s.max()),
                   **{f"cost_usd/{t}": float(v) for t, v in per_tenant.cost_usd.items()}}
        create_table_artifact(key="platform-round",
                              table=json.loads(table.drop(columns=["run_id"]).to_json(orient="records")),
                              description=f"Live round: {len(requests)} jobs, {slots} slots, {scheduler}")
        run.close(metrics=metrics, artifacts=[str(out / "jobs.csv"), str(out / "ledger.csv")],
                  tags={"slots_backend": rc.slots.backend})
    return {"run_id": run.run_id, "jobs": table, "metrics": metrics, "slots": rc.slots.describe()}
