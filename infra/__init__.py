"""Worker provisioning, per-tenant accounting, Prometheus metrics, MLflow helpers."""
