"""`rlhfops bench sweep`: the example sweep run twice from the same sampler seed, with and without the platform's
detector as pruner: GPU-seconds, wall, trials pruned, best held-out score with its SE."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import typer

from common.errors import BadInput


def one_run(spec, ledger_factory, prune: bool, console) -> dict:
    from rlhfops.commands.sweep import progress_events, results_table
    from tasks.sweep import run_sweep

    progress, on_event, begin = progress_events(console)
    begin(spec.name, 0, spec.trials)
    with progress:
        summary = run_sweep(spec, ledger_factory(), prune=prune, resume=False, on_event=on_event)
    console.print(results_table(summary, f"{spec.name}: {'pruning' if prune else 'no pruning'}"))
    best = summary.get("best") or {}
    return {"gpu_seconds": summary["gpu_seconds"], "wall_s": summary["wall_s"], "trials": summary["trials_done"],
            "trials_pruned": summary["trials_pruned"], "trials_failed": summary["trials_failed"],
            "steps_trained": sum(t["steps"] for t in summary["trials"]),
            "best_score": best.get("objective", math.nan), "best_se": best.get("objective_se", math.nan),
            "best_trial": best.get("number"), "best_params": best.get("params"),
            "mlflow_run_id": summary.get("mlflow_run_id"),
            "per_trial": [{k: t[k] for k in ("number", "params", "state", "objective", "objective_se", "best_step",
                                             "pruned_at", "steps", "gpu_seconds", "wall_s")}
                          for t in summary["trials"]]}


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("sweep")
    def bench_sweep_cmd(
        spec: Path = typer.Option(Path("configs/sweeps/example.yaml"), "--spec", help="the sweep spec to run twice"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
        work: Path = typer.Option(Path("runs/bench-sweep"), "--work",
                                  help="where both sweeps keep their studies and trials (emptied first)"),
    ) -> None:
        """The same sweep and sampler seed with and without pruning: GPU-seconds saved, best score kept."""
        import json
        import platform

        from common.validate import check_out_dir, check_out_file
        from infra.ledger import Ledger, load_prices
        from rlhfops.console import make_console
        from sweeps.spec import trial_config
        from tasks.sweep import prepare

        check_out_file(out, "out")
        check_out_dir(work, "work")
        base, _ = prepare(spec)
        if base.storage:
            raise BadInput("spec: storage: the bench keeps its studies in --work; remove storage from the spec")
        console = make_console()
        shutil.rmtree(work, ignore_errors=True)
        # warm starts (the SFT'd base policy, the proxy reward model) are built once, outside both timings
        from training.trainer import Trainer

        Trainer(trial_config(base, {k: p.candidates()[0] for k, p in base.space.items()}), base.overlap, None)
        runs = {}
        for label, prune in (("pruned", True), ("unpruned", False)):
            spec_run = base.model_copy(update={"name": f"{base.name}-{label}", "out_dir": str(work / label)})
            runs[label] = one_run(spec_run, lambda: Ledger(load_prices()), prune, console)
        p, u = runs["pruned"], runs["unpruned"]
        saved = 1 - p["gpu_seconds"] / u["gpu_seconds"] if u["gpu_seconds"] else math.nan
        gap = u["best_score"] - p["best_score"]
        result = {
            "spec": str(spec), "sampler": base.sampler.kind, "sampler_seed": base.sampler.seed,
            "trials": base.trials, "concurrency": base.concurrency, "pruner": base.pruning.detector,
            "pruned": p, "unpruned": u, "gpu_seconds_saved_frac": saved,
            "wall_saved_frac": 1 - p["wall_s"] / u["wall_s"] if u["wall_s"] else math.nan,
            # PPO steps are not inflated by other load on the machine, GPU-seconds (timed phases) are
            "steps_saved_frac": 1 - p["steps_trained"] / u["steps_trained"] if u["steps_trained"] else math.nan,
            "best_score_gap": gap,
            "best_within_one_se": bool(abs(gap) <= u["best_se"]) if math.isfinite(gap) else False,
            "acceptance": {"gpu_seconds_saved_frac >= 0.30": bool(saved >= 0.30),
                           "|best gap| <= unpruned best SE": bool(abs(gap) <= u["best_se"])},
            "python": platform.python_version(), "machine": platform.machine(),
        }
        console.print(f"GPU-seconds: pruned {p['gpu_seconds']:.1f}, unpruned {u['gpu_seconds']:.1f} "
                      f"({saved:.1%} saved); wall {p['wall_s']:.0f}s vs {u['wall_s']:.0f}s; "
                      f"{p['trials_pruned']} of {p['trials']} trials pruned")
        console.print(f"best held-out: pruned {p['best_score']:+.4f} ± {p['best_se']:.4f}, unpruned "
                      f"{u['best_score']:+.4f} ± {u['best_se']:.4f} (gap {gap:+.4f}: "
                      f"{'within' if result['best_within_one_se'] else 'outside'} one SE)")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2, default=str) + "\n")
