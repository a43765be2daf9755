"""`rlhfops train CONFIG`: one PPO job with OPPO overlap; checkpoints and a per-step metrics CSV."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from common.errors import BadInput

OVERLAP_HELP = ("none: sequential PPO; intra: stream C-token chunks to the reward/reference/critic while "
                "decoding; inter: start B+Delta prompts, train on the first B to finish, defer the rest; "
                "full: both (OPPO)")


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        ctx: typer.Context,
        config: Path = typer.Argument(..., help="PPO config YAML, e.g. configs/ppo-tiny.yaml"),
        overlap: str = typer.Option("full", "--overlap", help=OVERLAP_HELP),
        steps: int = typer.Option(None, "--steps", help="total PPO steps (default: the config's `steps`)"),
        out: Path = typer.Option(None, "--out", help="run directory (default runs/<config-stem>-<overlap>/)"),
        fresh: bool = typer.Option(False, "--fresh", help="ignore checkpoints in the run directory and start over"),
        trace: Path = typer.Option(None, "--trace", help="also write the run as a Trace CSV (DESIGN.md) here"),
        label: int = typer.Option(None, "--label", help="Trace CSV label for this run: 1 hacking, 0 healthy"),
    ) -> None:
        """Train a policy with PPO (+ OPPO overlap); writes OUT/metrics.csv, OUT/checkpoints/, OUT/summary.json."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        from rlhfops.console import make_console
        from training.config import load_config
        from training.rundir import locked_run_dir

        if steps is not None and not 1 <= steps <= 10_000_000:
            raise BadInput("--steps: must be between 1 and 10,000,000 (the config's bound on steps)")
        if label not in (None, 0, 1):
            raise BadInput("--label: must be 0 (healthy) or 1 (hacking)")
        from common.validate import check_out_dir, check_out_file

        cfg = load_config(config)
        out = out or Path("runs") / f"{config.stem}-{overlap}"
        check_out_dir(out, "out")
        check_out_file(trace, "trace")
        # torch: only once the config is known good, so a config error is reported in under a second
        from training.trace import export_trace
        from training.trainer import Trainer, check_overlap

        check_overlap(overlap)
        # one writer per run directory, held until the command ends (a second one exits 2 naming the holder)
        ctx.with_resource(locked_run_dir(out, "--out"))
        if fresh and out.exists():
            import shutil

            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            (out / "metrics.csv").unlink(missing_ok=True)
        console = make_console()
        trainer = Trainer(cfg, overlap, out, resume=not fresh, progress=lambda m: console.print(f"[dim]{m}[/dim]"))
        total = steps or cfg.steps
        first = trainer.step
        last = None
        best_gold = (-math.inf, 0)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("{task.fields[info]}"), console=console) as progress:
            task = progress.add_task(f"PPO {overlap}", total=total, completed=first, info="")
            for rec in trainer.run(total):
                last = rec
                if not math.isnan(rec.gold_eval) and rec.gold_eval > best_gold[0]:
                    best_gold = (rec.gold_eval, rec.step)
                gold = "" if math.isnan(rec.gold_eval) else f" gold {rec.gold_eval:+.3f}"
                progress.update(task, completed=rec.step,
                                info=f"reward {rec.reward_mean:+.3f}{gold} kl {rec.kl:.2f} Δ {rec.delta}")
        if last is None:
            console.print(f"nothing to do: {out} already holds step {first} of {total}")
            return
        console.print(
            f"[bold]{overlap}[/bold] steps {first + 1}-{last.step} in {last.wall_s:.1f}s train wall | "
            f"final reward {last.reward_mean:+.3f} | best gold {best_gold[0]:+.3f} @ step {best_gold[1]} | "
            f"run dir {out}"
        )
        if trace:
            n = export_trace(out / "metrics.csv", trace, run_id=f"{config.stem}-{overlap}", label=label)
            console.print(f"trace: {n} rows -> {trace}")
