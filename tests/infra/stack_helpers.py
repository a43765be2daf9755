"""Helpers of the stack tests: run the CLI in a subprocess, read an MLflow store back with the plain MLflow client
(not through infra/tracking.py, the code under test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

RLHFOPS = str(Path(sys.executable).parent / "rlhfops")
#: tag keys whose values differ between any two runs of the same thing (ids, hosts, clocks, processes)
VOLATILE_TAG_PREFIXES = ("mlflow.", "prefect.", "rlhfops.host", "rlhfops.pid", "rlhfops.key")
#: the nightly's run name carries the minute it started
TIME_IN_NAME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}")


def cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([RLHFOPS, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def base_env(**extra: str) -> dict[str, str]:
    """This environment without any Prefect API or MLflow store of the test session's."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_HOME", "RAY_ADDRESS")
           and not k.startswith("PYTEST")}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", OMP_WAIT_POLICY="PASSIVE", MPLBACKEND="Agg", **extra)
    return env


def mlflow_content(tracking_uri: str, out_dir: str | Path | None = None) -> dict:
    """What a store holds, minus what differs by nature between two runs of the same nightly: per normalised run
    name (a Counter of names, so a lost or duplicated run shows), its status, its stable tags (paths under
    `out_dir` made relative to it), its metric keys and param keys; the registered models with their version
    counts."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=tracking_uri)
    runs = []
    for exp in c.search_experiments():
        token = None
        while True:
            page = c.search_runs([exp.experiment_id], max_results=1000, page_token=token)
            runs += [(exp.name, r) for r in page]
            token = page.token
            if not token:
                break
    names = Counter(f"{e}/{TIME_IN_NAME.sub('<time>', r.info.run_name)}" for e, r in runs)
    content = {}
    for e, r in runs:
        key = f"{e}/{TIME_IN_NAME.sub('<time>', r.info.run_name)}"
        content.setdefault(key, []).append({
            "status": r.info.status,
            "tags": sorted((k, v.replace(str(out_dir), "<out>") if out_dir else v) for k, v in r.data.tags.items()
                           if not k.startswith(VOLATILE_TAG_PREFIXES) and k != "rlhfops.names"),
            "metric_keys": sorted(r.data.metrics),
            "param_keys": sorted(r.data.params),
        })
    for v in content.values():
        v.sort(key=repr)
    registry = {m.name: len(c.search_model_versions(f"name='{m.name}'")) for m in c.search_registered_models()}
    return {"names": names, "runs": content, "registry": registry}
