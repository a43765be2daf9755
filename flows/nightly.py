"""`nightly_sweep`: the scheduling matrix, the detector comparison, a real RLHF job (best checkpoint
registered, then re-scored by `evaluate_checkpoint`), the health canaries, a live platform round, and a
report comparing tonight with the last nightly (Prefect markdown artifact + MLflow). Every stage runs for
real; `quick` shrinks seeds and steps, never swaps a stage for a stand-in."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows import progress
from flows.evaluate import evaluate_checkpoint
from flows.nightly_check import (  # noqa: F401
    NIGHTLY_BENCH_BASELINE,
    NIGHTLY_BENCH_CONFIG,
    NIGHTLY_SWEEP_SPEC,
    BenchPlan,
    NightlyPlan,
    check_nightly,
    nightly_job_config,
)
from flows.params import CanaryName, ExperimentName, RunnerKind, default_cache_dir
from flows.platform_round import platform_round
from flows.rlhf_job import rlhf_job
from flows.simulate import experiment_params, gather_units, run_units_as_tasks, submit_units, track_experiment
from infra import tracking as T
from infra.compute import compute_pool
from infra.ledger import tenant_costs
from infra.provision import no_heartbeats, task_runner
from infra.reporting import nightly_report, report_markdown
from scheduling.request import ExperimentRequest, plan_experiment, run_experiment
from tasks.timing import StageTimes, clock
from tasks.tracking import parent_run
from training.job.request import JobInternals, parse_internals


@task(name="canary", task_run_name="canary {name}", cache_policy=NO_CACHE)
def run_canary_task(name: str, steps: int, fault_at: int, cache_dir: str) -> dict[str, Any]:
    """One fault-injection canary (a real small PPO run): the expected alert must fire and move the run
    state; the control must stay quiet."""
    from eval.health import Catalog
    from training.benches.canaries import CANARIES, run_canary

    canary = {c.name: c for c in CANARIES}[name]
    catalog = Catalog.from_file(None, algorithm="ppo", profile="canary")
    with clock.span("work"):
        return run_canary(canary, steps, fault_at, cache_dir, catalog)


def detector_comparison(seeds: list[int], fail_rate: float, fault_seed: int, retry_delay_s: float, runner=None):
    """The detector report's runs (E7 under three noise kinds, E8) as tasks (on `runner` if given); mean over
    seeds."""
    from studies.detector_report import report_units

    units = [u for u in report_units() if u.seed in seeds]
    for u in units:
        u.keep_jobs = False
    per_seed, _ = run_units_as_tasks(units, fail_rate, fault_seed, retry_delay_s, "detectors: variant x seed",
                                     runner)
    cols = ["precision", "recall", "fpr", "jct", "wasted_frac", "detection_delay", "regret", "stopped",
            "useful_recall", "false_stop_rate", "quality_kept"]  # render() reads the usefulness columns too
    return per_seed.groupby(["experiment", "variant", "scheduler"], sort=False)[cols].mean().reset_index()


def _records(df: pd.DataFrame) -> list[dict]:
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in df.to_dict("records")]


@dataclass
class NightlyResult:
    """What a nightly returns: its MLflow run, where it wrote, each stage's result (None: the stage did not run)."""

    run_id: str
    flow_run_id: str
    out_dir: str
    #: the scheduling matrix: one row per (experiment, variant, scheduler)
    matrix: pd.DataFrame | None = None
    #: the detector comparison (mean over seeds)
    detectors: pd.DataFrame | None = None
    #: the RLHF job's summary (`rlhf_job`'s return), or the error it failed with
    job: Any = None
    #: the registered checkpoint re-scored from the registry
    evaluation: dict[str, Any] | None = None
    #: one row per canary
    canaries: pd.DataFrame | None = None
    #: the platform round's return (`platform_round`)
    platform: dict[str, Any] | None = None
    #: the sweep's summary (`flows.sweep.sweep`'s return)
    sweep: dict[str, Any] | None = None
    #: the OPPO bench's summary (`stage_bench`): its ratios, the baseline comparison and the ratios that regressed
    bench: dict[str, Any] | None = None
    #: tonight vs the last nightly, with where the time went
    report: str = ""
    #: the flow's wall, work, tracking and orchestration seconds
    timing: dict[str, float] = field(default_factory=dict)
    #: each stage's wall seconds (`<stage>_s`)
    stages: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Chaos:
    """The chaos knobs every stage passes on: injected failure rate, its seed, the first retry delay."""

    fail_rate: float = 0.0
    fault_seed: int = 0
    retry_delay_s: float = 1.0


