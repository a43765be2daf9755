"""`rlhfops canary`: fault-injection canaries on real small PPO runs; every alert must fire, the control
must stay quiet (the runbook's verification step: "every alert fires under injected failure")."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer

from common.errors import BadInput


@dataclass(frozen=True)
class Canary:
    name: str
    #: the trainer's `fault:` block (training/config.py FaultConfig); None for the control
    fault: dict | None
    #: the alert that must fire (None: nothing may page)
    expected: str | None
    #: config overrides on top of the shared base (dotted keys)
    overrides: dict = field(default_factory=dict)


CANARIES = (
    Canary("control", None, None),
    Canary("frozen_sync", {"kind": "frozen_sync"}, "sync_stall"),
    Canary("constant_reward", {"kind": "constant_reward"}, "dead_run"),
    Canary("oversized_lr", {"kind": "lr_spike", "factor": 50.0}, "kl_blowup"),
    Canary("gameable_reward", {"kind": "gameable_reward", "bonus": 1.0, "trigger": "z"}, "reward_hacking"),
)


def base_config(steps: int, fault_at: int, cache_dir: str) -> dict:
    """A small healthy PPO job on the synthetic task: a strong KL penalty and a modest learning rate keep
    the policy near the base distribution where proxy and gold agree (training/task.py), and a batch of
    32 keeps per-step reward noise low enough that learning is visible within the canary's windows."""
    return {
        "seed": 0, "steps": steps,
        "task": {"n_train_prompts": 128, "n_heldout_prompts": 32, "n_pairs": 400, "rm_epochs": 1,
                 "sft_steps": 150, "rm_trainer": "torch"},
        "ppo": {"batch_size": 32, "max_new_tokens": 32, "kl_coef": 0.1, "actor_lr": 3e-4, "critic_lr": 1e-3},
        "eval_every": 2, "eval_prompts": 16, "checkpoint_every": 10_000, "cache_dir": cache_dir,
        "fault": {"kind": "none", "at_step": fault_at},
    }


def _set(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    for k in keys[:-1]:
        d = d.setdefault(k, {})
    d[keys[-1]] = value


def run_canary(canary: Canary, steps: int, fault_at: int, cache_dir: str, catalog: Any, metrics: Any = None,
               ledger: Any = None, progress: Any = None) -> dict:
    """Run one canary: a real PPO job fed step by step through the catalog and the run state machine.
    A fault canary stops as soon as its expected alert fired (proof obtained); the control runs in full."""
    from eval.states import RunState, RunSupervisor
    from training.config import TrainConfig
    from training.trainer import train

    raw = base_config(steps, fault_at, cache_dir)
    raw["name"] = f"canary-{canary.name}"
    if canary.fault:
        raw["fault"].update(canary.fault)
    for key, value in canary.overrides.items():
        _set(raw, key, value)
    cfg = TrainConfig.model_validate(raw)
    run_id = f"canary-{canary.name}"
    sup = RunSupervisor(run_id, "canary", catalog.start(tenant="canary"), ledger=ledger, metrics=metrics,
                        gpu_kind="cpu")
    sup.begin()
    fired_at = math.nan
    t0 = time.perf_counter()
    error: BaseException | None = None
    try:
        for rec in train(cfg, overlap="none"):
            for ev in sup.observe(rec):
                if ev.alert == canary.expected and math.isnan(fired_at):
                    fired_at = ev.step
            if progress is not None:
                progress(rec.step)
            if canary.expected is not None and not math.isnan(fired_at):
                break
            if sup.machine.state is RunState.PAUSED_BY_GATE and canary.expected is None:
                break
    except Exception as err:  # a crashed canary is a failed canary, reported in the table
        error = err
    status = sup.finish(completed=error is None, exception=error)
    paged = [e.alert for e in sup.events if e.severity == "paging"]
    moved = any(s.state in (RunState.DEGRADED, RunState.PAUSED_BY_GATE) for s in sup.machine.history)
    if canary.expected is None:
        ok = error is None and not paged and status.state is RunState.SUCCEEDED
    else:
        ok = error is None and not math.isnan(fired_at) and moved and status.state is RunState.FAILED
    if metrics is not None:
        metrics.end_run(run_id)
    return {
        "canary": canary.name, "expected": canary.expected or "(none: must stay quiet)",
        "fired_at": fired_at, "paged": paged, "states": sup.machine.labels(), "state": status.label,
        "reason": status.reason, "steps_run": sup.steps, "wall_s": time.perf_counter() - t0, "ok": ok,
        "error": f"{type(error).__name__}: {error}" if error else "",
    }


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
        cache_dir: str = typer.Option("runs/.cache", "--cache-dir", help="base-policy / reward-model cache"),
        metrics_file: Path = typer.Option(
            None, "--metrics-file", help="write Prometheus text exposition here"
        ),
        metrics_port: int = typer.Option(None, "--metrics-port", help="serve Prometheus /metrics on this "
                                         "port while the canaries run"),
        out: Path = typer.Option(None, "--out", help="write the result table as CSV here"),
    ) -> None:
        """Run real small PPO jobs with injected faults (frozen weight sync, constant reward, oversized LR,
        gameable reward) plus a healthy control; print (canary, expected alert, fired at step, state);
        exit 0 only if every expected alert fired and moved the run state and the control stayed quiet."""
        from rich.table import Table

        from eval.health import Catalog
        from infra.ledger import Ledger, PriceTable
        from infra.metrics import PlatformMetrics
        from rlhfops.console import make_console

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
        check_out_dir(cache_dir, "cache_dir")
        catalog = Catalog.from_file(alerts, algorithm="ppo", profile="canary")
        metrics = PlatformMetrics(tenants=["canary"])
        ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
        server = metrics.serve(metrics_port) if metrics_port is not None else None
        console = make_console()
        rows = []
        t0 = time.perf_counter()
        try:
            for canary in chosen:
                with console.status(f"canary {canary.name}: training (fault at step {fault_at})") as status:
                    def tick(step: int, _s=status, _c=canary) -> None:
                        _s.update(f"canary {_c.name}: step {step}/{steps}")

                    r = run_canary(canary, steps, fault_at, cache_dir, catalog, metrics, ledger, tick)
                rows.append(r)
                err = f" {r['error']}" if r["error"] else ""
                console.print(f"{r['canary']}: {'ok' if r['ok'] else 'FAILED'} ({r['state']}, "
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
