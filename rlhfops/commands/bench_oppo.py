"""`rlhfops bench oppo`: sequential vs intra vs inter vs full OPPO over several seeds, interleaved, with the noise of
every ratio, the machine's load, and a comparison with a baseline JSON (exit 1 when a ratio regressed)."""

from __future__ import annotations

from pathlib import Path

import typer

from common.errors import BadInput


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("oppo")
    def bench_oppo_cmd(
        quick: bool = typer.Option(False, "--quick", help="30 steps per run, smoothing 5 (CI, nightly, a first look)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here; the plot goes next to it (.png)"),
        config: Path = typer.Option(Path("configs/ppo-bench.yaml"), "--config", help="PPO config to benchmark"),
        steps: int = typer.Option(None, "--steps",
                                  help="steps per run (default: the config's `steps`, or 30 with --quick)"),
        seeds: int = typer.Option(3, "--seeds", help="seeds per mode (the config's seed, then the next ones)"),
        gate_every: int = typer.Option(5, "--gate-every", help="steps between held-out gold gates"),
        device: str = typer.Option(None, "--device", help="auto, cpu, cuda or cuda:N (replaces the config's)"),
        dtype: str = typer.Option(None, "--dtype", help="float32 or bfloat16; replaces the config's `dtype`"),
        target_frac: float = typer.Option(0.7, "--target-frac",
                                          help="targets = sequential start + this share of its best improvement"),
        baseline: Path = typer.Option(None, "--baseline",
                                      help="an earlier run's JSON (same settings): say which ratio fell beyond its "
                                           "noise; exit 1 if one did"),
        ablation: bool = typer.Option(False, "--ablation",
                                      help="instead of the four modes: sequential, then full overlap with each "
                                           "correction (none, tis, decoupled) at staleness bounds 1 and 4"),
        threads: int = typer.Option(0, "--threads",
                                    help="also run sequential and inter with this many torch threads beside the "
                                         "config's (the thread-count check of docs/oppo.md)"),
        also_config: Path = typer.Option(None, "--also-config", help="a config on the same task (e.g. GRPO's): its "
                                         "sequential and full runs against this config's targets"),
        slow_intra: float = typer.Option(0.0, "--slow-intra", hidden=True,
                                         help="demonstration fault: the intra mode sleeps this many seconds per "
                                              "decoded chunk (shows the --baseline check flagging a slowed path)"),
    ) -> None:
        """Run the OPPO modes round-robin over seeds; time to proxy and held-out gold targets, final held-out gold,
        tokens; every ratio as its median, min and max over seeds; the load average while it ran."""
        from rich.table import Table

        from common.validate import check_out_file
        from rlhfops.console import make_console, progress
        from training.benches.baseline import bench_settings, read_baseline, same_task
        from training.job.config import load_config
        from training.job.device import check_named_cuda

        if not 0.0 < target_frac <= 1.0:
            raise BadInput("--target-frac: must be in (0, 1]")
        if steps is not None and steps < 10:
            raise BadInput("--steps: need at least 10 steps per mode")
        if not 1 <= seeds <= 20:
            raise BadInput("--seeds: need 1 to 20 seeds")
        if gate_every < 1:
            raise BadInput("--gate-every: need at least 1")
        if not 0 <= threads <= 64:
            raise BadInput("--threads: a torch thread count in 1..64 (0: no extra runs)")
        if threads and ablation:
            raise BadInput("--threads: not with --ablation (one variant set at a time)")
        if not 0.0 <= slow_intra <= 10.0:
            raise BadInput("--slow-intra: seconds per chunk in [0, 10]")
        check_out_file(out, "out")
        if out is not None:
            check_out_file(out.with_suffix(".png"), "out (its .png plot)")
        overrides = {k: v for k, v in (("device", device), ("dtype", dtype)) if v is not None}
        cfg = load_config(config, overrides or None)
        other = also_config and same_task(load_config(also_config, overrides or None), cfg, "--also-config")
        check_named_cuda(cfg.device, "--device" if device else "device")  # before any model is built
        settings = bench_settings(cfg, quick, steps=steps, seeds=seeds, gate_every=gate_every,
                                  target_frac=target_frac)
        base = read_baseline(baseline, settings, "--baseline") if baseline is not None else None
        # torch: only once the config and baseline are known good, so an error is reported in about a second
        from training.benches.oppo import (
            DEFAULT_VARIANTS,
            Variant,
            ablation_variants,
            config_variants,
            format_mean_se,
            format_ratio,
            load_lines,
            regression_check,
        )

        n_steps, seed_list = settings["steps"], settings["seeds"]
        variants = ablation_variants() if ablation else DEFAULT_VARIANTS
        if threads:
            variants = variants + tuple(Variant(f"{mode}-{threads}threads", mode, {"oppo.torch_threads": threads})
                                        for mode in ("none", "inter"))
        if other:
            variants = variants + config_variants(other)
        console = make_console()
        what = f"steps ({len(variants)} variants x {seeds} seeds, round-robin)"
        with progress(console, what, total=n_steps) as shown:
            result = regression_check(cfg, settings, base, str(baseline), out, quick=quick, variants=variants,
                                      slow_intra_s=slow_intra, progress=lambda done, _total: shown.update(done))
        ref = result["reference"]
        table = Table(title=f"rlhfops bench oppo ({n_steps} steps per run, seeds {seed_list}; mean ± SE over seeds; "
                            "ratios: median \\[min-max] over seeds)")
        for col in ("mode", "time to gold s", "time to proxy s", "speedup gold", "speedup proxy", "step speedup",
                    "final held-out gold", "tokens generated", "tokens trained", "step s", "ESS min",
                    "rollout/score/optim"):
            table.add_column(col, justify="right")
        for label, m in result["modes"].items():
            r = {k: result["ratios"][k].get(label) for k in ("speedup_gold", "speedup", "step_time_speedup")}
            one = "1.00x" if label == ref else None
            share = m["phase_share"]
            table.add_row(
                label, format_mean_se(m, "time_to_gold_s"), format_mean_se(m, "time_to_reward_s"),
                *(one or format_ratio(r[k], lbracket="\\[") for k in ("speedup_gold", "speedup", "step_time_speedup")),
                format_mean_se(m, "final_gold_heldout", 3), format_mean_se(m, "tokens_generated", 0),
                format_mean_se(m, "tokens_trained", 0),
                f"{m['step_s_mean']:.3f}", f"{m['is_ess_min']:.2f}",
                f"{share['rollout']:.0%}/{share['score']:.0%}/{share['optim']:.0%}",
            )
        console.print(table)
        for line in load_lines(result):
            console.print(line)
        for label, g in result["final_gold_gap"].items():
            se = f" ± {g['se']:.3f}" if g["se"] is not None else ""
            console.print(f"final held-out gold {label} - {ref}: {g['mean']:+.3f}{se} (paired by seed)")
        w = result["workload"]
        console.print(f"workload ({ref} runs): {w['responses']} responses, median length {w['median_len']:.0f}, "
                      f"p90 {w['p90_len']:.0f}, max {w['max_len']}, {w['frac_ge_4x_median']:.1%} >= 4x median")
        regressed = []
        if base is not None:
            rows = result["baseline_comparison"]["rows"]
            cmp = Table(title=f"against {baseline} (regressed: current seeds all below the baseline's, median down "
                              "> 10%)")
            for col in ("ratio", "baseline median \\[range]", "now median \\[range]", "change", "verdict"):
                cmp.add_column(col, justify="right")
            for row in rows:
                if row["current_median"] is None or row["baseline_median"] is None:
                    cmp.add_row(row["ratio"], "n/a", "n/a", "-", "not compared (target not reached)")
                    continue
                b, c = row["baseline_range"], row["current_range"]
                cmp.add_row(row["ratio"], f"{row['baseline_median']:.2f} \\[{b[0]:.2f}-{b[1]:.2f}]",
                            f"{row['current_median']:.2f} \\[{c[0]:.2f}-{c[1]:.2f}]", f"{row['change']:+.0%}",
                            "REGRESSED" if row["regressed"] else "within noise")
            console.print(cmp)
            regressed = result["baseline_comparison"]["regressed"]
            console.print(f"regressed beyond noise: {', '.join(regressed)}" if regressed
                          else "no ratio fell beyond its noise")
        if out is not None:
            console.print(f"wrote {out} and {out.with_suffix('.png')}")
        if regressed:
            raise typer.Exit(1)
