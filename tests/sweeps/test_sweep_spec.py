"""A bad sweep spec exits 2 with one line naming the field, before any study, slot, run directory or MLflow store
exists (`rlhfops sweep`, in-process)."""

from __future__ import annotations

import copy
import sys

import pytest
import yaml

from common.errors import BadInput

GOOD = {
    "name": "bad", "base": "configs/ppo-tiny.yaml", "overrides": {"steps": 4},
    "space": {"ppo.kl_coef": {"log_uniform": [0.01, 0.3]}, "ppo.actor_lr": {"choice": [1.0e-4, 3.0e-4]}},
    "sampler": {"kind": "tpe", "seed": 0}, "trials": 3, "concurrency": 2,
    "budget": {"gpu_hours": 1.0, "wall_s": 600}, "pruning": {"detector": "default"},
}

REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def _run_cli(args, monkeypatch, capsys) -> tuple[int, str]:
    from rlhfops.cli import main

    monkeypatch.setattr(sys, "argv", ["rlhfops", *args])
    with pytest.raises(SystemExit) as exc:
        main()
    return exc.value.code, capsys.readouterr().err


def _with(path: str, value):
    spec = copy.deepcopy(GOOD)
    node = spec
    *parents, last = path.split("/")
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return spec


DELETE = object()

CASES = [
    # (what to change, value, text the one-line error must contain)
    ("trialz", 3, "field 'trialz': unknown key"),
    ("space", {}, "space: give at least one field"),
    ("trials", 0, "field 'trials'"),
    ("space/ppo.kl_coeff", {"uniform": [0.01, 0.1]}, "space.ppo.kl_coeff"),
    ("space/ppo.actor_lr", {"uniform": [0.5, 2.0]}, "space.ppo.actor_lr"),
    ("space/ppo.kl_coef", {"log_uniform": [0.0, 0.3]}, "space.ppo.kl_coef"),
    ("space/ppo.kl_coef", {"grid": []}, "space.ppo.kl_coef"),
    ("budget/gpu_hours", 0, "field 'budget.gpu_hours'"),
    ("budget/wall_s", -5, "field 'budget.wall_s'"),
    ("pruning/detector", "nosuch", "pruning.detector"),
    ("gpu_kind", "tpu9", "gpu_kind"),
    ("name", DELETE, "field 'name'"),
    # a pair of values a trial may draw that the job config refuses together (each is valid alone): before any trial
    ("space", {"algorithm": {"choice": ["ppo", "grpo"]}, "ppo.group_size": {"choice": [1, 4]}},
     "space.algorithm: 'grpo' with space.ppo.group_size: 1 does not make a valid job"),
]


@pytest.mark.parametrize("path,value,expected", CASES, ids=[c[0] + "=" + repr(c[1])[:20] for c in CASES])
def test_bad_spec_exits_2_naming_the_field_before_anything_starts(path, value, expected, tmp_path, monkeypatch,
                                                                   capsys):
    monkeypatch.chdir(REPO)  # the base config path is relative to the repository, as in configs/sweeps/
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = _with(path, value)
    spec["out_dir"] = str(tmp_path / "sweep")
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    code, err = _run_cli(["sweep", str(f)], monkeypatch, capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], err
    assert not (tmp_path / "sweep").exists()  # no study storage, no trial directory
    assert not (tmp_path / "mlflow.db").exists()  # no MLflow run


@pytest.mark.parametrize("field,value", [("tenant", "Acme.Corp"), ("name", "KL.lr"), ("tenant", ""),
                                         ("registered_model", "../x"), ("name", "n" * 58)])
def test_a_name_the_job_rule_refuses_exits_2_naming_the_sweep_field(field, value, tmp_path, monkeypatch, capsys):
    """Tenant, sweep name and model name follow the job request's name rule (a tenant `Acme.Corp` or a 58-character
    name, whose model `<name>-sweep` is 64 characters, would make job or model names the platform refuses)."""
    from sweeps.runner import SweepRunner

    def accepted(self, *a, **k):
        raise AssertionError("the spec was accepted and the sweep started")

    monkeypatch.setattr(SweepRunner, "run", accepted)  # a wrong acceptance fails at once, without training
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = {**GOOD, field: value, "out_dir": str(tmp_path / "sweep")}
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    code, err = _run_cli(["sweep", str(f)], monkeypatch, capsys)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and f"field '{field}'" in lines[0] and f"sweep.{field}" in lines[0], err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "mlflow.db").exists()


