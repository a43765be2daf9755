"""The top-level `algorithm` (ppo | grpo | rloo) and the ppo fields it governs (training/job/config.py).

Bad settings go through the real CLI (`rlhfops train CONFIG`, in-process as tests/cli/test_bad_input.py runs it, the
trainer tripwired): each exits 2 with one stderr line naming the field, before any work and without writing a file.
The defaults each algorithm fills in (TRL 1.16's GRPOConfig / RLOOConfig, TRL 0.19's PPOConfig) are checked on the
validated config.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_helpers import WorkStarted, run_cli

from tests.cli.test_bad_input import ppo_yaml
from training.job.config import TrainConfig, resolve_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """A working directory (`.dir`); the trainer, once started, records its config in `.started` and stops."""
    import training.trainer

    started = []

    def tripwire(config, *_a, **_k):
        started.append(config)
        raise WorkStarted

    monkeypatch.setattr(training.trainer, "Trainer", tripwire)
    monkeypatch.setattr(training.trainer, "train", tripwire)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "16")  # the same bound on any machine
    return SimpleNamespace(dir=tmp_path, started=started)


def tiny_yaml(d: Path, changes: dict, name: str = "c.yaml") -> str:
    """configs/ppo-tiny.yaml (batch_size 16, kl_coef 0.2, num_ppo_epochs 2) with dotted `changes`, written to
    d/name."""
    return ppo_yaml(d, name, changes)


# (case id, dotted changes to ppo-tiny.yaml, substrings the one stderr line must contain)
BAD = [
    ("unknown-algorithm", {"algorithm": "dpo"}, ["c.yaml", "'algorithm'", "'ppo'", "'grpo'", "'rloo'"]),
    ("grpo-group-of-one", {"algorithm": "grpo", "ppo.group_size": 1},
     ["ppo.group_size", "grpo needs at least 2", "got 1"]),
    ("rloo-group-of-one", {"algorithm": "rloo", "ppo.group_size": 1},
     ["ppo.group_size", "rloo needs at least 2", "got 1"]),
    ("scale-rewards-with-ppo", {"ppo.scale_rewards": "none"},
     ["ppo.scale_rewards", "'none'", "grpo only", "ppo"]),
    ("scale-rewards-with-rloo", {"algorithm": "rloo", "ppo.scale_rewards": "none"},
     ["ppo.scale_rewards", "grpo only", "rloo"]),
    # an explicit group size the batch does not divide
    ("batch-not-whole-groups", {"algorithm": "grpo", "ppo.group_size": 3},
     ["ppo.batch_size (16)", "multiple of ppo.group_size (3)"]),
    # the algorithm's default group size (grpo: 8) the batch does not divide: TrainConfig's check
    ("batch-not-whole-default-groups", {"algorithm": "grpo", "ppo.batch_size": 12},
     ["ppo.batch_size (12)", "multiple of ppo.group_size (8)"]),
    ("legacy-advantage-grpo", {"ppo.advantage": "grpo"},
     ["'ppo'", "advantage: 'grpo' moved", "algorithm: grpo"]),
    ("legacy-advantage-rloo", {"ppo.advantage": "rloo"},
     ["'ppo'", "advantage: 'rloo' moved", "algorithm: rloo"]),
    ("kl-in-unknown", {"algorithm": "grpo", "ppo.kl_in": "both"}, ["ppo.kl_in", "'reward'", "'loss'"]),
]


@pytest.mark.parametrize("changes, needles", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_algorithm_setting_exits_2_with_one_line(changes, needles, scratch, capsys, monkeypatch):
    tiny_yaml(scratch.dir, changes)
    before = sorted(scratch.dir.rglob("*"))
    code, lines = run_cli(["train", "c.yaml"], capsys, monkeypatch)
    assert code == 2, (code, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert scratch.started == []
    assert sorted(scratch.dir.rglob("*")) == before


def run_until_work(argv, monkeypatch):
    """`rlhfops ARGS` until the tripwired trainer starts; False if it exited first."""
    import sys

    from rlhfops import cli

    monkeypatch.setattr(sys, "argv", ["rlhfops", *argv])
    try:
        cli.main()
    except WorkStarted:
        return True
    except SystemExit:
        return False
    return False


def test_legacy_advantage_gae_still_loads(scratch, capsys, monkeypatch):
    """An old saved config holds `ppo.advantage: gae` (the default then): dropped, still PPO with GAE."""
    tiny_yaml(scratch.dir, {"ppo.advantage": "gae"})
    assert run_until_work(["train", "c.yaml"], monkeypatch), capsys.readouterr().err
    (cfg,) = scratch.started
    assert cfg.algorithm == "ppo" and cfg.ppo.group_size == 1 and cfg.ppo.kl_coef == 0.2
    cfg = resolve_config(scratch.dir / "c.yaml")
    assert cfg.algorithm == "ppo" and "advantage" not in cfg.ppo.model_dump()


def test_grpo_and_rloo_configs_reach_the_trainer(scratch, capsys, monkeypatch):
    """The valid side of the table above: the same file with a good algorithm setting passes the CLI's checks."""
    tiny_yaml(scratch.dir, {"algorithm": "grpo", "ppo.scale_rewards": "none"})
    assert run_until_work(["train", "c.yaml"], monkeypatch), capsys.readouterr().err
    tiny_yaml(scratch.dir, {"algorithm": "rloo", "ppo.group_size": 4})
    assert run_until_work(["train", "c.yaml", "--out", "runs/b"], monkeypatch), capsys.readouterr().err
    grpo, rloo = scratch.started
    assert (grpo.algorithm, grpo.ppo.group_size, grpo.ppo.scale_rewards) == ("grpo", 8, "none")
    assert (rloo.algorithm, rloo.ppo.group_size, rloo.ppo.kl_in) == ("rloo", 4, "reward")


