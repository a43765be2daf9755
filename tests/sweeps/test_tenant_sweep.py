"""A sweep over a tenant's own job: the base config is their dataset config (relative to the spec's folder), the
overrides and the space may name `task.*`, `reward.*` and `gate.*` fields of the new kinds; a value that does not
make a valid job (a reward file that is not there, a data file that does not read, a field the dataset task does
not have) is refused before the sweep starts, naming the key. A 2-trial tiny sweep on the dataset config trains
both trials with the tenant's reward function.

Oracles: the tenant folder of tests/cli/test_tenant_train.py (`_job`), the spec's grid written here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tenant_job as TENANT  # noqa: N812 - tests/tenant_job.py: the tenant's folder
import yaml

from common.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]



def _spec(tmp_path: Path, merge: bool = True, **fields) -> Path:
    """A sweep spec beside the tenant's files (base: job.yaml, relative to the spec's folder); `fields` update the
    tiny default spec (mappings merged into its own unless `merge` is off)."""
    folder = tmp_path / "tenant"
    TENANT.write_job(folder, "my_reward.py:score")
    raw = {"name": "mine", "base": "job.yaml", "overrides": {"reward.ref": "my_reward.py:score", "steps": 4},
           "space": {"ppo.actor_lr": {"grid": [5e-4, 1e-3]}}, "sampler": {"kind": "grid", "seed": 0}, "trials": 2,
           "tenant": "globex", "concurrency": 1, "pruning": {"detector": "none"}, "out_dir": str(tmp_path / "sweep"),
           "mlflow_experiment": "tenant-sweep"}
    for key, value in fields.items():
        merged = merge and isinstance(value, dict) and isinstance(raw.get(key), dict)
        raw[key] = {**raw[key], **value} if merged else value
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_spec_over_a_dataset_config_takes_the_tenant_fields(tmp_path, monkeypatch):
    from sweeps.spec import load_spec, trial_config, trial_request

    monkeypatch.chdir(tmp_path)  # not the spec's folder: its base and the base's files are still found
    path = _spec(tmp_path, merge=False,
                 overrides={"steps": 4, "gate.ref": "my_reward.py:exact", "task.max_prompt_tokens": 48,
                            "reward.timeout_s": 20},
                 space={"ppo.actor_lr": {"grid": [5e-4, 1e-3]},
                        "reward.ref": {"choice": ["my_reward.py:score", "my_reward.py:exact"]},
                        "reward.max_error_frac": {"uniform": [0.0, 0.1]}},
                 sampler={"kind": "random", "seed": 0})
    spec = load_spec(path)
    cfg = trial_config(spec, {"ppo.actor_lr": 1e-3, "reward.ref": "my_reward.py:exact",
                              "reward.max_error_frac": 0.05}, base_dir=path.parent)
    assert cfg.task.kind == "dataset" and cfg.task.train == str(tmp_path / "tenant" / "train.jsonl")
    assert cfg.task.max_prompt_tokens == 48 and cfg.reward.timeout_s == 20
    assert (cfg.reward.ref, cfg.reward.max_error_frac, cfg.gate.ref) == ("my_reward.py:exact", 0.05,
                                                                         "my_reward.py:exact")
    assert cfg.config_dir == str(tmp_path / "tenant") and cfg.ppo.actor_lr == 1e-3
    request = trial_request(spec, {"ppo.actor_lr": 5e-4, "reward.ref": "my_reward.py:score"}, 1,
                            base_dir=path.parent)
    assert request.config == str(tmp_path / "tenant" / "job.yaml")
    assert request.checked().config.reward.ref == "my_reward.py:score"


@pytest.mark.parametrize("fields, start, names", [
    ({"overrides": {"reward.ref": "nowhere.py:score"}}, "base/overrides: reward.ref: ", ("nowhere.py",)),
    ({"overrides": {"gate.ref": "exact"}}, "base/overrides: gate.ref: ", ("names no function",)),
    ({"overrides": {"task.heldout": "gone.jsonl"}}, "base/overrides: task.heldout: ", ("gone.jsonl",)),
    ({"overrides": {"reward.max_error_frac": 2}}, "base/overrides: ", ("reward.max_error_frac",)),
    ({"overrides": {"gate.kind": "oracle"}}, "base/overrides: ", ("gate",)),
    ({"space": {"gate.ref": {"choice": ["my_reward.py:exact", "their_reward.py:exact"]}}},
     "space.gate.ref: 'their_reward.py:exact' does not make a valid job (gate.ref: ", ("their_reward.py",)),
    ({"space": {"task.train": {"choice": ["train.jsonl", "broken.jsonl"]}}},
     "space.task.train: 'broken.jsonl' does not make a valid job (task.train: ", ("broken.jsonl", "line 2")),
    ({"space": {"task.n_pairs": {"grid": [32, 64]}}}, "space.task.n_pairs: 32 does not make a valid job", ()),
    ({"space": {"reward.timeout_s": {"grid": [0.0, 10.0]}}}, "space.reward.timeout_s: 0.0 does not make", ()),
])
def test_a_wrong_tenant_field_is_refused_naming_the_key(fields, start, names, tmp_path):
    from sweeps.spec import load_spec

    path = _spec(tmp_path, **fields)
    (tmp_path / "tenant" / "broken.jsonl").write_text(json.dumps({"question": "a", "answer": "b"}) + "\n{oops\n")
    with pytest.raises(BadInput) as err:
        load_spec(path)
    line = str(err.value)
    assert start in line and "\n" not in line, line
    for name in names:
        assert name in line, line


def test_rlhfops_sweep_exits_2_on_a_bad_tenant_ref_before_anything_starts(tmp_path, capsys, monkeypatch):
    from cli_helpers import run_cli

    path = _spec(tmp_path, overrides={"reward.ref": "nowhere.py:score"})
    monkeypatch.chdir(tmp_path)
    code, lines = run_cli(["sweep", path], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and "reward.ref" in lines[0] and "nowhere.py" in lines[0], lines
    assert not (tmp_path / "sweep").exists()


@pytest.mark.timeout(300)
def test_a_two_trial_sweep_trains_the_tenants_dataset_job(tmp_path, mlflow_store):
    from tasks.sweep import prepare, run_sweep

    path = _spec(tmp_path)
    spec, ledger = prepare(str(path))
    summary = run_sweep(spec, ledger, prune=False, base_dir=path.parent)
    assert summary["trials_failed"] == 0, summary
    import optuna

    study = optuna.load_study(study_name="mine", storage=spec.storage_url)
    assert sorted(t.params["ppo.actor_lr"] for t in study.trials) == [5e-4, 1e-3]
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    # the tenant's function scored both trials' samples (its rows.json oracle raises on a misaligned row): its
    # processes' CPU seconds were charged to the tenant, trial by trial
    charges = ledger.frame()
    fn = charges[charges.phase == "reward_fn"] if "phase" in charges else charges
    assert len(set(fn.run_id)) == 2 and (fn.tenant == "globex").all(), charges


def test_the_shipped_dataset_sweep_is_valid(monkeypatch):
    """configs/sweeps/arith.yaml: a sweep over the shipped dataset config, its reward fixed."""
    from tasks.sweep import prepare

    monkeypatch.chdir(ROOT)
    spec, _ = prepare("configs/sweeps/arith.yaml")  # what `rlhfops sweep` checks before it starts
    assert spec.base == "configs/ppo-arith.yaml" and spec.overrides["reward.ref"] == "gsm8k:flexible_extract"
    assert set(spec.space) == {"ppo.actor_lr", "ppo.kl_coef"}
