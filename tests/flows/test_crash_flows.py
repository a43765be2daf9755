"""`rlhf_job` under Prefect's test harness: a failed job registers nothing, a locked run directory fails the flow
at once (bad input, not retried), a finished job's directory is started over while an interrupted one resumes."""

from __future__ import annotations

import json

import pytest

from infra import tracking as T
from training.job.rundir import locked_run_dir

#: a smaller job than the nightly's (fewer reward-model pairs and SFT steps) so the tests stay short
TINY_JOB = {"task.n_pairs": 200, "task.sft_steps": 60, "ppo.batch_size": 16, "ppo.max_new_tokens": 24}


def _job_config(tmp_path, steps: int, fault: dict | None = None) -> dict:
    from flows.nightly import nightly_job_config

    raw = nightly_job_config(steps, str(tmp_path / "cache"))
    raw.update(eval_every=2, checkpoint_every=2)
    if fault:
        raw["fault"] = fault
    return raw


def test_a_locked_run_directory_fails_the_job_at_once_without_retries_or_runs(prefect_server, mlflow_store,
                                                                              tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.rlhf_job import rlhf_job

    out = tmp_path / "job"
    with locked_run_dir(out):
        state = rlhf_job(request={"config": _job_config(tmp_path, 4), "overrides": TINY_JOB, "out_root": str(out),
                                  "run_dir": "."}, return_state=True)
    assert state.is_failed()
    assert "run_dir: run directory" in state.message and "in use by pid" in state.message
    assert T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}") is None  # nothing tracked
    with get_client(sync_client=True) as c:
        tasks = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[
            state.state_details.flow_run_id])))
    assert tasks == []  # failed before any task (no worker started, nothing retried)
    assert not (out / "checkpoints").exists()


@pytest.mark.slow
def test_a_job_failed_by_kl_blowup_registers_nothing_and_a_rerun_starts_over(prefect_server, mlflow_store, tmp_path):
    """The canaries' 50x learning-rate fault: the KL alert pages, the job ends FAILED(algorithmic_non_convergence)
    with gated checkpoints on disk; before the fix its best checkpoint was registered and took `@best`. Then a
    healthy job on the same directory (resume is the default) starts over: the directory's job had ended."""
    from flows.rlhf_job import JOB_DONE, rlhf_job

    out = tmp_path / "job"
    state = rlhf_job(request={"config": _job_config(tmp_path, 10, {"kind": "lr_spike", "factor": 50.0, "at_step": 2}),
                              "overrides": TINY_JOB, "alert_profile": "canary", "out_root": str(out), "run_dir": "."},
                     return_state=True)
    assert state.is_failed()
    summary = json.loads((out / JOB_DONE).read_text())
    assert summary["state"] == "FAILED(algorithmic_non_convergence)", summary
    scores = json.loads((out / "scores.json").read_text())
    assert scores, "no checkpoint was scored: the test would not show a failed run's checkpoint being kept out"
    c = T.client()
    assert c.search_model_versions(f"run_id = '{summary['run_id']}'") == []
    assert "kl_blowup" in c.get_run(summary["run_id"]).data.tags["alerts"]

    healthy = rlhf_job(request={"config": _job_config(tmp_path, 4), "overrides": TINY_JOB, "out_root": str(out),
                                "run_dir": "."}, return_state=True)
    assert healthy.is_completed(), healthy.message
    res = healthy.result()
    # started over: steps 1-4 trained again in this run, not "nothing to do" after the failed job's last step
    assert res["metrics"]["steps"] >= 1 and res["state"] == "SUCCEEDED"
    assert [m.step for m in c.get_metric_history(res["run_id"], "reward_mean")][0] == 1
    mv = c.get_model_version_by_alias("acme-policy", "best")
    assert mv.run_id == res["run_id"]


def test_the_reaper_marks_a_dead_processs_flow_run_crashed(prefect_server, mlflow_store):
    import subprocess
    import sys

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    import tasks.tracking as TT

    @flow(name="killed-flow")
    def killed_flow():
        pass

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with get_client(sync_client=True) as c:
        fr = c.create_flow_run(killed_flow)
        c.set_flow_run_state(fr.id, Running(), force=True)
        done = c.create_flow_run(killed_flow)
        c.set_flow_run_state(done.id, Running(), force=True)
    run_id, _ = T.open_run("test/killed-flow", "killed", tags={T.FLOW_RUN_TAG: fr.id})
    T.set_tags(run_id, {T.OWNER_PID_TAG: dead.pid})
    alive_id, _ = T.open_run("test/alive-flow", "alive", tags={T.FLOW_RUN_TAG: done.id})  # owned by this process
    TT._reaped.discard(mlflow_store)
    assert TT.reap_once(mlflow_store) == [run_id]
    with get_client(sync_client=True) as c:
        assert c.read_flow_run(fr.id).state.type.value == "CRASHED"
        assert c.read_flow_run(done.id).state.type.value == "RUNNING"
    assert T.client().get_run(run_id).info.status == "KILLED"
    assert T.client().get_run(alive_id).info.status == "RUNNING"
