"""OPPO-accelerated PPO: models, tokenizer, rollout engines, PPO math, overlap machinery, trainer.

Plain torch + transformers: no Prefect or MLflow here.
"""

import os

# OpenMP threads that busy-wait at barriers collapse (10-20x slower) when another process shares the
# two cores; passive waiting costs nothing measurable here. Must be set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
