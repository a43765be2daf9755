"""MLflow helpers: one store per working directory, idempotent runs, batched metrics (the comparison report built
from them is `infra/reporting.py`).

Why this module exists instead of bare `mlflow.*` calls:
- The store must be an absolute SQLite URI (a relative one, or a stray `./mlruns/` file store, makes
  MLflow switch stores silently), and a fresh database must be created once, before tasks fan out
  (concurrent first opens race on migrations).
- Flow tasks run in threads (or Ray workers) where `mlflow.active_run()` is None, and Prefect may run a
  task more than once (retries). So every run is created through `MlflowClient` with an explicit
  parent and a `rlhfops.key` tag that names the unit of work: a retried task finds the run its earlier
  attempt made instead of adding a duplicate. A FINISHED run is returned as is; an unfinished one (the
  attempt died mid-logging) is deleted and made again, so MLflow ends with exactly one run per key.
- Per-step metrics go through `log_batch` (1,000 per call): one `log_metric` call costs ~3.5 ms.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KEY_TAG = "rlhfops.key"
KIND_TAG = "rlhfops.kind"
PARENT_TAG = "mlflow.parentRunId"
FLOW_RUN_TAG = "prefect.flow_run_id"
DEPLOYMENT_TAG = "prefect.deployment"
TENANT_TAG = "tenant"
#: a job run's training algorithm, ppo | grpo | rloo (training.inputs.job_inputs.ALGORITHM_TAG: the domain does not
#: import infra)
ALGORITHM_TAG = "algorithm"
NAMES_TAG = "rlhfops.names"  # JSON {metric-safe key: original name}, for the report
#: the experiment's kind ("custom_model_development": machine learning, not a GenAI app), the tag MLflow 3's UI shows
#: as the experiment type (mlflow/server/js: `mlflow.experimentKind`).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: MLflow 3.17's UI picks an experiment's view from its global "GenAI / Model training" switch, not from the kind tag:
#: the switch is the `workflowType` URL parameter, else the browser's saved choice, else "genai" (the traces
#: overview). A link that names the runs page and this parameter opens the runs table in any browser (`ui_url`;
#: checked in headless chromium by tests/infra/test_mlflow_ui.py).
UI_WORKFLOW_QUERY = "workflowType=machine_learning"

DEFAULT_EXPERIMENT = "rlhfops"
_BATCH = 1000
_lock = threading.RLock()
_ready: set[str] = set()


def tracking_uri(base_dir: str | Path | None = None) -> str:
    """The store's URI: `MLFLOW_TRACKING_URI` if set (a relative `sqlite:///x.db` is made absolute), else
    `sqlite:///<base_dir or cwd>/mlflow.db`. Sets the environment variable so every thread and child
    process (process pools, Prefect workers) uses the same store."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not uri:
        uri = f"sqlite:///{(Path(base_dir or Path.cwd()) / 'mlflow.db').resolve()}"
    elif uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    return uri


def artifact_root(uri: str) -> str | None:
    """Artifacts live beside a SQLite store (`<dir>/mlruns/`), never in whatever directory a worker runs in."""
    if uri.startswith("sqlite:///"):
        return (Path(uri[len("sqlite:///"):]).parent / "mlruns").resolve().as_uri()
    return None


def init_store(base_dir: str | Path | None = None) -> str:
    """Create or upgrade the store once per process, before any fan-out. Returns the URI."""
    import mlflow

    uri = tracking_uri(base_dir)
    with _lock:
        if uri not in _ready:
            if uri.startswith("sqlite:///"):
                Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
            mlflow.set_tracking_uri(uri)
            mlflow.MlflowClient(uri).search_experiments(max_results=1)  # runs the migrations
            _ready.add(uri)
    return uri


@contextmanager
def orm_import_guard() -> Iterator[None]:
    """Hold while importing a module that defines SQLAlchemy ORM classes (Prefect's server) in a thread while another
    may open the store: SQLAlchemy configures every mapper registry in the process at once, so MLflow's first query
    during that import fails on the half-defined classes (`expression 'WorkQueue' failed to locate a name`: seen when
    `rlhfops nightly` opened the store while its background thread imported the temporary server). `init_store`
    takes the same lock."""
    with _lock:
        yield


def client():
    import mlflow

    return mlflow.MlflowClient(init_store())


