"""A tenant's own job in a platform round: a jobs file entry naming the tenant's dataset config (relative to the jobs
file's folder) with overrides such as `reward.ref` becomes a request that carries them, and the round trains it (its
warm start from the tenant's reference completions, no proxy reward model to fit, its data files and code hashes on
its MLflow run); a bad ref or a missing data file in one entry is refused before the round starts, in one line
naming the entry.

Oracles: the tenant folder of tests/cli/test_tenant_train.py (`_job`), paths worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tenant_job as TENANT  # noqa: N812 - tests/tenant_job.py: the tenant's folder

from common.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]



def _jobs_file(tmp_path: Path, *extra: dict) -> Path:
    """tmp_path/round/jobs.json: a synthetic job and the tenant's dataset job (config relative to the file), and
    `extra` entries."""
    TENANT.write_job(tmp_path / "round" / "tenant", "my_reward.py:score")
    jobs = [{"tenant": "acme", "name": "synthetic", "overrides": {"ppo.kl_coef": 0.1}},
            {"tenant": "globex", "name": "mine", "config": "tenant/job.yaml",
             "overrides": {"reward.ref": "my_reward.py:exact", "ppo.actor_lr": 5e-4}}, *extra]
    path = tmp_path / "round" / "jobs.json"
    path.write_text(json.dumps(jobs))
    return path


def _requests(path: Path, **kw):
    from flows.params import jobs_relative_to, round_requests

    jobs = jobs_relative_to(json.loads(path.read_text()), path.parent)
    return round_requests(jobs, steps=kw.pop("steps", 6), slots=2, out_dir=str(path.parent / "out"),
                          cache_dir=str(path.parent / "cache"), **kw)


def test_a_jobs_file_entry_names_the_tenants_dataset_config_and_its_overrides(tmp_path):
    from flows.params import check_round

    path = _jobs_file(tmp_path)
    synthetic, mine = _requests(path)
    assert isinstance(synthetic.config, dict)  # the round's shared small config
    assert mine.config == str(tmp_path / "round" / "tenant" / "job.yaml")
    assert mine.overrides == {"reward.ref": "my_reward.py:exact", "ppo.actor_lr": 5e-4}
    assert (mine.tenant, mine.name, mine.steps, mine.cluster_gpus) == ("globex", "mine", 6, 2)
    assert mine.out_dir == tmp_path / "round" / "out" / "globex" / "mine"
    _, checked = check_round([synthetic, mine])
    cfg = checked.config
    assert cfg.task.kind == "dataset" and cfg.task.train == str(tmp_path / "round" / "tenant" / "train.jsonl")
    assert cfg.reward.kind == "function" and cfg.reward.ref == "my_reward.py:exact"
    assert cfg.config_dir == str(tmp_path / "round" / "tenant") and cfg.ppo.actor_lr == 5e-4 and cfg.steps == 6
    # an absolute config path stays as it is; a working directory elsewhere changes nothing
    from flows.params import jobs_relative_to

    absolute = [{"tenant": "a", "name": "b", "config": str(path.parent / "tenant" / "job.yaml")}]
    assert jobs_relative_to(absolute, "/elsewhere") == absolute


@pytest.mark.parametrize("entry, names", [
    ({"tenant": "initech", "name": "bad-ref", "config": "tenant/job.yaml",
      "overrides": {"reward.ref": "their_reward.py:score"}}, ("reward.ref", "their_reward.py")),
    ({"tenant": "initech", "name": "bad-gate", "config": "tenant/job.yaml",
      "overrides": {"gate.ref": "exact"}}, ("gate.ref", "names no function")),
    ({"tenant": "initech", "name": "no-data", "config": "tenant/job.yaml",
      "overrides": {"task.heldout": "gone.jsonl"}}, ("task.heldout", "gone.jsonl")),
    ({"tenant": "initech", "name": "no-config", "config": "tenant/nope.yaml"}, ("config", "nope.yaml")),
])
def test_a_bad_tenant_entry_is_refused_naming_it(entry, names, tmp_path):
    from flows.params import check_round

    path = _jobs_file(tmp_path, entry)
    with pytest.raises(BadInput) as err:
        check_round(_requests(path))
    line = str(err.value)
    assert line.startswith(f"jobs[2] (initech/{entry['name']}): ") and "\n" not in line, line
    for name in names:
        assert name in line, line


def test_rlhfops_platform_reads_config_paths_from_the_jobs_files_folder_and_refuses_a_bad_entry(
        tmp_path, capsys, monkeypatch):
    """`rlhfops platform --jobs FILE` from another working directory: a bad entry exits 2 naming it before any server
    starts; a good file reaches the round with the tenant's config found."""
    from cli_helpers import run_cli, tripwire

    import rlhfops.commands.flowrun as flowrun

    monkeypatch.setattr(flowrun, "start_prefect_api", tripwire)
    monkeypatch.chdir(tmp_path)
    bad = _jobs_file(tmp_path, {"tenant": "initech", "name": "x", "config": "tenant/job.yaml",
                                "overrides": {"reward.ref": "nowhere.py:score"}})
    code, lines = run_cli(["platform", "--steps", "4", "--jobs", bad, "--out", tmp_path / "out"], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: jobs[2] (initech/x): reward.ref") and "nowhere.py" in lines[0], lines
    assert not (tmp_path / "out").exists()

    class Reached(Exception):
        pass

    def reached(*_a, **kw):
        raise Reached(kw)

    good = _jobs_file(tmp_path)
    monkeypatch.setattr(flowrun, "prefect_env", lambda verbose: None)
    monkeypatch.setattr(flowrun, "start_prefect_api", lambda: None)
    monkeypatch.setattr(flowrun, "run_flow", reached)
    monkeypatch.setattr("infra.tracking.init_store", lambda: "sqlite:///nowhere")
    with pytest.raises(Reached) as got:
        run_cli(["platform", "--steps", "4", "--jobs", good, "--out", tmp_path / "out"], capsys, monkeypatch)
    jobs = got.value.args[0]["jobs"]
    assert jobs[1]["config"] == str(tmp_path / "round" / "tenant" / "job.yaml")
    assert jobs[1]["overrides"]["reward.ref"] == "my_reward.py:exact"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_a_round_trains_the_tenants_dataset_job(algorithm, prefect_server, mlflow_store, tmp_path):
    """One tiny tenant job in a round of its own: it completes, warm-started from its references, with its data
    files and code hashes on its MLflow run; as its config's PPO or as critic-free GRPO (its entry's overrides), the
    algorithm on its run (tag and params), its jobs.csv row and its ledger row."""
    import pandas as pd

    from flows.params import jobs_relative_to
    from flows.platform_round import platform_round
    from infra import tracking as T

    path = _jobs_file(tmp_path)
    jobs = jobs_relative_to(json.loads(path.read_text())[1:], path.parent)
    if algorithm == "grpo":
        jobs[0]["overrides"].update({"algorithm": "grpo", "ppo.group_size": 2})
    state = platform_round(jobs=jobs, scheduler="FIFO", slots=1, steps=4, out_dir=str(tmp_path / "out"),
                           cache_dir=str(tmp_path / "cache"), slot_limit="gpu-slots-tenant-round",
                           retry_delay_s=0.1, return_state=True)
    assert state.is_completed(), state.message
    table = state.result()["jobs"]
    (row,) = table.to_dict("records")
    assert (row["tenant"], row["job"], row["state"], row["steps"]) == ("globex", "mine", "SUCCEEDED", 4), row
    run = T.client().get_run(row["run_id"])
    assert row["algorithm"] == run.data.tags["algorithm"] == run.data.params["algorithm"] == algorithm
    assert run.data.params["ppo.group_size"] == ("2" if algorithm == "grpo" else "1")
    ledger = pd.read_csv(tmp_path / "out" / "ledger.csv").set_index("run_id")
    assert ledger.loc[row["run_id"], "algorithm"] == algorithm
    contexts = sorted({t.key: t.value for t in i.tags}["mlflow.data.context"] for i in run.inputs.dataset_inputs)
    assert contexts == ["eval", "training"]
    assert run.data.tags["reward.ref"] == "my_reward.py:exact" and run.data.tags["reward.code_hash"]
    assert list((tmp_path / "round" / "tenant" / "cache").glob("base-*.pt"))  # warm start from the references
