"""`scheduling_experiment`: one `ExperimentRequest` (one of E1-E8, or a YAML path) run by
`scheduling.request.run_experiment` with one Prefect task per workload unit (variant x seed, every scheduler); every
output file written there (summary.csv, per_seed.csv, jobs.csv, tenants.csv, config.yaml, plots), then a Prefect
table artifact and MLflow runs (a parent for the flow run, a child per variant)."""

from __future__ import annotations

import math
import time
from typing import Any

import pandas as pd
from prefect import flow
from prefect.artifacts import create_table_artifact
from prefect.futures import as_completed

from flows import progress
from infra import tracking as T
from infra.compute import compute_pool
from infra.ledger import tenant_costs
from infra.provision import task_runner
from scheduling.request import ExperimentPlan, ExperimentRequest, ExperimentResult, run_experiment
from tasks.retry import backoff
from tasks.sim import simulate_unit
from tasks.timing import clock
from tasks.tracking import ParentRun, parent_run, track_variant
from training.job.request import JobInternals, parse_internals


def _clean(x: Any) -> Any:
    return None if isinstance(x, float) and math.isnan(x) else x


def experiment_params(plan: ExperimentPlan, fail_rate: float) -> dict[str, Any]:
    """An experiment run's MLflow params."""
    cfg = plan.config
    return {"experiment": cfg.name, "seeds": ",".join(map(str, cfg.seeds)), "jobs": cfg.workload.jobs,
            "gpus": cfg.workload.gpus, "variants": len(cfg.variants), "units": len(plan.units), "fail_rate": fail_rate}


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


def track_experiment(result: ExperimentResult, run: ParentRun, *, mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
                     fail_rate: float = 0.0, fault_seed: int = 0, retry_delay_s: float = 1.0,
                     marks: list | None = None) -> dict[str, Any]:
    """An experiment's outputs are written (`scheduling.request.write_experiment`): one MLflow child run per variant
    under `run` (tasks, retried), a Prefect table artifact, and `run` closed with the files. `marks` collects
    (phase, time) pairs."""
    marks = marks if marks is not None else []
    cfg, summary, per_seed = result.plan.config, result.summary, result.per_seed
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
    big = {"jobs.csv"}  # one row per job, seed and scheduler: on disk, not copied into the store
    run.close(metrics={"units": len(result.plan.units), "variants": len(child_runs)},
              artifacts=[str(p) for p in result.files if p.name not in big])
    marks.append(("artifacts_close", time.time()))
    return {"experiment": cfg.name, "run_id": run.run_id, "child_runs": child_runs, "out_dir": str(result.out),
            "summary": summary, "per_seed": per_seed, "plots": [str(p) for p in result.plots],
            "files": [str(p) for p in result.files]}


@flow(name="scheduling-experiment", flow_run_name="{request.experiment}", task_runner=task_runner("thread"),
      log_prints=False)
def scheduling_experiment(
    request: ExperimentRequest = ExperimentRequest(),  # noqa: B008 - a pydantic default, never mutated
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    internals: JobInternals = JobInternals(),  # noqa: B008
) -> dict[str, Any]:
    """Run one experiment of the EvalStop paper in the discrete-event simulator: one task per variant x seed, every
    output of `rlhfops simulate` (summary.csv, per_seed.csv, jobs.csv, tenants.csv, config.yaml, plots), a table
    artifact and MLflow runs.

    Args:
        request: the experiment, its seeds, size, overrides and output directory (as `rlhfops simulate` takes them).
        mlflow_experiment: MLflow experiment the runs go to.
        internals: chaos injection (a share of task attempts fails; retries with exponential backoff from
            `retry_delay_s` absorb them) and the MLflow run to nest under; the defaults are safe.
    """
    from scheduling.request import plan_experiment

    internals = parse_internals(internals)
    marks = [("start", time.time())]
    plan = plan_experiment(request)  # every check, before the MLflow run opens
    with parent_run("scheduling_experiment", f"simulate {plan.config.name}", mlflow_experiment,
                    internals.parent_run_id, tenant="simulation", params=experiment_params(plan, internals.fail_rate),
                    fail_rate=internals.fail_rate, fault_seed=internals.fault_seed,
                    retry_delay_s=internals.retry_delay_s) as run:
        marks.append(("open_run", time.time()))

        def run_as_tasks(p: ExperimentPlan):
            with compute_pool(request.workers):
                out = run_units_as_tasks(p.units, internals.fail_rate, internals.fault_seed, internals.retry_delay_s,
                                         f"{p.config.name}: variant x seed")
            marks.append(("units", time.time()))
            return out

        result = run_experiment(plan, tenant_costs=tenant_costs, run=run_as_tasks,
                                write_context=lambda: clock.span("work"))
        marks.append(("aggregate_plots", time.time()))
        out = track_experiment(result, run, mlflow_experiment=mlflow_experiment, fail_rate=internals.fail_rate,
                               fault_seed=internals.fault_seed, retry_delay_s=internals.retry_delay_s, marks=marks)
    return {**out, "phases": {name: t - marks[i][1] for i, (name, t) in enumerate(marks[1:])}}
