"""The nightly's inputs, all checked before any server starts or any stage runs: by `rlhfops nightly` before it
starts the temporary Prefect server, and by the `nightly_sweep` flow as its first step (a deployment run has no
CLI in front of it). Light on purpose: no Prefect, no torch, so a bad input is reported in about a second.

Every config path resolves as every other config does (`common.config.config_path`): against the working directory,
then the shipped `configs/`; the sweep spec's default `configs/sweeps/example.yaml` works from any directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from common.errors import BadInput

QUICK_SEEDS = [42, 123]
FULL_SEEDS = [42, 123, 456, 789, 1024]
#: the nightly's RLHF job: the canaries' small healthy PPO job (training/benches/canaries.py), with a
#: checkpoint at every eval gate so the best gated checkpoint is the one kept
NIGHTLY_JOB_STEPS = {True: 24, False: 60}
#: the sweep stage's spec, and its trials in a quick nightly (the spec's own count otherwise)
NIGHTLY_SWEEP_SPEC = "configs/sweeps/example.yaml"
QUICK_SWEEP_TRIALS = 2
#: the bench stage: `rlhfops bench oppo --quick` on this config, compared with this baseline (a quick run of it)
NIGHTLY_BENCH_CONFIG = "configs/ppo-bench.yaml"
NIGHTLY_BENCH_BASELINE = "docs/bench/oppo-baseline.json"
#: the stages, in the order they run (`rlhfops nightly --stages`)
STAGES = ("matrix", "detectors", "job", "canaries", "sweep", "platform", "bench")


@dataclass(frozen=True)
class BenchPlan:
    """The bench stage's checked inputs: the PPO config, the settings (`training.benches.baseline.bench_settings`), the
    baseline to compare with (None: no comparison) and where it came from."""

    config: Any
    settings: dict
    baseline: dict | None
    baseline_path: str


@dataclass(frozen=True)
class NightlyPlan:
    """The checked inputs, with every default filled in."""

    experiments: list[str]
    seeds: list[int]
    canaries: list[str]
    canary_steps: int
    fault_at: int
    job_steps: int
    platform_steps: int
    sweep_trials: int | None
    out: Path
    #: the RLHF job stage's request (None: the stage is off)
    job: Any = None
    #: the job's training algorithm (its checked config's: ppo, grpo or rloo; "" when the stage is off)
    job_algorithm: str = ""
    #: the OPPO bench stage's inputs (None: the stage is off)
    bench: BenchPlan | None = None


def check_nightly(*, quick: bool = False, experiments: list[str] | None = None, seeds: list[int] | None = None,
                  canaries: list[str] | None = None, canary_steps: int | None = None, job: bool = True,
                  job_steps: int | None = None, job_overrides: dict[str, Any] | None = None,
                  job_config: str | None = None, job_tenant: str | None = None, job_name: str | None = None,
                  job_gpus: int = 1, platform_steps: int | None = None, sweep: bool = True,
                  sweep_spec: str = NIGHTLY_SWEEP_SPEC,
                  sweep_trials: int | None = None, runner: str = "thread", workers: int | None = None,
                  out_dir: str | Path = "results/nightly", cache_dir: str | None = None,
                  mlflow_experiment: str | None = None, bench: bool = False,
                  bench_config: str = NIGHTLY_BENCH_CONFIG, bench_baseline: str | None = NIGHTLY_BENCH_BASELINE,
                  bench_steps: int | None = None, bench_seeds: int | None = None) -> NightlyPlan:
    """Every input of a nightly, or `BadInput` naming the parameter: the experiments, seeds, canaries, step counts,
    runner, workers, output and cache directories, the job's config overrides, the sweep spec (its fields, every
    varied value against the job config, its pruner and its GPU kind's price), and the bench's config and baseline
    (comparable with tonight's settings)."""
    from common.validate import check_out_dir, check_seed, check_workers
    from flows.params import CanaryName, ExperimentName
    from infra.provision import check_runner

    EXPERIMENTS = get_args(ExperimentName)  # noqa: N806 - scheduling.experiments.EXPERIMENTS, without pandas
    check_runner(runner)
    check_workers(workers)
    exps = [str(e).upper() for e in (EXPERIMENTS if experiments is None else experiments)]
    for e in exps:
        if e not in EXPERIMENTS:
            raise BadInput(f"experiments: '{e}' is not one of {', '.join(EXPERIMENTS)}")
    seed_list = list(seeds or (QUICK_SEEDS if quick else FULL_SEEDS))
    for seed in seed_list:
        check_seed(seed, "seeds")
    if len(set(seed_list)) < len(seed_list):
        raise BadInput(f"seeds: {seed_list} lists a seed twice (it would count twice in the means)")
    known = list(get_args(CanaryName))
    names = known if canaries is None else list(canaries)
    for c in names:
        if c not in known:
            raise BadInput(f"canaries: unknown canary '{c}' (choose from: {', '.join(known)})")
    for field, value, low in (("job_steps", job_steps, 4), ("canary_steps", canary_steps, 4),
                              ("platform_steps", platform_steps, 2), ("sweep_trials", sweep_trials, 1),
                              ("bench_steps", bench_steps, 10), ("bench_seeds", bench_seeds, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise BadInput(f"{field}: {value!r} must be a whole number >= {low}"
                           + (" (the job gates every 4 steps)" if field == "job_steps" else ""))
    canary_steps = canary_steps or (60 if quick else 120)
    steps = job_steps or NIGHTLY_JOB_STEPS[quick]
    check_out_dir(out_dir, "out_dir")
    from training.job.config import default_cache_dir

    cache_dir = cache_dir or default_cache_dir()  # as a config without cache_dir: the same warm starts
    check_out_dir(cache_dir, "cache_dir")
    job_request, job_algorithm = None, ""
    if job:
        job_request = nightly_job_request(steps, job_overrides, cache_dir, Path(out_dir), mlflow_experiment,
                                          config=job_config, steps_given=job_steps is not None,
                                          tenant=job_tenant, name=job_name, gpus=job_gpus, runner=runner)
        job_algorithm = job_request.checked().config.algorithm
    trials = sweep_trials or (QUICK_SWEEP_TRIALS if quick else None)
    if sweep:
        from common.config import config_path
        from tasks.sweep import prepare

        if not config_path(sweep_spec).is_file():
            raise BadInput(f"sweep_spec: file '{sweep_spec}' not found, here or among the shipped configs "
                           "(pass a sweep spec YAML, e.g. configs/sweeps/example.yaml)")
        prepare(str(config_path(sweep_spec)), trials)
    bench_plan = check_bench(bench_config, bench_baseline, bench_steps, bench_seeds, cache_dir) if bench else None
    return NightlyPlan(exps, seed_list, names, canary_steps, min(8 if quick else 30, canary_steps - 2), steps,
                       platform_steps or (12 if quick else 24), trials, Path(out_dir), job_request, job_algorithm,
                       bench_plan)


def check_bench(config: str, baseline: str | None, steps: int | None, seeds: int | None, cache_dir: str) -> BenchPlan:
    """The bench stage's inputs: `rlhfops bench oppo --quick` settings (30 steps, 3 seeds; `steps`/`seeds` change
    them) on `config` with the nightly's warm-start cache, and the baseline JSON (relative: here, else in this
    checkout), which must have the same settings; empty `baseline`: no comparison."""
    from common.config import config_path
    from training.benches.baseline import bench_settings, read_baseline
    from training.job.config import load_config

    if seeds is not None and seeds > 20:
        raise BadInput(f"bench_seeds: {seeds} must be at most 20")
    cfg = load_config(config_path(config), {"cache_dir": cache_dir})
    settings = bench_settings(cfg, quick=True, steps=steps, seeds=seeds or 3)
    if not baseline:
        return BenchPlan(cfg, settings, None, "")
    path = Path(baseline)
    checkout = Path(__file__).resolve().parents[1] / path
    if not path.is_file() and not path.is_absolute() and checkout.is_file():
        path = checkout
    if not path.is_file():
        raise BadInput(f"bench_baseline: file '{baseline}' not found, here or in this checkout (give the JSON a quick "
                       "OPPO bench wrote with the same settings, or 'none' (empty) for no comparison)")
    return BenchPlan(cfg, settings, read_baseline(path, settings, "bench_baseline"), str(path))


def nightly_job_config(steps: int, cache_dir: str) -> dict[str, Any]:
    """The nightly job's config: the canaries' small healthy PPO job with a gate and a checkpoint every 4 steps."""
    from training.benches.canaries import base_config

    raw = base_config(steps, 0, cache_dir)
    raw.update(name="nightly-ppo", eval_every=4, checkpoint_every=4)
    return raw


def nightly_job_request(steps: int, overrides: dict[str, Any] | None, cache_dir: str, out: Path,
                        mlflow_experiment: str | None = None, config: str | None = None, steps_given: bool = False,
                        tenant: str | None = None, name: str | None = None, gpus: int = 1, runner: str = "thread"):
    """The nightly's RLHF job as a `training.job.request.JobRequest`: `nightly_job_config` (or `config`, a job config
    file such as a tenant's dataset job or configs/grpo-arith.yaml, its own steps unless `steps_given`), under
    `tenant` (default acme) and `name` (default by its algorithm: `nightly-ppo`, `nightly-grpo`, `nightly-rloo`, the
    config's or the overrides'), run directory OUT/rlhf-job, on `gpus` ranks launched by `runner` (thread or ray)."""
    from training.job.config import resolve_config
    from training.job.request import parse_request

    if config is not None:
        from common.config import config_path

        if not config_path(config).is_file():
            raise BadInput(f"job_config: file '{config}' not found, here or among the shipped configs (pass a job "
                           "config YAML, e.g. configs/ppo-arith.yaml)")
        job_config: Any = str(config_path(config))
        overrides = {**({"steps": steps} if steps_given else {}), **(overrides or {})}
    else:
        job_config = nightly_job_config(steps, cache_dir)
    algorithm = resolve_config(job_config, overrides or {}).algorithm  # BadInput naming the field, as checked() would
    fields = {"config": job_config, "overrides": overrides or {}, "tenant": tenant or "acme",
              "name": name or f"nightly-{algorithm}", "overlap": "full", "out_root": str(out), "run_dir": "rlhf-job",
              "gpus": gpus, "runner": runner, "cluster_gpus": max(4, gpus)}
    if mlflow_experiment is not None:
        fields["mlflow_experiment"] = mlflow_experiment
    return parse_request(fields, "job")
