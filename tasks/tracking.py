"""MLflow bookkeeping for flows: one parent run per flow run (`parent_run`), child runs per simulation variant.

Every call here is safe to retry: runs are keyed (`infra.tracking.open_run`), so a retried attempt finds
or replaces what an earlier attempt left and MLflow ends with one run per unit of work.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from infra import tracking as T
from tasks.retry import RETRIES, backoff, maybe_fail, retried, retry_transient, with_retries
from tasks.timing import clock

_RETRY = dict(retries=RETRIES, retry_delay_seconds=backoff(1.0), retry_jitter_factor=0.5,
              retry_condition_fn=retry_transient, cache_policy=NO_CACHE)


def flow_context() -> dict[str, str]:
    """Tags that tie an MLflow run to the Prefect flow run that made it."""
    from prefect.runtime import flow_run

    from infra.provision import retry_unreachable

    # the deployment lookup is a fresh client's request: during a server restart it failed the flow at once
    return {T.FLOW_RUN_TAG: str(flow_run.id or "none"), "prefect.flow_name": str(flow_run.flow_name or ""),
            T.DEPLOYMENT_TAG: retry_unreachable(deployment_name)}


def deployment_name() -> str:
    """The deployment this flow run (or the flow run it is a subflow of) belongs to, or "local".

    `prefect.runtime.deployment.name` reads the flow run back from the API whenever no deployment is known,
    i.e. on every local run (a request per flow run, ~0.05-0.3 s on the temporary server); the flow run in the
    context already says whether there is one, and Prefect's engine keeps a deployment run's id in a context
    variable for its subflows."""
    from prefect.runtime import deployment

    try:
        from prefect.context import FlowRunContext, _deployment_id
    except ImportError:  # another Prefect: ask the runtime
        return str(deployment.name or "local")
    ctx = FlowRunContext.get()
    if ctx is not None and ctx.flow_run is not None and ctx.flow_run.deployment_id is None \
            and _deployment_id.get() is None:
        return "local"
    return str(deployment.name or "local")


# Opening and closing a flow run's MLflow run are a few SQLite writes each: plain calls with the tasks' retry rule
# (`tasks.retry.with_retries`) rather than task runs of their own, which would add Prefect bookkeeping to every
# flow run for no extra safety.


@retried
def open_parent(kind: str, name: str, experiment: str = T.DEFAULT_EXPERIMENT, parent_run_id: str | None = None,
                tenant: str = "platform", params: dict[str, Any] | None = None,
                tags: dict[str, Any] | None = None, fail_rate: float = 0.0, fault_seed: int = 0,
                ctx: dict[str, str] | None = None, key: str | None = None) -> str:
    """The one MLflow run of a flow run (nested under the caller's run for subflows), or with `key` another run
    that runs nest under (a scheduling experiment inside the nightly). Retried (keyword `retry_delay_s`): a
    retried attempt reopens the run an earlier one made."""
    ctx = ctx or flow_context()
    key = key or f"flow/{ctx[T.FLOW_RUN_TAG]}"
    with clock.span("tracking"):
        maybe_fail("tracking-open", f"{kind}/{name}", fail_rate, fault_seed)
        run_id, _ = T.open_run(key, name, experiment, parent_run_id,
                               tags={**ctx, T.KIND_TAG: kind, T.TENANT_TAG: tenant, **(tags or {})},
                               reuse_unfinished=True)
        if params:
            T.log_params(run_id, params)
    return run_id


@retried
def close_parent(run_id: str, metrics: dict[str, float] | None = None, artifacts: list[str] | None = None,
                 texts: dict[str, str] | None = None, tags: dict[str, Any] | None = None,
                 status: str = "FINISHED") -> str:
    """Log the flow run's results to its MLflow run and end it with `status`. Retried (keyword `retry_delay_s`)."""
    with clock.span("tracking"):
        if metrics:
            T.log_metrics(run_id, metrics)
        if tags:
            T.set_tags(run_id, tags)
        for name, text in (texts or {}).items():
            T.log_text(run_id, text, name)
        T.log_artifacts(run_id, artifacts or [])
        T.finish(run_id, status)
    return run_id


def error_tags(err: BaseException) -> dict[str, str]:
    """What a flow run's MLflow run records when the flow fails on an unexpected error."""
    return {"failure_class": "platform_fault", "error": f"{type(err).__name__}: {err}"[:500]}


_reaped: set[str] = set()


def reap_once(uri: str) -> list[str]:
    """Close the runs killed processes left RUNNING in this store (`infra.tracking.reap_dead_runs`), once per process
    and store: the first flow a process runs does it, before it adds runs of its own. Retried like the parent run;
    the reaped runs are reported in the log."""
    if uri in _reaped:
        return []
    import logging

    with clock.span("tracking"):
        reaped = with_retries(T.reap_dead_runs)
    _reaped.add(uri)
    if reaped:
        logging.getLogger("rlhfops.tracking").warning(
            "closed %d MLflow run(s) left RUNNING by a process that died: %s", len(reaped), ", ".join(reaped))
        from prefect.runtime import flow_run

        # not this flow run: a flow run re-executed in a new process (`prefect flow-run retry`) reaps its own old run
        crash_flow_runs({T.client().get_run(r).data.tags.get(T.FLOW_RUN_TAG) for r in reaped}
                        - {None, "none", str(flow_run.id)})
    return reaped


def crash_flow_runs(flow_run_ids: set[str]) -> list[str]:
    """Mark the Prefect flow runs of reaped MLflow runs Crashed where they are still in a non-final state: a killed
    process could not report its end, and on the temporary server (no heartbeats) nothing else would. Best effort:
    a flow run another server holds, or one already final, is left as it is. Returns the ids marked."""
    import logging

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    marked = []
    try:
        with get_client(sync_client=True) as c:
            for fid in sorted(flow_run_ids):
                try:
                    fr = c.read_flow_run(fid)
                    if fr.state is None or fr.state.is_final():
                        continue
                    c.set_flow_run_state(fid, Crashed(message="the process running it died (closed by the "
                                                              "rlhfops reaper on the next start)"), force=True)
                    marked.append(fid)
                except Exception:  # noqa: BLE001 - not on this server
                    continue
    except Exception as err:  # noqa: BLE001 - no API reachable: the MLflow side is what the reaper guarantees
        logging.getLogger("rlhfops.tracking").info("could not mark flow runs crashed: %s", err)
    return marked


class ParentRun:
    """A flow run's MLflow run, as `parent_run` yields it: `run_id`, the flow-run tags `ctx`, and `close`."""

    def __init__(self, run_id: str, ctx: dict[str, str], retry_delay_s: float) -> None:
        self.run_id, self.ctx, self.retry_delay_s = run_id, ctx, retry_delay_s
        self.closed = False

    def close(self, metrics: dict[str, float] | None = None, artifacts: list[str] | None = None,
              texts: dict[str, str] | None = None, tags: dict[str, Any] | None = None,
              status: str = "FINISHED") -> None:
        close_parent(self.run_id, metrics=metrics, artifacts=artifacts, texts=texts, tags=tags, status=status,
                     retry_delay_s=self.retry_delay_s)
        self.closed = True


@contextmanager
def parent_run(kind: str, name: str, experiment: str = T.DEFAULT_EXPERIMENT, parent_run_id: str | None = None, *,
               tenant: str = "platform", params: dict[str, Any] | None = None, fail_rate: float = 0.0,
               fault_seed: int = 0, retry_delay_s: float = 1.0,
               failure_tags: Callable[[BaseException], dict[str, Any]] = error_tags,
               key: str | None = None) -> Iterator[ParentRun]:
    """Every flow's MLflow bookkeeping in one place: create the store if needed, open the flow run's run (tagged
    with the Prefect flow-run id, deployment, kind and tenant; nested under `parent_run_id`), and yield it. The
    flow closes it with its results; if the block raises first, the run is closed FAILED with
    `failure_tags(error)` and the error propagates. `key`: not the flow run's own run but another one, under
    the flow run's (default key `flow/<flow-run id>`). The first flow of a process first closes the runs that
    killed processes left RUNNING (`reap_once`); inside the block, Prefect API requests ride out an outage of a few
    minutes (`infra.provision.api_outage_tolerance`)."""
    from infra.provision import api_outage_tolerance

    reap_once(T.init_store())
    ctx = flow_context()
    run = ParentRun(open_parent(kind, name, experiment, parent_run_id, tenant=tenant, params=params,
                                fail_rate=fail_rate, fault_seed=fault_seed, ctx=ctx, key=key,
                                retry_delay_s=retry_delay_s),
                    ctx, retry_delay_s)
    try:
        with api_outage_tolerance():
            yield run
    except BaseException as err:
        if not run.closed:
            run.close(tags=failure_tags(err), status="FAILED")
        raise


SUMMARY_METRICS = ["jct_mean", "jct_std", "ttfuc_mean", "wasted_frac", "saved_frac", "precision", "recall", "fpr",
                   "stopped", "jain", "jct_p_value"]
VARIANT_FAULT_SITES = ("tracking-open", "tracking-mid")
PER_SEED_METRICS = ["jct", "wasted_frac", "precision", "recall", "fpr"]


@task(name="track-variant", task_run_name="track {experiment}/{variant}", **_RETRY)
def track_variant(parent_run_id: str, flow_run_id: str, experiment: str, variant: str, summary: pd.DataFrame,
                  per_seed: pd.DataFrame, params: dict[str, Any], mlflow_experiment: str = T.DEFAULT_EXPERIMENT,
                  fail_rate: float = 0.0, fault_seed: int = 0) -> str:
    """One child run per simulation variant: its parameters, one metric per (summary metric, scheduler)
    named `<metric>/<scheduler>`, and per-seed metrics with the seed as the step."""
    key = f"{flow_run_id}/{experiment}/{variant}"
    fault_key = f"{experiment}/{variant}"  # no run id: a fault plan replays identically across flow runs
    with clock.span("tracking"):
        maybe_fail("tracking-open", fault_key, fail_rate, fault_seed, VARIANT_FAULT_SITES)
        names = {T.safe_key(s): s for s in summary["scheduler"]}
        run_id, done = T.open_run(key, f"{experiment}/{variant}", mlflow_experiment, parent_run_id,
                                  tags={T.KIND_TAG: "sim_variant", T.TENANT_TAG: "simulation",
                                        T.FLOW_RUN_TAG: flow_run_id, T.NAMES_TAG: json.dumps(names)})
        if done:
            return run_id
        T.log_params(run_id, {"experiment": experiment, "variant": variant, **params})
        rows = [(f"{m}/{r.scheduler}", r[m], 0) for _, r in summary.iterrows() for m in SUMMARY_METRICS]
        rows += [(f"seed_{m}/{r.scheduler}", r[m], int(r.seed)) for _, r in per_seed.iterrows()
                 for m in PER_SEED_METRICS if m in r]
        T.log_metric_rows(run_id, rows)
        # the attempt can die here, between opening the run and finishing it: the next one replaces the run
        maybe_fail("tracking-mid", fault_key, fail_rate, fault_seed, VARIANT_FAULT_SITES)
        T.finish(run_id)
    return run_id


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
