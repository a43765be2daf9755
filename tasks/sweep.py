"""A sweep's MLflow record and the entry point the CLI and the Prefect flow share.

`MlflowSweepTracker` is the runner's tracker (sweeps/runner.py `NullTracker` interface) on MLflow: one parent
run per sweep (key `sweep/<storage>/<name>`: a resumed or extended sweep reopens it), one child per trial (every
varied param, per-step metrics, final state, pruned-at step, cost, best checkpoint), the best trial's checkpoint
registered under the sweep's own model (`sweep_model`), the sweep report and the ledger as artifacts of the parent.

`run_sweep(...)` checks everything (spec, pruning detector, price of the GPU kind, storage) before a study is opened
or a slot is taken, closes the MLflow runs a killed process left RUNNING (`infra.tracking.reap_dead_runs`), then runs
the sweep.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from infra import tracking as T

KIND = "sweep"
STATE_TAG = "final_state"
#: a trial's `decided_by` tag (training.job.lifecycle.DECIDERS) by its state: only the pruner stops a running trial (the
#: budget stops the sweep from starting new ones; a trial's catalog is empty, so no alert ends one)
TRIAL_DECIDED_BY = {"completed": "none", "pruned": "pruner", "failed": "error"}


def sweep_key(spec) -> str:
    where = hashlib.sha1(spec.storage_url.encode()).hexdigest()[:10]
    return f"sweep/{where}/{spec.name}"


def sweep_model(spec) -> str:
    """The registered model a sweep's best trial goes to (`SweepSpec.model_name`): the spec's `registered_model`,
    else `<sweep name>-sweep`, the sweep's own; never a job's model (`<tenant>-policy`) unless the spec names it: a
    trial reaches a job's model through `rlhfops promote`, by the paired test."""
    return spec.model_name


class MlflowSweepTracker:
    def __init__(self, ledger=None, parent_run_id: str | None = None, flow_tags: dict[str, str] | None = None,
                 base_dir: Path | None = None):
        self.ledger = ledger
        self.outer_parent = parent_run_id  # the caller's run (the nightly's) to nest the sweep under
        self.flow_tags = flow_tags or {}
        self.base_dir = base_dir  # where the spec's relative base is read from (the runner's)
        self.run_id: str | None = None
        self.spec = None

    def start(self, spec, resume: bool) -> None:
        self.spec = spec
        T.init_store()
        T.reap_dead_runs(spec.mlflow_experiment)
        run_id, finished = T.open_run(sweep_key(spec), f"sweep {spec.name}", spec.mlflow_experiment,
                                      self.outer_parent, reuse_unfinished=True,
                                      tags={T.KIND_TAG: KIND, T.TENANT_TAG: spec.tenant, **self.flow_tags})
        if finished:  # an extended sweep (--resume --trials more): the same parent runs again
            T.client().update_run(run_id, status="RUNNING")
            T.set_tags(run_id, T.owner_tags())
        self.run_id = run_id
        params = {"base": spec.base if isinstance(spec.base, str) else "inline", "sampler": spec.sampler.kind,
                  "sampler_seed": spec.sampler.seed, "trials": spec.trials, "seeds_per_trial": spec.seeds_per_trial,
                  "concurrency": spec.concurrency, "gpus_per_trial": spec.gpus_per_trial,
                  "scheduler": spec.scheduler, "queue_depth": spec.lookahead,
                  "pruning": spec.pruning.detector, "direction": spec.objective.direction,
                  "budget_gpu_hours": spec.budget.gpu_hours, "budget_wall_s": spec.budget.wall_s,
                  "storage": spec.storage_url,
                  **{f"space.{k}": f"{p.kind} {p.candidates()}" for k, p in spec.space.items()},
                  **{f"fixed.{k}": v for k, v in spec.overrides.items()}}
        try:
            T.log_params(run_id, params)
        except Exception:  # noqa: BLE001 - a resumed sweep logged them already (MLflow params are write-once)
            pass

    def trial_started(self, number: int, params: dict[str, Any]) -> str:
        spec = self.spec
        algorithm = self.trial_algorithm(params)
        run_id, _ = T.open_run(f"{sweep_key(spec)}/trial-{number}", f"{spec.name}/trial-{number}",
                               spec.mlflow_experiment, self.run_id,
                               tags={T.KIND_TAG: "sweep-trial", T.TENANT_TAG: spec.tenant, "optuna_trial": number,
                                     STATE_TAG: "RUNNING", T.ALGORITHM_TAG: algorithm.get("algorithm")})
        T.log_params(run_id, {**algorithm, **params, "trial": number, "seeds": spec.seeds_per_trial})
        return run_id

    def trial_algorithm(self, params: dict[str, Any]) -> dict[str, Any]:
        """The trial's training algorithm and its fields (`training.inputs.job_inputs.algorithm_params`) from its
        config, varied or not, so every trial run filters by `params.algorithm` as a job's does; empty when the config
        does not resolve (the trial then fails on its own check, with the error on its run)."""
        from common.errors import BadInput
        from sweeps.spec import trial_config
        from training.inputs.job_inputs import algorithm_params

        try:
            return algorithm_params(trial_config(self.spec, params, 0, self.base_dir))
        except BadInput:
            return {}

    def trial_finished(self, result, records: list[dict[str, Any]]) -> None:
        if not result.run_id:
            return
        rid = result.run_id
        T.log_step_records(rid, records)
        totals = self.ledger.run_totals().get(rid) if self.ledger is not None else None
        T.log_metrics(rid, {"objective": result.objective, "objective_se": result.objective_se,
                            "best_eval": result.objective, "best_step": result.best_step or math.nan,
                            "pruned_at_step": result.pruned_at if result.pruned_at is not None else math.nan,
                            "gpu_seconds": result.gpu_seconds, "gpu_hours": result.gpu_seconds / 3600,
                            "cost_usd": float(totals.cost) if totals else math.nan,
                            "steps": result.steps, "wall_s": result.wall_s})
        T.set_tags(rid, {STATE_TAG: result.state.upper(), "decided_by": TRIAL_DECIDED_BY.get(result.state, "error"),
                         "decision": result.state, "best_checkpoint": result.best_checkpoint or "",
                         "stop_reason": (result.stop_reason or "")[:500], "error": (result.error or "")[:500]})
        T.finish(rid, "FAILED" if result.state == "failed" else "FINISHED")

    def finish(self, summary: dict[str, Any], report_files: list[Path], failed: bool = False) -> dict[str, Any]:
        if self.run_id is None:
            return {}
        spec = self.spec
        registry: dict[str, Any] = {}
        best = summary.get("best")
        if best and best.get("run_id") and best.get("best_checkpoint") and Path(best["best_checkpoint"]).is_dir():
            from tasks.training import register_checkpoint

            registry = register_checkpoint.fn(
                best["run_id"], sweep_model(spec),
                {"checkpoint": best["best_checkpoint"], "step": best["best_step"], "eval_score": best["objective"],
                 "eval_se": best["objective_se"]},
                spec.tenant, f"{spec.tenant}/{spec.name}/trial-{best['number']}", run_state="SUCCEEDED")
        T.log_metrics(self.run_id, {
            "trials_done": summary["trials_done"], "trials_pruned": summary["trials_pruned"],
            "trials_failed": summary["trials_failed"], "gpu_seconds": summary["gpu_seconds"],
            "gpu_hours": summary["gpu_seconds"] / 3600, "wall_s": summary["wall_s"],
            "best_objective": best["objective"] if best else math.nan,
            "best_objective_se": best["objective_se"] if best else math.nan})
        T.set_tags(self.run_id, {"budget_stop": summary.get("budget_stop") or "",
                                 "best_trial": best["number"] if best else "",
                                 "registered_model": registry.get("model", ""),
                                 "registered_version": registry.get("version", "")})
        T.log_artifacts(self.run_id, report_files, artifact_path="report")
        if self.ledger is not None and spec is not None:
            path = spec.run_dir / "ledger.csv"
            self.ledger.frame().to_csv(path, index=False)
            T.log_artifacts(self.run_id, [path])
        T.finish(self.run_id, "FAILED" if failed else "FINISHED")
        return registry


