"""`rlhfops canary` as a user runs it (slow): a fault canary fires its alert, moves the run state and writes the
Prometheus metrics file. One canary: every canary, the controls included, runs in-process in
tests/training/test_faults_canaries.py::test_canary."""

import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow
def test_a_canary_fires_and_writes_its_alert_to_the_metrics_file(tmp_path):
    out = tmp_path / "canary.csv"
    cmd = [sys.executable, "-m", "rlhfops.cli", "canary", "--quick", "--only", "frozen_sync", "--cache-dir",
           str(tmp_path / "cache"), "--out", str(out), "--metrics-file", str(tmp_path / "m.prom")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = pd.read_csv(out).set_index("canary")
    assert list(rows.index) == ["frozen_sync"]
    assert rows.loc["frozen_sync", "state"] == "FAILED(platform_fault)"
    assert rows.loc["frozen_sync", "fired_at"] > 8  # the quick canaries' fault starts at step 8
    assert 'rlapi_alerts_total{alert="sync_stall",severity="paging"} 1.0' in (tmp_path / "m.prom").read_text()


def test_unknown_canary_exits_2():
    res = subprocess.run([sys.executable, "-m", "rlhfops.cli", "canary", "--only", "meteor"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--only: unknown canary 'meteor'" in res.stderr
