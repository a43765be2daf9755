"""Every deployment in prefect.yaml, run the way docs/orchestration.md tells a user to: `prefect server start`,
a process work pool, `prefect --no-prompt deploy --all` from the repository root, `prefect worker start`, then
`run_deployment` for each deployment. Each flow run must end Completed, and MLflow must hold what it wrote.

In-process flows (tests/flows/test_flows_e2e.py) never saw what only a worker does: it loads the entrypoint with
`flows/` first on `sys.path` and runs each flow run in a fresh process that spawns the compute pool. Every
process started here is stopped by its process group, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
POOL = "local-process"  # prefect.yaml's work pool
#: the nightly-sweep run, trimmed so CI stays short: the matrix on the compute pool (what died under a worker)
#: and the RLHF job as a subflow; the canaries, detectors and platform round run in tests/flows/test_flows_e2e.py
NIGHTLY = {"quick": True, "experiments": ["E1"], "seeds": [42], "detectors": False, "job_steps": 4,
           "job_overrides": {"task.n_pairs": 200, "task.sft_steps": 60, "ppo.batch_size": 8,
                             "ppo.max_new_tokens": 16},
           "canaries": [], "platform": False, "sweep": False, "workers": 2}


def _tenant_job(folder: Path) -> Path:
    """A tenant's folder (data, reward module, config): tests/tenant_job.py."""
    from tenant_job import write_job

    return write_job(folder, "my_reward.py:score")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started with its own session, and everything it started, by its group id. A process
    worker ignores SIGTERM for ~30 s, so the group gets SIGKILL after a short grace period."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"prefect server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"prefect server not healthy after {timeout_s} s:\n{log.read_text()[-3000:]}")


