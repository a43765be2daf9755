"""Crash-safety acceptance, with real processes: kill -9 of a nightly then a rerun, a 60-s outage of a real
`prefect server start` during an `rlhf-job`, two writers on one run directory, the temporary server dying with
its parent. Every process started here is stopped by its PID."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
#: a smaller job than the nightly's (fewer reward-model pairs and SFT steps) so the tests stay short
TINY_JOB = {"task.n_pairs": 200, "task.sft_steps": 60, "ppo.batch_size": 16, "ppo.max_new_tokens": 24}

# each test runs whole CLI processes with their own timeouts (up to 900 s for a rerun): above those
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", OMP_WAIT_POLICY="PASSIVE",
               MPLBACKEND="Agg", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180", **extra)
    return env


def _wait_for(cond, timeout: float, what: str, every: float = 0.1, proc: subprocess.Popen | None = None):
    t0 = time.time()
    while time.time() - t0 < timeout:
        v = cond()
        if v:
            return v
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before {what}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _stop(proc: subprocess.Popen | None, group: bool = False) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


def _store_runs(tmp_path: Path):
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = [e.experiment_id for e in c.search_experiments()]
    return c, c.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY, max_results=10_000)


def _gone(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---------------------------------------------------------------------------------------------------------


def test_kill_9_of_a_nightly_then_a_rerun_leaves_no_running_run_no_server_no_version(tmp_path):
    """`rlhfops nightly --quick` (E1, one seed, no detectors, canaries or platform) killed with SIGKILL once its
    RLHF job has taken a checkpoint; then the same command again. Wall about 2-4 minutes on 2 shared cores."""
    import psutil

    env = _env(tmp_path)
    cmd = [PY, "-m", "rlhfops.cli", "nightly", "--quick", "--experiments", "E1", "--seeds", "42", "--no-detectors",
           "--canaries", "none", "--no-platform", "--no-sweep", "--job-steps", "12", "--workers", "1",
           "--out", str(tmp_path / "out"),
           "--cache-dir", str(tmp_path / "cache")]
    job_dir = tmp_path / "out" / "rlhf-job"
    t0 = time.time()
    log = open(tmp_path / "nightly-killed.log", "w")
    nightly = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    server_pid = None
    try:
        def cmdline(proc) -> str:
            try:
                return " ".join(proc.cmdline())
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # a short-lived child ended while we looked
                return ""

        def server():
            kids = psutil.Process(nightly.pid).children(recursive=True)
            return next((k.pid for k in kids if "uvicorn" in cmdline(k)), None)

        server_pid = _wait_for(server, 300, "the temporary Prefect server", proc=nightly)
        _wait_for(lambda: (job_dir / "checkpoints" / "step-000004").exists(), 600, "the job's first checkpoint",
                  every=0.05, proc=nightly)
        nightly.send_signal(signal.SIGKILL)
        nightly.wait()
        killed_at = time.time()
        _wait_for(lambda: _gone(server_pid), 30, "the orphaned server to stop")
        server_stop_s = time.time() - killed_at
    except AssertionError:
        log.flush()
        print((tmp_path / "nightly-killed.log").read_text()[-4000:])
        raise
    finally:
        _stop(nightly)
        log.close()
        if server_pid is not None and not _gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)
    c, runs = _store_runs(tmp_path)
    dead = {r.info.run_id for r in runs if r.info.status == "RUNNING"}
    assert dead, "the kill left no RUNNING run: nothing to reap (killed too late?)"

    rerun = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    wall = time.time() - t0
    c, runs = _store_runs(tmp_path)
    status = {r.info.run_id: r.info.status for r in runs}
    assert [r for r, s in status.items() if s == "RUNNING"] == []
    assert {status[r] for r in dead} == {"KILLED"}
    assert all("died" in c.get_run(r).data.tags["rlhfops.reaped"] for r in dead)
    versions = c.search_model_versions("name = 'acme-policy'")
    assert not {v.run_id for v in versions} & dead  # nothing registered from the dead run
    job = [r for r in runs if r.data.tags.get("rlhfops.kind") == "rlhf_job" and r.info.run_id not in dead]
    assert len(job) == 1 and job[0].info.status in ("FINISHED", "FAILED")
    # the rerun resumed the killed job from its checkpoint instead of wiping it: its history covers every step
    steps = [m.step for m in c.get_metric_history(job[0].info.run_id, "reward_mean")]
    assert min(steps) == 1 and sorted(set(steps)) == list(range(1, max(steps) + 1))
    print(f"\nkill -9 nightly + rerun: wall {wall:.0f} s; orphaned server stopped {server_stop_s:.1f} s after the kill")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def test_a_60s_api_outage_during_an_rlhf_job_ends_succeeded_scored_and_registered(tmp_path):
    """A real `prefect server start` on a free loopback port; the job runs against it in its own process; the test
    stops the server once training has begun and starts it again 60 s later on the same port and database. Wall
    about 2.5-3.5 minutes on 2 shared cores (60 s of it the outage)."""
    port = _free_port()
    env = _env(tmp_path, PREFECT_API_URL=f"http://127.0.0.1:{port}/api", PREFECT_UI_ENABLED="false")
    log = open(tmp_path / "server.log", "a")

    def start_server():
        return subprocess.Popen([PY, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    job_dir = tmp_path / "job"
    code = textwrap.dedent(f"""
        import json
        from flows.nightly import nightly_job_config
        from flows.rlhf_job import rlhf_job
        state = rlhf_job(request=dict(config=nightly_job_config(12, {str(tmp_path / 'cache')!r}),
                                      overrides={TINY_JOB!r}, name="outage", out_root={str(job_dir)!r},
                                      run_dir="."), return_state=True)
        res = state.result(raise_on_failure=False)
        print("RESULT " + json.dumps({{"flow_state": state.type.value, "message": state.message,
                                       "summary": res if isinstance(res, dict) else repr(res)}}, default=str))
    """)
    t0 = time.time()
    server = start_server()
    job = None
    try:
        _wait_for(lambda: _healthy(port), 300, "the Prefect server")
        job = subprocess.Popen([PY, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE,
                               stderr=open(tmp_path / "job.log", "w"), text=True)
        csv = job_dir / "metrics.csv"
        _wait_for(lambda: csv.exists() and len(csv.read_text().splitlines()) >= 3, 600, "training to begin",
                  proc=job)
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        down_at = time.time()
        time.sleep(60)
        assert job.poll() is None, "the job ended during the outage"
        server = start_server()
        _wait_for(lambda: _healthy(port), 300, "the Prefect server to come back")
        outage_s = time.time() - down_at
        out, _ = job.communicate(timeout=600)
    finally:
        _stop(job)
        _stop(server, group=True)
        log.close()
    wall = time.time() - t0
    result = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    assert result["flow_state"] == "COMPLETED", result
    summary = result["summary"]
    assert summary["state"] == "SUCCEEDED"
    scores = json.loads((job_dir / "scores.json").read_text())
    checkpoints = sorted(p.name for p in (job_dir / "checkpoints").glob("step-*"))
    assert checkpoints and sorted(Path(s["checkpoint"]).name for s in scores) == checkpoints
    c, runs = _store_runs(tmp_path)
    (run,) = [r for r in runs if r.data.tags.get("rlhfops.kind") == "rlhf_job"]
    assert run.info.status == "FINISHED" and run.data.tags["run_state"] == "SUCCEEDED"
    versions = c.search_model_versions(f"run_id = '{run.info.run_id}'")
    assert [int(v.version) for v in versions] == [summary["registry"]["version"]]
    assert float(versions[0].tags["eval_score"]) == max(s["eval_score"] for s in scores)
    print(f"\nAPI outage {outage_s:.0f} s during an rlhf-job: SUCCEEDED, {len(scores)} checkpoints scored, "
          f"version {summary['registry']['version']} registered; wall {wall:.0f} s")


def test_two_trains_on_one_run_directory_one_runs_the_other_exits_2(tmp_path):
    """Two `rlhfops train` of the same config and run directory started together (the issue's reproduction: both
    exited 0 and `metrics.csv` lost steps): one exits 2 at once with one line naming the other, which writes every
    step once. Wall about 30-60 s on 2 shared cores."""
    import pandas as pd

    from flows.nightly import nightly_job_config
    from training.job.config import resolve_config

    cfg = resolve_config(nightly_job_config(6, str(tmp_path / "cache")), TINY_JOB)
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    out = tmp_path / "run"
    cmd = [PY, "-m", "rlhfops.cli", "train", str(config), "--out", str(out)]
    env = _env(tmp_path)
    t0 = time.time()
    # the winner builds the warm-start cache and trains while holding the directory: the loser, started at the same
    # time, reaches the lock long before the winner is done
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    try:
        outputs = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            _stop(p)
    wall = time.time() - t0
    codes = [p.returncode for p in procs]
    assert sorted(codes) == [0, 2], outputs
    winner, loser = (0, 1) if codes[0] == 0 else (1, 0)
    lines = outputs[loser][1].strip().splitlines()
    assert len(lines) == 1 and "--out: run directory" in lines[0] and f"in use by pid {procs[winner].pid}" in lines[0]
    assert list(pd.read_csv(out / "metrics.csv")["step"]) == list(range(1, 7))  # every step once, in order
    # the winner's output is a pipe: its progress arrives as plain lines (a rich bar printed nothing there)
    assert re.search(r"\] stage 1: PPO \w+ \(0/6\)$", outputs[winner][0], re.M), outputs[winner][0]
    assert re.search(r"\]   done: PPO \w+ \(6/6\) in \d+\.\d s$", outputs[winner][0], re.M), outputs[winner][0]
    print(f"\ntwo writers: one refused, the other wrote 6/6 steps; wall {wall:.0f} s")


def test_the_temporary_server_dies_with_its_parent_on_kill_9(tmp_path):
    """A process that starts the temporary server the way `rlhfops nightly` does, killed with SIGKILL: its server
    stops within seconds (Prefect's own atexit hook never runs on SIGKILL). Wall about 15-40 s."""
    code = textwrap.dedent("""
        from infra.provision import own_temporary_server
        from prefect.client.orchestration import get_client
        from prefect.server.api.server import SubprocessASGIServer
        import threading, time
        own_temporary_server()
        # from a short-lived thread, as `rlhfops nightly` does: a parent-death signal would fire when it exits
        t = threading.Thread(target=lambda: get_client(sync_client=True).__enter__().hello())
        t.start(); t.join()
        print(SubprocessASGIServer._instances[None].server_process.pid, flush=True)
        time.sleep(600)
    """)
    t0 = time.time()
    parent = subprocess.Popen([PY, "-c", code], cwd=REPO, env=_env(tmp_path), stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        server_pid = int(parent.stdout.readline())
        time.sleep(3)
        assert not _gone(server_pid)  # alive while its parent is, after the starting thread ended
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        killed = time.time()
        _wait_for(lambda: _gone(server_pid), 30, "the server to stop")
        stop_s = time.time() - killed
    finally:
        _stop(parent)
        if server_pid is not None and not _gone(server_pid):
            os.kill(server_pid, signal.SIGKILL)
    print(f"\ntemporary server stopped {stop_s:.1f} s after kill -9 of its parent; wall {time.time() - t0:.0f} s")
