"""`platform_round`: a live multi-tenant round. Real small PPO jobs from several tenants share a fixed pool of
GPU worker slots; the same scheduler objects the simulator uses (`scheduling.policies.parse_scheduler`: a
base policy inside the EarlyStop wrapper with the platform's default detector) decide which queued job
starts next and whether a running job stops at its eval-gate checkpoints.

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
from infra import tracking as T
from infra.provision import gpu_slots, task_runner
from scheduling.live import LiveRound
from tasks.timing import clock
from tasks.tracking import parent_run
from tasks.training import PrefectJobHooks, resolve_train_config
from training.lifecycle import JOB_DONE, JobSpec, job_record, paused_run, reopen_paused, run_job

#: the default round: five tenants, one job each; two are set up to over-optimise the proxy reward
DEFAULT_JOBS: list[dict[str, Any]] = [
    {"tenant": "acme", "name": "healthy-kl", "overrides": {"ppo.kl_coef": 0.2}},
    {"tenant": "globex", "name": "gameable", "overrides": {"fault.kind": "gameable_reward", "fault.bonus": 1.0,
                                                            "fault.at_step": 2}},
    {"tenant": "initech", "name": "healthy", "overrides": {}},
    {"tenant": "umbrella", "name": "weak-kl", "overrides": {"ppo.kl_coef": 0.0, "ppo.actor_lr": 1e-3}},
    {"tenant": "hooli", "name": "short", "overrides": {}, "steps_factor": 0.5},
]


def check_job_spec(spec: dict[str, Any], i: int) -> None:
    """Types of one `jobs` entry (BadInput naming `jobs[i].<key>`)."""
    if isinstance(spec["gpus"], bool) or not isinstance(spec["gpus"], int):
        raise BadInput(f"jobs[{i}].gpus: {spec['gpus']!r} is not a whole number of GPU slots")
    factor = spec.get("steps_factor", 1.0)
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 100:
        raise BadInput(f"jobs[{i}].steps_factor: {factor!r} must be a number in (0, 100]")
    if not isinstance(spec.get("overrides") or {}, dict):
        raise BadInput(f"jobs[{i}].overrides: must be a mapping of dotted fields, e.g. {{\"ppo.kl_coef\": 0.1}}")
    for key in ("tenant", "name"):
        if not isinstance(spec[key], str):
            raise BadInput(f"jobs[{i}].{key}: {spec[key]!r} must be a string")


def platform_job_config(steps: int, cache_dir: str) -> dict[str, Any]:
    """The canaries' small PPO job (training/canaries.py) with a gate and a checkpoint every 2 steps;
    one torch thread per job so concurrent jobs share the cores instead of oversubscribing them."""
    from training.canaries import base_config

    raw = base_config(steps, 0, cache_dir)
    raw.update(name="platform-ppo", eval_every=2, checkpoint_every=2)
    raw["oppo"] = {"torch_threads": 1}
    return raw


@dataclass(frozen=True)
class RoundContext:
    """What every job of one round shares: where it writes, its MLflow parent, the alert catalog, the ledger, the
    slot pool, the first retry delay, the round's start time."""

    out_dir: str
    flow_run_id: str
    mlflow_experiment: str
    parent_run_id: str
    catalog: Any
    ledger: Any
    gpu_kind: str
    slots: Any
    retry_delay_s: float
    round_start: float


