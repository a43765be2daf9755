"""The algorithms' math, after verl's `core_algos.py`: what PPO, GRPO and RLOO compute from a batch.

- `core_algos.py`: masked statistics, KL-penalised rewards and GAE (PPO), group advantages (GRPO, Dr. GRPO, RLOO)
  and their statistics, the clipped policy loss and the value loss, the k3 KL in the loss, and the off-policy
  correction of carried tokens (importance weights, effective sample size, the corrected loss).
- `update.py`: one step's update (a mixin of the trainer): micro-batches, proximal log-probs, advantages, the loss.

Must not import: anything of the project's but `common/` (rollout, inputs, models, the trainer; the update names the
rollout's `Sample` for type checking only). Plain torch, so every formula is tested against a hand computation.
"""
