"""A tenant's own job (data files, reward and gate functions in a folder outside the repository) through the
`rlhf-job` flow, as its deployment runs it: COMPLETED with the data files as MLflow dataset inputs and the code
hashes as tags; a reward function that raises ends the flow run FAILED with the failure class in its state message,
the examples in job.json and as an MLflow artifact, while the trainer's process lives on; bad data fails the flow
run before a slot, an MLflow run or a run directory exists. The deployment's run form tells a user how to name
their data and reward.

Oracles: the tenant folder of tests/cli/test_tenant_train.py (`_job`), the files' sha256 computed here, the
tenant function's own process id written by the function."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import tenant_job as TENANT  # noqa: N812 - tests/tenant_job.py: the tenant's folder

from infra import tracking as T

ROOT = Path(__file__).resolve().parents[2]


#: appended to the tenant's module: a reward that tries to write into its folder (read-only in its sandbox) and
#: raises on every sample
RAISES = '''

def broken(prompts, completions, **_):
    try:
        with open("pids.txt", "a") as f:
            f.write(f"{os.getpid()}\\n")
    except OSError:
        pass
    raise KeyError("no such answer column")
'''


def _request(config: Path, out: Path, **fields) -> dict:
    return {"config": str(config), "tenant": "acme", "name": "mine", "out_root": str(out), "run_dir": ".",
            "detector": None, **fields}


#: the job as its config says (PPO), and as critic-free GRPO chosen on the run form (its drop-down and group size:
#: 2 groups of 2 completions a step)
ALGORITHMS = {"ppo": {}, "grpo": {"algorithm": "grpo", "group_size": 2}}


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_a_tenant_dataset_job_completes_with_its_inputs_and_code_hashes(algorithm, prefect_server, mlflow_store,
                                                                        tmp_path, monkeypatch):
    import pandas as pd

    from flows.rlhf_job import rlhf_job

    config = TENANT.write_job(tmp_path / "tenant", "my_reward.py:score")
    monkeypatch.chdir(tmp_path)  # not the config's folder
    state = rlhf_job(request=_request(config, tmp_path / "jobs", **ALGORITHMS[algorithm]), return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["state"] == "SUCCEEDED" and summary["metrics"]["steps"] == 4
    run = T.client().get_run(summary["run_id"])
    # the algorithm everywhere an analyst looks: the run's tag and params, its ledger row, the registered version
    group = 2 if algorithm == "grpo" else 1
    assert run.data.tags["algorithm"] == algorithm == summary["algorithm"]
    assert (run.data.params["algorithm"], run.data.params["ppo.group_size"]) == (algorithm, str(group))
    ledger = pd.read_csv(tmp_path / "jobs" / "ledger.csv")
    assert ledger.set_index("run_id").loc[summary["run_id"], "algorithm"] == algorithm
    version = T.client().get_model_version(summary["registry"]["model"], str(summary["registry"]["version"]))
    assert version.tags["algorithm"] == algorithm
    assert ("loss_value" in run.data.metrics) == (algorithm == "ppo")  # GRPO trained no value model
    inputs = {i.dataset.name: i for i in run.inputs.dataset_inputs}
    contexts = {name: {t.key: t.value for t in i.tags}["mlflow.data.context"] for name, i in inputs.items()}
    assert sorted(contexts.values()) == ["eval", "training"], contexts
    for i in inputs.values():
        context = {t.key: t.value for t in i.tags}["mlflow.data.context"]
        path = tmp_path / "tenant" / ("train.jsonl" if context == "training" else "heldout.jsonl")
        assert hashlib.sha256(path.read_bytes()).hexdigest().startswith(i.dataset.digest)
        assert str(path) in i.dataset.source
    tags = run.data.tags
    from training.inputs.code_identity import file_function_identity

    source = tmp_path / "tenant" / "my_reward.py"
    assert tags["task.kind"] == "dataset" and tags["reward.kind"] == tags["gate.kind"] == "function"
    assert tags["reward.ref"] == "my_reward.py:score" and tags["gate.ref"] == "my_reward.py:exact"
    # one file, two functions: each hash is its own function's code (training/inputs/code_identity.py), not the file's
    assert tags["reward.code_hash"] == file_function_identity(source, "score")
    assert tags["gate.code_hash"] == file_function_identity(source, "exact")
    assert tags["reward.code_hash"] != tags["gate.code_hash"]
    file_hash = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    assert file_hash not in (tags["reward.code_hash"], tags["gate.code_hash"])
    assert run.data.tags["run_state"] == "SUCCEEDED"
    assert tags["tenant_code.sandbox"] == "bwrap"  # where the tenant's code ran


def test_a_reward_function_that_raises_fails_the_flow_run_as_the_tenants_fault(prefect_server, mlflow_store,
                                                                                 tmp_path):
    from flows.rlhf_job import JOB_DONE, TENANT_ERRORS, rlhf_job

    config = TENANT.write_job(tmp_path / "tenant", "my_reward.py:broken")
    with (tmp_path / "tenant" / "my_reward.py").open("a") as f:
        f.write(RAISES)
    out = tmp_path / "jobs"
    state = rlhf_job(request=_request(config, out), return_state=True)
    assert state.is_failed()
    message = " ".join(state.message.split())
    assert "acme/mine: FAILED(tenant_code_fault): " in message, message
    assert "your reward function my_reward.py:broken raised on 100.0% of samples (4 of 4) at step 1" in message
    # the trainer's process lived and goes on to read what was recorded; the function ran in its sandbox, where the
    # tenant's own folder is read-only
    assert not (tmp_path / "tenant" / "pids.txt").exists()
    job = json.loads((out / JOB_DONE).read_text())
    assert job["state"].startswith("FAILED") and job["failure_class"] == "tenant_code_fault"
    assert len(job["examples"]) == 4
    assert {e["error"] for e in job["examples"]} == {"KeyError: 'no such answer column'"}
    assert all("broken" in e["traceback"] for e in job["examples"])
    assert json.loads((out / TENANT_ERRORS).read_text()) == job["examples"]
    run = T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}")
    assert run is not None and run.info.status == "FAILED"
    assert run.data.tags["failure_class"] == "tenant_code_fault"
    assert TENANT_ERRORS in {a.path for a in T.client().list_artifacts(run.info.run_id)}


def test_a_rerun_in_the_same_directory_drops_the_last_runs_tenant_errors(tmp_path):
    """A job started over (its tenant fixed the function) logs no stale tenant_code_errors.json."""
    from flows.rlhf_job import JOB_DONE, TENANT_ERRORS, fresh_run_dir

    for name in (TENANT_ERRORS, JOB_DONE, "metrics.csv"):
        (tmp_path / name).write_text("{}")
    fresh_run_dir(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("broken, field, where", [
    ("train", "task.train", "line 7"),
    ("ref", "reward.ref", "nowhere.py"),
])
def test_bad_tenant_input_fails_the_flow_run_before_a_slot_a_run_or_a_directory(broken, field, where,
                                                                               prefect_server, mlflow_store,
                                                                               tmp_path):
    from flows.rlhf_job import rlhf_job
    from infra import provision

    config = TENANT.write_job(tmp_path / "tenant", "nowhere.py:score" if broken == "ref" else "my_reward.py:score")
    if broken == "train":
        lines = (tmp_path / "tenant" / "train.jsonl").read_text().splitlines()
        lines[6] = '{"question": "broken", "answer": '
        (tmp_path / "tenant" / "train.jsonl").write_text("\n".join(lines) + "\n")
    provision._slot_pools.clear()
    state = rlhf_job(request=_request(config, tmp_path / "jobs"), return_state=True)
    assert state.is_failed()
    (line,) = [ln for ln in state.message.splitlines() if ln.strip()]
    assert field in line and where in line, line
    if broken == "train":
        assert "train.jsonl" in line
    assert provision._slot_pools == {}  # no slot pool was even provisioned
    assert not (tmp_path / "jobs").exists()
    assert T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}") is None


# ------------------------------------------------------------------------------------------------ the run form
def test_the_run_form_tells_a_user_how_to_name_their_data_and_reward(tmp_path):
    """The `request` parameter's schema, as `prefect deploy` sends it for the rlhf-job deployment."""
    from prefect.utilities.callables import parameter_schema

    from flows.rlhf_job import rlhf_job

    schema = parameter_schema(rlhf_job).model_dump()
    fields = schema["definitions"]["JobRequest"]["properties"]
    config, overrides = fields["config"]["description"], fields["overrides"]["description"]
    assert "task: {kind: dataset" in config and "reward: {kind: function" in config, config
    assert "folder" in config  # where the relative paths are read from
    for key in ('"task.train"', '"reward.ref": "my_reward.py:score"'):
        assert key in overrides, overrides
    # the examples in the descriptions are valid: the overrides they show resolve against a dataset config
    from training.job.request import parse_request

    config_path = TENANT.write_job(tmp_path / "tenant", "my_reward.py:score")
    checked = parse_request({"config": str(config_path), "out_root": str(tmp_path / "jobs"),
                             "overrides": {"task.train": "train.jsonl", "reward.ref": "my_reward.py:score"}}
                            ).checked()
    assert checked.config.reward.ref == "my_reward.py:score" and checked.config.task.train.endswith("train.jsonl")


