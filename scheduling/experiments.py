"""Experiments E1-E8: load a YAML config, apply overrides, run variant x seed x scheduler, aggregate.

Each (variant, seed) unit draws its workload once and runs every scheduler on that same workload,
so schedulers are compared on identical jobs. Units run in parallel worker processes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from common.config import config_dir, config_path, load_config
from common.errors import BadInput, validated
from common.validate import check_memory, set_dotted
from scheduling.config import ExperimentConfig, simulation_memory_bytes
from scheduling.engine import simulate
from scheduling.metrics import job_table, summarize
from scheduling.policies import SHORT_BASE, parse_scheduler
from scheduling.workload import generate

CONFIG_DIR = config_dir()
EXPERIMENTS = [f"E{i}" for i in range(1, 9)]

SUMMARY_COLUMNS = [
    "experiment", "variant", "scheduler", "n_seeds", "jct_mean", "jct_std", "ttfuc_mean", "ttfuc_std",
    "wasted_frac", "saved_frac", "precision", "recall", "fpr", "stopped", "jain", "jct_p_value",
    # added after the DESIGN columns: the usefulness of stops (scheduling/metrics.py)
    "useful_recall", "false_stop_rate", "quality_kept",
]


def load_experiment(exp: str, overrides: dict[str, Any] | None = None) -> ExperimentConfig:
    """`exp` is E1..E8 or a YAML path. Overrides apply to the raw tree before validation, so a wrong
    key or type is reported with its full path."""
    path = CONFIG_DIR / f"{exp.upper()}.yaml" if exp.upper() in EXPERIMENTS else config_path(exp)
    if not path.is_file():
        raise BadInput(f"experiment '{exp}': not E1..E8 and no such file")
    cfg = load_config(ExperimentConfig, path, overrides, field="experiment")
    # every scheduler name and every variant override must be valid before any work starts
    for where, names in [("schedulers", cfg.schedulers)] + [
        (f"variants[{v.name}].schedulers", v.schedulers or []) for v in cfg.variants
    ]:
        for name in names:
            try:
                parse_scheduler(name)
            except ValueError as err:
                source = f"override 'schedulers={overrides['schedulers']}'" if "schedulers" in (overrides or {}) \
                    and where == "schedulers" else str(path)
                raise BadInput(f"{source}: field '{where}': {err}") from None
    for v in cfg.variants:
        variant_config(cfg, v.name)
    return cfg


def variant_config(cfg: ExperimentConfig, variant: str) -> ExperimentConfig:
    """The experiment config with one variant's overrides applied (validated)."""
    v = next(x for x in cfg.variants if x.name == variant)
    tree = cfg.model_dump()
    for key, value in v.set.items():
        set_dotted(tree, key, copy.deepcopy(value))
    return validated(ExperimentConfig, tree, f"{cfg.name} variant '{variant}'")


def scale(cfg: ExperimentConfig, jobs: int | None = None, gpus: int | None = None) -> ExperimentConfig:
    """`--jobs` and `--gpus`. Scaling GPUs scales the arrival rate with them so the offered load per
    GPU stays what the experiment was designed for."""
    tree = cfg.model_dump()
    if jobs is not None:
        tree["workload"]["jobs"] = jobs
    if gpus is not None:
        base = tree["workload"]["gpus"]
        tree["workload"]["gpus"] = gpus
        tree["workload"]["arrival_rate"] *= gpus / base
        for v in tree["variants"]:
            if "workload.gpus" in v["set"]:
                v["set"]["workload.gpus"] = gpus
    return validated(ExperimentConfig, tree, "jobs/gpus")


@dataclass
class Unit:
    experiment: str
    variant: str
    seed: int
    config: dict  # ExperimentConfig dump (picklable, cheap)
    schedulers: list[str]
    keep_jobs: bool = True


def run_unit(unit: Unit) -> tuple[list[dict], list[pd.DataFrame]]:
    """One workload, every scheduler. Returns summary rows and (optionally) job tables."""
    cfg = ExperimentConfig.model_validate(unit.config)
    wc = cfg.workload
    wl = generate(wc, unit.seed)
    rows, tables = [], []
    for spec in unit.schedulers:
        policy = parse_scheduler(spec)
        res = simulate(
            wl, policy, wc.gpus, overhead=wc.preemption_overhead_min,
            quality_threshold=cfg.metrics.quality_threshold, min_improvement=cfg.metrics.min_improvement,
        )
        jobs = job_table(wl, res)
        row = summarize(jobs, wc.tenants)
        base = policy.base.name
        row.update(experiment=unit.experiment, variant=unit.variant, seed=unit.seed, scheduler=policy.name,
                   base=SHORT_BASE.get(base, base), base_name=base, early_stop=policy is not policy.base,
                   events=res.events)
        rows.append(row)
        if unit.keep_jobs:
            df = pd.DataFrame(jobs)
            df.insert(0, "seed", unit.seed)
            df.insert(0, "scheduler", policy.name)
            df.insert(0, "variant", unit.variant)
            df.insert(0, "experiment", unit.experiment)
            tables.append(df)
    return rows, tables