def prepare(spec_path: str | Path | dict, trials: int | None = None, prices: str | None = None):
    """The spec, checked, and a ledger priced for its GPU kind: everything is validated here, before any study is
    opened or slot taken. Raises BadInput naming the field. `prices` (a price table YAML) replaces the spec's own
    `prices`: every trial's request names it, so each trial is checked against it and charged with it."""
    from common.errors import BadInput
    from infra.ledger import Ledger, load_prices
    from sweeps.runner import check_pruning
    from sweeps.spec import check_against_job, load_spec, parse_spec
    from training.job.request import check_gpu_kind

    if isinstance(spec_path, dict):
        raw = dict(spec_path)
        if trials is not None:
            raw["trials"] = trials
        spec = parse_spec(raw)
        check_against_job(spec)
    else:
        spec = load_spec(spec_path, trials)
    check_pruning(spec)
    if prices is not None:
        spec = spec.model_copy(update={"prices": prices})
    table = load_prices(spec.prices)
    check_gpu_kind(spec.gpu_kind, table.gpu_hour, prices=spec.prices)
    if trials is not None and trials < 1:
        raise BadInput("trials: must be >= 1")
    return spec, Ledger(table)


def run_sweep(spec, ledger, *, prune: bool = True, resume: bool = False, on_event=None, slot=None,
              parent_run_id: str | None = None, flow_tags: dict[str, str] | None = None,
              base_dir: Path | None = None, trial_fn=None) -> dict[str, Any]:
    """Run a prepared sweep with MLflow tracking and the tenant's ledger."""
    from sweeps.runner import SweepRunner, run_trial
    from tasks.timing import clock

    def timed_trial(*args, **kwargs):
        with clock.span("work"):  # the nightly's overhead accounting: a trial's training is domain work
            return (trial_fn or run_trial)(*args, **kwargs)

    tracker = MlflowSweepTracker(ledger, parent_run_id, flow_tags, base_dir)
    runner = SweepRunner(spec, prune=prune, resume=resume, tracker=tracker, ledger=ledger, on_event=on_event,
                         slot=slot, base_dir=base_dir, trial_fn=timed_trial)
    summary = runner.run()
    summary["mlflow_run_id"] = tracker.run_id
    return summary
