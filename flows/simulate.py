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

from common.validate import check_out_dir, check_workers
from flows import progress
from flows.params import ExperimentName
from infra import tracking as T
from infra.provision import compute_pool, task_runner
from scheduling.experiments import aggregate, load_experiment, scale, units_for
from scheduling.plots import plot_summary
from tasks.retry import backoff
from tasks.sim import simulate_unit
from tasks.timing import clock
from tasks.tracking import ParentRun, parent_run, track_variant


def resolve_experiment(experiment: str, seeds: list[int] | None = None, jobs: int | None = None,
                       gpus: int | None = None, overrides: dict[str, Any] | None = None):
    """Validate the whole experiment before anything runs (raises BadInput naming the field)."""
    from common.errors import BadInput

    if jobs is not None and jobs < 1:
        raise BadInput("jobs: must be >= 1")
    if gpus is not None and gpus < 1:
        raise BadInput("gpus: must be >= 1")
    cfg = load_experiment(experiment, {**(overrides or {}), **({"seeds": list(seeds)} if seeds else {})})
    return scale(cfg, jobs, gpus)


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def plan_experiment(experiment: str, seeds: list[int] | None = None, jobs: int | None = None,
                    gpus: int | None = None, overrides: dict[str, Any] | None = None, keep_jobs: bool = True):
    """The validated experiment and its workload units (variant x seed), or BadInput naming the field."""
    cfg = resolve_experiment(experiment, seeds, jobs, gpus, overrides)
    return cfg, units_for(cfg, keep_jobs=keep_jobs)


def experiment_params(cfg, units, fail_rate: float) -> dict[str, Any]:
    """An experiment run's MLflow params."""
    return {"experiment": cfg.name, "seeds": ",".join(map(str, cfg.seeds)), "jobs": cfg.workload.jobs,
            "gpus": cfg.workload.gpus, "variants": len(cfg.variants), "units": len(units), "fail_rate": fail_rate}


def submit_units(units, fail_rate: float, fault_seed: int, retry_delay_s: float, runner=None) -> list:
    """One `simulate_unit` task per unit (retried with backoff from `retry_delay_s`), on `runner` (a task runner the
    caller has entered) or else on the flow's own task runner. Returns the futures in unit order."""
    task = simulate_unit.with_options(retry_delay_seconds=backoff(retry_delay_s))
    if runner is None:
        return [task.submit(u, fail_rate, fault_seed) for u in units]
    return [runner.submit(task, {"unit": u, "fail_rate": fail_rate, "fault_seed": fault_seed}) for u in units]


def gather_units(futures) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Advance the progress stage as the units finish; return (per_seed, jobs) in unit order."""
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


def run_units_as_tasks(units, fail_rate: float, fault_seed: int, retry_delay_s: float, label: str | None,
                       runner=None):
    """Submit one task per unit, report progress as they finish, return (per_seed, jobs) in unit order.
    `label=None`: advance the caller's progress stage instead of opening one."""
    futures = submit_units(units, fail_rate, fault_seed, retry_delay_s, runner)
    if label is not None:
        progress.reporter.stage(label, total=len(futures))
    return gather_units(futures)


def record_experiment(cfg, units, per_seed: pd.DataFrame, job_rows: pd.DataFrame, out: Path, run: ParentRun, *,
                      keep_jobs: bool = True, mlflow_experiment: str = T.DEFAULT_EXPERIMENT, fail_rate: float = 0.0,
                      fault_seed: int = 0, retry_delay_s: float = 1.0, marks: list | None = None) -> dict[str, Any]:
    """An experiment's units are done: aggregate them (summary.csv, per_seed.csv, jobs.csv, plots, the resolved
    config), one MLflow child run per variant under `run` (tasks, retried), a Prefect table artifact, and close
    `run` with the files. `marks` collects (phase, time) pairs."""
    marks = marks if marks is not None else []
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
    seeds = ",".join(map(str, cfg.seeds))
    variant_params = {"seeds": seeds, "jobs": cfg.workload.jobs, "gpus": cfg.workload.gpus}
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
        description=f"{cfg.name}: {cfg.description} (means over seeds {seeds})")
    artifacts = [out / "summary.csv", out / "per_seed.csv", out / "config.yaml", *plots]
    run.close(metrics={"units": len(units), "variants": len(child_runs)}, artifacts=[str(p) for p in artifacts])
    marks.append(("artifacts_close", time.time()))
    return {"experiment": cfg.name, "run_id": run.run_id, "child_runs": child_runs, "out_dir": str(out),
            "summary": summary, "per_seed": per_seed, "plots": [str(p) for p in plots]}


