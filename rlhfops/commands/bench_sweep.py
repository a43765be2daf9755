"""`rlhfops bench sweep`: the example sweep run four times from the same sampler seed, in one process: without
pruning, with the incumbent pruner (`eval.incumbent_pruner`: paired per-prompt evidence against the best finished
trial), with Optuna's `MedianPruner` and with its `WilcoxonPruner`: GPU-seconds, PPO steps, wall, trials pruned,
best held-out score with its SE, and the machine's load average around each run."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import typer

from common.errors import BadInput

#: the bench's runs, in the order they run: JSON key -> the sweep spec's `pruning.detector` (None: no pruning)
VARIANTS = {"unpruned": None, "pruned": "incumbent", "median": "median", "wilcoxon": "wilcoxon"}


def one_run(spec, ledger_factory, prune: bool, console) -> dict:
    import os

    from rlhfops.commands.sweep import progress_events, results_table
    from tasks.sweep import run_sweep

    progress, on_event, begin = progress_events(console)
    begin(spec.name, 0, spec.trials)
    load_before = os.getloadavg()[0]
    with progress:
        summary = run_sweep(spec, ledger_factory(), prune=prune, resume=False, on_event=on_event)
    pruner = spec.pruning.detector if prune else "none"
    console.print(results_table(summary, f"{spec.name}: pruner {pruner}"))
    best = summary.get("best") or {}
    return {"pruner": pruner, "pruning_params": dict(spec.pruning.params) if prune else {},
            "load_avg_1m": [load_before, os.getloadavg()[0]],
            "gpu_seconds": summary["gpu_seconds"], "wall_s": summary["wall_s"], "trials": summary["trials_done"],
            "trials_pruned": summary["trials_pruned"], "trials_failed": summary["trials_failed"],
            "steps_trained": sum(t["steps"] for t in summary["trials"]),
            "best_score": best.get("objective", math.nan), "best_se": best.get("objective_se", math.nan),
            "best_trial": best.get("number"), "best_params": best.get("params"),
            "mlflow_run_id": summary.get("mlflow_run_id"),
            "per_trial": [{k: t[k] for k in ("number", "params", "state", "objective", "objective_se", "best_step",
                                             "pruned_at", "stop_reason", "steps", "gpu_seconds", "wall_s")}
                          for t in summary["trials"]]}


def step_costs(run_dir: Path) -> dict[tuple[int, int, int], float]:
    """(trial, seed index, step) -> the step's GPU-seconds (its timed phases, one GPU) from the trial run
    directories' `metrics.csv` under a sweep's `run_dir` (`trial-NNNN/seed-S/`)."""
    import csv

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


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("sweep-replay")
    def bench_sweep_replay_cmd(
        run_dir: Path = typer.Option(..., "--run-dir", help="an unpruned sweep's out_dir (or bench sweep's "
                                                              "<work>/unpruned)"),
        spec: Path = typer.Option(Path("configs/sweeps/example.yaml"), "--spec",
                                  help="the spec whose slots and incumbent-pruner params to use"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """Replay a recorded unpruned sweep under the incumbent pruner, Median and Wilcoxon (no training): PPO steps
        and GPU-seconds (at the recorded prices) saved, and the best kept score, for each."""
        import json

        from common.validate import check_out_file
        from eval.sweep_pruners import make_pruner, replay
        from rlhfops.console import make_console
        from tasks.sweep import prepare

        check_out_file(out, "out")
        base, _ = prepare(spec, None)
        trials = recorded_trials(run_dir)
        console = make_console()
        params = dict(base.pruning.params) if base.pruning.detector == "incumbent" else {}
        result = {"run_dir": str(run_dir), "spec": str(spec), "slots": base.parallel_trials}
        for label, name in VARIANTS.items():
            r = replay(trials, make_pruner(name or "none", params if name == "incumbent" else {}), base.parallel_trials)
            result[label] = {k: v for k, v in r.items() if k != "per_trial"}
            result[label]["per_trial"] = {str(n): v for n, v in r["per_trial"].items()}
        u = result["unpruned"]
        for label in VARIANTS:
            r = result[label]
            r["steps_saved_frac"] = 1 - r["steps_trained"] / u["steps_trained"]
            r["gpu_seconds_saved_frac"] = 1 - r["gpu_seconds"] / u["gpu_seconds"] if u["gpu_seconds"] else math.nan
            console.print(f"{label:>9}: PPO steps {r['steps_trained']} ({r['steps_saved_frac']:.1%} saved), GPU-s "
                          f"{r['gpu_seconds']:.1f} ({r['gpu_seconds_saved_frac']:.1%} saved), {r['trials_pruned']} "
                          f"pruned, best {r['best_score']:+.4f} (trial {r['best_trial']})")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2, default=str) + "\n")


    @bench_app.command("sweep")
    def bench_sweep_cmd(
        spec: Path = typer.Option(Path("configs/sweeps/example.yaml"), "--spec",
                                  help="the sweep spec to run four times"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
        work: Path = typer.Option(Path("runs/bench-sweep"), "--work",
                                  help="where the four sweeps keep their studies and trials (emptied first)"),
        trials: int = typer.Option(None, "--trials", help="trials per sweep (default: the spec's)"),
    ) -> None:
        """The same sweep and sampler seed without pruning, with the incumbent pruner, Optuna's Median and Wilcoxon
        pruners: GPU-seconds and PPO steps saved, best score kept."""
        import json
        import platform

        from common.validate import check_out_dir, check_out_file
        from infra.ledger import Ledger, load_prices
        from rlhfops.console import make_console
        from sweeps.spec import PruningSpec, trial_config
        from tasks.sweep import prepare

        check_out_file(out, "out")
        check_out_dir(work, "work")
        base, _ = prepare(spec, trials)
        if base.storage:
            raise BadInput("spec: storage: the bench keeps its studies in --work; remove storage from the spec")
        console = make_console()
        shutil.rmtree(work, ignore_errors=True)
        # warm starts (the SFT'd base policy, the proxy reward model) are built once, outside every timing
        from training.trainer import Trainer

        Trainer(trial_config(base, {k: p.candidates()[0] for k, p in base.space.items()}), base.overlap, None)
        runs, dirs = {}, {}
        for label, pruner in VARIANTS.items():
            # the spec's own params go to the pruner it names (the incumbent pruner's alpha and margin, say)
            params = dict(base.pruning.params) if pruner == base.pruning.detector else {}
            spec_run = base.model_copy(update={"name": f"{base.name}-{label}", "out_dir": str(work / label),
                                               "pruning": PruningSpec(detector=pruner or "none", params=params)})
            runs[label] = one_run(spec_run, lambda: Ledger(load_prices()), pruner is not None, console)
            dirs[label] = spec_run.run_dir
        priced(runs, dirs, base.gpus_per_trial)
        compare(runs)
        p = runs["pruned"]
        result = {
            "spec": str(spec), "sampler": base.sampler.kind, "sampler_seed": base.sampler.seed,
            "trials": base.trials, "concurrency": base.concurrency, "pruner": "incumbent", "order": list(VARIANTS),
            **runs,
            # the incumbent pruner's figures at the top level, as before the comparison runs were added
            "gpu_seconds_saved_frac": p["gpu_seconds_saved_frac"], "wall_saved_frac": p["wall_saved_frac"],
            # GPU-seconds at the unpruned run's per-step prices and PPO steps do not move with the machine's load
            "steps_saved_frac": p["steps_saved_frac"], "best_score_gap": p["best_score_gap"],
            "best_within_one_se": p["best_within_one_se"], "acceptance": acceptance(runs),
            "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        }
        for label, r in runs.items():
            console.print(f"{label:>9} ({r['pruner']}): GPU-s at unpruned prices {r['gpu_seconds_priced']:.1f} "
                          f"({r['gpu_seconds_saved_frac']:.1%} saved; measured {r['gpu_seconds']:.1f}, "
                          f"{r['gpu_seconds_measured_saved_frac']:.1%}), PPO steps {r['steps_trained']} "
                          f"({r['steps_saved_frac']:.1%} saved), "
                          f"{r['trials_pruned']} of {r['trials']} pruned, best {r['best_score']:+.4f} ± "
                          f"{r['best_se']:.4f}, load {r['load_avg_1m'][0]:.1f}-{r['load_avg_1m'][1]:.1f}")
        verdicts = result["acceptance"].items()
        console.print("acceptance: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdicts))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2, default=str) + "\n")
