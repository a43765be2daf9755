"""A job's MLflow run outside a flow (`rlhfops train` with `MLFLOW_TRACKING_URI` set): the same run the `rlhf-job`
flow leaves, written with the same helpers (`infra.tracking`: owner tags for the reaper, params, step metrics,
lineage, the closing tags), without Prefect.

    run = JobRun.open(tenant, name, cfg, params)       # tenant and name tags, every config field as a param, lineage
    ... hooks.log_records -> run.log_records(records) ...
    run.close(outcome, metrics)                        # run_state, decision, decided_by, failure_class, reason, ...

`outcome_tags(outcome)` is what both write when a job ends (docs/ARCHITECTURE.md "Who decided").
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from infra import tracking as T


def outcome_tags(outcome: Any) -> dict[str, Any]:
    """The tags a job's MLflow run closes with: its final state, failure class and reason (a paused run's reason is
    its attribution: the step, the verdict, the kept checkpoint), who decided and what, the alerts and the state
    history."""
    from training.job.lifecycle import decided_by, ended_by

    status, sup = outcome.status, outcome.supervisor
    paused = status.state.value == "PAUSED_BY_GATE"
    reason = sup.attribution.reason if paused else status.reason
    return {"run_state": status.label, "final_state": status.state.value,
            "failure_class": status.failure.value if status.failure else "", "reason": reason[:500],
            "decision": ended_by(outcome), "decided_by": decided_by(outcome),
            "alerts": json.dumps([e.alert for e in sup.events]),
            "state_history": json.dumps(sup.machine.labels())[:5000]}


class JobRun:
    """One job's MLflow run, opened by `open` and closed by `close`."""

    def __init__(self, run_id: str, experiment: str) -> None:
        self.run_id, self.experiment = run_id, experiment

    @classmethod
    def open(cls, tenant: str, name: str, config: Any, params: dict[str, Any] | None = None, *,
             kind: str = "train", experiment: str = T.DEFAULT_EXPERIMENT) -> JobRun:
        """Create the store if needed, close runs dead processes left RUNNING, open the job's run named
        `<tenant>/<name>` (tags: kind, tenant, algorithm; params: `params` and every field of `config`, a
        `TrainConfig`) and log its data files and code hashes (`training.inputs.job_inputs.job_lineage`)."""
        from common.config import flatten
        from training.inputs.job_inputs import job_lineage

        T.init_store()
        T.reap_dead_runs()
        run_id, _ = T.open_run(f"{kind}/{tenant}/{name}/{uuid.uuid4().hex}", f"{tenant}/{name}", experiment,
                               tags={T.KIND_TAG: kind, T.TENANT_TAG: tenant, T.ALGORITHM_TAG: config.algorithm})
        T.log_params(run_id, {**(params or {}), **flatten(config.model_dump(mode="json"))})
        lineage = job_lineage(config)
        T.log_datasets(run_id, lineage["datasets"])
        T.set_tags(run_id, lineage["tags"])
        return cls(run_id, experiment)

    def log_records(self, records: list[dict]) -> None:
        if records:
            T.log_step_records(self.run_id, records)

    def close(self, outcome: Any, metrics: dict[str, float] | None = None) -> None:
        """The job's end: its tags (`outcome_tags`), `metrics`, and the run FAILED or FINISHED with the job."""
        T.set_tags(self.run_id, outcome_tags(outcome))
        if metrics:
            T.log_metrics(self.run_id, metrics)
        T.finish(self.run_id, "FAILED" if outcome.status.state.value == "FAILED" else "FINISHED")

    def fail(self, err: BaseException) -> None:
        """The command failed before the job ended (an error, an interrupt): the run closes FAILED, saying why."""
        T.set_tags(self.run_id, {"failure_class": "platform_fault", "error": f"{type(err).__name__}: {err}"[:500]})
        T.finish(self.run_id, "FAILED")