def units_for(cfg: ExperimentConfig, keep_jobs: bool = True, workers: int | None = None) -> list[Unit]:
    """The (variant, seed) units, after checking the experiment's memory estimate against the limit
    (common.validate.check_memory) so a huge `jobs` fails in one line instead of a MemoryError."""
    check_memory(simulation_memory_bytes(cfg, workers or os.cpu_count() or 1, keep_jobs), "workload.jobs",
                 f"{cfg.name} ({cfg.workload.jobs:,} jobs x {len(cfg.seeds)} seeds x "
                 f"{sum(len(v.schedulers or cfg.schedulers) for v in cfg.variants)} scheduler runs)",
                 "lower jobs or the number of seeds")
    units = []
    for v in cfg.variants:
        vc = variant_config(cfg, v.name)
        dump = vc.model_dump()
        for seed in cfg.seeds:
            units.append(Unit(cfg.name, v.name, seed, dump, v.schedulers or cfg.schedulers, keep_jobs))
    return units


def run_units(units: list[Unit], workers: int | None = None,
              on_done: Callable[[Unit], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Run units (in worker processes when more than one is useful); returns (per-seed rows, jobs)."""
    workers = workers or min(os.cpu_count() or 1, len(units))
    rows: list[dict] = []
    tables: list[pd.DataFrame] = []
    if workers <= 1 or len(units) == 1:
        results = map(run_unit, units)
        for unit, (r, t) in zip(units, results, strict=True):
            rows += r
            tables += t
            if on_done:
                on_done(unit)
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = pool.map(run_unit, units, chunksize=1)  # the workers are forked (all of them) here
            # aggregate() needs scipy.stats, ~1 s to import: import it now, while the workers simulate
            from scipy import stats  # noqa: F401

            for unit, (r, t) in zip(units, results, strict=True):
                rows += r
                tables += t
                if on_done:
                    on_done(unit)
    per_seed = pd.DataFrame(rows)
    jobs = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
    return per_seed, jobs


def aggregate(per_seed: pd.DataFrame, jobs: pd.DataFrame) -> pd.DataFrame:
    """summary.csv rows: means over seeds, standard deviations of JCT/TTFUC across seeds, and Welch's
    t-test of JCT against the same base scheduler without early stop. The test uses per-job JCTs
    pooled over seeds (every job is an observation), which is what gives the paper's p-values power
    with 5 seeds; runs without job tables fall back to per-seed means."""
    out = []
    for (exp, variant, sched), g in per_seed.groupby(["experiment", "variant", "scheduler"], sort=False):
        first = g.iloc[0]
        row = {
            "experiment": exp, "variant": variant, "scheduler": sched, "n_seeds": len(g),
            "jct_mean": g["jct"].mean(), "jct_std": g["jct"].std(ddof=1) if len(g) > 1 else 0.0,
            "ttfuc_mean": g["ttfuc"].mean(), "ttfuc_std": g["ttfuc"].std(ddof=1) if len(g) > 1 else 0.0,
            "wasted_frac": g["wasted_frac"].mean(), "saved_frac": g["saved_frac"].mean(),
            "precision": g["precision"].mean() if g["stopped"].sum() > 0 else np.nan,
            "recall": g["recall"].mean(), "fpr": g["fpr"].mean(),
            "stopped": g["stopped"].mean(), "jain": g["jain"].mean(), "jct_p_value": np.nan,
            **{c: g[c].mean() if c in g else np.nan for c in ("useful_recall", "false_stop_rate", "quality_kept")},
        }
        if first["early_stop"]:
            base_rows = per_seed[(per_seed.experiment == exp) & (per_seed.variant == variant)
                                 & (per_seed.scheduler == first["base_name"])]
            if len(base_rows):
                if len(jobs):
                    sel = (jobs.experiment == exp) & (jobs.variant == variant)
                    a = jobs.loc[sel & (jobs.scheduler == sched), "jct"].to_numpy()
                    b = jobs.loc[sel & (jobs.scheduler == first["base_name"]), "jct"].to_numpy()
                else:
                    a, b = g["jct"].to_numpy(), base_rows["jct"].to_numpy()
                if len(a) > 1 and len(b) > 1:
                    from scipy import stats  # here, not at import: scipy.stats alone takes ~1 s to import

                    row["jct_p_value"] = float(stats.ttest_ind(a, b, equal_var=False).pvalue)
        out.append(row)
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)
