"""A job on several ranks: the launcher, the process group and the collectives (docs/ranks.md).

- `world.py`: a rank's view of the job (rank, world size, a standalone gloo group with a timeout on every
  collective); at world size 1 every collective is a no-op, so the one-process trainer runs the same code.
- `plan.py`: which rank rolls out which unit (groups whole, carried units stay, fresh ones balanced by expected
  tokens) and the checks of a config against its world size (exit 2 naming the field). No torch.
- `ranks.py`: the trainer's side (a mixin): counts and samples gathered over ranks, gradients summed.
- `launch.py`: the local launcher (rank 0 in the caller's process, ranks 1..N-1 spawned on 127.0.0.1), what a
  rank that died or hung ends the job with (`RankFailed`), and the bounded restarts from the last checkpoint.
- `apart.py`: `placement: reward_apart`, the reward and reference models in a scorer process of their own that the
  policy ranks stream their decoded chunks to.

Must not be imported by: the math (`training/algorithms/`) or the inputs (`training/inputs/`); import-linter holds it.
Nothing here imports Ray: the Ray Train launcher of the same per-rank run is `infra/ray_train.py`.
"""
