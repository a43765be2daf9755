"""`scheduling_experiment`: one of E1-E8 (or a YAML path) fanned out as Prefect tasks, one per workload unit
(variant x seed, every scheduler), aggregated into summary.csv, plots, a Prefect table artifact and MLflow
runs (a parent for the flow run, a child per variant)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.futures import as_completed

from flows import progress
from infra import tracking as T
from infra.provision import compute_pool, task_runner
from scheduling.experiments import aggregate, load_experiment, scale, units_for
from scheduling.plots import plot_summary
from tasks.retry import backoff
from tasks.sim import simulate_unit
from tasks.timing import clock
from tasks.tracking import parent_run, track_variant


def resolve_experiment(experiment: str, seeds: list[int] | None = None, jobs: int | None = None,
                       gpus: int | None = None, overrides: dict[str, Any] | None = None):
    """Validate the whole experiment before anything runs (raises BadInput naming the field)."""
    from rlhfops.errors import BadInput

    if jobs is not None and jobs < 1:
        raise BadInput("jobs: must be >= 1")
    if gpus is not None and gpus < 1:
        raise BadInput("gpus: must be >= 1")
    cfg = load_experiment(experiment, overrides or {})
    if seeds:
        cfg = cfg.model_copy(update={"seeds": list(seeds)})
    return scale(cfg, jobs, gpus)


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def run_units_as_tasks(units, fail_rate: float, fault_seed: int, retry_delay_s: float, label: str | None):
    """Submit one task per unit, report progress as they finish, return (per_seed, jobs) in unit order.
    `label=None`: advance the caller's progress stage instead of opening one."""
    task = simulate_unit.with_options(retry_delay_seconds=backoff(retry_delay_s))
    futures = [task.submit(u, fail_rate, fault_seed) for u in units]
    if label is not None:
        progress.reporter.stage(label, total=len(futures))
    for _ in as_completed(futures):
        progress.reporter.advance()
    rows, tables = [], []
    for fut in futures:
        r, t = fut.result()
        rows += r
        tables += t
    per_seed = pd.DataFrame(rows)
    jobs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    return per_seed, jobs


@flow(name="scheduling-experiment", flow_run_name="{experiment}", task_runner=task_runner("thread"),
      log_prints=False)
def scheduling_experiment(
    experiment: str = "E2",
    seeds: list[int] | None = None,
    jobs: int | None = None,
    gpus: int | None = None,
    overrides: dict[str, Any] | None = None,
    out_dir: str | None = None,
    workers: int | None = None,
    keep_jobs: bool = True,
    fail_rate: float = 0.0,
    fault_seed: int = 0,
    retry_delay_s: float = 1.0,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    parent_run_id: str | None = None,
    progress_stage: bool = True,
) -> dict[str, Any]:
    """Run experiment E1..E8 (or a YAML path) in the simulator: one task per variant x seed.

    Writes summary.csv, per_seed.csv, jobs.csv and plots to `out_dir` (default results/<EXP>), a table
    artifact, and MLflow runs. `fail_rate` injects transient failures into that share of task attempts
    (chaos testing); retries with exponential backoff from `retry_delay_s` absorb them."""
    marks = [("start", time.time())]
    cfg = resolve_experiment(experiment, seeds, jobs, gpus, overrides)
    units = units_for(cfg, keep_jobs=keep_jobs)
    out = Path(out_dir or Path("results") / cfg.name)
    params = {"experiment": cfg.name, "seeds": ",".join(map(str, cfg.seeds)), "jobs": cfg.workload.jobs,
              "gpus": cfg.workload.gpus, "variants": len(cfg.variants), "units": len(units),
              "fail_rate": fail_rate}
    with parent_run("scheduling_experiment", f"simulate {cfg.name}", mlflow_experiment, parent_run_id,
                    tenant="simulation", params=params, fail_rate=fail_rate, fault_seed=fault_seed,
                    retry_delay_s=retry_delay_s) as run:
        marks.append(("open_run", time.time()))
        with compute_pool(workers):
            per_seed, job_rows = run_units_as_tasks(units, fail_rate, fault_seed, retry_delay_s,
                                                    f"{cfg.name}: variant x seed" if progress_stage else None)
        marks.append(("units", time.time()))
        with clock.span("work"):
            summary = aggregate(per_seed, job_rows)
            out.mkdir(parents=True, exist_ok=True)
            summary.to_csv(out / "summary.csv", index=False)
            per_seed.to_csv(out / "per_seed.csv", index=False)
            if keep_jobs:
                job_rows.to_csv(out / "jobs.csv", index=False)
            plots = plot_summary(summary, out)
            (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        marks.append(("aggregate_plots", time.time()))
        variant_params = {"seeds": params["seeds"], "jobs": cfg.workload.jobs, "gpus": cfg.workload.gpus}
        track = track_variant.with_options(retry_delay_seconds=backoff(retry_delay_s))
        futures = [track.submit(run.run_id, run.ctx[T.FLOW_RUN_TAG], cfg.name, variant,
                                summary[summary.variant == variant], per_seed[per_seed.variant == variant],
                                variant_params, mlflow_experiment, fail_rate, fault_seed)
                   for variant in dict.fromkeys(summary["variant"])]
        child_runs = [f.result() for f in futures]
        marks.append(("track_variants", time.time()))
        create_table_artifact(
            key=f"summary-{cfg.name.lower().replace('_', '-')}",
            table=[{k: _clean(v) for k, v in r.items()} for r in summary.to_dict("records")],
            description=f"{cfg.name}: {cfg.description} (means over seeds {params['seeds']})")
        artifacts = [out / "summary.csv", out / "per_seed.csv", out / "config.yaml", *plots]
        run.close(metrics={"units": len(units), "variants": len(child_runs)}, artifacts=[str(p) for p in artifacts])
        marks.append(("artifacts_close", time.time()))
    return {"experiment": cfg.name, "run_id": run.run_id, "child_runs": child_runs, "out_dir": str(out),
            "summary": summary, "per_seed": per_seed, "plots": [str(p) for p in plots],
            "phases": {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}}


def with_runner(flow_obj, runner: str = "thread", max_workers: int | None = None):
    """The flow with the task runner `--runner` picks (threads by default, Ray with the extra)."""
    return flow_obj.with_options(task_runner=task_runner(runner, max_workers))