def stage_matrix(exps: list[str], seeds: list[int], out: Path, res: NightlyResult, chaos: Chaos, units_runner,
                 mlflow_experiment: str) -> pd.DataFrame:
    """1. The scheduling matrix: one `ExperimentRequest` per experiment (outputs in OUT/scheduling/<EXP>/, the same
    files as `rlhfops simulate`). Every experiment's units (variant x seed) go to the compute pool at once, as tasks
    on one task runner (threads, or Ray workers with runner="ray"); each experiment is written and tracked (its
    MLflow run under the nightly's, a child run per variant) as soon as its own units are done, while the later
    experiments' units keep the pool busy. (As subflows, two at a time, every experiment ended in a stretch where
    neither had work, and creating a flow run while ~100 task runs reported their states made the temporary
    server's SQLite refuse the write: 2-13 s of orchestration per matrix.)"""
    plans = [plan_experiment(ExperimentRequest(experiment=e, seeds=seeds, out_dir=str(out / "scheduling" / e)))
             for e in exps]
    progress.reporter.stage("simulation matrix: variant x seed", total=sum(len(p.units) for p in plans))
    submitted = [(plan, submit_units(plan.units, chaos.fail_rate, chaos.fault_seed, chaos.retry_delay_s,
                                     units_runner)) for plan in plans]
    summaries = []
    for plan, futures in submitted:  # in submission order: the first experiments finish first
        cfg = plan.config
        with parent_run("scheduling_experiment", f"simulate {cfg.name}", mlflow_experiment, res.run_id,
                        key=f"{res.flow_run_id}/experiment/{cfg.name}", tenant="simulation",
                        params=experiment_params(plan, chaos.fail_rate), fail_rate=chaos.fail_rate,
                        fault_seed=chaos.fault_seed, retry_delay_s=chaos.retry_delay_s) as exp_run:
            result = run_experiment(plan, tenant_costs=tenant_costs, run=lambda _p, f=futures: gather_units(f),
                                    write_context=lambda: clock.span("work"))
            r = track_experiment(result, exp_run, mlflow_experiment=mlflow_experiment, fail_rate=chaos.fail_rate,
                                 fault_seed=chaos.fault_seed, retry_delay_s=chaos.retry_delay_s)
        summaries.append(r["summary"])
    matrix = pd.concat(summaries, ignore_index=True)
    matrix.to_csv(out / "scheduling" / "summary.csv", index=False)
    return matrix


def stage_detectors(seeds: list[int], out: Path, res: NightlyResult, chaos: Chaos, units_runner,
                    mlflow_experiment: str) -> pd.DataFrame:
    """2. The detector comparison, tracked as one MLflow run under the nightly's."""
    from studies.detector_report import render

    table = detector_comparison(seeds, chaos.fail_rate, chaos.fault_seed, chaos.retry_delay_s, units_runner)
    table.to_csv(out / "detectors.csv", index=False)
    (out / "detectors.md").write_text(render(table))
    with clock.span("tracking"):
        det_run, _ = T.open_run(f"{res.flow_run_id}/detectors", "detector comparison", mlflow_experiment, res.run_id,
                                tags={T.KIND_TAG: "detectors", T.TENANT_TAG: "simulation"})
        T.log_metric_rows(det_run, [(f"{m}/{r.experiment}/{r.variant}/{r.scheduler}", r[m], 0)
                                    for _, r in table.iterrows() for m in ("precision", "recall", "fpr")])
        T.log_artifacts(det_run, [out / "detectors.csv", out / "detectors.md"])
        T.finish(det_run)
    create_table_artifact(key="nightly-detectors", table=_records(table),
                          description="Early-stop detectors under noise (E7) and base rates (E8)")
    return table