def experiment_id(name: str = DEFAULT_EXPERIMENT) -> str:
    c = client()
    with _lock:
        exp = c.get_experiment_by_name(name)
        if exp is not None:
            tag_experiment_kind(c, exp)
            return exp.experiment_id
        root = artifact_root(init_store())
        try:
            return c.create_experiment(name, artifact_location=f"{root}/{name}" if root else None,
                                       tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # another process created it between the two calls
            exp = c.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id


def ui_url(base: str = "http://127.0.0.1:5000", experiment: str = DEFAULT_EXPERIMENT, run_id: str | None = None) -> str:
    """Where the MLflow UI at `base` (the `mlflow ui` default unless given) shows `experiment`'s runs table, or one
    run's page with `run_id`, in the "Model training" view (`UI_WORKFLOW_QUERY`)."""
    page = f"runs/{run_id}" if run_id else "runs"
    return f"{base.rstrip('/')}/#/experiments/{experiment_id(experiment)}/{page}?{UI_WORKFLOW_QUERY}"


def tag_experiment_kind(c, exp) -> None:
    """Mark an experiment made before the kind tag existed, so the MLflow UI opens its training runs."""
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:
        c.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)


_UNSAFE = re.compile(r"[^A-Za-z0-9_\-. /]")


def safe_key(name: str) -> str:
    """A metric/param-safe version of a name such as `EvalStop(k=3)+SJF` (MLflow allows only alphanumerics,
    `_ - . /` and spaces; every other character becomes `_`). Runs keep the originals in `rlhfops.names`."""
    return _UNSAFE.sub("_", name)


def _finite(x: Any) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def find_run(experiment: str, key: str, include_deleted: bool = False):
    """The run tagged `rlhfops.key = key` in `experiment`, or None."""
    from mlflow.entities import ViewType

    c = client()
    safe = key.replace("'", "\\'")
    runs = c.search_runs([experiment_id(experiment)], filter_string=f"tags.`{KEY_TAG}` = '{safe}'",
                         run_view_type=ViewType.ALL if include_deleted else ViewType.ACTIVE_ONLY, max_results=10)
    return runs[0] if runs else None


def open_run(key: str, name: str, experiment: str = DEFAULT_EXPERIMENT, parent_run_id: str | None = None,
             tags: Mapping[str, Any] | None = None, reuse_unfinished: bool = False) -> tuple[str, bool]:
    """Create the run for a unit of work, or find it. Returns (run_id, already_finished).

    Idempotent under retries: a FINISHED run with the same key is reused (the caller skips its logging);
    a RUNNING/FAILED/KILLED one is what a dead attempt left and is deleted before a fresh one is made.
    `reuse_unfinished=True` (parent runs: a retried flow run keeps its run and the children under it)
    reopens an unfinished run instead."""
    c = client()
    old = find_run(experiment, key)
    if old is not None:
        if old.info.status == "FINISHED":
            return old.info.run_id, True
        if reuse_unfinished:
            c.update_run(old.info.run_id, status="RUNNING")
            set_tags(old.info.run_id, owner_tags())  # this process owns it now (see `reap_dead_runs`)
            return old.info.run_id, False
        c.delete_run(old.info.run_id)
    all_tags = {KEY_TAG: key, "mlflow.runName": name, **owner_tags()}
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    all_tags.update({k: str(v) for k, v in (tags or {}).items() if v is not None})
    run = c.create_run(experiment_id(experiment), tags=all_tags, run_name=name)
    return run.info.run_id, False


def log_params(run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(safe_key(k), str(v)[:6000]) for k, v in params.items() if v is not None]
    for i in range(0, len(items), 100):  # MLflow caps params per batch at 100
        client().log_batch(run_id, params=items[i:i + 100])


def log_metrics(run_id: str, metrics: Mapping[str, Any], step: int = 0) -> int:
    """Log a dict of scalars (non-finite values are skipped: MLflow stores NaN, but comparisons then lie)."""
    return log_metric_rows(run_id, [(k, v, step) for k, v in metrics.items()])


def log_metric_rows(run_id: str, rows: Iterable[tuple[str, Any, int]]) -> int:
    """Log (key, value, step) triples in batches of 1,000. Returns how many were logged."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    metrics = [Metric(safe_key(k), float(v), now, int(step)) for k, v, step in rows if _finite(v)]
    for i in range(0, len(metrics), _BATCH):
        client().log_batch(run_id, metrics=metrics[i:i + _BATCH])
    return len(metrics)


def log_step_records(run_id: str, records: Iterable[Mapping[str, Any]], prefix: str = "") -> int:
    """Per-step training metrics (`StepRecord.flat()` dicts, each with a `step`) in batches."""
    rows = []
    for rec in records:
        step = int(rec["step"])
        rows += [(f"{prefix}{k}", v, step) for k, v in rec.items() if k != "step"]
    return log_metric_rows(run_id, rows)


def set_tags(run_id: str, tags: Mapping[str, Any]) -> None:
    from mlflow.entities import RunTag

    client().log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items() if v is not None])


def log_datasets(run_id: str, datasets: Iterable[Any]) -> None:
    """A job's data files as MLflow dataset inputs (the runs table shows and filters by them): each with its name,
    digest (the file's own sha256: MLflow's computed digest reads only the first 10,000 rows and skips list columns),
    source (the path), row count (the profile) and context (`training` or `eval`, the `mlflow.data.context` tag).
    `datasets`: training.inputs.job_inputs.DatasetLineage."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = [DatasetInput(Dataset(name=d.name, digest=d.digest[:36], source_type="local",
                                   source=json.dumps({"uri": d.source}), profile=json.dumps({"num_rows": d.rows})),
                           tags=[InputTag("mlflow.data.context", d.context)]) for d in datasets]
    if inputs:
        client().log_inputs(run_id, datasets=inputs)


