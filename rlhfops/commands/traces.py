"""`rlhfops record-traces`: real PPO runs (the shipped hacking and healthy configs, several seeds) recorded
as one labelled Trace CSV, so every detector can be replayed on non-parametric curves."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import typer

from common.config import config_dir
from common.errors import BadInput
from rlhfops.console import make_console, progress

CONFIG_DIR = config_dir()
#: shipped configs and their labels (1: over-optimises the proxy, 0: healthy)
LABELLED_CONFIGS = {"ppo-hack": 1, "ppo-healthy": 0}


def record(configs: dict[str, int], seeds: list[int], steps: int | None, out_dir: Path, progress=None) -> pd.DataFrame:
    from training.job.config import load_config
    from training.trainer import train

    rows = []
    for name, label in configs.items():
        for seed in seeds:
            cfg = load_config(CONFIG_DIR / f"{name}.yaml", {"seed": seed})
            run_id = f"{name}/seed{seed}"
            for rec in train(cfg, overlap="none", out_dir=out_dir / name / f"seed{seed}", steps=steps, resume=False):
                if progress is not None:
                    progress()
                if math.isnan(rec.gold_eval):
                    continue
                rows.append({"run_id": run_id, "step": rec.step, "eval_score": rec.gold_eval,
                             "eval_se": rec.gold_eval_se, "reward": rec.reward_mean, "loss": rec.loss_policy,
                             "kl": rec.kl, "entropy": rec.entropy, "grad_norm": rec.grad_norm,
                             "response_len": rec.response_len_mean, "label": label})
    return pd.DataFrame(rows)


def register(app: typer.Typer) -> None:
    @app.command("record-traces")
    def record_traces_cmd(
        seeds: str = typer.Option("0,1,2", "--seeds", help="comma-separated training seeds per config"),
        steps: int = typer.Option(None, "--steps", help="PPO steps per run (default: the config's)"),
        out: Path = typer.Option(Path("results/traces/ppo-real.csv"), "--out", help="trace CSV to write"),
    ) -> None:
        """Train configs/ppo-hack.yaml (label 1) and configs/ppo-healthy.yaml (label 0) for each seed and write
        their eval-gate checkpoints as one Trace CSV (with the gate's standard error in `eval_se`)."""
        from rlhfops.commands.args import parse_seeds
        from training.job.config import load_config

        seed_list = parse_seeds(seeds)
        if not seed_list:
            raise BadInput("--seeds: give at least one seed")
        from common.validate import check_out_dir, check_out_file, check_seed

        for seed in seed_list:
            check_seed(seed, "seeds")
        check_out_file(out, "out")
        check_out_dir(out.parent / "runs", "out (its runs/ directory)")
        if steps is not None and steps < 1:
            raise BadInput("--steps must be >= 1")
        total = sum((steps or load_config(CONFIG_DIR / f"{n}.yaml").steps) for n in LABELLED_CONFIGS) * len(seed_list)
        console = make_console()
        with progress(console, "PPO steps", total=total) as shown:
            df = record(LABELLED_CONFIGS, seed_list, steps, out.parent / "runs", shown.advance)
        out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(out, index=False)
        console.print(f"[green]{df.run_id.nunique()} runs, {len(df)} eval checkpoints -> {out}[/]  "
                      f"(replay: rlhfops detect {out}; all detectors: rlhfops compare-detectors --traces {out})")