def stage_job(request, out: Path, res: NightlyResult, chaos: Chaos,
              mlflow_experiment: str) -> tuple[Any, dict[str, Any] | None]:
    """3. A real RLHF job (`request`: `flows.nightly_check.nightly_job_request`), its best checkpoint registered,
    then the gate re-run on the registry entry. Returns the job's summary (or its error) and the re-evaluation (None
    without a registered checkpoint)."""
    state = rlhf_job(request, JobInternals(fail_rate=chaos.fail_rate, fault_seed=chaos.fault_seed,
                                           retry_delay_s=chaos.retry_delay_s, parent_run_id=res.run_id),
                     return_state=True)
    summary = state.result(raise_on_failure=False)
    evaluation = None
    if isinstance(summary, dict) and summary.get("registry"):
        reg = summary["registry"]
        progress.reporter.stage("checkpoint evaluation", total=None)
        evaluation = evaluate_checkpoint(
            checkpoint=f"models:/{reg['model']}/{reg['version']}", tenant="acme", mlflow_experiment=mlflow_experiment,
            internals={"retry_delay_s": chaos.retry_delay_s, "parent_run_id": res.run_id})
    return summary, evaluation


def stage_canaries(names: list[str], steps: int, fault_at: int, cache_dir: str, out: Path, res: NightlyResult,
                   mlflow_experiment: str) -> pd.DataFrame:
    """4. The health canaries, one MLflow run each under the nightly's."""
    progress.reporter.stage("health canaries", total=len(names))
    rows = []
    for name in names:
        r = run_canary_task(name, steps, fault_at, cache_dir)
        rows.append(r)
        with clock.span("tracking"):
            crun, _ = T.open_run(f"{res.flow_run_id}/canary/{name}", f"canary {name}", mlflow_experiment,
                                 res.run_id, tags={T.KIND_TAG: "canary", T.TENANT_TAG: "canary",
                                                   "expected": r["expected"], "run_state": r["state"],
                                                   "ok": r["ok"], "error": r["error"] or None})
            T.log_metrics(crun, {"ok": float(r["ok"]), "fired_at": r["fired_at"], "steps_run": r["steps_run"],
                                 "wall_s": r["wall_s"]})
            T.finish(crun, "FINISHED" if r["ok"] else "FAILED")
        progress.reporter.advance()
    canary_df = pd.DataFrame(rows)
    canary_df.to_csv(out / "canaries.csv", index=False)
    create_table_artifact(key="nightly-canaries", table=_records(canary_df.drop(columns=["paged", "states"])),
                          description="Fault-injection canaries: every alert must fire, the control stay quiet")
    return canary_df