def log_artifacts(run_id: str, paths: Iterable[str | Path], artifact_path: str | None = None) -> None:
    c = client()
    for p in paths:
        p = Path(p)
        if p.is_dir():
            c.log_artifacts(run_id, str(p), artifact_path=artifact_path)
        elif p.is_file():
            c.log_artifact(run_id, str(p), artifact_path=artifact_path)


def log_text(run_id: str, text: str, artifact_file: str) -> None:
    client().log_text(run_id, text, artifact_file)


def finish(run_id: str, status: str = "FINISHED") -> None:
    client().set_terminated(run_id, status=status)


# ---------------------------------------------------------------------------------------------------------
# runs whose process died: never left RUNNING, nothing of theirs in the registry

OWNER_HOST_TAG = "rlhfops.host"
OWNER_PID_TAG = "rlhfops.pid"
OWNER_START_TAG = "rlhfops.pid_start"  # the process's start time: a reused pid is not the run's owner
REAPED_TAG = "rlhfops.reaped"


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def owner_tags() -> dict[str, str]:
    """Which process is writing a run: host, pid and the pid's start time (see `reap_dead_runs`)."""
    import socket

    start = _process_start(os.getpid())
    return {OWNER_HOST_TAG: socket.gethostname(), OWNER_PID_TAG: str(os.getpid()),
            OWNER_START_TAG: repr(start) if start is not None else ""}


def owner_alive(tags: Mapping[str, str]) -> bool | None:
    """Whether the process that owns a run (its owner tags) still runs: None when that cannot be told here (another
    host, or a run without owner tags)."""
    import socket

    host, pid = tags.get(OWNER_HOST_TAG), tags.get(OWNER_PID_TAG)
    if not host or not pid or host != socket.gethostname():
        return None
    start = _process_start(int(pid))
    if start is None:
        return False
    recorded = tags.get(OWNER_START_TAG)
    return not recorded or abs(start - float(recorded)) < 1e-3  # same pid, other start time: a reused pid


def reap_dead_runs(experiment: str | None = None) -> list[str]:
    """Close the runs a killed process left RUNNING (kill -9, OOM, power loss: no code of the dead process ran).

    Every RUNNING run of `experiment` (default: every experiment) whose owner process (`owner_tags`) is gone from
    this host is ended KILLED with tags saying so (`rlhfops.reaped`, `failure_class=platform_fault`), and the model
    versions registered from it are deleted (their aliases go with them): a run that did not finish registers
    nothing. Runs owned by live processes, by other hosts or by no recorded process are left alone. Returns the
    run ids reaped. Called once per process when a flow opens its MLflow run (`tasks.tracking.parent_run`)."""
    import datetime

    from mlflow.entities import ViewType

    c = client()
    if experiment is None:
        ids = [e.experiment_id for e in c.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
    else:
        exp = c.get_experiment_by_name(experiment)
        ids = [exp.experiment_id] if exp is not None else []
    if not ids:
        return []
    reaped = []
    token = None
    while True:
        page = c.search_runs(ids, filter_string="attributes.status = 'RUNNING'", max_results=1000, page_token=token)
        for run in page:
            if owner_alive(run.data.tags) is not False:
                continue
            rid = run.info.run_id
            when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            reason = (f"process {run.data.tags.get(OWNER_PID_TAG)} on {run.data.tags.get(OWNER_HOST_TAG)} died while "
                      f"the run was RUNNING; closed by the reaper at {when}")
            set_tags(rid, {REAPED_TAG: reason, "failure_class": "platform_fault", "reason": reason})
            for mv in c.search_model_versions(f"run_id = '{rid}'"):
                c.delete_model_version(mv.name, mv.version)
            c.set_terminated(rid, status="KILLED")
            reaped.append(rid)
        token = page.token
        if not token:
            return reaped
