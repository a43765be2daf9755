"""What `rlhfops bench sweep` and `bench sweep-replay` measure, without running anything: the four variants of one
sweep (no pruning, the incumbent pruner `eval.incumbent_pruner`, Optuna's `MedianPruner` and `WilcoxonPruner`),
each run's record, its GPU-seconds at the unpruned run's per-step prices, its savings against the unpruned run, the
bar the incumbent pruner is held to, and the replay of a recorded unpruned sweep under each pruner.

Plain Python: the sweeps themselves run in `tasks/bench_sweep.py` (MLflow tracking, the ledger), the CLI prints.
"""

from __future__ import annotations

import csv
import math
import os
import platform
from pathlib import Path

from common.errors import BadInput

#: the bench's runs, in the order they run: JSON key -> the sweep spec's `pruning.detector` (None: no pruning)
VARIANTS = {"unpruned": None, "pruned": "incumbent", "median": "median", "wilcoxon": "wilcoxon"}

#: the fields of each trial a run's record keeps
TRIAL_FIELDS = ("number", "params", "state", "objective", "objective_se", "best_step", "pruned_at", "stop_reason",
                "steps", "gpu_seconds", "wall_s")


def variant_spec(base, label: str, work: Path):
    """`base` as the bench runs it for the variant `label`: its own name and out_dir under `work`, the variant's
    pruner; the spec's own pruning params go to the pruner it names (the incumbent pruner's alpha and margin, say)."""
    from sweeps.spec import PruningSpec

    pruner = VARIANTS[label]
    params = dict(base.pruning.params) if pruner == base.pruning.detector else {}
    return base.model_copy(update={"name": f"{base.name}-{label}", "out_dir": str(Path(work) / label),
                                   "pruning": PruningSpec(detector=pruner or "none", params=params)})


def run_record(summary: dict, spec, prune: bool, load_avg_1m: list[float]) -> dict:
    """One run of the bench as its JSON holds it, from the sweep runner's summary."""
    best = summary.get("best") or {}
    return {"pruner": spec.pruning.detector if prune else "none",
            "pruning_params": dict(spec.pruning.params) if prune else {},
            "load_avg_1m": load_avg_1m,
            "gpu_seconds": summary["gpu_seconds"], "wall_s": summary["wall_s"], "trials": summary["trials_done"],
            "trials_pruned": summary["trials_pruned"], "trials_failed": summary["trials_failed"],
            "steps_trained": sum(t["steps"] for t in summary["trials"]),
            "best_score": best.get("objective", math.nan), "best_se": best.get("objective_se", math.nan),
            "best_trial": best.get("number"), "best_params": best.get("params"),
            "mlflow_run_id": summary.get("mlflow_run_id"),
            "per_trial": [{k: t[k] for k in TRIAL_FIELDS} for t in summary["trials"]]}


def step_costs(run_dir: Path) -> dict[tuple[int, int, int], float]:
    """(trial, seed index, step) -> the step's GPU-seconds (its timed phases, one GPU) from the trial run
    directories' `metrics.csv` under a sweep's `run_dir` (`trial-NNNN/seed-S/`)."""
    out = {}
    for path in sorted(Path(run_dir).glob("trial-*/seed-*/metrics.csv")):
        trial, seed = int(path.parent.parent.name.split("-")[1]), int(path.parent.name.split("-")[1])
        with path.open() as f:
            for row in csv.DictReader(f):
                out[(trial, seed, int(row["step"]))] = sum(float(v or 0.0) for k, v in row.items()
                                                           if k.startswith("phase_") and k.endswith("_s"))
    return out


def priced(runs: dict[str, dict], dirs: dict[str, Path], gpus_per_trial: int) -> None:
    """Each run's GPU-seconds at the unpruned run's prices, in place (`gpu_seconds_priced`): every step a run trained
    is charged what the same step (same trial settings, seed and step: the same computation, since the runs share the
    sampler seed and training is deterministic) cost in the unpruned run, so the comparison does not move with the
    machine's load between the four runs. A step the unpruned run has no price for (a setting it did not try) is
    charged as measured."""
    prices = step_costs(dirs["unpruned"])
    params = {t["number"]: t["params"] for t in runs["unpruned"]["per_trial"]}
    for label, r in runs.items():
        mine = {t["number"]: t["params"] for t in r["per_trial"]}
        total, unpriced = 0.0, 0
        for key, cost in step_costs(dirs[label]).items():
            same = mine.get(key[0]) == params.get(key[0])
            if same and key in prices:
                total += prices[key]
            else:
                total += cost
                unpriced += 1
        r["gpu_seconds_priced"] = total * gpus_per_trial
        r["steps_unpriced"] = unpriced


def compare(runs: dict[str, dict]) -> None:
    """Each run's savings against the unpruned one, in place: `gpu_seconds_saved_frac` (at the unpruned run's prices,
    `priced`; the saving as measured is `gpu_seconds_measured_saved_frac`), `steps_saved_frac`, `wall_saved_frac`,
    `best_score_gap` (unpruned best - this best) and `best_within_one_se` (gap within the unpruned best's SE)."""
    u = runs["unpruned"]
    for r in runs.values():
        up = u.get("gpu_seconds_priced", u["gpu_seconds"])
        r["gpu_seconds_saved_frac"] = 1 - r.get("gpu_seconds_priced", r["gpu_seconds"]) / up if up else math.nan
        r["gpu_seconds_measured_saved_frac"] = (1 - r["gpu_seconds"] / u["gpu_seconds"] if u["gpu_seconds"]
                                                else math.nan)
        r["steps_saved_frac"] = 1 - r["steps_trained"] / u["steps_trained"] if u["steps_trained"] else math.nan
        r["wall_saved_frac"] = 1 - r["wall_s"] / u["wall_s"] if u["wall_s"] else math.nan
        gap = u["best_score"] - r["best_score"]
        r["best_score_gap"] = gap
        r["best_within_one_se"] = bool(abs(gap) <= u["best_se"]) if math.isfinite(gap) else False


