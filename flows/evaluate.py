"""`evaluate_checkpoint`: run the held-out eval gate on any saved checkpoint and record it in MLflow."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from prefect import flow

from common.errors import BadInput
from infra import tracking as T
from tasks.retry import backoff
from tasks.timing import clock
from tasks.tracking import parent_run
from tasks.training import score_checkpoints


def _resolve_checkpoint(checkpoint: str) -> Path:
    """A checkpoint directory, a run directory (its newest checkpoint), or `models:/name@alias`."""
    if checkpoint.startswith("models:/"):
        import mlflow

        T.init_store()
        try:
            with clock.span("tracking"):
                local = mlflow.artifacts.download_artifacts(checkpoint)
        except Exception as err:  # noqa: BLE001 - unknown model or alias
            raise BadInput(f"checkpoint: cannot resolve '{checkpoint}' in the registry ({err})") from None
        return Path(local)
    path = Path(checkpoint)
    if (path / "checkpoints").is_dir():
        from training.trainer import latest_checkpoint

        newest = latest_checkpoint(path)
        if newest is None:
            raise BadInput(f"checkpoint: run directory '{path}' holds no checkpoints/step-* yet")
        path = newest
    if not (path / "actor").is_dir() or not (path / "config.yaml").is_file():
        raise BadInput(f"checkpoint: '{path}' is not a trainer checkpoint (needs actor/ and config.yaml; pass a "
                       "checkpoints/step-NNNNNN directory, a run directory or models:/NAME@best)")
    return path


@flow(name="evaluate-checkpoint", log_prints=False)
def evaluate_checkpoint_internal(
    checkpoint: str,
    min_score: float | None = None,
    tenant: str = "platform",
    retry_delay_s: float = 1.0,
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    parent_run_id: str | None = None,
) -> dict[str, Any]:
    """`evaluate_checkpoint` with the knobs the run form does not show: `retry_delay_s` (first backoff delay)
    and `parent_run_id` (the MLflow run to nest under; the nightly's)."""
    path = _resolve_checkpoint(checkpoint)
    # a registry entry is named by its reference: its download path is a random directory on a tracking server
    shown = checkpoint if checkpoint.startswith("models:/") else f"{path.parent.parent.name}/{path.name}"
    with parent_run("evaluation", f"evaluate {shown}", mlflow_experiment, parent_run_id,
                    tenant=tenant, params={"checkpoint": checkpoint, "resolved": str(path), "min_score": min_score},
                    retry_delay_s=retry_delay_s) as run:
        (score,) = score_checkpoints.with_options(retry_delay_seconds=backoff(retry_delay_s))(path.name, [str(path)])
        lower = score["eval_score"] - 1.96 * (score["eval_se"] if math.isfinite(score["eval_se"]) else 0.0)
        passed = None if min_score is None else bool(lower >= min_score)
        run.close(metrics={"eval_score": score["eval_score"], "eval_se": score["eval_se"],
                           "eval_lower95": lower, "unparseable_rate": score["unparseable_rate"]},
                  tags={"gate": "none" if passed is None else ("passed" if passed else "failed")})
    return {**score, "lower95": lower, "passed": passed, "run_id": run.run_id}


@flow(name="evaluate-checkpoint", log_prints=False)
def evaluate_checkpoint(
    checkpoint: str = "models:/acme-policy@best",
    min_score: float | None = None,
    tenant: str = "platform",
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
) -> dict[str, Any]:
    """Score a saved checkpoint with the gold scorer on its config's held-out prompts (the eval gate).

    Args:
        checkpoint: a registry model (models:/NAME@best, models:/NAME/VERSION), a run directory (its newest
            checkpoint) or a checkpoints/step-NNNNNN directory.
        min_score: pass mark: the gate passes when the score's lower 95% bound (mean - 1.96 SE) clears it
            (empty: score only).
        tenant: the tenant the evaluation is recorded under in MLflow.
        mlflow_experiment: MLflow experiment the evaluation run goes to.
    """
    return evaluate_checkpoint_internal.fn(checkpoint=checkpoint, min_score=min_score, tenant=tenant,
                                           mlflow_experiment=mlflow_experiment)
