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
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from common.errors import BadInput
from common.validate import check_out_dir
from flows import progress
from infra import tracking as T
from infra.provision import gpu_slots, task_runner
from tasks.retry import backoff
from tasks.timing import clock
from tasks.tracking import parent_run
from tasks.training import best_of, resolve_train_config, score_checkpoints, start_worker, train_supervised

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


@task(name="platform-job", task_run_name="job {spec[tenant]}/{spec[name]}", cache_policy=NO_CACHE)
def platform_job(spec: dict[str, Any], cfg, view, policy, lock: threading.Lock, ctx: dict[str, Any]) -> dict:
    """One tenant job on its slots: worker start, supervised training, the scheduler's checkpoint decisions,
    the best checkpoint kept; a child MLflow run with the tenant's cost."""
    from eval.states import RunSupervisor
    from flows.rlhf_job import fresh_run_dir

    job = f"{spec['tenant']}/{spec['name']}"
    out = Path(ctx["out_dir"]) / spec["tenant"] / spec["name"]
    fresh_run_dir(out)
    with clock.span("tracking"):
        run_id, _ = T.open_run(f"{ctx['flow_run_id']}/{job}", job, ctx["mlflow_experiment"], ctx["parent_run_id"],
                               tags={T.KIND_TAG: "platform_job", T.TENANT_TAG: spec["tenant"]})
    sup = RunSupervisor(run_id, spec["tenant"], ctx["catalog"].start(tenant=spec["tenant"]), ledger=ctx["ledger"],
                        gpu_kind=ctx["gpu_kind"], n_gpus=spec["gpus"])
    started = time.time()
    with ctx["slots"].take(spec["gpus"]):
        slot_start = time.time()  # the job's own record of when it held its slots (tests check the pool size)
        sup.begin()
        trainer = start_worker.with_options(retry_delay_seconds=backoff(ctx["retry_delay_s"]))(
            job, cfg, "full", str(out))

        def on_step(rec, _sup) -> bool:
            if rec.gold_eval != rec.gold_eval:  # no gate at this step: nothing new for the scheduler
                return False
            with lock:  # the policy's detector monitors are shared by every job thread
                view.attained = float(rec.step)
                view.progress = rec.step / cfg.steps
                view.eval_history.append(float(rec.gold_eval))
                view.loss_history.append(float(rec.loss_policy))
                view.reward_history.append(float(rec.reward_mean))
                view.progress_history.append(view.progress)
                view.eval_se = float(rec.gold_eval_se)
                return bool(policy.on_checkpoint(view))

        result = train_supervised(job, trainer, sup, run_id, cfg.steps, on_step=on_step)
        slot_end = time.time()
    finished = time.time()
    status = sup.finish(completed=result["decision"] != "failed", exception=result["error"])
    scores = score_checkpoints(job, [str(p) for p in sorted((out / "checkpoints").glob("step-*"))])
    best = best_of(scores)
    totals = ctx["ledger"].run_totals().get(run_id)
    metrics = {"cost_usd": float(totals.cost) if totals else 0.0,
               "gpu_hours": totals.gpu_seconds / 3600 if totals else 0.0, "steps": len(result["records"]),
               "tokens_generated": totals.tokens_generated if totals else 0,
               "best_eval": best["eval_score"] if best else float("nan"),
               "jct_s": finished - ctx["round_start"], "run_s": finished - started}
    with clock.span("tracking"):
        T.log_metrics(run_id, metrics)
        T.set_tags(run_id, {"run_state": status.label, "decision": result["decision"],
                            "alerts": json.dumps([e.alert for e in sup.events]),
                            "failure_class": status.failure.value if status.failure else "",
                            "best_checkpoint": best["checkpoint"] if best else ""})
        T.finish(run_id, "FAILED" if status.failure else "FINISHED")
    return {"tenant": spec["tenant"], "job": spec["name"], "gpus": spec["gpus"], "decision": result["decision"],
            "state": status.label, "alerts": ",".join(e.alert for e in sup.events),
            "stopped_at": view.attained if result["decision"] == "stopped" else None,
            "best_step": best["step"] if best else None, **metrics, "slot_start": slot_start, "slot_end": slot_end,
            "run_id": run_id}


