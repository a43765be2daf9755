"""One simulator experiment, asked for and run: `ExperimentRequest` (what `rlhfops simulate` and the `simulate`
deployment's run form take, validated once) and `run_experiment` (the one place its outputs are written).

    request = ExperimentRequest(experiment="E2", seeds=[42, 123], jobs=60, plots=True)
    result = run_experiment(request, tenant_costs=infra.ledger.tenant_costs)
    # result.out: summary.csv, per_seed.csv, jobs.csv, tenants.csv, config.yaml, E2.png

`plan_experiment` (the validated experiment, its units and its output directory; `BadInput` naming the field, before
any work) and `write_experiment` (every output file of units already run) are the two halves, for a caller that runs
the units its own way (the flows: one Prefect task per unit; the nightly: every experiment's units on one pool).
The per-tenant costs come from the platform's ledger, which the domain does not import: the caller passes it in.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from common.errors import BadInput

#: scheduling.experiments.EXPERIMENTS, as the run form's choices (tests/flows/test_flow_forms.py keeps them equal)
ExperimentName = Literal["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8"]
#: a workload seed; checked by `common.validate.check_seed` (the one seed rule), the bounds shown in the run form
Seed = Annotated[int, WithJsonSchema({"type": "integer", "minimum": 0, "maximum": 2**32 - 1})]

#: per-tenant GPU-hours and cost of a jobs.csv frame (`infra.ledger.tenant_costs`: the ledger and its prices)
TenantCosts = Callable[[Any], Any]


class ExperimentRequest(BaseModel):
    """One EvalStop experiment in the discrete-event simulator."""

    model_config = ConfigDict(extra="forbid")

    experiment: ExperimentName | Annotated[str, Field(min_length=1)] = Field(
        "E2", description="E1 (main comparison) ... E8 (see docs/reproduction.md for what each one "
        "varies), or a path to an experiment YAML")
    seeds: list[Seed] | None = Field(
        None, min_length=1, description="workload seeds (empty: the experiment's own, usually 42,123,456,789,1024)")
    jobs: int | None = Field(None, ge=1, description="jobs per workload (empty: the experiment's; scales arrivals "
                             "to keep the load)")
    gpus: int | None = Field(None, ge=1, description="cluster GPUs (empty: the experiment's; the arrival rate "
                             "scales with them so the load per GPU is unchanged)")
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='dotted experiment fields to change, e.g. {"workload.eval_noise.sigma": 0.08}')
    out_dir: str | None = Field(None, min_length=1, description="where the CSVs, config.yaml and plots go (empty: "
                                "results/<experiment>)")
    workers: Annotated[int, WithJsonSchema({"type": "integer", "minimum": 1})] | None = Field(
        None, description="processes for the simulation units (empty: one per core)")
    keep_jobs: bool = Field(True, description="keep one row per job, seed and scheduler: jobs.csv and tenants.csv "
                            "(off: less memory for huge runs)")
    plots: bool = Field(True, description="draw <experiment>.png (matplotlib)")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, seeds: list[int] | None) -> list[int] | None:
        from common.validate import check_seed

        for seed in seeds or []:
            check_seed(seed, "seeds")
        if seeds is not None and len(set(seeds)) < len(seeds):
            raise BadInput(f"seeds: {seeds} lists a seed twice (it would count twice in the means)")
        return seeds

    @field_validator("workers")
    @classmethod
    def _workers(cls, workers: int | None) -> int | None:
        from common.validate import check_workers

        check_workers(workers)  # the one worker-count rule: >= 1, at most 4x the cores
        return workers

    @classmethod
    def build(cls, **fields: Any) -> ExperimentRequest:
        """The request from keyword fields, or `BadInput` naming the field (the CLI's and the tests' way in)."""
        from common.errors import validated

        return validated(cls, fields, "experiment request")


@dataclass
class ExperimentPlan:
    """A request checked against its experiment: the scaled config, its (variant, seed) units, where it writes."""

    request: ExperimentRequest
    config: Any  # scheduling.config.ExperimentConfig
    units: list
    out: Path


def plan_experiment(request: ExperimentRequest) -> ExperimentPlan:
    """Everything checked before any work (`BadInput` naming the field): the experiment file, the overrides, every
    scheduler and variant, the seeds, the memory estimate, the worker count and the output directory (default
    results/<experiment name>)."""
    from common.validate import check_out_dir
    from scheduling.experiments import load_experiment, scale, units_for

    overrides = {**request.overrides, **({"seeds": list(request.seeds)} if request.seeds else {})}
    cfg = scale(load_experiment(request.experiment, overrides), request.jobs, request.gpus)
    out = Path(request.out_dir) if request.out_dir else Path("results") / cfg.name
    check_out_dir(out, "out_dir")
    units = units_for(cfg, keep_jobs=request.keep_jobs, workers=request.workers)
    return ExperimentPlan(request, cfg, units, out)


@dataclass
class ExperimentResult:
    """What `run_experiment` / `write_experiment` produced."""

    plan: ExperimentPlan
    summary: Any  # pandas.DataFrame: summary.csv
    per_seed: Any  # pandas.DataFrame: per_seed.csv
    files: list[Path] = field(default_factory=list)  # every file written, summary.csv first
    plots: list[Path] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def out(self) -> Path:
        return self.plan.out


def write_experiment(plan: ExperimentPlan, per_seed, job_rows, tenant_costs: TenantCosts) -> ExperimentResult:
    """Every output of an experiment whose units have run: summary.csv, per_seed.csv, the resolved config.yaml and,
    with the per-job rows, jobs.csv and tenants.csv (per scheduler and tenant: GPU-hours and cost, mean over seeds,
    by `tenant_costs`); `<EXP>.png` when the request asks for plots."""
    import yaml

    from scheduling.experiments import aggregate

    summary = aggregate(per_seed, job_rows)
    out = plan.out
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "summary.csv", out / "per_seed.csv", out / "config.yaml"]
    summary.to_csv(files[0], index=False)
    per_seed.to_csv(files[1], index=False)
    files[2].write_text(yaml.safe_dump(plan.config.model_dump(mode="json"), sort_keys=False))
    if plan.request.keep_jobs:
        job_rows.to_csv(out / "jobs.csv", index=False)
        tenant_costs(job_rows).to_csv(out / "tenants.csv", index=False)
        files += [out / "jobs.csv", out / "tenants.csv"]
    plots = []
    if plan.request.plots:
        from scheduling.plots import plot_summary

        plots = plot_summary(summary, out)
    return ExperimentResult(plan, summary, per_seed, files + plots, plots)


#: runs a plan's units: (per-seed rows, per-job rows); the default is `scheduling.experiments.run_units`
UnitRunner = Callable[[ExperimentPlan], tuple[Any, Any]]


def run_experiment(request: ExperimentRequest | ExperimentPlan, *, tenant_costs: TenantCosts,
                   run: UnitRunner | None = None, on_done: Callable[[Any], None] | None = None,
                   write_context: Callable[[], AbstractContextManager] | None = None) -> ExperimentResult:
    """Plan (every check before any work; a plan already made is used as it is), run the units, write every output.
    `run` runs the units another way (one Prefect task per unit); by default they run in worker processes,
    `on_done(unit)` called as each ends. `write_context()`: a context the writing runs in (a clock's span)."""
    import time

    from scheduling.experiments import run_units

    plan = request if isinstance(request, ExperimentPlan) else plan_experiment(request)
    t0 = time.perf_counter()
    if run is None:
        per_seed, job_rows = run_units(plan.units, workers=plan.request.workers, on_done=on_done)
    else:
        per_seed, job_rows = run(plan)
    wall = time.perf_counter() - t0
    with write_context() if write_context is not None else nullcontext():
        result = write_experiment(plan, per_seed, job_rows, tenant_costs)
    result.wall_s = wall
    return result