@pytest.fixture()
def stack(tmp_path):
    """A real Prefect server on a free loopback port with its own home, the work pool, the deployments and a
    process worker whose flow runs write MLflow to a store in tmp_path."""
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    store = f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    env = {**os.environ, "PREFECT_API_URL": api, "PREFECT_UI_API_URL": api, "PREFECT_HOME": str(tmp_path / "home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_TRACKING_URI": store,
           "OMP_WAIT_POLICY": "PASSIVE", "MPLBACKEND": "Agg", "PREFECT_WORKER_QUERY_SECONDS": "2"}
    procs: list[subprocess.Popen] = []
    logs = {name: tmp_path / f"{name}.log" for name in ("server", "worker")}

    def start(name: str, *args: str) -> subprocess.Popen:
        with open(logs[name], "w") as out:
            proc = subprocess.Popen([PREFECT, *args], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        procs.append(proc)
        return proc

    def cli(*args: str) -> str:
        done = subprocess.run([PREFECT, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    # concurrent first opens of a fresh MLflow database race on its migrations: create it once, here
    subprocess.run([sys.executable, "-c", "from infra.tracking import init_store; init_store()"], cwd=ROOT, env=env,
                   check=True, timeout=300)
    t0 = time.time()
    try:
        server = start("server", "server", "start", "--host", "127.0.0.1", "--port", str(port))
        _wait_healthy(api, server, logs["server"])
        cli("work-pool", "create", POOL, "--type", "process")
        deployed = cli("--no-prompt", "deploy", "--all")
        start("worker", "worker", "start", "--pool", POOL)
        yield {"api": api, "store": store, "env": env, "tmp": tmp_path, "deployed": deployed, "logs": logs,
               "setup_s": time.time() - t0}
    finally:
        for proc in reversed(procs):
            _stop(proc)
        for proc in procs:
            assert proc.poll() is not None, f"process {proc.pid} still running"


def _wait(flow_run_ids: dict[str, object], worker_log: Path, timeout_s: float = 900) -> dict[str, object]:
    """Poll the flow runs until each is final; returns them by name."""
    from prefect.client.orchestration import get_client

    deadline, done = time.time() + timeout_s, {}
    with get_client(sync_client=True) as c:
        while len(done) < len(flow_run_ids) and time.time() < deadline:
            for name, fid in flow_run_ids.items():
                if name not in done:
                    fr = c.read_flow_run(fid)
                    if fr.state is not None and fr.state.is_final():
                        done[name] = fr
            time.sleep(2)
    missing = set(flow_run_ids) - set(done)
    assert not missing, f"not finished after {timeout_s} s: {missing}\n{worker_log.read_text()[-4000:]}"
    for name, fr in done.items():
        assert fr.state.is_completed(), (f"{name}: {fr.state.name}: {fr.state.message}\n"
                                         f"worker log:\n{worker_log.read_text()[-4000:]}")
    return done


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a real server and worker (the `stack` fixture), then up to 900 s of flow runs
def test_every_deployment_completes_under_a_real_server_and_process_worker(stack, monkeypatch):
    import mlflow
    import pandas as pd
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra import tracking as T

    tmp = stack["tmp"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", stack["store"])
    t0 = time.time()
    with temporary_settings({PREFECT_API_URL: stack["api"]}):
        with get_client(sync_client=True) as c:
            names = sorted(f"{c.read_flow(d.flow_id).name}/{d.name}" for d in c.read_deployments())
        assert names == ["evaluate-checkpoint/evaluate", "nightly-sweep/nightly-sweep", "rlhf-job/rlhf-job",
                         "scheduling-experiment/simulate", "sweep/sweep"], stack["deployed"]
        # all at once (the worker runs them side by side), then the evaluation of what the jobs registered
        submitted = {
            # the deployment's own defaults; only the output root moves out of the checkout
            "job": run_deployment("rlhf-job/rlhf-job", parameters={"request": {"out_root": str(tmp / "job")}},
                                  timeout=0),
            # the docs' example, `prefect deployment run 'rlhf-job/rlhf-job' -p request='{"tenant": "globex",
            # "steps": 40}'`, with 20 steps (CI time; a checkpoint at 20): a partial request over the defaults
            "job-docs": run_deployment("rlhf-job/rlhf-job", parameters={"request": {
                "tenant": "globex", "steps": 20, "out_root": str(tmp / "job-globex")}}, timeout=0),
            # a run's `request` replaces the deployment's (experiment E2) as a whole: name it again
            "simulate": run_deployment("scheduling-experiment/simulate", parameters={"request": {
                "experiment": "E2", "out_dir": str(tmp / "sim")}}, timeout=0),
            "nightly": run_deployment("nightly-sweep/nightly-sweep", parameters={
                **NIGHTLY, "out_dir": str(tmp / "nightly"), "cache_dir": str(tmp / "cache")}, timeout=0),
            # a tenant's own job: their GSM8K-format files and reward module in a folder outside the repository; the
            # reward function's processes are spawned from the worker's flow-run process (flows/ first on its path)
            "tenant": run_deployment("rlhf-job/rlhf-job", parameters={"request": {
                "config": str(_tenant_job(tmp / "tenant")), "tenant": "initech", "name": "arith",
                "out_root": str(tmp / "job-initech")}}, timeout=0),
        }
        runs = _wait({k: fr.id for k, fr in submitted.items()}, stack["logs"]["worker"])
        t1 = time.time()
        # the deployment's default: models:/acme-policy@best, which the jobs above just registered
        evaluate = run_deployment("evaluate-checkpoint/evaluate", timeout=0)
        runs.update(_wait({"evaluate": evaluate.id}, stack["logs"]["worker"]))
        job_id = runs["job"].id
        with get_client(sync_client=True) as c:
            logs = [rec.message for rec in c.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(
                any_=[job_id])))]
            arts = c.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[job_id])))
    print(f"server + pool + deploy + worker {stack['setup_s']:.1f} s; jobs, simulate, nightly {t1 - t0:.1f} s; "
          f"evaluate {time.time() - t1:.1f} s")

    # MLflow: one finished run per deployment run, tagged with its deployment and flow run
    mlflow.set_tracking_uri(stack["store"])
    df = mlflow.search_runs(experiment_names=[T.DEFAULT_EXPERIMENT], max_results=1000)
    by_flow_run = {r[f"tags.{T.FLOW_RUN_TAG}"]: r for _, r in df.iterrows()
                   if r.get(f"tags.{T.KEY_TAG}", "").startswith("flow/")}
    for name, kind, deployment in [("job", "rlhf_job", "rlhf-job"), ("job-docs", "rlhf_job", "rlhf-job"),
                                   ("evaluate", "evaluation", "evaluate"),
                                   ("simulate", "scheduling_experiment", "simulate"),
                                   ("nightly", "nightly", "nightly-sweep")]:
        r = by_flow_run[str(runs[name].id)]
        assert r[f"tags.{T.KIND_TAG}"] == kind and r.status == "FINISHED", name
        assert r[f"tags.{T.DEPLOYMENT_TAG}"] == deployment, name

    client = T.client()
    for name, tenant, steps in [("job", "acme", 60), ("job-docs", "globex", 20)]:
        job = by_flow_run[str(runs[name].id)]
        assert job["tags.run_state"].startswith("SUCCEEDED"), (name, job["tags.run_state"], job["tags.reason"])
        assert job["params.config"] == "configs/ppo-tiny.yaml" and job["params.overlap"] == "full"
        assert job[f"tags.{T.TENANT_TAG}"] == tenant and int(job["params.steps"]) == steps
        plots = {a.path for a in client.list_artifacts(job.run_id, "plots")}
        assert plots == {"plots/reward.png", "plots/kl.png", "plots/entropy.png", "plots/eval_gate.png"}, name
        assert client.search_model_versions(f"name = '{tenant}-policy' and run_id = '{job.run_id}'"), name
    tenant = by_flow_run[str(runs["tenant"].id)]
    assert tenant["tags.run_state"].startswith("SUCCEEDED"), tenant["tags.reason"]
    assert tenant["tags.reward.ref"] == "my_reward.py:score" and tenant["tags.task.kind"] == "dataset"
    inputs = {(d.dataset.name, {t.key: t.value for t in d.tags}["mlflow.data.context"])
              for d in client.get_run(tenant.run_id).inputs.dataset_inputs}
    assert inputs == {("train.jsonl", "training"), ("heldout.jsonl", "eval")}
    assert float(tenant["metrics.steps"]) == 4
    job = by_flow_run[str(job_id)]
    version = client.get_model_version_by_alias("acme-policy", "best")
    evaluation = by_flow_run[str(runs["evaluate"].id)]
    assert evaluation["params.checkpoint"] == "models:/acme-policy@best" and evaluation["metrics.eval_score"] == \
        pytest.approx(float(version.tags["eval_score"]), abs=1e-6)  # the same checkpoint, scored again
    exp = client.get_experiment_by_name(T.DEFAULT_EXPERIMENT)
    assert exp.tags[T.EXPERIMENT_KIND_TAG] == T.EXPERIMENT_KIND

    # simulate and the nightly's matrix ran their units in compute-pool processes of the worker's flow runs
    sim = pd.read_csv(tmp / "sim" / "summary.csv")
    assert set(sim["experiment"]) == {"E2"} and (sim["n_seeds"] == 5).all()  # E2's own five seeds
    night = by_flow_run[str(runs["nightly"].id)]
    below = df[df[f"tags.{T.PARENT_TAG}"] == night.run_id]
    assert set(below[f"tags.{T.KIND_TAG}"]) == {"scheduling_experiment", "rlhf_job", "evaluation"}

    # the run's log shows step progress; its artifact links the MLflow run
    steps = int(job["metrics.steps"])
    progress = [m for m in logs if m.startswith("step ") and f"/{60}:" in m]
    assert len(progress) >= steps // 5 and progress[0].startswith("step 5/60: reward ")
    (art,) = [a for a in arts if a.type == "markdown"]
    assert f"/runs/{job.run_id}" in art.data and "#/experiments/" in art.data
