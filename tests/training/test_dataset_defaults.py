"""A tenant's first config (only the required task, reward and gate fields) gets the dataset task's defaults: actor_lr
1e-4, where the global 1e-3 blew up the KL on the worked example's data (docs/tenant-jobs.md). A value the config
sets is kept; a synthetic config keeps 1e-3, which its committed figures rest on; the filled field stays unset, so a
config re-validated as another task kind takes that kind's default."""

from __future__ import annotations

import pytest

from training.job.config import TrainConfig

FIRST = {"task": {"kind": "dataset", "train": "train.jsonl", "heldout": "heldout.jsonl", "prompt_key": "question"},
         "reward": {"kind": "function", "ref": "gsm8k:flexible_extract"},
         "gate": {"kind": "function", "ref": "gsm8k:strict_match"}}


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "rloo"])
def test_a_first_dataset_config_gets_the_lower_actor_lr(algorithm):
    cfg = TrainConfig.model_validate({**FIRST, "algorithm": algorithm})
    assert cfg.ppo.actor_lr == 1e-4
    assert "actor_lr" not in cfg.ppo.model_fields_set  # still the config's default, not its choice
    assert cfg.ppo.critic_lr == 1e-3  # nothing else moved


def test_a_set_actor_lr_and_the_synthetic_task_keep_theirs():
    assert TrainConfig.model_validate({**FIRST, "ppo": {"actor_lr": 1e-3}}).ppo.actor_lr == 1e-3
    assert TrainConfig.model_validate({**FIRST, "ppo": {"actor_lr": 3e-5}}).ppo.actor_lr == 3e-5
    assert TrainConfig.model_validate({}).ppo.actor_lr == 1e-3
    assert TrainConfig.model_validate({"ppo": {"batch_size": 32}}).ppo.actor_lr == 1e-3


def test_the_shipped_configs_learning_rates_are_unchanged():
    from training.job.config import load_config

    assert load_config("configs/ppo-tiny.yaml").ppo.actor_lr == 1.5e-4  # written in the file
    assert load_config("configs/ppo-arith.yaml").ppo.actor_lr == 1e-4  # its own, written in the file