def test_the_nightly_job_stage_takes_a_dataset_config(tmp_path):
    """`nightly --job-config` (the flow's `job_config`): the nightly's RLHF job is the given dataset config, its own
    steps unless job_steps is given; a missing file is refused naming the parameter."""
    from common.errors import BadInput
    from flows.nightly_check import nightly_job_request

    arith = Path(__file__).resolve().parents[2] / "configs" / "ppo-arith.yaml"
    req = nightly_job_request(24, {"ppo.batch_size": 8}, str(tmp_path), tmp_path, config=str(arith))
    cfg = req.checked().config
    assert (cfg.task.kind, cfg.reward.ref, cfg.steps, cfg.ppo.batch_size) == ("dataset", "gsm8k:flexible_extract",
                                                                               150, 8)
    req = nightly_job_request(12, None, str(tmp_path), tmp_path, config=str(arith), steps_given=True)
    assert req.checked().config.steps == 12
    with pytest.raises(BadInput, match=r"^job_config: file 'nope.yaml' not found"):
        nightly_job_request(12, None, str(tmp_path), tmp_path, config="nope.yaml")


def test_the_nightly_job_stage_runs_a_grpo_config(tmp_path):
    """`nightly --job-config configs/grpo-arith.yaml`: the nightly's checked plan has a GRPO job (named by its
    algorithm, with the config's group size and no critic), and the algorithm becomes the nightly run's
    `job_algorithm` param; job_overrides may switch an algorithm too."""
    from flows.nightly_check import check_nightly, nightly_job_request
    from training.job.config import uses_critic

    grpo = Path(__file__).resolve().parents[2] / "configs" / "grpo-arith.yaml"
    plan = check_nightly(quick=True, experiments=[], canaries=[], sweep=False, job_config=str(grpo), job_steps=8,
                         out_dir=str(tmp_path / "out"), cache_dir=str(tmp_path / "cache"))
    cfg = plan.job.checked().config
    assert (plan.job_algorithm, plan.job.name, cfg.algorithm, cfg.ppo.group_size, cfg.steps) == (
        "grpo", "nightly-grpo", "grpo", 8, 8)
    assert not uses_critic(cfg)
    req = nightly_job_request(8, {"algorithm": "rloo", "ppo.group_size": 4}, str(tmp_path), tmp_path)
    assert req.name == "nightly-rloo" and req.checked().config.algorithm == "rloo"
