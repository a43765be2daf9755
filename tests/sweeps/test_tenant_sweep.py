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


#: what the two trials vary: the actor's learning rate (both PPO, the config's), or the algorithm itself (PPO against
#: critic-free GRPO, 2 completions per prompt fixed for both)
SEARCHES = {"actor_lr": ("ppo.actor_lr", [5e-4, 1e-3], {}),
            "algorithm": ("algorithm", ["grpo", "ppo"], {"ppo.group_size": 2})}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("search", list(SEARCHES))
def test_a_two_trial_sweep_trains_the_tenants_dataset_job(search, tmp_path, mlflow_store):
    from infra import tracking as T
    from tasks.sweep import prepare, run_sweep

    field, values, fixed = SEARCHES[search]
    path = _spec(tmp_path, merge=False, overrides={"reward.ref": "my_reward.py:score", "steps": 4, **fixed},
                 space={field: {"grid": values}})
    spec, ledger = prepare(str(path))
    summary = run_sweep(spec, ledger, prune=False, base_dir=path.parent)
    assert summary["trials_failed"] == 0, summary
    import optuna

    study = optuna.load_study(study_name="mine", storage=spec.storage_url)
    assert sorted(t.params[field] for t in study.trials) == values
    assert all(t.state.name == "COMPLETE" for t in study.trials)
    # the tenant's function scored both trials' samples (its rows.json oracle raises on a misaligned row): its
    # processes' CPU seconds were charged to the tenant, trial by trial
    charges = ledger.frame()
    fn = charges[charges.phase == "reward_fn"] if "phase" in charges else charges
    assert len(set(fn.run_id)) == 2 and (fn.tenant == "globex").all(), charges
    # every trial's run says which algorithm it trained, varied or not (tag and params), and so does its ledger row
    runs = T.client().search_runs([T.experiment_id("tenant-sweep")], f"tags.`{T.KIND_TAG}` = 'sweep-trial'")
    trained = {r.info.run_id: r.data.params["algorithm"] for r in runs}
    assert sorted(trained.values()) == (values if field == "algorithm" else ["ppo", "ppo"])
    assert all(r.data.tags["algorithm"] == trained[r.info.run_id] for r in runs)
    assert {r.data.params["ppo.group_size"] for r in runs} == {"2" if fixed else "1"}
    assert charges.set_index("run_id")["algorithm"].to_dict() == trained


def test_the_shipped_grpo_sweep_is_valid(monkeypatch):
    """configs/sweeps/grpo-arith.yaml: PPO against GRPO and GRPO's group size on the shipped dataset config; the
    check tried every pair, and each cell of the grid makes the job it says."""
    from sweeps.spec import trial_config
    from tasks.sweep import prepare

    monkeypatch.chdir(ROOT)
    spec, _ = prepare("configs/sweeps/grpo-arith.yaml")
    assert spec.base == "configs/grpo-arith.yaml" and spec.grid_size() == spec.trials == 4
    for algorithm in ("ppo", "grpo"):
        cfg = trial_config(spec, {"algorithm": algorithm, "ppo.group_size": 8})
        assert (cfg.algorithm, cfg.ppo.group_size, cfg.ppo.batch_size, cfg.steps) == (algorithm, 8, 32, 20)


def test_the_shipped_dataset_sweep_is_valid(monkeypatch):
    """configs/sweeps/arith.yaml: a sweep over the shipped dataset config, its reward fixed."""
    from tasks.sweep import prepare

    monkeypatch.chdir(ROOT)
    spec, _ = prepare("configs/sweeps/arith.yaml")  # what `rlhfops sweep` checks before it starts
    assert spec.base == "configs/ppo-arith.yaml" and spec.overrides["reward.ref"] == "gsm8k:flexible_extract"
    assert set(spec.space) == {"ppo.actor_lr", "ppo.kl_coef"}


def test_a_loaded_spec_carries_its_base_found_beside_it(tmp_path, monkeypatch):
    """`rlhfops sweep` and the sweep flow hand the runner the loaded spec, not its folder: before, a base relative to
    the spec's folder passed the check and then every trial failed "config: file 'job.yaml' not found"."""
    from sweeps.spec import load_spec, trial_config

    monkeypatch.chdir(tmp_path)  # not the spec's folder
    path = _spec(tmp_path)
    spec = load_spec(path)
    assert Path(spec.base) == path.parent / "job.yaml"
    assert trial_config(spec, {"ppo.actor_lr": 5e-4}).ppo.actor_lr == 5e-4  # no base_dir given: found all the same
