"""The tiny PPO job config the trainer and gate tests train (a 1-layer, 32-wide policy and reward model, 4 prompts a
step, a gate and a checkpoint every 2 steps): one builder, so the tests differ only where they say so."""

from __future__ import annotations

from typing import Any

from training.job.config import TrainConfig


def tiny_config(cache_dir, *, seed: int, n_heldout_prompts: int, **over: Any) -> TrainConfig:
    """The tiny config with `seed` and `task.n_heldout_prompts` (the held-out pool the gate and its extensions draw
    from); `over` replaces top-level fields, a mapping merged into the section it names (`ppo={"group_size": ...}`
    keeps the section's other fields)."""
    raw: dict[str, Any] = {
        "seed": seed, "steps": 4, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": n_heldout_prompts, "n_pairs": 32, "rm_epochs": 1,
                 "sft_steps": 8, "long_mean_len": 10.0},
        "ppo": {"batch_size": 4, "max_new_tokens": 16, "num_ppo_epochs": 2, "num_mini_batches": 2},
        "oppo": {"chunk_size": 4, "tune_chunk": False, "delta_init": 2, "delta_window": 1},
        "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 8,
    }
    for k, v in over.items():
        raw[k] = {**raw.get(k, {}), **v} if isinstance(v, dict) else v
    return TrainConfig.model_validate(raw)