def acceptance(runs: dict[str, dict]) -> dict[str, bool]:
    """The bar the incumbent pruner (`pruned`) is held to: >= 40% of GPU-seconds saved, its best within one SE of
    the unpruned best, and more saved than Median and Wilcoxon at a best score no lower than theirs (the same bars
    on PPO steps, which the machine's load does not inflate, are reported beside them)."""
    p = runs["pruned"]
    out = {"gpu_seconds_saved_frac >= 0.40": bool(p["gpu_seconds_saved_frac"] >= 0.40),
           "|best gap| <= unpruned best SE": bool(p["best_within_one_se"])}
    for other in ("median", "wilcoxon"):
        o = runs[other]
        out[f"saves more GPU-seconds than {other}"] = bool(p["gpu_seconds_saved_frac"] > o["gpu_seconds_saved_frac"])
        out[f"saves more PPO steps than {other}"] = bool(p["steps_saved_frac"] > o["steps_saved_frac"])
        out[f"best score >= {other}'s"] = bool(p["best_score"] >= o["best_score"])
    return out


def bench_result(spec_path, base, runs: dict[str, dict]) -> dict:
    """The JSON of `bench sweep`: the spec, the four runs (priced and compared), the incumbent pruner's figures at
    the top level, the acceptance and the machine."""
    p = runs["pruned"]
    return {
        "spec": str(spec_path), "sampler": base.sampler.kind, "sampler_seed": base.sampler.seed,
        "trials": base.trials, "concurrency": base.concurrency, "pruner": "incumbent", "order": list(VARIANTS),
        **runs,
        # the incumbent pruner's figures at the top level, as before the comparison runs were added
        "gpu_seconds_saved_frac": p["gpu_seconds_saved_frac"], "wall_saved_frac": p["wall_saved_frac"],
        # GPU-seconds at the unpruned run's per-step prices and PPO steps do not move with the machine's load
        "steps_saved_frac": p["steps_saved_frac"], "best_score_gap": p["best_score_gap"],
        "best_within_one_se": p["best_within_one_se"], "acceptance": acceptance(runs),
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
    }


def recorded_trials(run_dir: Path) -> list:
    """The trials of an unpruned sweep's run directory (`trial-NNNN/seed-0/`: `gate_records.csv` and `metrics.csv`)
    as `eval.sweep_pruners.RecordedTrial`s (BadInput when there are none, or a trial has several seeds)."""
    from eval.sweep_pruners import RecordedTrial
    from training.gate import GATE_RECORDS, read_records

    costs = step_costs(run_dir)
    out = []
    for d in sorted(Path(run_dir).glob("trial-*")):
        if sorted(p.name for p in d.glob("seed-*")) != ["seed-0"]:
            raise BadInput(f"run-dir: {d} does not hold exactly one seed (seed-0): replay takes one-seed trials")
        number = int(d.name.split("-")[1])
        path = d / "seed-0" / GATE_RECORDS
        if not path.is_file():
            raise BadInput(f"run-dir: {path} is missing (replay needs each trial's gate records)")
        ckpts: dict[int, dict[str, float]] = {}
        for r in read_records(path):
            ckpts.setdefault(int(r["step"]), {})[str(r["prompt_id"])] = float(r["gold_score"])
        out.append(RecordedTrial(number, sorted(ckpts.items()),
                                 {s: c for (t, seed, s), c in costs.items() if t == number and seed == 0}))
    if not out:
        raise BadInput(f"run-dir: no trial-NNNN/seed-0 directories under {run_dir} (give an unpruned sweep's out_dir)")
    return out


def replay_result(run_dir, spec_path, base) -> dict:
    """The JSON of `bench sweep-replay`: the recorded unpruned sweep under `run_dir` replayed (no training) under
    each variant's pruner in `base`'s slots, the incumbent pruner with `base`'s params when it names that pruner;
    each with its PPO steps and GPU-seconds (at the recorded prices) saved against the unpruned replay."""
    from eval.sweep_pruners import make_pruner, replay

    trials = recorded_trials(run_dir)
    params = dict(base.pruning.params) if base.pruning.detector == "incumbent" else {}
    result = {"run_dir": str(run_dir), "spec": str(spec_path), "slots": base.parallel_trials}
    for label, name in VARIANTS.items():
        r = replay(trials, make_pruner(name or "none", params if name == "incumbent" else {}), base.parallel_trials)
        result[label] = {k: v for k, v in r.items() if k != "per_trial"}
        result[label]["per_trial"] = {str(n): v for n, v in r["per_trial"].items()}
    u = result["unpruned"]
    for label in VARIANTS:
        r = result[label]
        r["steps_saved_frac"] = 1 - r["steps_trained"] / u["steps_trained"]
        r["gpu_seconds_saved_frac"] = 1 - r["gpu_seconds"] / u["gpu_seconds"] if u["gpu_seconds"] else math.nan
    return result
