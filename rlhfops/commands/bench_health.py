"""`rlhfops bench health`: the run-health catalog over a 10,000-run x 1,000-step fleet (target < 1 s)."""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np
import typer

TARGET_S = 1.0


def bench_health(runs: int, steps: int, repeats: int, workers: int, seed: int = 0, progress=None) -> dict:
    """Time `Catalog.scan` on a synthetic fleet; report detection quality and a streaming cross-check. `progress`:
    a `rlhfops.console.Progress` told each stage (outside the timed scans)."""
    from eval.health import FAULTS, Catalog, measure_false_positive_rates, replay_alert, synthetic_fleet

    def stage(name: str, total: int | None = None) -> None:
        if progress is not None:
            progress.stage(name, total)

    catalog = Catalog.from_file()
    stage(f"synthetic fleet: {runs:,} runs x {steps:,} steps")
    t0 = time.perf_counter()
    series, kind, onset = synthetic_fleet(runs, steps, seed=seed)
    gen_s = time.perf_counter() - t0
    walls, cpus = [], []
    first = {}
    stage("catalog scans (timed)", repeats)
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        first = catalog.scan(series, workers=workers)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        if progress is not None:
            progress.advance()
    stage("each alert alone, quality, streaming cross-check")
    per_alert = {}
    for name, alert in catalog.alerts.items():  # single-threaded, one alert at a time
        w0 = time.perf_counter()
        alert.scan(series)
        per_alert[name] = round(time.perf_counter() - w0, 4)
    healthy = kind == "healthy"
    quality = {}
    for name in catalog.alerts:
        fired = first[name] >= 0
        own = kind == name
        lag = first[name][own & fired] - onset[own & fired]
        quality[name] = {
            "false_positive_rate": float(fired[healthy].mean()),
            "recall_on_own_fault": float(fired[own].mean()) if own.any() else None,
            "median_lag_steps": float(np.median(lag)) if lag.size else None,
            "fired_on_other_faults": float(fired[other].mean()) if (other := ~healthy & ~own).any() else None,
        }
    # streaming cross-check on a sample of runs: monitors must agree with the vectorised scan
    rng = np.random.default_rng(seed)
    sample = rng.choice(runs, size=min(runs, 40), replace=False)
    mismatches = 0
    for r in sample:
        run = {k: v[r] for k, v in series.items()}
        for name, alert in catalog.alerts.items():
            mismatches += int(replay_alert(alert, run)[0] != first[name][r])
    stage("recorded false-positive rates")
    recorded = measure_false_positive_rates(catalog)
    return {
        "runs": runs, "steps": steps, "points": runs * steps, "workers": workers, "repeats": repeats,
        "catalog_wall_s": min(walls), "catalog_wall_s_all": [round(w, 4) for w in walls],
        "catalog_cpu_s": min(cpus), "target_s": TARGET_S, "under_target": min(walls) < TARGET_S,
        "per_alert_single_thread_s": per_alert, "fleet_generation_s": round(gen_s, 3),
        "fleet_mix": {k: int((kind == k).sum()) for k in FAULTS},
        "quality": quality,
        "streaming_crosscheck": {
            "runs": len(sample), "alerts": len(catalog.alerts), "mismatches": mismatches,
        },
        "recorded_fpr_2000_healthy_runs": recorded,
        "python": platform.python_version(), "numpy": np.__version__, "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("health")
    def bench_health_cmd(
        runs: int = typer.Option(10_000, "--runs", help="runs in the synthetic fleet"),
        steps: int = typer.Option(1_000, "--steps", help="steps per run"),
        repeats: int = typer.Option(
            5, "--repeats", help="timed repetitions of the catalog scan (best is reported)"
        ),
        workers: int = typer.Option(2, "--workers", help="threads sharing the scan (numpy releases the GIL)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """Run every catalog alert over runs x steps (vectorised); report wall time against the 1 s target,
        false-positive rate and recall per alert, and a streaming-vs-batch cross-check."""
        from rich.table import Table

        from common.errors import BadInput
        from common.validate import check_memory, check_out_file, check_workers
        from rlhfops.commands.bench import write_json
        from rlhfops.console import make_console, progress

        if runs < 1 or steps < 100 or repeats < 1 or workers < 1:
            raise BadInput("bench health: need --runs >= 1, --steps >= 100, --repeats >= 1, --workers >= 1")
        check_workers(workers)
        check_out_file(out, "out")
        # the fleet's signal arrays (float64, runs x steps each) and the scan's windowed copies of them
        check_memory(runs * steps * 8.0 * 40, "runs/steps", f"a {runs:,} x {steps:,} fleet", "lower --runs or --steps")
        console = make_console()
        with progress(console, transient=True) as shown:
            result = bench_health(runs, steps, repeats, workers, progress=shown)
        table = Table(title=f"rlhfops bench health: {runs:,} runs x {steps:,} steps, {workers} threads")
        for col in ("alert", "single-thread s", "FPR (healthy)", "recall (own fault)", "median lag (steps)"):
            table.add_column(col, justify="left" if col == "alert" else "right")
        for name, q in result["quality"].items():
            table.add_row(
                name, f"{result['per_alert_single_thread_s'][name]:.3f}", f"{q['false_positive_rate']:.4f}",
                "-" if q["recall_on_own_fault"] is None else f"{q['recall_on_own_fault']:.3f}",
                "-" if q["median_lag_steps"] is None else f"{q['median_lag_steps']:g}",
            )
        console.print(table)
        verdict = "under" if result["under_target"] else "OVER"
        check = result["streaming_crosscheck"]
        console.print(
            f"catalog scan: best {result['catalog_wall_s']:.3f} s wall of {repeats} "
            f"({verdict} the {TARGET_S:g} s target), {result['catalog_cpu_s']:.3f} s CPU; streaming "
            f"cross-check {check['mismatches']} mismatches on {check['runs']} runs x {check['alerts']} "
            "alerts; "
            f"load average {result['load_avg_1m']:.2f} on {result['cpus']} CPUs"
        )
        write_json(result, out)
        if out is not None:
            console.print(f"wrote {out}")
