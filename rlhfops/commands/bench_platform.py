"""`rlhfops bench platform`: N concurrent `rlhf-job` deployment runs and a quick nightly on the PostgreSQL stack
(`infra.bench_platform`): parse, run, print the table and write the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from rlhfops.commands.bench import write_json
from rlhfops.console import make_console, progress


def register_bench(bench_app: typer.Typer) -> None:
    @bench_app.command("platform")
    def bench_platform_cmd(
        dir: Path = typer.Option(None, "--dir", help="a running stack's directory (default: $RLHFOPS_STACK_DIR "  # noqa: A002
                                 "or ./.stack); when none runs there, a fresh stack is started in a temporary "
                                 "directory and stopped at the end"),
        jobs: int = typer.Option(8, "--jobs", help="concurrent rlhf-job deployment runs"),
        steps: int = typer.Option(4, "--steps", help="PPO steps per job (configs/ppo-tiny.yaml)"),
        nightly: bool = typer.Option(True, "--nightly/--no-nightly", help="run `nightly --quick` alongside"),
        timeout_s: float = typer.Option(1800.0, "--timeout", help="seconds to wait for every run to end"),
        restart_prefect_after: float = typer.Option(
            None, "--restart-prefect-after", help="fault case: this many seconds after the last submission (runs in "
            "flight), stop the stack's Prefect server, keep it down --prefect-down seconds, start it again on the "
            "same port and database; the JSON then says how each run ended and whether MLflow holds half-written runs"),
        prefect_down: float = typer.Option(None, "--prefect-down", help="seconds the Prefect server stays down "
                                           "with --restart-prefect-after (default 30)"),
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """>= 8 concurrent rlhf-job runs and a nightly on the PostgreSQL stack: errors, latency, lost runs; with
        --restart-prefect-after, the same under a Prefect server restart."""
        from common.errors import BadInput
        from common.validate import check_out_file
        from infra.bench_platform import bench_platform
        from rlhfops.commands.stack import stack_dir

        if not 1 <= jobs <= 64:
            raise BadInput("--jobs: must be in 1..64")
        if not 1 <= steps <= 200:
            raise BadInput("--steps: must be in 1..200")
        if restart_prefect_after is not None and not 0 < restart_prefect_after <= 3600:
            raise BadInput(f"--restart-prefect-after: {restart_prefect_after:g} is not in (0, 3600] seconds; give the "
                           "seconds after the submissions at which to stop the Prefect server, e.g. 20")
        if prefect_down is not None and restart_prefect_after is None:
            raise BadInput("--prefect-down: only with --restart-prefect-after (the restart it times)")
        if prefect_down is None:
            prefect_down = 30.0
        if not 0 <= prefect_down <= 3600:
            raise BadInput(f"--prefect-down: {prefect_down:g} is not in [0, 3600] seconds; e.g. 30")
        restart = None if restart_prefect_after is None else (restart_prefect_after, prefect_down)
        check_out_file(out, "out")
        console = make_console()
        with progress(console) as shown:
            result = bench_platform(stack_dir(dir), jobs=jobs, steps=steps, nightly=nightly, timeout_s=timeout_s,
                                    restart=restart, log=console.print, reporter=shown)
        write_json(result, out)
        _print(console, result)
        if result["failed"]:
            raise typer.Exit(1)


def _print(console, r: dict) -> None:
    from rich.table import Table

    t = Table(title="rlhfops bench platform (PostgreSQL stack)", title_justify="left", show_header=False)
    t.add_column("what")
    t.add_column("value")
    fmt = lambda x: "—" if x is None else f"{x:.1f} s"  # noqa: E731
    t.add_row("rlhf-job runs", f"{r['submitted']}/{r['jobs']} submitted, {r['completed']} completed "
              f"({r['steps']} steps each) in {r['jobs_wall_s']:.0f} s")
    t.add_row("nightly --quick alongside", "not run" if not r["nightly"] else f"exit {r['nightly_exit']}")
    t.add_row("submission to start", f"p50 {fmt(r['latency_p50_s'])}, p95 {fmt(r['latency_p95_s'])}")
    t.add_row("errors", str(len(r["errors"])) + ("" if not r["errors"] else f": {r['errors'][:3]}"))
    t.add_row("store write errors (server logs)", f"{sum(len(v) for v in r['store_write_errors'].values())} "
              f"(+ {r['handled_conflicts']} handled conflicts: registered model or task run exists)")
    t.add_row("registry versions per tenant model", ", ".join(f"{k} {v}" for k, v in r["registry_versions"].items()))
    t.add_row("MLflow runs lost / duplicated / left RUNNING",
              f"{len(r['lost_runs'])} / {len(r['duplicated_runs'])} / {len(r['left_running'])}")
    if "restart" in r:
        x = r["restart"]
        t.add_row("Prefect server restart", f"error: {x['error']}" if x.get("error") else
                  f"stopped {x['stopped_at_s']:.0f} s after the submissions, answering again {x['down_s']:.0f} s "
                  f"later; worker {'survived' if x.get('worker_survived') else 'DID NOT survive'}")
        t.add_row("how the runs ended (Prefect)", ", ".join(f"{k} {v}" for k, v in sorted(r["ended_by_state"].items())))
        t.add_row("runs in no clear state / half-written in MLflow",
                  f"{len(r['unclear_runs'])} / {len(r['half_written'])}")
        t.add_row("task runs left Pending/Running in Prefect / events dropped by clients",
                  f"{len(r['task_runs_not_final'])} / {len(r['dropped_events'])}")
    console.print(t)
    keys = ("errors", "store_write_errors") + (("not_completed", "half_written", "unclear_runs",
                                                "task_runs_not_final", "dropped_events") if "restart" in r else ())
    console.print(json.dumps({k: r[k] for k in keys}, indent=1)[:3000])