def stage_bench(plan: BenchPlan, out: Path, res: NightlyResult, mlflow_experiment: str) -> dict[str, Any]:
    """7. The OPPO speed regression check (`rlhfops bench oppo --quick --baseline ...`: the same
    `training.benches.oppo.regression_check`), its JSON and plot in OUT/bench-oppo.json|.png and on an MLflow run under
    the nightly's, FAILED when a ratio regressed beyond its noise. Returns the summary the nightly shows."""
    from training.benches.oppo import regression_check

    settings = plan.settings
    progress.reporter.stage(f"oppo bench: steps (4 modes x {len(settings['seeds'])} seeds, round-robin)",
                            total=settings["steps"])
    path = out / "bench-oppo.json"
    with clock.span("work"):
        result = regression_check(plan.config, settings, plan.baseline, plan.baseline_path, path, quick=True,
                                  progress=lambda _done, _total: progress.reporter.advance())
    cmp = result.get("baseline_comparison")
    rows = cmp["rows"] if cmp else []
    regressed = [r for r in rows if r["regressed"]]
    summary = {"json": str(path), "plot": str(path.with_suffix(".png")), "baseline": plan.baseline_path or None,
               "steps": settings["steps"], "seeds": settings["seeds"], "bench_wall_s": result["bench_wall_s"],
               "load_mean_1m": result["load"]["mean_1m"], "speedup_gold": result["speedup_gold"],
               "speedup": result["speedup"], "compared": cmp is not None, "rows": rows,
               "regressed": [{"ratio": r["ratio"], "baseline_median": r["baseline_median"],
                              "current_median": r["current_median"], "change": r["change"]} for r in regressed],
               "ok": not regressed}
    with clock.span("tracking"):
        brun, _ = T.open_run(f"{res.flow_run_id}/bench-oppo", "bench oppo", mlflow_experiment, res.run_id,
                             tags={T.KIND_TAG: "bench", T.TENANT_TAG: "platform", "ok": summary["ok"],
                                   "baseline": plan.baseline_path or "(none)",
                                   "regressed": ",".join(r["ratio"] for r in regressed) or None})
        T.log_params(brun, {"steps": settings["steps"], "seeds": ",".join(map(str, settings["seeds"])),
                            "smooth_window": settings["smooth_window"], "gate_every": settings["gate_every"],
                            "target_frac": settings["target_frac"]})
        T.log_metrics(brun, {**{f"{key}/{mode}": v for key in ("speedup", "speedup_gold", "step_time_speedup")
                                for mode, v in result[key].items() if v is not None},
                             **{f"change/{r['ratio']}": r["change"] for r in rows if r["change"] is not None},
                             "regressed": float(len(regressed)), "bench_wall_s": result["bench_wall_s"],
                             "load_mean_1m": result["load"]["mean_1m"]})
        T.log_artifacts(brun, [path, path.with_suffix(".png")])
        T.finish(brun, "FINISHED" if summary["ok"] else "FAILED")
    summary["run_id"] = brun
    if rows:
        create_table_artifact(key="nightly-bench", table=[{k: r[k] for k in ("ratio", "baseline_median",
                                                                           "current_median", "change", "regressed")}
                                                          for r in rows],
                              description="OPPO speed ratios against the baseline: REGRESSED = beyond their noise")
    return summary


def nightly_sweep_spec(spec: str, out: Path, flow_run_id: str, mlflow_experiment: str) -> dict[str, Any]:
    """Tonight's copy of a sweep spec: a study of its own (the spec's name + this flow run), its trials and SQLite
    study under the nightly's output directory, so each nightly starts a fresh study and never trips over last
    night's (a spec with a database `storage` keeps it: the name keeps the studies apart). Its best trial is
    registered under the spec's own sweep model (`registered_model`, default `<spec name>-sweep`), the same every
    night, never the nightly job's `<tenant>-policy`: a trial reaches a job's model only by `rlhfops promote`."""
    from common.config import read_config_mapping

    raw, path = read_config_mapping(spec, "sweep_spec")
    raw.setdefault("registered_model", f"{raw.get('name', 'sweep')}-sweep")
    raw["name"] = f"{str(raw.get('name', 'sweep'))[:40]}-nightly-{flow_run_id[:8]}"  # a name of <= 57 characters
    raw["out_dir"] = str(out / "sweep")
    raw["mlflow_experiment"] = mlflow_experiment  # nested under the nightly's run, so in its experiment
    if isinstance(raw.get("base"), str) and not Path(raw["base"]).is_file() and (path.parent / raw["base"]).is_file():
        raw["base"] = str(path.parent / raw["base"])
    return raw


