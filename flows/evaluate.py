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
from training.job.request import RunInternals, parse_internals


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
def evaluate_checkpoint(
    checkpoint: str = "models:/acme-policy@best",
    min_score: float | None = None,
    tenant: str = "platform",
    mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
    internals: RunInternals = RunInternals(),
) -> dict[str, Any]:
    """Score a saved checkpoint with the gold scorer on its config's held-out prompts (the eval gate). The score
    goes to MLflow, to the flow run's log and to a table artifact on the flow run.

    Args:
        checkpoint: a registry model (models:/NAME@best, models:/NAME/VERSION), a run directory (its newest
            checkpoint) or a checkpoints/step-NNNNNN directory.
        min_score: pass mark: the gate passes when the score's lower 95% bound (mean - 1.96 SE) clears it
            (empty: score only).
        tenant: the tenant the evaluation is recorded under in MLflow.
        mlflow_experiment: MLflow experiment the evaluation run goes to.
        internals: the first retry delay and the MLflow run to nest under (the nightly's); the defaults are safe.
    """
    internals = parse_internals(internals, model=RunInternals)
    if min_score is not None and not math.isfinite(min_score):
        raise BadInput(f"min_score: {min_score} is not a finite number")
    path = _resolve_checkpoint(checkpoint)
    # a registry entry is named by its reference: its download path is a random directory on a tracking server
    shown = checkpoint if checkpoint.startswith("models:/") else f"{path.parent.parent.name}/{path.name}"
    retry_delay_s = internals.retry_delay_s
    with parent_run("evaluation", f"evaluate {shown}", mlflow_experiment, internals.parent_run_id,
                    tenant=tenant, params={"checkpoint": checkpoint, "resolved": str(path), "min_score": min_score},
                    retry_delay_s=retry_delay_s) as run:
        (score,) = score_checkpoints.with_options(retry_delay_seconds=backoff(retry_delay_s))(path.name, [str(path)])
        lower = score["eval_score"] - 1.96 * (score["eval_se"] if math.isfinite(score["eval_se"]) else 0.0)
        passed = None if min_score is None else bool(lower >= min_score)
        run.close(metrics={"eval_score": score["eval_score"], "eval_se": score["eval_se"],
                           "eval_lower95": lower, "unparseable_rate": score["unparseable_rate"]},
                  tags={"gate": "none" if passed is None else ("passed" if passed else "failed")})
    result = {**score, "lower95": lower, "passed": passed, "run_id": run.run_id}
    score_report(checkpoint, result, min_score)
    return result


def score_line(checkpoint: str, result: dict[str, Any], min_score: float | None) -> str:
    """The evaluation in one line: the held-out score with its standard error and lower 95% bound, and the gate."""
    gate = "" if min_score is None else f"; gate {'passed' if result['passed'] else 'failed'} (min_score {min_score:g})"
    return (f"{checkpoint}: held-out score {result['eval_score']:+.4f} ± {result['eval_se']:.4f} (lower 95% "
            f"{result['lower95']:+.4f}, {result['n']} prompts, unparseable {result['unparseable_rate']:.1%}){gate}")


def score_report(checkpoint: str, result: dict[str, Any], min_score: float | None) -> None:
    """The score as a log line on the flow run and a table artifact (what the Prefect UI shows without MLflow)."""
    from prefect.artifacts import create_table_artifact
    from prefect.context import FlowRunContext
    from prefect.logging import get_run_logger

    if FlowRunContext.get() is None:  # the body called without a flow run: nothing to attach to
        return
    get_run_logger().info(score_line(checkpoint, result, min_score))

    def num(v):
        return round(float(v), 6) if isinstance(v, int | float) and math.isfinite(v) else None

    row = {"checkpoint": checkpoint, "eval_score": num(result["eval_score"]), "eval_se": num(result["eval_se"]),
           "lower95": num(result["lower95"]), "n": result["n"], "unparseable_rate": num(result["unparseable_rate"]),
           "min_score": min_score, "gate": "none" if result["passed"] is None else
           ("passed" if result["passed"] else "failed"), "mlflow_run": result["run_id"]}
    slug = "".join(ch if ch.isalnum() else "-" for ch in checkpoint.lower()).strip("-")[:80]
    create_table_artifact(key=f"evaluate-{slug}", table=[row], description=score_line(checkpoint, result, min_score))
