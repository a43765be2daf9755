"""`rlhfops sweep SPEC.yaml [--trials N] [--resume] [--no-prune]`: a team's own sweep over a base PPO job."""

from __future__ import annotations

import math
from pathlib import Path

import typer


def results_table(summary: dict, title: str):
    from rich.table import Table

    table = Table(title=title)
    trials = summary["trials"]
    params = sorted({k for t in trials for k in t["params"]})
    for col in ["trial", "state", *params, "held-out", "± SE", "best step", "pruned at", "GPU-s"]:
        table.add_column(col, justify="left" if col == "state" else "right")
    best = (summary.get("best") or {}).get("number")

    def f(v, fmt="{:.4g}"):
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return "—"
        return fmt.format(v) if isinstance(v, float) else str(v)

    for t in trials:
        mark = " *" if t["number"] == best else ""
        table.add_row(f"{t['number']}{mark}", t["state"], *[f(t["params"].get(p)) for p in params],
                      f(t["objective"], "{:+.3f}"), f(t["objective_se"], "{:.3f}"), f(t["best_step"]),
                      f(t["pruned_at"]), f(t["gpu_seconds"], "{:.1f}"))
    return table


def progress_events(console):
    """A progress display (`rlhfops.console.progress`: trials done / target, with running / pruned / GPU-hours on a
    terminal; plain lines otherwise) fed by the runner's events, the callback, and `begin(name, done, target)`,
    which starts the count."""
    from rlhfops.console import progress as progress_display

    progress = progress_display(console)
    state = {"started": False, "done": 0, "running": 0, "pruned": 0, "failed": 0, "gpu_s": 0.0}

    def status() -> str:
        return (f"running {state['running']}, pruned {state['pruned']}, failed {state['failed']}, "
                f"{state['gpu_s'] / 3600:.4f} GPU-h")

    def on_event(kind: str, info: dict) -> None:
        if kind == "trial_started":
            state["running"] += 1
        elif kind == "trial_finished":
            r = info["result"]
            state["running"] -= 1
            state["done"] += 1
            state["pruned"] += r.state == "pruned"
            state["failed"] += r.state == "failed"
            state["gpu_s"] += r.gpu_seconds
            where = f" at step {r.pruned_at}" if r.pruned_at is not None else ""
            score = f"held-out {r.objective:+.3f}" if math.isfinite(r.objective) else (r.error or "no score")
            console.print(f"trial {r.number} {r.state}{where}: {score}, {r.gpu_seconds:.1f} GPU-s")
        elif kind in ("budget", "warning"):
            console.print(f"[yellow]{info['message']}[/yellow]")
        if state["started"]:
            if kind == "trial_finished":
                progress.advance()
            progress.status(status())

    def begin(name: str, done: int, target: int) -> None:
        state["started"] = True
        progress.stage(f"sweep {name}: trials", target)
        progress.update(done)
        progress.status(status())

    return progress, on_event, begin


def register(app: typer.Typer) -> None:
    @app.command("sweep")
    def sweep_cmd(
        spec: Path = typer.Argument(..., help="sweep spec YAML, e.g. configs/sweeps/example.yaml"),
        trials: int = typer.Option(None, "--trials", help="finished trials the study should have (default: spec's)"),
        resume: bool = typer.Option(False, "--resume",
                                    help="continue (or, with a larger --trials, extend) the spec's existing study"),
        no_prune: bool = typer.Option(False, "--no-prune", help="run every trial to the end (no early stopping)"),
        out: Path = typer.Option(None, "--out", help="also write the summary JSON here"),
    ) -> None:
        """Run a sweep: Optuna samples the settings, each trial is a PPO job on the sweep's GPU slots, the platform's
        detector prunes over-optimising trials (keeping their best checkpoint), the budget stops new trials."""
        import json

        from common.validate import check_out_file
        from rlhfops.console import make_console
        from tasks.sweep import prepare, run_sweep

        check_out_file(out, "out")
        spec_obj, ledger = prepare(spec, trials)
        console = make_console()
        progress, on_event, begin = progress_events(console)
        started = {"done": False}

        def events(kind: str, info: dict) -> None:
            if not started["done"]:
                started["done"] = True
                begin(spec_obj.name, 0, trials or spec_obj.trials)
            on_event(kind, info)

        with progress:
            summary = run_sweep(spec_obj, ledger, prune=not no_prune, resume=resume, on_event=events)
        console.print(results_table(summary, f"sweep {summary['name']} ({summary['tenant']}): "
                                             f"{summary['trials_done']} trials, {summary['trials_pruned']} pruned"))
        best = summary.get("best")
        if summary.get("budget_stop"):
            console.print(f"[yellow]stopped starting trials: {summary['budget_stop']}[/yellow]")
        if best:
            reg = summary.get("registry") or {}
            console.print(f"best: trial {best['number']} held-out {best['objective']:+.4f} ± "
                          f"{best['objective_se']:.4f} at step {best['best_step']}"
                          + (f"; registered {reg['model']} v{reg['version']}" if reg else ""))
        console.print(f"GPU-hours {summary['gpu_seconds'] / 3600:.4f}; MLflow run {summary.get('mlflow_run_id')}; "
                      f"report {spec_obj.run_dir / 'report' / 'sweep.md'}")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(summary, indent=2, default=str) + "\n")
        if summary["trials_done"] == 0 or (best is None and summary["trials_failed"]):
            raise typer.Exit(1)