def stage_sweep(spec: str, trials: int | None, out: Path, res: NightlyResult, mlflow_experiment: str) -> dict[str, Any]:
    """6. A team's sweep (the example spec: kl_coef x actor_lr, pruned by the platform's default detector) as a
    subflow, its MLflow parent run nested under the nightly's."""
    import shutil

    import yaml

    from flows.sweep import sweep

    shutil.rmtree(out / "sweep", ignore_errors=True)  # last night's trials and study: tonight's is a new study
    tonight = out / "sweep-spec.yaml"
    raw = nightly_sweep_spec(spec, out, res.flow_run_id, mlflow_experiment)
    tonight.write_text(yaml.safe_dump(raw, sort_keys=False))
    progress.reporter.stage("sweep", total=None)
    return sweep(spec=str(tonight), trials=trials, internals={"parent_run_id": res.run_id})


def stage_report(mlflow_experiment: str, run_id: str, t_start: float, times: StageTimes, out: Path) -> str:
    """8. Tonight vs the last nightly (MLflow queries), with where the time went so far; written to report.md and
    a Prefect markdown artifact."""
    with clock.span("tracking"):  # MLflow queries
        rep = nightly_report(mlflow_experiment, tonight_id=run_id)
    report_md = report_markdown(rep)
    report_md += "\n" + overhead_markdown(clock.breakdown(t_start, time.time()), times.wall, times.orchestration)
    (out / "report.md").write_text(report_md)
    create_markdown_artifact(key="nightly-report", markdown=report_md,
                             description="Tonight vs the last nightly: schedulers, tenants, overhead")
    return report_md


