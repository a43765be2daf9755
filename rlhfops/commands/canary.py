"""`rlhfops canary`: parse, run the canaries (`training/benches/canaries.py`), print the table."""

from __future__ import annotations

import math
import time
from pathlib import Path

import typer

from common.errors import BadInput
from training.benches.canaries import CANARIES, run_canary


def register(app: typer.Typer) -> None:
    @app.command("canary")
    def canary_cmd(
        quick: bool = typer.Option(False, "--quick", help="shorter runs (target: under 5 minutes here)"),
        only: str = typer.Option(None, "--only", help="comma-separated canaries to run (default: all)"),
        steps: int = typer.Option(
            None, "--steps", help="steps per canary run (default: 60 quick, 120 full)"
        ),
        fault_at: int = typer.Option(
            None, "--fault-at", help="step the fault starts (default: 8 quick, 30 full)"
        ),
        alerts: Path = typer.Option(None, "--alerts", help="thresholds YAML (default: configs/alerts.yaml); "
                                    "its 'canary' profile shortens windows for these short runs"),
        cache_dir: str = typer.Option(None, "--cache-dir", help="warm-start cache (default: RLHFOPS_CACHE_DIR, "
                                      "else ~/.cache/rlhfops/warm-starts, as for a config without cache_dir)"),
        metrics_file: Path = typer.Option(
            None, "--metrics-file", help="write Prometheus text exposition here"
        ),
        metrics_port: int = typer.Option(None, "--metrics-port", help="serve Prometheus /metrics on this "
                                         "port while the canaries run"),
        out: Path = typer.Option(None, "--out", help="write the result table as CSV here"),
    ) -> None:
        """Run real small PPO jobs with injected faults (frozen weight sync, constant reward, oversized LR,
        gameable reward, behaviour/proximal policy mismatch, carried tokens duplicated) plus a healthy control, and a
        GRPO job with a constant reward plus its healthy control (each canary's catalog is built for its algorithm);
        print (canary, expected alert, fired at step, state); exit 0 only if every expected alert fired and moved the
        run state and the controls stayed quiet."""
        from rich.table import Table

        from eval.health import Catalog
        from infra.ledger import Ledger, PriceTable
        from infra.metrics import PlatformMetrics
        from rlhfops.console import make_console, progress

        chosen = list(CANARIES)
        if only:
            names = [n.strip() for n in only.split(",") if n.strip()]
            known = {c.name: c for c in CANARIES}
            for n in names:
                if n not in known:
                    raise BadInput(f"--only: unknown canary '{n}' (choose from: {', '.join(known)})")
            chosen = [known[n] for n in names]
        steps = steps or (60 if quick else 120)
        fault_at = fault_at if fault_at is not None else (8 if quick else 30)
        if steps < 10 or not 0 <= fault_at < steps:
            raise BadInput("--steps/--fault-at: need --steps >= 10 and 0 <= --fault-at < --steps")
        from common.validate import check_out_dir, check_out_file

        if metrics_port is not None and not 1 <= metrics_port <= 65535:
            raise BadInput(f"metrics_port: {metrics_port} is not a TCP port (1-65535)")
        check_out_file(out, "out")
        check_out_file(metrics_file, "metrics_file")
        from training.job.config import default_cache_dir

        cache_dir = cache_dir or default_cache_dir()
        check_out_dir(cache_dir, "cache_dir")
        catalog = Catalog.from_file(alerts, algorithm="ppo", profile="canary")
        metrics = PlatformMetrics(tenants=["canary"])
        ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
        server = metrics.serve(metrics_port) if metrics_port is not None else None
        console = make_console()
        rows = []
        t0 = time.perf_counter()
        try:
            # one stage per canary: bars on a terminal, flushed done/total lines into a pipe (cron, CI)
            with progress(console, transient=True) as bar:
                for canary in chosen:
                    bar.stage(f"canary {canary.name} (fault at step {fault_at})", total=steps)
                    r = run_canary(canary, steps, fault_at, cache_dir, catalog, metrics, ledger, bar.update)
                    rows.append(r)
                    err = f" {r['error']}" if r["error"] else ""
                    bar.note(f"{r['canary']}: {'ok' if r['ok'] else 'FAILED'} ({r['state']}, "
                             f"{r['steps_run']} steps, {r['wall_s']:.0f} s){err}")
        finally:
            if server is not None:
                server.shutdown()
        mode = "quick" if quick else "full"
        table = Table(title=f"rlhfops canary ({mode}): {time.perf_counter() - t0:.0f} s")
        for col in ("canary", "expected alert", "fired at step", "state", "other pages", "ok"):
            table.add_column(col)
        for r in rows:
            others = [a for a in r["paged"] if a != r["expected"]]
            fired = "-" if math.isnan(r["fired_at"]) else f"{r['fired_at']:g}"
            table.add_row(r["canary"], r["expected"], fired, r["state"], ", ".join(others) or "-",
                          "yes" if r["ok"] else "NO")
        console.print(table)
        if metrics_file is not None:
            console.print(f"Prometheus exposition written to {metrics.write(metrics_file)}")
        if out is not None:
            import pandas as pd

            out.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_csv(out, index=False)
        if not all(r["ok"] for r in rows):
            raise typer.Exit(1)
