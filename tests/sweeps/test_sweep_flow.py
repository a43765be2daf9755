"""The `sweep` Prefect flow on the session's temporary Prefect server (trials take the flow's GPU slot pool): the
sweep's MLflow parent carries the flow run's id, the best checkpoint is registered, the report is a Prefect artifact.
Real tiny training, two trials of two steps. Wall 30-100 s on 2 shared cores (most of it the server's start when
this file runs alone)."""

from __future__ import annotations

import pytest
import yaml
from sweep_helpers import BASE

pytestmark = pytest.mark.slow


def test_sweep_flow_runs_trials_on_slots_and_publishes_the_report(prefect_server, mlflow_store, tmp_path,
                                                                    warm_start_cache):
    from prefect.client.orchestration import get_client

    from flows.sweep import sweep
    from infra import tracking as T

    base = {**BASE, "steps": 2, "checkpoint_every": 1, "eval_every": 1, "cache_dir": str(warm_start_cache)}
    spec = {"name": "flow-sweep", "base": base, "space": {"ppo.kl_coef": {"grid": [0.05, 0.2]}},
            "sampler": {"kind": "grid"}, "trials": 2, "concurrency": 1, "tenant": "globex",
            "out_dir": str(tmp_path / "sweep"), "mlflow_experiment": "sweep-flow-test"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    state = sweep(spec=str(path), return_state=True)
    assert state.is_completed(), state
    summary = state.result()
    assert summary["trials_done"] == 2 and {t["state"] for t in summary["trials"]} <= {"completed", "pruned"}
    parent = T.client().get_run(summary["mlflow_run_id"])
    assert parent.data.tags[T.FLOW_RUN_TAG] == str(state.state_details.flow_run_id)
    # the best trial goes to the sweep's own model (<name>-sweep), never the tenant's job model
    mv = T.client().get_model_version_by_alias("flow-sweep-sweep", "best")
    assert mv.run_id == summary["trials"][[t["number"] for t in summary["trials"]].index(summary["best"]["number"])][
        "run_id"]
    # every trial's steps were charged to the tenant's ledger: a cost per child run, the ledger CSV on the parent
    from infra.ledger import load_prices

    price = float(load_prices().hourly("cpu"))
    for t in summary["trials"]:
        child = T.client().get_run(t["run_id"])
        assert child.data.metrics["cost_usd"] == pytest.approx(t["gpu_seconds"] / 3600 * price, rel=1e-4)
        assert t["gpu_seconds"] > 0
    assert "ledger.csv" in {a.path for a in T.client().list_artifacts(parent.info.run_id)}
    with get_client(sync_client=True) as c:
        keys = {a.key for a in c.read_artifacts()}
    assert {"sweep-flow-sweep", "sweep-flow-sweep-trials"} <= keys