@flow(name="nightly-sweep", task_runner=task_runner("thread"), log_prints=False)
def nightly_sweep(
    quick: bool = False,
    experiments: list[ExperimentName] | None = None,
    seeds: list[int] | None = None,
    detectors: bool = True,
    job: bool = True,
    job_steps: int | None = None,
    job_overrides: dict[str, Any] | None = None,
    job_config: str | None = None,
    job_tenant: str | None = None,
    job_name: str | None = None,
    job_gpus: int = 1,
    canaries: list[CanaryName] | None = None,
    canary_steps: int | None = None,
    platform: bool = True,
    platform_steps: int | None = None,
    platform_jobs: list[dict[str, Any]] | None = None,
    sweep: bool = True,
    sweep_spec: str = NIGHTLY_SWEEP_SPEC,
    sweep_trials: int | None = None,
    bench: bool | None = None,
    bench_config: str = NIGHTLY_BENCH_CONFIG,
    bench_baseline: str | None = NIGHTLY_BENCH_BASELINE,
    bench_steps: int | None = None,
    bench_seeds: int | None = None,
    runner: RunnerKind = "thread",
    workers: int | None = None,
    out_dir: str = "results/nightly",
    cache_dir: str | None = None,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    internals: JobInternals = JobInternals(),  # noqa: B008 - a pydantic default, never mutated
) -> NightlyResult:
    """The nightly: E1-E8 on the simulator, the detector comparison, one real RLHF job with its best
    checkpoint registered and re-evaluated, the health canaries, a sweep, a live platform round, and tonight vs the
    last nightly.

    Args:
        quick: seeds 42,123, a 24-step job, 60-step canaries, a 2-trial sweep and a 12-step platform round instead of
            five seeds, 60 / 120 steps, the spec's trials and 24 steps.
        experiments: the scheduling experiments to run (empty: E1-E8; [] for none).
        seeds: workload seeds of the matrix and the detector comparison (empty: by `quick`).
        detectors: run the early-stop detector comparison (E7 noise kinds, E8).
        job: run the RLHF job, register its best checkpoint and re-score it from the registry.
        job_steps: PPO steps of the job (empty: 24 quick, 60 full).
        job_overrides: dotted fields of the job's PPO config, e.g. {"ppo.max_new_tokens": 24}.
        job_config: the job's config file instead of the small synthetic job (e.g. configs/ppo-arith.yaml,
            configs/grpo-arith.yaml for a critic-free GRPO job, or a tenant's dataset job; its own steps and
            algorithm unless job_steps / job_overrides say otherwise).
        job_tenant: the tenant the job runs, is logged and registered under (empty: acme).
        job_name: the job's name (empty: nightly-<algorithm>).
        job_gpus: GPU slots the job holds and the data-parallel ranks it trains on (launched by `runner`).
        canaries: the fault-injection canaries to run (empty: all nine, the two GRPO ones included; [] for none).
        canary_steps: PPO steps per canary (empty: 60 quick, 120 full).
        platform: run a live multi-tenant platform round.
        platform_steps: PPO steps per platform job (empty: 12 quick, 24 full).
        platform_jobs: the round's jobs as {tenant, name, overrides, gpus?, steps_factor?} (empty: five tenants).
        sweep: run a sweep (a fresh Optuna study per nightly, trials on GPU slots, pruned by the default detector).
        sweep_spec: the sweep spec (YAML, here or among the shipped configs; see configs/sweeps/example.yaml).
        sweep_trials: trials of the sweep (empty: 2 quick, the spec's own otherwise).
        bench: run the OPPO speed regression check (`rlhfops bench oppo --quick --baseline`; 10-60 minutes on 2
            cores; empty: in the full nightly, not in a quick one).
        bench_config: the bench's PPO config (YAML, here or among the shipped configs).
        bench_baseline: the JSON tonight's ratios are compared with, a run of the same settings (empty: no
            comparison); a ratio that fell beyond its noise fails the bench's MLflow run.
        bench_steps: steps per bench run (empty: 30, the quick bench; the baseline must have the same).
        bench_seeds: seeds per bench mode (empty: 3; the baseline must have the same).
        runner: where the simulation units run, and the job's ranks when job_gpus > 1: thread (this process, its
            compute pool, the job's ranks spawned by its worker) or ray (Ray tasks; the job on Ray Train).
        workers: processes of the compute pool (empty: one per core).
        out_dir: where the nightly's CSVs, plots and report go.
        cache_dir: warm-start cache of the small PPO jobs (tokenizer, SFT policy, reward model); default the one
            a config without cache_dir uses (RLHFOPS_CACHE_DIR, else ~/.cache/rlhfops/warm-starts).
        mlflow_experiment: MLflow experiment the runs go to.
        internals: chaos injection (a share of task attempts fails; retries with exponential backoff from
            `retry_delay_s` absorb them) and an MLflow run to nest under; the defaults are safe.
    """
    t_start = time.time()
    internals = parse_internals(internals)
    cache_dir = cache_dir or default_cache_dir()
    plan: NightlyPlan = check_nightly(
        quick=quick, experiments=experiments, seeds=seeds, canaries=canaries, canary_steps=canary_steps, job=job,
        job_steps=job_steps, job_overrides=job_overrides, job_config=job_config, job_tenant=job_tenant,
        job_name=job_name, job_gpus=job_gpus, platform_steps=platform_steps, sweep=sweep,
        sweep_spec=sweep_spec, sweep_trials=sweep_trials, runner=runner, workers=workers, out_dir=out_dir,
        cache_dir=cache_dir, mlflow_experiment=mlflow_experiment, bench=not quick if bench is None else bench,
        bench_config=bench_config, bench_baseline=bench_baseline, bench_steps=bench_steps, bench_seeds=bench_seeds)
    out = plan.out
    out.mkdir(parents=True, exist_ok=True)
    times = StageTimes()
    chaos = Chaos(internals.fail_rate, internals.fault_seed, internals.retry_delay_s)
    with parent_run("nightly", f"nightly {time.strftime('%Y-%m-%d %H:%M')}", mlflow_experiment,
                    internals.parent_run_id, tenant="platform",
                    params={"quick": quick, "experiments": ",".join(plan.experiments),
                            "seeds": ",".join(map(str, plan.seeds)), "runner": runner,
                            "job_steps": plan.job_steps if job else 0, "job_algorithm": plan.job_algorithm,
                            "canaries": ",".join(plan.canaries),
                            "platform": platform, "sweep": sweep_spec if sweep else "", "fail_rate": chaos.fail_rate,
                            "bench": plan.bench.baseline_path or "no baseline" if plan.bench else ""},
                    fail_rate=chaos.fail_rate, fault_seed=chaos.fault_seed, retry_delay_s=chaos.retry_delay_s) as run, \
            no_heartbeats():  # the job's and platform's subflows run in this process: no heartbeat thread each
        res = NightlyResult(run_id=run.run_id, flow_run_id=run.ctx[T.FLOW_RUN_TAG], out_dir=str(out))
        with compute_pool(workers), task_runner(runner) as units_runner:
            if plan.experiments:
                with times.stage("matrix"):
                    res.matrix = stage_matrix(plan.experiments, plan.seeds, out, res, chaos, units_runner,
                                              mlflow_experiment)
            if detectors:
                with times.stage("detectors"):
                    res.detectors = stage_detectors(plan.seeds, out, res, chaos, units_runner, mlflow_experiment)
        if plan.job is not None:
            with times.stage("job"):
                res.job, res.evaluation = stage_job(plan.job, out, res, chaos, mlflow_experiment)
        if plan.canaries:
            with times.stage("canaries"):
                res.canaries = stage_canaries(plan.canaries, plan.canary_steps, plan.fault_at, cache_dir, out, res,
                                              mlflow_experiment)
        if sweep:
            with times.stage("sweep"):
                res.sweep = stage_sweep(sweep_spec, plan.sweep_trials, out, res, mlflow_experiment)
        if platform:
            with times.stage("platform"):
                res.platform = platform_round(jobs=platform_jobs, steps=plan.platform_steps, slots=2,
                                              out_dir=str(out / "platform"), cache_dir=cache_dir,
                                              retry_delay_s=chaos.retry_delay_s, mlflow_experiment=mlflow_experiment,
                                              parent_run_id=res.run_id)
        if plan.bench is not None:  # last: a timing benchmark, with nothing else of the nightly running
            with times.stage("bench"):
                res.bench = stage_bench(plan.bench, out, res, mlflow_experiment)
        with times.stage("report"):
            progress.reporter.stage("report: tonight vs the last nightly", total=None)
            res.report = stage_report(mlflow_experiment, res.run_id, t_start, times, out)
        res.timing, res.stages = clock.breakdown(t_start, time.time()), times.wall
        ok_canaries = bool(res.canaries is None or res.canaries["ok"].all())
        job_state = res.job.get("state") if isinstance(res.job, dict) else "not run"
        bench_regressed = {"bench_regressed": float(len(res.bench["regressed"]))} if res.bench else {}
        run.close(metrics={**res.timing, **times.wall,
                           **{f"orchestration_s/{k}": v for k, v in times.orchestration.items()},
                           "canaries_ok": float(ok_canaries), **bench_regressed},
                  texts={"report.md": res.report, "timing.json": json.dumps({**res.timing, **times.wall}, indent=2)},
                  artifacts=[str(p) for p in [out / "scheduling" / "summary.csv"] if p.is_file()],
                  tags={"job_state": job_state, "canaries_ok": ok_canaries,
                        **({"bench_regressed": ",".join(r["ratio"] for r in res.bench["regressed"]) or "none"}
                           if res.bench else {})})
    return res


def overhead_markdown(timing: dict[str, float], stages: dict[str, float], orch: dict[str, float]) -> str:
    lines = ["## Where the time went", "",
             f"Flow wall {timing['wall_s']:.1f} s: domain work {timing['work_s']:.1f} s, MLflow tracking (while no "
             f"work ran) {timing['tracking_s']:.1f} s, orchestration {timing['orchestration_s']:.1f} s "
             f"({100 * timing['orchestration_frac']:.1f}% of the wall).", "",
             "| stage | seconds | orchestration s |", "|---|---|---|"]
    lines += [f"| {k.removesuffix('_s')} | {v:.1f} | {orch.get(k.removesuffix('_s'), float('nan')):.1f} |"
              for k, v in stages.items()]
    return "\n".join(lines) + "\n"
