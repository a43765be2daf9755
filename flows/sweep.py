"""`sweep`: a team's own sweep as a Prefect flow (the deployment `sweep/sweep` in prefect.yaml, with a cron example).

check the spec (before any slot is taken) -> open or resume the Optuna study -> trials as jobs, each holding
`gpus_per_trial` of the cluster's GPU slots (the Prefect global concurrency limit the rlhf-job flow uses) while it
trains -> the platform's detector prunes over-optimising trials -> the budget stops new trials -> MLflow parent +
child per trial, best checkpoint registered, the sweep report as MLflow and Prefect artifacts.

The flow is a thin wrapper: the domain runner is `sweeps.runner.SweepRunner`, the MLflow record
`tasks.sweep.MlflowSweepTracker`; `rlhfops sweep` runs the same two without Prefect.
"""

from __future__ import annotations

import math
from typing import Any

from prefect import flow

from infra import tracking as T
from training.job.request import RunInternals, parse_internals


@flow(name="sweep", flow_run_name="sweep {spec}", log_prints=False)
def sweep(
    spec: str = "configs/sweeps/example.yaml",
    trials: int | None = None,
    resume: bool = False,
    prune: bool = True,
    cluster_gpus: int | None = None,
    internals: RunInternals = RunInternals(),
) -> dict[str, Any]:
    """Run a sweep spec: Optuna samples the settings, each trial is a PPO job on the GPU slots, the platform's
    early-stop detector prunes trials that over-optimise the proxy reward (keeping their best checkpoint), the
    budget stops new trials; the best trial's checkpoint is registered under the tenant's model. A retried flow run
    resumes the study its first attempt started: finished trials are not run again.

    Args:
        spec: sweep spec YAML, relative to the repository root (configs/sweeps/example.yaml: 12 trials over
            kl_coef and actor_lr, including over-optimising settings).
        trials: finished trials the study should have (empty: the spec's `trials`); with resume, a larger number
            extends a finished sweep.
        resume: continue the spec's existing study (a killed sweep: finished trials are not run again).
        prune: let the spec's detector stop trials early (off: every trial runs to the end).
        cluster_gpus: size of the GPU slot pool the trials share (the Prefect global concurrency limit
            `gpu-slots`; empty: the spec's `concurrency`).
        internals: the MLflow run to nest the sweep's parent run under (the nightly's); the default is none.
    """
    from prefect.runtime import flow_run

    from infra.provision import gpu_slots
    from tasks.sweep import prepare, run_sweep
    from tasks.tracking import flow_context

    internals = parse_internals(internals, model=RunInternals)
    spec_obj, ledger = prepare(spec, trials)  # everything checked before a slot is taken
    size = cluster_gpus or spec_obj.concurrency
    if size < spec_obj.gpus_per_trial:
        from common.errors import BadInput

        raise BadInput(f"cluster_gpus: {size} slots cannot hold a trial of {spec_obj.gpus_per_trial} GPUs")
    pool = gpu_slots(size)
    retried = (flow_run.run_count or 1) > 1
    summary = run_sweep(spec_obj, ledger, prune=prune, resume=resume or retried,
                        slot=lambda: pool.take(spec_obj.gpus_per_trial), parent_run_id=internals.parent_run_id,
                        flow_tags=flow_context())
    sweep_artifacts(summary)
    return summary


def sweep_artifacts(summary: dict[str, Any]) -> None:
    """The sweep report as a Prefect markdown artifact and the trials as a table artifact (when in a flow run)."""
    from pathlib import Path

    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return
    slug = "".join(ch if ch.isalnum() else "-" for ch in summary["name"].lower())
    md = next((Path(p) for p in summary.get("report_files", []) if p.endswith(".md")), None)
    text = md.read_text() if md is not None and md.is_file() else f"# Sweep {summary['name']}\n"
    text += f"\nMLflow run: {summary.get('mlflow_run_id')} (`mlflow ui --backend-store-uri {T.tracking_uri()}`)\n"
    create_markdown_artifact(key=f"sweep-{slug}", markdown=text, description=f"sweep {summary['name']}")

    def clean(v):
        return None if isinstance(v, float) and not math.isfinite(v) else v

    rows = [{"trial": t["number"], "state": t["state"], **{k: clean(v) for k, v in t["params"].items()},
             "objective": clean(t["objective"]), "se": clean(t["objective_se"]), "pruned_at": t["pruned_at"],
             "gpu_seconds": round(t["gpu_seconds"], 2)} for t in summary["trials"]]
    create_table_artifact(key=f"sweep-{slug}-trials", table=rows, description=f"sweep {summary['name']}: trials")
