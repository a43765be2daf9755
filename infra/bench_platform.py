"""`bench platform`: load on the PostgreSQL-backed stack. N concurrent `rlhf-job` deployment runs (tiny config, few
steps) through a real process worker, submitted as typed requests (`infra.deployments.submit_job`), plus a quick
nightly writing to the same stores at the same time. Measures jobs submitted/completed, errors, p50/p95
submission-to-start latency, store write errors in the servers' logs, lost or duplicated MLflow runs (counted by run
name) and runs left RUNNING; with a restart, how each run ended. `rlhfops bench platform` parses, calls
`bench_platform` and prints; tests call it directly (tests/infra/test_stack.py runs a reduced form in CI)."""

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
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def bench_platform(stack_root: Path, *, jobs: int = 8, steps: int = 4, nightly: bool = True,
                   timeout_s: float = 1800.0, restart: tuple[float, float] | None = None, log=print,
                   reporter: Any = None) -> dict[str, Any]:
    """Run the bench against the stack answering in `stack_root`, or, when none answers there, a fresh stack
    started in a temporary directory and stopped at the end. `restart`: (seconds after the submissions, seconds
    down) of a Prefect server restart. `reporter` (optional; `stage(name, total)`, `advance(n)`) shows progress.
    Returns every figure (the JSON `rlhfops bench platform --out` writes; docs/ARCHITECTURE.md "Benchmark JSON"),
    and `failed`: whether the bench's acceptance failed (`failed`)."""
    from infra import stack as S

    st = S.status(stack_root)
    own_stack = not (st and all(s["answers"] for s in st.values()))
    root = stack_root
    if own_stack:
        root = Path(tempfile.mkdtemp(prefix="rlhfops-bench-stack-"))
        root.chmod(0o755)  # PostgreSQL runs as another user under root
        cfg = S.StackConfig(root, pg_port=S.free_port(), prefect_port=S.free_port(), mlflow_port=S.free_port())
        log(f"no stack answers in {stack_root}: starting one in {root}")
        S.up(cfg, log=log)
    cfg = S.StackConfig.load(root)
    env = {**os.environ, **cfg.env(), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "OMP_WAIT_POLICY": "PASSIVE",
           "MPLBACKEND": "Agg", "PREFECT_WORKER_QUERY_SECONDS": "2"}
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI")}
    os.environ.update({k: env[k] for k in saved})
    try:
        result = _bench(log, reporter, cfg, env, jobs, steps, nightly, timeout_s, restart)
    finally:
        for k, v in saved.items():  # the caller's stores again (a test goes on after this)
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if own_stack:
            S.down(root, log=log)
    result["stack"] = {"own": own_stack, "dir": str(root)}
    result["failed"] = failed(result)
    return result


def failed(result: dict[str, Any]) -> bool:
    """The bench's acceptance: every run completed with nothing lost, duplicated or written badly. Under a restart a
    run may end Crashed or Failed and still be clear: what fails then is a run in no clear state, a half-written
    MLflow run, a worker that died or a restart that did not happen."""
    if "restart" not in result:
        return bool(result["errors"] or result["lost_runs"] or result["duplicated_runs"]
                    or result["store_write_errors"] or result["left_running"])
    r = result["restart"]
    return bool(r["error"] or not r["worker_survived"] or result["unclear_runs"] or result["half_written"]
                or result["lost_runs"] or result["duplicated_runs"] or result["left_running"]
                or result["submit_errors"] or result["nightly_exit"] not in (None, 0)
                or result["task_runs_not_final"])


#: what a store write error looks like in the servers' logs (PostgreSQL, Prefect, MLflow)
WRITE_ERROR = re.compile(r"deadlock detected|could not serialize|database is locked|too many clients|"
                         r"IntegrityError|OperationalError|InternalError|duplicate key|Internal Server Error|"
                         r"Duplicate task_run, discarding|"
                         r"\b50[0-9]\b .*(POST|PATCH|PUT)|(POST|PATCH|PUT).* 50[0-9]\b", re.IGNORECASE)


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


