"""Sweeps of training jobs: the spec (`spec.py`), the Optuna-backed runner whose trials are the platform's job
lifecycle (`runner.py`), and the sweep report (`report.py`). Plain Python: no Prefect, MLflow or CLI; it sits
above `training/` and `scheduling/` and below the platform layers."""