@task(name="platform-job", task_run_name="job {spec[tenant]}/{spec[name]}", cache_policy=NO_CACHE)
def platform_job(spec: dict[str, Any], cfg, observe, rc: RoundContext, paused: Any = None) -> dict:
    """One tenant job on its slots (`training.lifecycle.run_job`): worker start, supervised training, the
    scheduler's checkpoint decisions (`observe`; a stop pauses the run, resumable), the best checkpoint kept; a
    child MLflow run with the tenant's cost. `paused` (`training.lifecycle.PausedRun`): continue the run the
    scheduler paused in the job's directory from its kept checkpoint instead of starting over."""
    from eval.supervisor import RunSupervisor
    from flows.rlhf_job import fresh_run_dir

    job = f"{spec['tenant']}/{spec['name']}"
    out = Path(rc.out_dir) / spec["tenant"] / spec["name"]
    if paused is not None:  # continue from the kept checkpoint
        reopen_paused(out, paused)
    else:
        fresh_run_dir(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.resolved.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    with clock.span("tracking"):
        run_id, _ = T.open_run(f"{rc.flow_run_id}/{job}", job, rc.mlflow_experiment, rc.parent_run_id,
                               tags={T.KIND_TAG: "platform_job", T.TENANT_TAG: spec["tenant"]})
    jspec = JobSpec(tenant=spec["tenant"], name=spec["name"], config=cfg, run_id=run_id, out_dir=out, overlap="full",
                    gpus=spec["gpus"], gpu_kind=rc.gpu_kind, pausable=True, resume=paused)
    sup = RunSupervisor(run_id, spec["tenant"], rc.catalog.start(tenant=spec["tenant"]), ledger=rc.ledger,
                        gpu_kind=rc.gpu_kind, n_gpus=spec["gpus"])
    started = time.time()
    outcome = run_job(jspec, observe, hooks=PrefectJobHooks(run_id, rc.slots, rc.retry_delay_s), supervisor=sup)
    status, best = outcome.status, outcome.best
    (out / JOB_DONE).write_text(json.dumps({**job_record(outcome), "tenant": spec["tenant"], "name": spec["name"],
                                            "detector": None, "overlap": "full", "gpus": spec["gpus"]}))
    totals = rc.ledger.run_totals().get(run_id)
    metrics = {"cost_usd": float(totals.cost) if totals else 0.0,
               "gpu_hours": totals.gpu_seconds / 3600 if totals else 0.0, "steps": len(outcome.records),
               "tokens_generated": totals.tokens_generated if totals else 0,
               "best_eval": best["eval_score"] if best else float("nan"),
               "jct_s": outcome.slot_end - rc.round_start, "run_s": outcome.slot_end - started}
    with clock.span("tracking"):
        T.log_metrics(run_id, metrics)
        T.set_tags(run_id, {**(paused.tags() if paused is not None else {}),
                            "run_state": status.label, "decision": outcome.decision,
                            "alerts": json.dumps([e.alert for e in sup.events]),
                            "failure_class": status.failure.value if status.failure else "",
                            "best_checkpoint": best["checkpoint"] if best else "",
                            "state_history": json.dumps(sup.machine.labels())[:5000]})
        T.finish(run_id, "FAILED" if status.failure else "FINISHED")
    stopped_at = outcome.records[-1]["step"] if outcome.decision == "stopped" and outcome.records else None
    return {"tenant": spec["tenant"], "job": spec["name"], "gpus": spec["gpus"], "decision": outcome.decision,
            "state": status.label, "alerts": ",".join(e.alert for e in sup.events),
            "resumed_from_step": paused.best_step if paused is not None else None,
            "stopped_at": float(stopped_at) if stopped_at is not None else None,
            "best_step": best["step"] if best else None, **metrics, "slot_start": outcome.slot_start,
            "slot_end": outcome.slot_end, "run_id": run_id}


@flow(name="platform-round", task_runner=task_runner("thread", 8), log_prints=False)
def platform_round(
    jobs: list[dict[str, Any]] | None = None,
    scheduler: str = "NoisePatience+SRTF",
    slots: int = 2,
    steps: int = 16,
    gpu_kind: str = "cpu",
    alerts: str | None = None,
    alert_profile: str | None = None,
    out_dir: str = "results/platform",
    cache_dir: str = "runs/.cache",
    retry_delay_s: float = 1.0,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    parent_run_id: str | None = None,
    slot_limit: str = "gpu-slots-platform",
    resume_paused: bool = False,
) -> dict[str, Any]:
    """Run a live round: `jobs` ({tenant, name, overrides, gpus?, steps_factor?}; default: five tenants) are
    queued at once and placed on `slots` GPU worker slots by `scheduler` (any simulator name, e.g.
    `NoisePatience+SRTF`, `Divergence+SRTF`, `EvalStop+SJF`, `FIFO`), which may also stop them at their eval gates: a
    stopped job is paused (PAUSED_BY_GATE) with its best checkpoint kept. `resume_paused`: run only the jobs of
    `jobs` that an earlier round in `out_dir` paused, each continued from its kept checkpoint (the scheduler's
    detector watches the continuation afresh); the others are left as they are."""
    from eval.health import Catalog
    from infra.ledger import Ledger, load_prices
    from scheduling.jobview import JobView
    from scheduling.policies import parse_scheduler

    try:
        policy = parse_scheduler(scheduler)
    except ValueError as err:
        raise BadInput(f"scheduler: {err}") from None
    if not all(isinstance(j, dict) for j in (jobs or DEFAULT_JOBS)):
        raise BadInput("jobs: every entry must be an object {tenant, name, overrides, gpus, steps_factor}")
    specs = [dict(j) for j in (jobs or DEFAULT_JOBS)]
    check_out_dir(out_dir, "out_dir")
    cfgs = []
    for i, spec in enumerate(specs):
        for key in ("tenant", "name"):
            if not spec.get(key):
                raise BadInput(f"jobs[{i}].{key}: required")
        extra = set(spec) - {"tenant", "name", "overrides", "gpus", "steps_factor"}
        if extra:
            raise BadInput(f"jobs[{i}]: unknown key '{sorted(extra)[0]}' (allowed: tenant, name, overrides, gpus, "
                           "steps_factor)")
        spec.setdefault("gpus", 1)
        check_job_spec(spec, i)
        if not 1 <= spec["gpus"] <= slots:
            raise BadInput(f"jobs[{i}].gpus: {spec['gpus']} does not fit a pool of {slots} slots")
        job_steps = max(4, round(steps * float(spec.get("steps_factor", 1.0))))
        cfgs.append(resolve_train_config(platform_job_config(job_steps, cache_dir), spec.get("overrides"), job_steps))
    paused = [paused_run(Path(out_dir) / s["tenant"] / s["name"]) if resume_paused else None for s in specs]
    if resume_paused:
        keep = [i for i, p in enumerate(paused) if p is not None]
        if not keep:
            raise BadInput(f"resume_paused: no job of this round is paused under {out_dir} (no <tenant>/<name>/"
                           f"{JOB_DONE} says PAUSED_BY_GATE with a kept checkpoint); leave resume_paused off to run "
                           "the round")
        specs, cfgs, paused = [specs[i] for i in keep], [cfgs[i] for i in keep], [paused[i] for i in keep]
    prices = load_prices()
    if gpu_kind not in prices.gpu_hour:
        raise BadInput(f"gpu_kind: '{gpu_kind}' has no price (add it under gpu_hour in configs/prices.yaml)")
    with parent_run("platform", f"platform round ({scheduler})", mlflow_experiment, parent_run_id, tenant="platform",
                    params={"scheduler": scheduler, "slots": slots, "steps": steps, "jobs": len(specs),
                            "resume_paused": resume_paused},
                    retry_delay_s=retry_delay_s) as run:
        tenants = list(dict.fromkeys(s["tenant"] for s in specs))
        views = [JobView(i, "rlhf", tenants.index(s["tenant"]), s["gpus"], 0.0, float(c.steps))
                 for i, (s, c) in enumerate(zip(specs, cfgs, strict=True))]
        rc = RoundContext(out_dir=out_dir, flow_run_id=run.ctx[T.FLOW_RUN_TAG], mlflow_experiment=mlflow_experiment,
                          parent_run_id=run.run_id,
                          catalog=Catalog.from_file(alerts, algorithm="ppo", profile=alert_profile),
                          ledger=Ledger(prices), gpu_kind=gpu_kind, slots=gpu_slots(slots, slot_limit),
                          retry_delay_s=retry_delay_s, round_start=time.time())
        live = LiveRound(policy, views, [s["gpus"] for s in specs], slots)
        progress.reporter.stage(f"platform round: {len(specs)} jobs on {slots} slots ({scheduler})", total=len(specs))
        running, rows = {}, []
        while not live.done:
            for i in live.to_start():
                running[platform_job.submit(specs[i], cfgs[i], live.observer(i, cfgs[i].steps), rc, paused[i])] = i
            fut = next(as_completed(list(running)))  # the first job to end frees its slots
            live.finished(running.pop(fut))
            rows.append(fut.result())
            progress.reporter.advance()
        table = pd.DataFrame(rows)
        index_of = {(s["tenant"], s["name"]): i for i, s in enumerate(specs)}
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
                              description=f"Live round: {len(specs)} jobs, {slots} slots, {scheduler}")
        run.close(metrics=metrics, artifacts=[str(out / "jobs.csv"), str(out / "ledger.csv")],
                  tags={"slots_backend": rc.slots.backend})
    return {"run_id": run.run_id, "jobs": table, "metrics": metrics, "slots": rc.slots.describe()}
