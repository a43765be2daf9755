"""The MLflow links the platform prints (the nightly's closing hint, an RLHF job's artifact) open the run in the UI's
"Model training" view: the runs page of the run's experiment with `workflowType=machine_learning`, the address
tests/infra/test_mlflow_ui.py opens in a browser."""

from __future__ import annotations


def _experiment_id(name: str) -> str:
    from infra import tracking as T

    T.experiment_id(name)  # creates it in a fresh store
    return T.client().get_experiment_by_name(name).experiment_id


def test_rlhf_job_run_link(mlflow_store, monkeypatch):
    from flows.rlhf_job import mlflow_run_url

    eid = _experiment_id("links")
    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    assert mlflow_run_url("abc123", "links") == (f"http://127.0.0.1:5000/#/experiments/{eid}/runs/abc123"
                                                 "?workflowType=machine_learning")
    monkeypatch.setenv("MLFLOW_UI_URL", "https://mlflow.example.org/")
    assert mlflow_run_url("abc123", "links") == (f"https://mlflow.example.org/#/experiments/{eid}/runs/abc123"
                                                 "?workflowType=machine_learning")


def test_nightly_hint_links_its_run(mlflow_store, monkeypatch):
    from rlhfops.commands.nightly import run_link, server_hints

    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    eid = _experiment_id("rlhfops")
    local = run_link("sqlite:////srv/m.db", "r1")
    assert local == f"http://127.0.0.1:5000/#/experiments/{eid}/runs/r1?workflowType=machine_learning"
    mlflow, _ = server_hints("sqlite:////srv/m.db", None, local)
    assert mlflow == ("MLflow UI   mlflow ui --backend-store-uri sqlite:////srv/m.db   (store: /srv/m.db), then "
                      + local)
    # a tracking server: the link is on the server itself
    remote = run_link("http://mlflow.internal:5000/", "r1")
    assert remote == f"http://mlflow.internal:5000/#/experiments/{eid}/runs/r1?workflowType=machine_learning"
    assert server_hints("http://mlflow.internal:5000", None, remote)[0] == f"MLflow UI   {remote}"
