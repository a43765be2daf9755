"""One RLHF job's training: PPO, GRPO and RLOO with OPPO's overlap, in rooms by role.

- `algorithms/`: the math of the three algorithms (GAE, group advantages, the clipped and corrected losses, the KL)
  and the update that applies it. Imports torch and `common/` only.
- `rollout/`: the generation engines (continuous batching included), one rollout with or without intra-step
  streaming, and OPPO's online controllers (Delta, chunk size).
- `inputs/`: what a job trains on and is scored by: a tenant's data files, the synthetic task, the tokenizer, the
  built-in rewards, the reward and gate scorers, the pool that runs tenant code. Never imports rollout, the models or
  the trainer: a request is checked without the model stack.
- `distributed/`: a job on several ranks: the process group and its collectives, who rolls out what, the launcher.
  The math and the inputs never import it.
- `job/`: a job's life: its config, request, device, sizing, lifecycle, run directory and detector.
- `benches/`: `bench oppo`, `bench gain`, the baseline check, profiling, the GPU check, the canaries. Nothing else in
  `training/` imports them.

At the top: the trainer (`trainer.py`, with its mixins `checkpoint.py` and `evaluation.py`), the models
(`models.py`), the per-step record (`metrics.py`), the gate's per-prompt records (`gate.py`), the Trace CSV export
(`trace.py`) and the plots. Plain torch + transformers: no Prefect or MLflow here (docs/ARCHITECTURE.md).
"""

import os

# OpenMP threads that busy-wait at barriers collapse (10-20x slower) when another process shares the
# two cores; passive waiting costs nothing measurable here. Must be set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