@flow(name="scheduling-experiment", flow_run_name="{experiment}", task_runner=task_runner("thread"),
      log_prints=False)
def scheduling_experiment_internal(
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
    """`scheduling_experiment` with the knobs the run form does not show: `experiment` may be a YAML path,
    `fail_rate`/`fault_seed` inject transient failures into that share of task attempts (chaos testing; retries
    with exponential backoff from `retry_delay_s` absorb them), `parent_run_id` nests the MLflow run,
    `progress_stage` opens a CLI progress stage."""
    marks = [("start", time.time())]
    check_workers(workers)
    cfg, units = plan_experiment(experiment, seeds, jobs, gpus, overrides, keep_jobs)
    out = Path(out_dir or Path("results") / cfg.name)
    check_out_dir(out, "out_dir")
    with parent_run("scheduling_experiment", f"simulate {cfg.name}", mlflow_experiment, parent_run_id,
                    tenant="simulation", params=experiment_params(cfg, units, fail_rate), fail_rate=fail_rate,
                    fault_seed=fault_seed, retry_delay_s=retry_delay_s) as run:
        marks.append(("open_run", time.time()))
        with compute_pool(workers):
            per_seed, job_rows = run_units_as_tasks(units, fail_rate, fault_seed, retry_delay_s,
                                                    f"{cfg.name}: variant x seed" if progress_stage else None)
        marks.append(("units", time.time()))
        result = record_experiment(cfg, units, per_seed, job_rows, out, run, keep_jobs=keep_jobs,
                                   mlflow_experiment=mlflow_experiment, fail_rate=fail_rate, fault_seed=fault_seed,
                                   retry_delay_s=retry_delay_s, marks=marks)
    return {**result, "phases": {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}}


@flow(name="scheduling-experiment", flow_run_name="{experiment}", task_runner=task_runner("thread"),
      log_prints=False)
def scheduling_experiment(
    experiment: ExperimentName = "E2",
    seeds: list[int] | None = None,
    jobs: int | None = None,
    gpus: int | None = None,
    overrides: dict[str, Any] | None = None,
    out_dir: str | None = None,
    workers: int | None = None,
    keep_jobs: bool = True,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
) -> dict[str, Any]:
    """Run one experiment of the EvalStop paper in the discrete-event simulator: one task per variant x seed,
    aggregated into summary.csv, per_seed.csv, jobs.csv and plots, a table artifact and MLflow runs.

    Args:
        experiment: E1 (main comparison) ... E8 (see docs/reproduction.md for what each one varies).
        seeds: workload seeds (empty: the experiment's own, usually 42,123,456,789,1024).
        jobs: jobs per workload (empty: the experiment's; scales arrivals to keep the load).
        gpus: cluster GPUs (empty: the experiment's).
        overrides: dotted experiment fields to change, e.g. {"workload.eval_noise.sigma": 0.08}.
        out_dir: where the CSVs and plots go (empty: results/<experiment>).
        workers: processes for the simulation units (empty: one per core; 1: in the flow's own process).
        keep_jobs: also write jobs.csv (one row per job, seed and scheduler).
        mlflow_experiment: MLflow experiment the runs go to.
    """
    return scheduling_experiment_internal.fn(experiment=experiment, seeds=seeds, jobs=jobs, gpus=gpus,
                                             overrides=overrides, out_dir=out_dir, workers=workers,
                                             keep_jobs=keep_jobs, mlflow_experiment=mlflow_experiment)
