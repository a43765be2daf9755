"""`rlhfops bench platform`: load on the PostgreSQL-backed stack. N concurrent `rlhf-job` deployment runs (tiny
config, few steps) through a real process worker, plus a quick nightly writing to the same stores at the same time.
Reports jobs submitted/completed, errors, p50/p95 submission-to-start latency, store write errors in the servers'
logs, lost or duplicated MLflow runs (counted by run name) and runs left RUNNING."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import typer

from rlhfops.commands.bench import write_json
from rlhfops.console import make_console

REPO = Path(__file__).resolve().parents[2]
#: what a store write error looks like in the servers' logs (PostgreSQL, Prefect, MLflow)
WRITE_ERROR = re.compile(r"deadlock detected|could not serialize|database is locked|too many clients|"
                         r"IntegrityError|OperationalError|InternalError|duplicate key|Internal Server Error|"
                         r"\b50[0-9]\b .*(POST|PATCH|PUT)|(POST|PATCH|PUT).* 50[0-9]\b", re.IGNORECASE)


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


#: a conflict the store answers and the client handles: MLflow creates a registered model by inserting it, and
#: when another job of the same tenant inserted it first, PostgreSQL logs this and MLflow answers
#: RESOURCE_ALREADY_EXISTS, which the registering client takes as "the model exists" (no write is lost)
HANDLED_CONFLICT = re.compile(r'duplicate key value violates unique constraint "registered_model_pk"')


def log_offsets(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (root / "logs").glob("*.log")}


def write_errors_since(root: Path, offsets: dict[str, int]) -> tuple[dict[str, list[str]], int]:
    """Lines matching WRITE_ERROR that the servers logged after `offsets` (by log), and how many of the matches
    were HANDLED_CONFLICTs (left out of the first)."""
    found: dict[str, list[str]] = {}
    handled = 0
    for p in (root / "logs").glob("*.log"):
        if p.name in ("worker.log", "nightly.log"):
            continue
        with open(p, "rb") as f:
            f.seek(offsets.get(p.name, 0))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if WRITE_ERROR.search(ln)]
        handled += sum(1 for ln in lines if HANDLED_CONFLICT.search(ln))
        lines = [ln for ln in lines if not HANDLED_CONFLICT.search(ln)]
        if lines:
            found[p.name] = lines[:20]
    return found, handled


def percentile(xs: list[float], q: float) -> float | None:
    import numpy as np

    return float(np.percentile(xs, q)) if xs else None


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
        out: Path = typer.Option(None, "--out", help="write the JSON here"),
    ) -> None:
        """>= 8 concurrent rlhf-job runs and a nightly on the PostgreSQL stack: errors, latency, lost runs."""
        from common.errors import BadInput
        from common.validate import check_out_file
        from infra import stack as S
        from rlhfops.commands.stack import stack_dir

        if not 1 <= jobs <= 64:
            raise BadInput("--jobs: must be in 1..64")
        if not 1 <= steps <= 200:
            raise BadInput("--steps: must be in 1..200")
        check_out_file(out, "out")
        console = make_console()
        root = stack_dir(dir)
        st = S.status(root)
        own_stack = not (st and all(s["answers"] for s in st.values()))
        if own_stack:
            root = Path(tempfile.mkdtemp(prefix="rlhfops-bench-stack-"))
            root.chmod(0o755)  # PostgreSQL runs as another user under root
            cfg = S.StackConfig(root, pg_port=S.free_port(), prefect_port=S.free_port(), mlflow_port=S.free_port())
            console.print(f"no stack answers in {stack_dir(dir)}: starting one in {root}")
            S.up(cfg, log=console.print)
        cfg = S.StackConfig.load(root)
        env = {**os.environ, **cfg.env(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "OMP_WAIT_POLICY": "PASSIVE",
               "MPLBACKEND": "Agg", "PREFECT_WORKER_QUERY_SECONDS": "2"}
        os.environ.update({k: env[k] for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")})
        try:
            result = _bench(console, cfg, env, jobs, steps, nightly, timeout_s)
        finally:
            if own_stack:
                S.down(root, log=console.print)
        result["stack"] = {"own": own_stack, "dir": str(root)}
        write_json(result, out)
        _print(console, result)
        if result["errors"] or result["lost_runs"] or result["duplicated_runs"] or result["store_write_errors"]:
            raise typer.Exit(1)


def _bench(console, cfg, env: dict, jobs: int, steps: int, nightly: bool, timeout_s: float) -> dict:
    from infra import stack as S
    from infra import tracking as T

    root = cfg.root
    t_setup = time.time()
    T.init_store()
    # the process work pool and the rlhf-job deployment from prefect.yaml, as docs/orchestration.md does it
    for args in (["work-pool", "create", "local-process", "--type", "process", "--overwrite"],
                 ["--no-prompt", "deploy", "--name", "rlhf-job"]):
        done = subprocess.run([_bin("prefect"), *args], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"prefect {' '.join(args)} failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    offsets = log_offsets(root)
    worker_sid = S._spawn("worker", [_bin("prefect"), "worker", "start", "--pool", "local-process", "--limit",
                                     str(jobs)], env, root)
    setup_s = time.time() - t_setup
    tag = time.strftime("%H%M%S")
    names = [f"bench{tag}-{i}" for i in range(jobs)]
    submitted: dict[str, dict] = {}
    errors: list[str] = []
    lock = threading.Lock()
    nightly_proc = None
    try:
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment

        def submit(i: int, name: str) -> None:
            t0 = time.time()
            try:
                fr = run_deployment("rlhf-job/rlhf-job", timeout=0, parameters={
                    "tenant": f"tenant{i % 4}", "name": name, "steps": steps, "cluster_gpus": jobs,
                    "out_dir": str(root / "bench-runs" / name)})
                with lock:
                    submitted[name] = {"flow_run_id": str(fr.id), "submitted_at": t0}
            except Exception as err:  # noqa: BLE001 - every failed submission is counted and reported
                with lock:
                    errors.append(f"submit {name}: {type(err).__name__}: {err}")

        if nightly:
            nightly_proc = subprocess.Popen(
                [_bin("rlhfops"), "nightly", "--quick", "--no-detectors", "--out", str(root / "bench-nightly"),
                 "--cache-dir", str(root / "bench-cache")], env=env, cwd=root,
                stdout=open(root / "logs" / "nightly.log", "ab"), stderr=subprocess.STDOUT)
        t_start = time.time()
        threads = [threading.Thread(target=submit, args=(i, n)) for i, n in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        console.print(f"{len(submitted)}/{jobs} rlhf-job runs submitted in {time.time() - t_start:.1f} s")
        final: dict[str, object] = {}
        deadline = time.time() + timeout_s
        with get_client(sync_client=True) as c:
            while len(final) < len(submitted) and time.time() < deadline:
                for name, s in submitted.items():
                    if name not in final:
                        fr = c.read_flow_run(s["flow_run_id"])
                        if fr.state is not None and fr.state.is_final():
                            final[name] = fr
                time.sleep(2)
        jobs_wall = time.time() - t_start
        nightly_rc = None
        if nightly_proc is not None:
            nightly_rc = nightly_proc.wait(timeout=max(60.0, deadline - time.time()))
    finally:
        if nightly_proc is not None and nightly_proc.poll() is None:
            nightly_proc.kill()
        S.stop_session(worker_sid)
    latencies, states = [], {}
    for name, fr in final.items():
        states[name] = fr.state.name
        if fr.start_time is not None:
            latencies.append(fr.start_time.timestamp() - submitted[name]["submitted_at"])
        if not fr.state.is_completed():
            errors.append(f"{name}: {fr.state.name}: {fr.state.message}")
    for name in set(submitted) - set(final):
        errors.append(f"{name}: not final after {timeout_s:.0f} s")
    if nightly_rc not in (None, 0):
        errors.append(f"nightly exited {nightly_rc} (log: {root / 'logs' / 'nightly.log'})")
    # MLflow: exactly one run per job, by name; nothing left RUNNING
    from mlflow.tracking import MlflowClient

    client = MlflowClient(cfg.mlflow_url)
    exp = client.get_experiment_by_name(T.DEFAULT_EXPERIMENT)
    runs = client.search_runs([exp.experiment_id], max_results=5000) if exp else []
    by_name: dict[str, int] = {}
    for r in runs:
        by_name[r.info.run_name] = by_name.get(r.info.run_name, 0) + 1
    expected = [f"tenant{i % 4}/{n}" for i, n in enumerate(names)]
    lost = [n for n in expected if by_name.get(n, 0) == 0]
    duplicated = [n for n in expected if by_name.get(n, 0) > 1]
    running = [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    write_errors, handled = write_errors_since(root, offsets)
    versions = {f"tenant{t}-policy": len(client.search_model_versions(f"name='tenant{t}-policy'"))
                for t in range(min(jobs, 4))}
    return {"jobs": jobs, "steps": steps, "nightly": nightly, "setup_s": setup_s,
            "submitted": len(submitted), "completed": sum(1 for fr in final.values() if fr.state.is_completed()),
            "errors": errors, "states": states, "nightly_exit": nightly_rc, "jobs_wall_s": jobs_wall,
            "latency_p50_s": percentile(latencies, 50), "latency_p95_s": percentile(latencies, 95),
            "latencies_s": sorted(latencies), "store_write_errors": write_errors,
            "handled_conflicts": handled, "registry_versions": versions,
            "mlflow_runs": len(runs), "lost_runs": lost, "duplicated_runs": duplicated, "left_running": running}


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
              f"(+ {r['handled_conflicts']} handled 'registered model exists' conflicts)")
    t.add_row("registry versions per tenant model", ", ".join(f"{k} {v}" for k, v in r["registry_versions"].items()))
    t.add_row("MLflow runs lost / duplicated / left RUNNING",
              f"{len(r['lost_runs'])} / {len(r['duplicated_runs'])} / {len(r['left_running'])}")
    console.print(t)
    console.print(json.dumps({k: r[k] for k in ("errors", "store_write_errors")}, indent=1)[:3000])