#: a conflict the store answers and the client handles: MLflow creates a registered model by inserting it, and
#: when another job of the same tenant inserted it first, PostgreSQL logs this and MLflow answers
#: RESOURCE_ALREADY_EXISTS, which the registering client takes as "the model exists" (no write is lost)
#: Likewise Prefect's task-run recorder (server side) inserts a task run from its events and, when another batch
#: inserted the same id first, PostgreSQL logs `pk_task_run` and the recorder retries the upsert against the row now
#: there; only a retry that fails too loses the event, and then the server logs "Duplicate task_run, discarding"
#: (a WRITE_ERROR)
HANDLED_CONFLICT = re.compile(r'duplicate key value violates unique constraint "(registered_model_pk|pk_task_run)"')


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


def process_pool_template() -> dict:
    """Prefect's process work-pool template with `python -m infra.engine_entry` (this environment's Python) as the
    default command: flow runs wait for the API before the engine's first request (infra/engine_entry.py)."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    template["variables"]["properties"]["command"]["default"] = f"{sys.executable} -m infra.engine_entry"
    return template


def _bench(log, reporter, cfg, env: dict, jobs: int, steps: int, nightly: bool, timeout_s: float,
           restart: tuple[float, float] | None = None) -> dict:
    from infra import stack as S
    from infra import tracking as T

    root = cfg.root
    t_setup = time.time()
    T.init_store()
    # the process work pool and the rlhf-job deployment from prefect.yaml, as docs/orchestration.md does it; the
    # pool starts flow runs through infra.engine_entry, which waits out a restarting server (docs/stack.md)
    template = root / "process-pool-template.json"
    template.write_text(json.dumps(process_pool_template(), indent=1))
    for args in (["work-pool", "create", "local-process", "--type", "process", "--overwrite",
                  "--base-job-template", str(template)],
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
    restart_thread = None
    restart_record: dict = {}
    poll_failures = 0
    try:
        from prefect.client.orchestration import get_client

        from infra.deployments import submit_job

        def submit(i: int, name: str) -> None:
            t0 = time.time()
            try:
                fr = submit_job({"tenant": f"tenant{i % 4}", "name": name, "steps": steps, "cluster_gpus": jobs,
                                 "out_root": str(root / "bench-runs"), "run_dir": name})
                with lock:
                    submitted[name] = {"flow_run_id": str(fr.id), "submitted_at": t0}
            except Exception as err:  # noqa: BLE001 - every failed submission is counted and reported
                with lock:
                    errors.append(f"submit {name}: {type(err).__name__}: {err}")

        if nightly:
            nightly_proc = subprocess.Popen(
                [_bin("rlhfops"), "nightly", "--quick", "--no-detectors", "--out", str(root / "bench-nightly"),
                 "--cache-dir", str(root / "bench-cache"),
                 # it runs in the stack's directory: the sweep stage's spec by its path in this checkout
                 "--sweep-spec", str(REPO / "configs" / "sweeps" / "example.yaml")], env=env, cwd=root,
                stdout=open(root / "logs" / "nightly.log", "ab"), stderr=subprocess.STDOUT)
        t_start = time.time()
        threads = [threading.Thread(target=submit, args=(i, n)) for i, n in enumerate(names)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        t_submitted = time.time()
        log(f"{len(submitted)}/{jobs} rlhf-job runs submitted in {t_submitted - t_start:.1f} s")
        if restart is not None:
            restart_thread = threading.Thread(target=_restart_prefect, args=(log, root, t_submitted, *restart,
                                                                            restart_record), daemon=True)
            restart_thread.start()
        final: dict[str, object] = {}
        last_seen: dict[str, str] = {}
        deadline = time.time() + timeout_s
        if reporter is not None:
            reporter.stage("rlhf-job runs final", total=len(submitted))
        with get_client(sync_client=True) as c:
            while (len(final) < len(submitted) or (restart_thread and restart_thread.is_alive())) \
                    and time.time() < deadline:
                for name, s in submitted.items():
                    if name in final:
                        continue
                    try:
                        fr = c.read_flow_run(s["flow_run_id"])
                    except Exception:  # noqa: BLE001 - the server is down (the restart): ask again next round
                        poll_failures += 1
                        continue
                    last_seen[name] = fr.state.name if fr.state is not None else "none"
                    if fr.state is not None and fr.state.is_final():
                        final[name] = fr
                        if reporter is not None:
                            reporter.advance()
                if restart_record.get("done") and not S.session_members(worker_sid):
                    log("the worker is gone after the Prefect restart: runs it had not started never will")
                    break
                time.sleep(2)
        if restart_thread is not None:
            restart_thread.join(timeout=max(1.0, deadline - time.time()))
            restart_record["worker_survived"] = bool(S.session_members(worker_sid))
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
    extra: dict = {}
    if restart is not None:
        job_runs = {n: [r for r in runs if r.info.run_name == n] for n in expected}
        registered = {n: [v for r in rs for v in client.search_model_versions(f"run_id = '{r.info.run_id}'")]
                      for n, rs in job_runs.items()}
        ended: dict[str, dict] = {}
        for i, name in enumerate(names):
            fr = final.get(name)
            run_name = expected[i]
            rs = job_runs[run_name]
            mlflow_run = rs[0] if len(rs) == 1 else None
            prefect_state = fr.state.name if fr is not None else f"not final ({last_seen.get(name, 'unknown')})"
            ended[name] = {"prefect_state": prefect_state,
                           "message": (fr.state.message or "")[:300] if fr is not None else "",
                           "mlflow_status": mlflow_run.info.status if mlflow_run else None,
                           "run_state": mlflow_run.data.tags.get("run_state") if mlflow_run else None,
                           "half_written": job_run_gaps(mlflow_run, registered[run_name]) if mlflow_run else [],
                           "clear": clear_end(fr is not None and fr.state.is_final(),
                                              fr is not None and fr.state.is_completed(), mlflow_run, len(rs))}
        # a run that ended before it opened its MLflow run (Crashed at start-up) wrote nothing: not lost
        lost = [expected[i] for i, n in enumerate(names)
                if not job_runs[expected[i]] and ended[n]["prefect_state"] == "Completed"]
        never_opened = [expected[i] for i, n in enumerate(names)
                        if not job_runs[expected[i]] and ended[n]["prefect_state"] != "Completed"]
        by_state: dict[str, int] = {}
        for e in ended.values():
            by_state[e["prefect_state"]] = by_state.get(e["prefect_state"], 0) + 1
        extra = {"restart": restart_record, "poll_failures": poll_failures, "ended": ended,
                 "task_runs_not_final": task_runs_not_final(), "dropped_events": dropped_events(root, offsets),
                 "ended_by_state": by_state,
                 "not_completed": {n: f"{e['prefect_state']}: {e['message']}" for n, e in ended.items()
                                   if e["prefect_state"] != "Completed"},
                 "unclear_runs": [n for n, e in ended.items() if not e["clear"]],
                 "half_written": {n: e["half_written"] for n, e in ended.items() if e["half_written"]},
                 "never_opened_mlflow_run": never_opened,
                 "submit_errors": [e for e in errors if e.startswith("submit ")]}
    completed = sum(1 for fr in final.values() if fr.state.is_completed())
    # the contract's keys (docs/ARCHITECTURE.md "Benchmark JSON"), then the bench's own detail
    contract = {"store": "postgresql", "runner": "process worker", "jobs_submitted": len(submitted),
                "jobs_completed": completed, "runs_left_running": len(running),
                "submit_to_start_p50_s": percentile(latencies, 50), "submit_to_start_p95_s": percentile(latencies, 95)}
    return {**contract, **extra, "jobs": jobs, "steps": steps, "nightly": nightly, "setup_s": setup_s,
            "submitted": len(submitted), "completed": completed,
            "errors": errors, "states": states, "nightly_exit": nightly_rc, "jobs_wall_s": jobs_wall,
            "latency_p50_s": percentile(latencies, 50), "latency_p95_s": percentile(latencies, 95),
            "latencies_s": sorted(latencies), "store_write_errors": write_errors,
            "handled_conflicts": handled, "registry_versions": versions,
            "mlflow_runs": len(runs), "lost_runs": lost, "duplicated_runs": duplicated, "left_running": running}


#: what the normal path writes on a job's MLflow run before it ends it FINISHED (flows/rlhf_job.py: job_metrics and the
#: final tags); a FINISHED run without one of them was closed half-written
JOB_FINAL_METRICS = ("cost_usd", "gpu_hours", "steps", "tokens_generated", "best_eval", "final_reward",
                     "slot_wait_s", "train_wall_s", "alerts_paged")
JOB_FINAL_TAGS = ("run_state", "final_state", "decision", "state_history")
#: run states that register the best checkpoint (flows/rlhf_job.py: SUCCEEDED and PAUSED_BY_GATE with a best one)
REGISTERING_STATES = ("SUCCEEDED", "PAUSED_BY_GATE")


def job_run_gaps(run, versions: list) -> list[str]:
    """What a job's MLflow run lacks that its end status promises: a FINISHED run has every final metric and tag and,
    when its run state registers, exactly one model version from it; a FAILED or KILLED run says why (a failure
    class and a reason or error). RUNNING is reported apart (left RUNNING). Empty: the run is whole."""
    status, metrics, tags = run.info.status, run.data.metrics, run.data.tags
    gaps: list[str] = []
    if status == "FINISHED":
        gaps += [f"metric {k} missing" for k in JOB_FINAL_METRICS if k not in metrics]
        gaps += [f"tag {k} missing" for k in JOB_FINAL_TAGS if k not in tags]
        state = tags.get("run_state", "")
        if any(state.startswith(s) for s in REGISTERING_STATES) and metrics.get("best_step") is not None \
                and metrics["best_step"] == metrics["best_step"] and len(versions) != 1:  # best_step NaN: none kept
            gaps.append(f"{len(versions)} registered versions (want 1 for run_state {state})")
    elif status in ("FAILED", "KILLED"):
        if "failure_class" not in tags:
            gaps.append(f"{status} without a failure_class tag")
        if not (tags.get("reason") or tags.get("error")):
            gaps.append(f"{status} without a reason or error tag")
        if versions:
            gaps.append(f"{status} yet {len(versions)} registered versions")
    return gaps


def clear_end(prefect_final: bool, prefect_completed: bool, run, n_runs: int) -> bool:
    """A run ended in a clear state: Prefect holds a final state and MLflow agrees. Completed with exactly one
    FINISHED MLflow run; Crashed/Failed/Cancelled with its MLflow run closed FAILED or KILLED, or with none at all
    (it ended before it opened one). A run not final in Prefect, RUNNING in MLflow, duplicated, or Completed in
    Prefect but closed FAILED in MLflow (or the other way round) is not clear. Half-written runs are counted apart."""
    if not prefect_final or n_runs > 1:
        return False
    if run is None:
        return not prefect_completed
    if prefect_completed:
        return run.info.status == "FINISHED"
    return run.info.status in ("FAILED", "KILLED")


def task_runs_not_final() -> list[str]:
    """Task runs the Prefect server still holds Pending or Running once every flow run has ended (the bench asks
    after the jobs and the nightly are done): Prefect records task-run states from events, and an event a client
    could not send during the restart is lost, so a task run that completed can stay Running there."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterState, TaskRunFilterStateType
    from prefect.client.schemas.objects import StateType

    time.sleep(10)  # the server records events in batches
    flt = TaskRunFilter(state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.PENDING,
                                                                                   StateType.RUNNING])))
    with get_client(sync_client=True) as c:
        return [f"{tr.name}: {tr.state.name if tr.state else 'no state'}"
                for tr in c.read_task_runs(task_run_filter=flt, limit=200)]  # the API's maximum page


