"""`rlhfops train` says how a run ended by its exit code and its job.json, whatever ended it: a run a paging alert made
FAILED exits 1, stops at the step the alert paged (the slots it would have spent on the rest are not spent), and
writes job.json with the reason; every pointer its lines make holds (the health history is in job.json, a
checkpoint is named only when one was saved).

The fault is injected by hand into the real trainer: from step 2 on every step's KL reads 10, over the PPO ceiling of
the shipped catalog (configs/alerts.yaml: 6.0 per sequence, persist 2), so `kl_blowup` pages at step 3 of the 8
asked for. The oracle is that arithmetic, not the code under test."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from cli_helpers import run_cli_output

STEPS, SPIKE_FROM, PAGED_AT = 8, 2, 3


def tiny_yaml(folder: Path, cache: Path, checkpoint_every: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    raw = {"seed": 0, "steps": STEPS, "cache_dir": str(cache),
           "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
           "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
           "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 8,
                    "long_mean_len": 10.0},
           "ppo": {"batch_size": 4, "max_new_tokens": 16, "num_ppo_epochs": 1, "num_mini_batches": 1},
           "oppo": {"tune_chunk": False},
           "checkpoint_every": checkpoint_every, "eval_every": 2, "eval_prompts": 8}
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def spike_kl(monkeypatch) -> None:
    from training.trainer import Trainer

    real_step = Trainer.train_step

    def train_step(self):
        rec = real_step(self)
        if rec.step >= SPIKE_FROM:
            rec.kl = 10.0
        return rec

    monkeypatch.setattr(Trainer, "train_step", train_step)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("checkpoint_every", [2, 100])
def test_a_run_an_alert_failed_exits_1_stops_and_records_why(tmp_path, capsys, monkeypatch, warm_start_cache,
                                                            checkpoint_every):
    spike_kl(monkeypatch)
    config = tiny_yaml(tmp_path / "job", warm_start_cache, checkpoint_every)
    out_dir = tmp_path / "run"
    code, out, err = run_cli_output(["train", config, "--overlap", "none", "--out", out_dir], capsys, monkeypatch)
    text = " ".join((out + err).split())
    assert code == 1, text
    # fewer steps than asked: the run stopped at the step the alert paged, it did not train on to step 8
    steps = [int(r["step"]) for r in csv.DictReader((out_dir / "metrics.csv").open())]
    assert steps == list(range(1, PAGED_AT + 1))
    done = json.loads((out_dir / "job.json").read_text())
    assert done["state"] == "FAILED(algorithmic_non_convergence)"
    assert done["failure_class"] == "algorithmic_non_convergence"
    assert done["decided_by"] == "alert" and done["decision"] == f"failed: kl_blowup at step {PAGED_AT}"
    assert "kl_blowup" in done["reason"] and done["reason"] in text
    # "the health history is attached": it is, in job.json
    assert "the health history is attached" in done["reason"]
    assert done["alerts"] and all(line.startswith("kl_blowup at step 3") for line in done["alerts"])
    assert done["history"][-1] == "FAILED(algorithmic_non_convergence)"
    assert "traceback" not in done and "examples" not in done  # nothing raised, no sample failed
    assert f"the health history and the run's record: {out_dir / 'job.json'}" in text
    saved = sorted(str(p) for p in (out_dir / "checkpoints").glob("step-*"))
    if checkpoint_every == 2:
        assert [Path(p).name for p in saved] == ["step-000002"]
        assert done["last_checkpoint"] == saved[-1] and f"last checkpoint: {saved[-1]}" in text
    else:  # none saved: none named
        assert saved == [] and done["last_checkpoint"] is None and "checkpoint:" not in text


@pytest.mark.timeout(600)
def test_train_logs_to_mlflow_under_the_tenant_and_name_given(tmp_path, capsys, monkeypatch, warm_start_cache):
    """With MLFLOW_TRACKING_URI set (a temporary SQLite store), `rlhfops train --tenant --name` leaves one MLflow run
    named `<tenant>/<name>` with the tenant tag, the config as params, the steps it ran as metrics and how it ended
    (the alert-failed run above: FAILED, decided by the alert at step 3)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    spike_kl(monkeypatch)
    config = tiny_yaml(tmp_path / "job", warm_start_cache, 2)
    code, out, err = run_cli_output(["train", config, "--overlap", "none", "--out", tmp_path / "run",
                                     "--tenant", "umbrella", "--name", "first-try"], capsys, monkeypatch)
    assert code == 1, out + err
    client = MlflowClient(uri)
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    tags, params = run.data.tags, run.data.params
    assert run.info.run_name == "umbrella/first-try" and tags["tenant"] == "umbrella"
    assert run.info.status == "FAILED" and tags["run_state"] == "FAILED(algorithmic_non_convergence)"
    assert tags["decided_by"] == "alert" and tags["decision"] == f"failed: kl_blowup at step {PAGED_AT}"
    assert params["steps"] == str(STEPS) and params["ppo.batch_size"] == "4" and params["overlap"] == "none"
    kl = client.get_metric_history(run.info.run_id, "kl")
    assert [m.step for m in kl] == list(range(1, PAGED_AT + 1))  # every step it ran, none after the page
    assert [m.value for m in kl][SPIKE_FROM - 1:] == [10.0] * (PAGED_AT - SPIKE_FROM + 1)
    done = json.loads((tmp_path / "run" / "job.json").read_text())
    assert (done["tenant"], done["name"]) == ("umbrella", "first-try")
    assert run.info.run_id in " ".join((out + err).split())


def test_train_writes_no_store_without_a_tracking_uri(tmp_path, monkeypatch):
    from rlhfops.commands.train import tracked_run

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracked_run(None, None) is None and list(tmp_path.iterdir()) == []