def test_a_name_the_job_rule_takes_makes_a_valid_spec():
    from sweeps.spec import parse_spec

    spec = parse_spec({**GOOD, "tenant": "acme-corp_2", "name": "n" * 57})
    assert spec.tenant == "acme-corp_2" and spec.model_name == "n" * 57 + "-sweep"


def test_trials_flag_below_one_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    spec = {**GOOD, "out_dir": str(tmp_path / "sweep")}
    f = tmp_path / "spec.yaml"
    f.write_text(yaml.safe_dump(spec))
    code, err = _run_cli(["sweep", str(f), "--trials", "0"], monkeypatch, capsys)
    assert code == 2 and "field 'trials'" in err and not (tmp_path / "sweep").exists()


def test_the_example_spec_is_valid_and_its_space_reaches_over_optimising_settings():
    from sweeps.spec import load_spec

    spec = load_spec(REPO / "configs" / "sweeps" / "example.yaml")
    assert spec.trials == 12 and spec.concurrency == 2
    hack = yaml.safe_load((REPO / "configs" / "ppo-hack.yaml").read_text())["ppo"]
    kl = spec.space["ppo.kl_coef"].log_uniform
    lr = spec.space["ppo.actor_lr"].log_uniform
    # the hacking config's KL coefficient and learning rate lie inside the searched ranges
    assert kl[0] <= hack["kl_coef"] <= kl[1] and lr[0] <= hack["actor_lr"] <= lr[1]


def test_a_spec_may_search_the_algorithm_and_the_group_size():
    """`algorithm` (a top-level categorical) and `ppo.group_size` (an integer) are fields like any other: each trial's
    config takes its algorithm's defaults for the ppo fields the base leaves out (`ALGORITHM_DEFAULTS`), and Optuna
    draws them as a categorical and integers."""
    from optuna.distributions import CategoricalDistribution, IntDistribution

    from sweeps.runner import distributions
    from sweeps.spec import check_against_job, parse_spec, trial_config
    from training.job.config import uses_critic

    spec = parse_spec({**GOOD, "space": {"algorithm": {"choice": ["ppo", "grpo", "rloo"]},
                                         "ppo.group_size": {"choice": [2, 4]},
                                         "ppo.num_ppo_epochs": {"uniform": [1, 3]}}})
    base = REPO  # the spec's base, configs/ppo-tiny.yaml, from wherever the tests run
    check_against_job(spec, base)  # every value and every pair makes a valid job
    dist = distributions(spec)
    assert isinstance(dist["algorithm"], CategoricalDistribution)
    assert dist["algorithm"].choices == ("ppo", "grpo", "rloo")
    assert isinstance(dist["ppo.num_ppo_epochs"], IntDistribution)
    grpo = trial_config(spec, {"algorithm": "grpo", "ppo.group_size": 4, "ppo.num_ppo_epochs": 1}, base_dir=base)
    ppo = trial_config(spec, {"algorithm": "ppo", "ppo.group_size": 2, "ppo.num_ppo_epochs": 1}, base_dir=base)
    assert (grpo.algorithm, grpo.ppo.group_size, grpo.ppo.kl_in, uses_critic(grpo)) == ("grpo", 4, "loss", False)
    assert (ppo.algorithm, ppo.ppo.group_size, ppo.ppo.kl_in, uses_critic(ppo)) == ("ppo", 2, "reward", True)


@pytest.mark.parametrize("space, expected", [
    # each end of the range divides the batch of 16, 3 inside it does not
    ({"ppo.group_size": {"uniform": [2, 4]}}, "space.ppo.group_size: 3 (inside uniform [2, 4]: list the values with "
                                             "choice) does not make a valid job"),
    # grpo's own default group size (8) does not divide a batch of 12; ppo's (1) does
    ({"algorithm": {"grid": ["ppo", "grpo"]}, "ppo.batch_size": {"grid": [16, 12]}},
     "space.algorithm: 'grpo' with space.ppo.batch_size: 12 does not make a valid job"),
])
def test_an_invalid_algorithm_combination_is_refused_naming_the_fields(space, expected):
    from sweeps.spec import check_against_job, parse_spec

    with pytest.raises(BadInput) as err:
        check_against_job(parse_spec({**GOOD, "space": space}), REPO)
    line = str(err.value)
    assert line.startswith(expected) and "\n" not in line, line
