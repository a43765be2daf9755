"""`rlhfops bench sweep`: the example sweep run four times from the same sampler seed, in one process: without
pruning, with the incumbent pruner (`eval.incumbent_pruner`: paired per-prompt evidence against the best finished
trial), with Optuna's `MedianPruner` and with its `WilcoxonPruner`: GPU-seconds, PPO steps, wall, trials pruned,
best held-out score with its SE, and the machine's load average around each run. `bench sweep-replay` replays a
recorded unpruned sweep under the same pruners. The measurement is `sweeps/bench.py` and `tasks/bench_sweep.py`;
this module parses, calls and prints."""

from __future__ import annotations

from pathlib import Path

import typer


def shown_sweep(console):
    """`tasks.bench_sweep.run_bench`'s `sweep` with the sweep's progress display and, after it, its trials."""

    def sweep(spec, ledger, prune: bool) -> dict:
        from rlhfops.commands.sweep import progress_events, results_table
        from tasks.sweep import run_sweep

        progress, on_event, begin = progress_events(console)
        begin(spec.name, 0, spec.trials)
        with progress:
            summary = run_sweep(spec, ledger, prune=prune, resume=False, on_event=on_event)
        console.print(results_table(summary, f"{spec.name}: pruner {spec.pruning.detector if prune else 'none'}"))
        return summary

    return sweep


def write_json(result: dict, out: Path | None) -> None:
    import json

    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")


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
        from common.validate import check_out_file
        from rlhfops.console import make_console
        from sweeps.bench import VARIANTS, replay_result
        from tasks.sweep import prepare

        check_out_file(out, "out")
        base, _ = prepare(spec, None)
        result = replay_result(run_dir, spec, base)
        console = make_console()
        for label in VARIANTS:
            r = result[label]
            console.print(f"{label:>9}: PPO steps {r['steps_trained']} ({r['steps_saved_frac']:.1%} saved), GPU-s "
                          f"{r['gpu_seconds']:.1f} ({r['gpu_seconds_saved_frac']:.1%} saved), {r['trials_pruned']} "
                          f"pruned, best {r['best_score']:+.4f} (trial {r['best_trial']})")
        write_json(result, out)

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
        from common.validate import check_out_dir, check_out_file
        from rlhfops.console import make_console
        from sweeps.bench import bench_result
        from tasks.bench_sweep import run_bench
        from tasks.sweep import prepare

        check_out_file(out, "out")
        check_out_dir(work, "work")
        base, _ = prepare(spec, trials)
        console = make_console()
        runs = run_bench(base, work, shown_sweep(console))
        result = bench_result(spec, base, runs)
        for label, r in runs.items():
            console.print(f"{label:>9} ({r['pruner']}): GPU-s at unpruned prices {r['gpu_seconds_priced']:.1f} "
                          f"({r['gpu_seconds_saved_frac']:.1%} saved; measured {r['gpu_seconds']:.1f}, "
                          f"{r['gpu_seconds_measured_saved_frac']:.1%}), PPO steps {r['steps_trained']} "
                          f"({r['steps_saved_frac']:.1%} saved), "
                          f"{r['trials_pruned']} of {r['trials']} pruned, best {r['best_score']:+.4f} ± "
                          f"{r['best_se']:.4f}, load {r['load_avg_1m'][0]:.1f}-{r['load_avg_1m'][1]:.1f}")
        verdicts = result["acceptance"].items()
        console.print("acceptance: " + ", ".join(f"{k}: {'yes' if v else 'NO'}" for k, v in verdicts))
        write_json(result, out)