#: what Prefect's events client logs when it drops an event it could not send (the server was down)
DROPPED_EVENT = re.compile(r"Service 'EventsWorker' failed to process item Event\(.*?event='([^']+)'")


def dropped_events(root: Path, offsets: dict[str, int]) -> list[str]:
    """The events the worker's flow runs and the nightly dropped (by their logs): task-run state changes the server
    never recorded."""
    found = []
    for name in ("worker.log", "nightly.log"):
        path = root / "logs" / name
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offsets.get(name, 0))
                found += [f"{name}: {m.group(1)}" for m in DROPPED_EVENT.finditer(f.read().decode(errors="replace"))]
    return found


def _restart_prefect(log, root: Path, t_submitted: float, after_s: float, down_s: float, record: dict) -> None:
    """The fault: `after_s` seconds after the submissions, stop the stack's Prefect server, keep it down `down_s`,
    start it again (infra.stack.restart_service). Fills `record` (times relative to the last submission)."""
    from infra import stack as S

    time.sleep(max(0.0, t_submitted + after_s - time.time()))
    record.update(service="prefect", after_s=after_s, down_s_asked=down_s, error=None)
    try:
        r = S.restart_service(root, "prefect", down_s=down_s, log=log)
        record.update(stopped_at_s=r["stopped_at"] - t_submitted, answered_at_s=r["answered_at"] - t_submitted,
                      down_s=r["down_s"], old_pid=r["old_pid"], new_pid=r["new_pid"])
    except Exception as err:  # noqa: BLE001 - reported: a restart that did not happen fails the bench
        record["error"] = f"{type(err).__name__}: {err}"[:2000]
    record["done"] = True