@flow(name="platform-round", task_runner=task_runner("thread", 8), log_prints=False)
def platform_round(
    jobs: list[dict[str, Any]] | None = None,
    scheduler: str = "Divergence+SRTF",
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
) -> dict[str, Any]:
    """Run a live round: `jobs` ({tenant, name, overrides, gpus?, steps_factor?}; default: five tenants) are
    queued at once and placed on `slots` GPU worker slots by `scheduler` (any simulator name, e.g.
    `Divergence+SRTF`, `EvalStop+SJF`, `FIFO`), which may also stop them at their eval gates."""
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
    prices = load_prices()
    if gpu_kind not in prices.gpu_hour:
        raise BadInput(f"gpu_kind: '{gpu_kind}' has no price (add it under gpu_hour in configs/prices.yaml)")
    with parent_run("platform", f"platform round ({scheduler})", mlflow_experiment, parent_run_id, tenant="platform",
                    params={"scheduler": scheduler, "slots": slots, "steps": steps, "jobs": len(specs)},
                    retry_delay_s=retry_delay_s) as run:
        tenants = list(dict.fromkeys(s["tenant"] for s in specs))
        views = [JobView(i, "rlhf", tenants.index(s["tenant"]), s["gpus"], 0.0, float(c.steps))
                 for i, (s, c) in enumerate(zip(specs, cfgs, strict=True))]
        ctx = {"out_dir": out_dir, "flow_run_id": run.ctx[T.FLOW_RUN_TAG], "mlflow_experiment": mlflow_experiment,
               "parent_run_id": run.run_id,
               "catalog": Catalog.from_file(alerts, algorithm="ppo", profile=alert_profile),
               "ledger": Ledger(prices), "gpu_kind": gpu_kind, "slots": gpu_slots(slots, slot_limit),
               "retry_delay_s": retry_delay_s, "round_start": time.time()}
        lock = threading.Lock()
        progress.reporter.stage(f"platform round: {len(specs)} jobs on {slots} slots ({scheduler})", total=len(specs))
        pending, running, rows, free, order = list(range(len(specs))), {}, [], slots, []
        while pending or running:
            with lock:
                pending.sort(key=lambda i: (policy.priority(views[i]), i))
            for i in list(pending):
                if specs[i]["gpus"] <= free:
                    pending.remove(i)
                    free -= specs[i]["gpus"]
                    order.append(i)
                    running[platform_job.submit(specs[i], cfgs[i], views[i], policy, lock, ctx)] = i
            fut = next(as_completed(list(running)))  # the first job to end frees its slots
            i = running.pop(fut)
            free += specs[i]["gpus"]
            rows.append(fut.result())
            progress.reporter.advance()
        table = pd.DataFrame(rows)
        index_of = {(s["tenant"], s["name"]): i for i, s in enumerate(specs)}
        table.insert(0, "start_order", [order.index(index_of[(r["tenant"], r["job"])]) for r in rows])
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        table.to_csv(out / "jobs.csv", index=False)
        ctx["ledger"].frame().to_csv(out / "ledger.csv", index=False)
        per_tenant = table.groupby("tenant")[["cost_usd", "gpu_hours", "steps"]].sum()
        metrics = {"jobs": len(table), "stopped": int((table.decision == "stopped").sum()),
                   "mean_jct_s": float(table.jct_s.mean()), "makespan_s": float(table.jct_s.max()),
                   **{f"cost_usd/{t}": float(v) for t, v in per_tenant.cost_usd.items()}}
        create_table_artifact(key="platform-round",
                              table=json.loads(table.drop(columns=["run_id"]).to_json(orient="records")),
                              description=f"Live round: {len(specs)} jobs, {slots} slots, {scheduler}")
        run.close(metrics=metrics, artifacts=[str(out / "jobs.csv"), str(out / "ledger.csv")],
                  tags={"slots_backend": ctx["slots"].backend})
    return {"run_id": run.run_id, "jobs": table, "metrics": metrics, "slots": ctx["slots"].describe()}
