"""Simulator benchmark: the whole E1-E8 matrix, and one very large run.

The large run uses the E2 job mix on a big cluster with the arrival rate set for a target offered
load (GPU-minutes demanded per minute / GPUs), so the queue stays realistic instead of holding every
job at once; EvalStop+SRTF is the policy (the paper's headline scheduler: preemptive, a detector
verdict at every checkpoint). Its checkpoints are coalesced (see `engine.py`); `coalesce=False` times
the one-event-per-checkpoint path that LossAware and EvalSched always take, for comparison.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

import numpy as np

from scheduling.config import WorkloadConfig
from scheduling.engine import simulate
from scheduling.experiments import EXPERIMENTS, load_experiment, run_units, units_for
from scheduling.policies import parse_scheduler
from scheduling.workload import checkpoint_grid, generate


def mean_gpu_minutes(wc: WorkloadConfig) -> float:
    """Expected GPU-minutes one job of this workload needs run to completion (training + evals)."""
    mix = np.array([wc.mix.lora, wc.mix.dpo, wc.mix.rlhf])
    mix = mix / mix.sum()
    per_type = []
    for spec in (wc.lora, wc.dpo, wc.rlhf):
        minutes = sum(spec.duration_min) / 2 + len(checkpoint_grid(spec.eval_interval)) * spec.eval_minutes
        per_type.append(sum(spec.gpus) / 2 * minutes)
    return float(mix @ np.array(per_type))


def bench_matrix(seeds: list[int] | None = None, workers: int | None = None) -> dict:
    units = []
    for exp in EXPERIMENTS:
        cfg = load_experiment(exp)
        if seeds:
            cfg = cfg.model_copy(update={"seeds": seeds})
        units += units_for(cfg, keep_jobs=False)
    t0 = time.perf_counter()
    per_seed, _ = run_units(units, workers=workers)
    wall = time.perf_counter() - t0
    return {"matrix_wall_s": wall, "matrix_units": len(units), "matrix_runs": len(per_seed),
            "matrix_events": int(per_seed["events"].sum())}


def bench_large(jobs: int, gpus: int, load: float = 0.95, scheduler: str = "EvalStop+SRTF", seed: int = 42,
                progress: Callable[[int], None] | None = None, coalesce: bool = True) -> dict:
    base = load_experiment("E2").workload
    wc = base.model_copy(update={"jobs": jobs, "gpus": gpus})
    wc = wc.model_copy(update={"arrival_rate": load * gpus / mean_gpu_minutes(wc)})
    t0 = time.perf_counter()
    wl = generate(wc, seed)
    t1 = time.perf_counter()
    res = simulate(wl, parse_scheduler(scheduler), gpus, overhead=wc.preemption_overhead_min, progress=progress,
                   coalesce=coalesce)
    t2 = time.perf_counter()
    jct = res.end - wl.arrival
    return {
        "jobs": jobs, "gpus": gpus, "offered_load": load, "arrival_rate_per_min": wc.arrival_rate,
        "scheduler": scheduler, "coalesce": coalesce, "generate_s": t1 - t0, "simulate_s": t2 - t1, "wall_s": t2 - t0,
        "events": res.events, "events_per_s": res.events / (t2 - t1),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "mean_jct_min": float(jct.mean()), "stopped": int(res.stopped.sum()),
        "cpu_count": os.cpu_count(),
    }
