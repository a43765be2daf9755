"""`rlhfops bench oppo`: sequential vs intra vs inter vs full OPPO, side by side, from one seed."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from common.errors import BadInput


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("oppo")
    def bench_oppo_cmd(
        quick: bool = typer.Option(False, "--quick", help="fewer steps (for CI and a first look)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here; the plot goes next to it (.png)"),
        config: Path = typer.Option(Path("configs/ppo-bench.yaml"), "--config", help="PPO config to benchmark"),
        steps: int = typer.Option(None, "--steps",
                                  help="steps per mode (default: the config's `steps`, or 30 with --quick)"),
        target_frac: float = typer.Option(0.7, "--target-frac",
                                          help="target = sequential start + this share of its best improvement"),
    ) -> None:
        """Run none/intra/inter/full PPO in round-robin; report time-to-reward, samples/s and speedups."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.table import Table

        from rlhfops.console import make_console
        from training.bench import bench_oppo, plot_bench
        from training.config import load_config

        if not 0.0 < target_frac <= 1.0:
            raise BadInput("--target-frac: must be in (0, 1]")
        if steps is not None and steps < 10:
            raise BadInput("--steps: need at least 10 steps per mode")
        from common.validate import check_out_file

        check_out_file(out, "out")
        if out is not None:
            check_out_file(out.with_suffix(".png"), "out (its .png plot)")
        cfg = load_config(config)
        n_steps = steps or (30 if quick else cfg.steps)
        smooth = 5 if quick else 8
        console = make_console()
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("none | intra | inter | full, round-robin", total=n_steps)
            result = bench_oppo(cfg, n_steps, smooth=smooth, target_frac=target_frac,
                                progress=lambda done, total: progress.update(task, completed=done))
        result["quick"] = quick
        table = Table(title=f"rlhfops bench oppo ({n_steps} steps per mode, target reward "
                            f"{result['target_reward']:+.3f})")
        for col in ("mode", "time-to-reward s", "steps-to-reward", "speedup", "step s", "samples/s",
                    "final train reward", "held-out proxy", "held-out gold", "rollout/score/optim share",
                    "Δ mean", "C"):
            table.add_column(col, justify="right")
        for mode, m in result["modes"].items():
            sp = result["speedup"].get(mode)
            ttr = m["time_to_reward_s"]
            share = m["phase_share"]
            table.add_row(
                mode, "not reached" if ttr is None else f"{ttr:.1f}", str(m["steps_to_reward"] or "-"),
                "1.00x" if mode == "none" else ("n/a" if sp is None else f"{sp:.2f}x"),
                f"{m['step_s_mean']:.3f}", f"{m['samples_per_s']:.1f}",
                f"{m['final_reward']:+.3f} ± {m['final_reward_se']:.3f}",
                f"{m['final_proxy_heldout']:+.3f} ± {m['final_proxy_heldout_se']:.3f}",
                f"{m['final_gold_heldout']:+.3f} ± {m['final_gold_heldout_se']:.3f}",
                f"{share['rollout']:.0%}/{share['score']:.0%}/{share['optim']:.0%}",
                f"{m['delta_mean']:.1f}", str(m["chunk_size_final"] or "-"),
            )
        console.print(table)
        w = result["workload"]
        console.print(f"workload (sequential run): {w['responses']} responses, median length {w['median_len']:.0f}, "
                      f"p90 {w['p90_len']:.0f}, max {w['max_len']}, {w['frac_ge_4x_median']:.1%} >= 4x median "
                      f"({'long-tailed' if w['long_tailed'] else 'NOT long-tailed: < 10%'}); first 10 steps: median "
                      f"{w['first10_median_len']:.0f}, {w['first10_frac_ge_4x_median']:.1%} >= 4x median")
        for mode in ("inter", "full"):
            h = result["modes"][mode]["deferral_histogram"]
            console.print(f"deferral ({mode}): 0 steps {h['0']:.1%}, 1 {h['1']:.1%}, 2 {h['2']:.1%}, "
                          f">=3 {h['3+']:.1%}, mean {h['mean']:.2f}")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2) + "\n")
            plot = out.with_suffix(".png")
            plot_bench(result, plot)
            console.print(f"wrote {out} and {plot}")
