"""`rlhfops bench gain`: the held-out gate score of a job's warm start against the trained policy, per seed, paired
per prompt (training/benches/gain.py). Exit 1 when a seed's gain is not above `--z` standard errors."""

from __future__ import annotations

from pathlib import Path

import typer

from common.errors import BadInput


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("gain")
    def bench_gain_cmd(
        config: Path = typer.Option(Path("configs/ppo-arith.yaml"), "--config", help="the job's config"),
        seeds: int = typer.Option(3, "--seeds", help="seeds (the config's seed, then the next ones)"),
        overlap: str = typer.Option("full", "--overlap", help="none, intra, inter or full"),
        steps: int = typer.Option(None, "--steps", help="training steps (default: the config's)"),
        z: float = typer.Option(2.0, "--z", help="standard errors a seed's gain must exceed"),
        set_: list[str] = typer.Option([], "--set", help="a dotted config override, e.g. ppo.actor_lr=3e-5 "
                                       "(repeatable)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """Warm start vs trained policy on every held-out prompt, per seed: gain, its standard error, z, wall."""
        from common.validate import check_out_file
        from rlhfops.commands.bench import write_json
        from rlhfops.console import make_console
        from training.job.config import load_config
        from training.trainer import check_overlap

        if not 1 <= seeds <= 20:
            raise BadInput("--seeds: need 1 to 20 seeds")
        if steps is not None and steps < 1:
            raise BadInput("--steps: need at least 1")
        if not 0 < z <= 10:
            raise BadInput("--z: a number of standard errors in (0, 10]")
        check_overlap(overlap)
        if out is not None:
            check_out_file(out, "--out")
        from common.config import parse_overrides

        overrides = parse_overrides(set_)
        cfg = load_config(config, overrides)
        from training.inputs.job_inputs import check_inputs

        check_inputs(cfg)
        from training.benches.gain import bench_gain

        console = make_console()
        result = bench_gain(config, [cfg.seed + k for k in range(seeds)], overlap, steps, z,
                            say=lambda m: console.print(m, highlight=False), overrides=overrides)
        write_json(result, out)
        for r in result["seeds"]:
            console.print(f"seed {r['seed']}: {r['start']:.3f} ± {r['start_se']:.3f} -> {r['final']:.3f} ± "
                          f"{r['final_se']:.3f}; gain {r['gain']:+.3f} ± {r['gain_se']:.3f} (z {r['z']:.1f}, "
                          f"{'passed' if r['passed'] else 'NOT above ' + str(z) + ' SE'}); {r['wall_s']:.0f} s")
        if not result["passed"]:
            raise typer.Exit(1)