# ---- the defaults each algorithm fills in -------------------------------------------------------------------

def ppo_fields(cfg: TrainConfig) -> dict:
    p = cfg.ppo
    return {"group_size": p.group_size, "kl_coef": p.kl_coef, "kl_in": p.kl_in, "num_ppo_epochs": p.num_ppo_epochs,
            "whiten_advantages": p.whiten_advantages}


def test_grpo_alone_gets_trl_grpo_defaults():
    # TRL 1.16 GRPOConfig: num_generations 8, beta 0.0, num_iterations 1, no batch whitening; the KL in the loss
    cfg = TrainConfig.model_validate({"algorithm": "grpo"})
    assert ppo_fields(cfg) == {"group_size": 8, "kl_coef": 0.0, "kl_in": "loss", "num_ppo_epochs": 1,
                               "whiten_advantages": False}
    assert cfg.ppo.scale_rewards == "group"


def test_rloo_alone_gets_trl_rloo_defaults():
    # TRL 1.16 RLOOConfig: num_generations 2, beta 0.05 folded into the reward, normalize_advantages False
    cfg = TrainConfig.model_validate({"algorithm": "rloo"})
    assert ppo_fields(cfg) == {"group_size": 2, "kl_coef": 0.05, "kl_in": "reward", "num_ppo_epochs": 1,
                               "whiten_advantages": False}


def test_ppo_keeps_its_defaults():
    # TRL 0.19 PPOConfig: one completion per prompt, kl_coef 0.05 (k1, in the reward), 4 epochs, whitened
    for cfg in (TrainConfig.model_validate({}), TrainConfig.model_validate({"algorithm": "ppo"})):
        assert ppo_fields(cfg) == {"group_size": 1, "kl_coef": 0.05, "kl_in": "reward", "num_ppo_epochs": 4,
                                   "whiten_advantages": True}


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_explicit_values_are_kept(algorithm):
    explicit = {"group_size": 4, "kl_coef": 0.04, "kl_in": "reward" if algorithm == "grpo" else "loss",
                "num_ppo_epochs": 2, "whiten_advantages": True}
    cfg = TrainConfig.model_validate({"algorithm": algorithm, "ppo": explicit})
    assert ppo_fields(cfg) == explicit
    # one field given, the others the algorithm's: kl_coef 0.0 given explicitly is kept under rloo (default 0.05)
    cfg = TrainConfig.model_validate({"algorithm": algorithm, "ppo": {"kl_coef": 0.0}})
    assert cfg.ppo.kl_coef == 0.0
    assert cfg.ppo.group_size == {"grpo": 8, "rloo": 2}[algorithm]


def test_a_file_and_an_override_take_the_overriding_algorithms_defaults(tmp_path, monkeypatch):
    """The filled defaults stay unset (with_algorithm_defaults): switching the algorithm by an override re-fills
    them with the new algorithm's, while the file's explicit values stay."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHFOPS_MEMORY_LIMIT_GIB", "16")
    tiny_yaml(tmp_path, {"algorithm": "grpo"})  # ppo-tiny sets kl_coef 0.2 and num_ppo_epochs 2 explicitly
    cfg = resolve_config(tmp_path / "c.yaml")
    assert ppo_fields(cfg) == {"group_size": 8, "kl_coef": 0.2, "kl_in": "loss", "num_ppo_epochs": 2,
                               "whiten_advantages": False}
    cfg = resolve_config(tmp_path / "c.yaml", {"algorithm": "rloo"})
    assert ppo_fields(cfg) == {"group_size": 2, "kl_coef": 0.2, "kl_in": "reward", "num_ppo_epochs": 2,
                               "whiten_advantages": False}
    # re-validating a validated config's own fields under another algorithm gives that algorithm's defaults
    again = TrainConfig.model_validate({**cfg.model_dump(exclude_unset=True), "algorithm": "ppo"})
    assert ppo_fields(again) == {"group_size": 1, "kl_coef": 0.2, "kl_in": "reward", "num_ppo_epochs": 2,
                                 "whiten_advantages": True}


def test_shipped_grpo_config_validates():
    cfg = resolve_config(REPO / "configs" / "grpo-arith.yaml")
    assert cfg.algorithm == "grpo" and cfg.ppo.group_size == 8 and cfg.ppo.batch_size % 8 == 0
    assert cfg.ppo.kl_coef == 0.0 and cfg.ppo.kl_in == "loss" and cfg.ppo.num_ppo_epochs == 1
