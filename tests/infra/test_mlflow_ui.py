"""The MLflow UI of the pinned MLflow opens the `rlhfops` experiment on its runs table, checked in a real headless
browser (the Debian `chromium` package driven by playwright; playwright's own browsers are never downloaded).

MLflow 3.17's UI chooses an experiment's view from its "GenAI / Model training" switch (the `workflowType` URL
parameter, else the browser's saved choice, else GenAI: the traces overview), not from the experiment's kind tag.
This test starts `mlflow server` on a temporary SQLite store holding one run logged through `infra/tracking.py`,
opens the address `infra.tracking.ui_url` gives in a fresh browser profile and waits for the run's name in the runs
table. Skipped only when no chromium (or no playwright) is installed.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from infra import tracking as T

CHROMIUM = os.environ.get("RLHFOPS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = [
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium installed (apt-get install chromium)"),
    pytest.mark.timeout(420),  # a store, a server and a browser to start: about 15 s idle, minutes on a loaded machine
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"mlflow server did not answer {url} in {timeout_s} s")


@pytest.fixture(scope="module")
def mlflow_ui(tmp_path_factory):
    """A store with one run in the `rlhfops` experiment (through infra/tracking.py), and `mlflow server` serving it
    on a free loopback port. Yields (base URL, the store's URI, the run's id)."""
    pytest.importorskip("playwright.sync_api", reason="playwright not installed (extra `dev`)")
    root = tmp_path_factory.mktemp("mlflow-ui")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        run_id, _ = T.open_run("ui-check/job", "ui-check-ppo-run")
        T.log_metrics(run_id, {"reward": 0.5})
        T.finish(run_id)

    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
         "--default-artifact-root", (root / "mlruns").as_uri(), "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=(root / "server.log").open("w"),
        start_new_session=True)  # its own process group: `mlflow server` runs uvicorn as a child process
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_up(f"{base}/health", proc)
        yield base, uri, run_id
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 900})
        finally:
            browser.close()


def test_experiment_kind_is_set_where_the_experiment_is_created(mlflow_ui):
    import mlflow

    _base, uri, _run_id = mlflow_ui
    exp = mlflow.MlflowClient(uri).get_experiment_by_name("rlhfops")
    assert exp.tags.get("mlflow.experimentKind") == "custom_model_development"


def test_ui_url_opens_the_rlhfops_experiment_on_its_runs_table(mlflow_ui, page, monkeypatch):
    base, uri, _run_id = mlflow_ui
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    url = T.ui_url(base)
    exp_id = T.experiment_id()
    page.goto(url, wait_until="domcontentloaded")
    page.get_by_text("ui-check-ppo-run").first.wait_for(state="visible", timeout=60_000)
    # the runs page of this experiment in the "Model training" view (the GenAI view titles it "Training runs")
    assert f"#/experiments/{exp_id}/runs" in page.url
    page.get_by_role("heading", name="Runs", exact=True).wait_for(state="visible", timeout=10_000)
    if os.environ.get("RLHFOPS_UI_SCREENSHOT"):
        page.screenshot(path=os.environ["RLHFOPS_UI_SCREENSHOT"])


def test_ui_url_of_a_run_opens_that_run(mlflow_ui, page, monkeypatch):
    base, uri, run_id = mlflow_ui
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    page.goto(T.ui_url(base, run_id=run_id), wait_until="domcontentloaded")
    # the run page: its name as the title and its logged metric
    page.get_by_role("heading", name="ui-check-ppo-run").first.wait_for(state="visible", timeout=60_000)
    page.get_by_text("reward").first.wait_for(state="visible", timeout=10_000)
    assert f"/runs/{run_id}" in page.url
