"""OPPO-accelerated PPO: models, tokenizer, rollout engines, PPO math, overlap machinery, trainer.

Plain torch + transformers: no Prefect or MLflow here.
"""
