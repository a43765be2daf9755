"""What the sweep tests share: a job config tiny enough to train a trial in seconds (shared warm start)."""

BASE = {
    "seed": 2, "steps": 12,
    "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
    "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 40,
             "long_mean_len": 10.0},
    "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1, "num_mini_batches": 1},
    "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 8,
}
