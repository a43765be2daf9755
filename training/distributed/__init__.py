"""A job on several ranks: the launcher, the process group and the collectives (docs/ranks.md).

- `world.py`: a rank's view of the job (rank, world size, a standalone gloo group with a timeout on every
  collective); at world size 1 every collective is a no-op, so the one-process trainer runs the same code.
- `plan.py`: which rank rolls out which unit (groups whole, carried units stay, fresh ones balanced by expected
  tokens) and the checks of a config against its world size (exit 2 naming the field). No torch.
- `ranks.py`: the trainer's side (a mixin): counts and samples gathered over ranks, gradients summed.
- `launch.py`: the local launcher (rank 0 in the caller's process, ranks 1..N-1 spawned on 127.0.0.1) and what a
  rank that died or hung ends the job with (`RankFailed`).

Must not be imported by: the math (`training/algorithms/`) or the inputs (`training/inputs/`); import-linter holds it.
Ray may be imported here and in `infra/` only.
"""
