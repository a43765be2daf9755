"""Canaries on real small PPO runs (slow): injected faults fire their alerts and move the run state;
the healthy control stays quiet. Runs a subset to fit the test budget; `rlhfops canary --quick` runs all."""

import subprocess
import sys

import pandas as pd
import pytest


@pytest.mark.slow
def test_canaries_fire_and_control_stays_quiet(tmp_path):
    out = tmp_path / "canary.csv"
    cmd = [sys.executable, "-m", "rlhfops.cli", "canary", "--quick",
           "--only", "control,frozen_sync,oversized_lr", "--cache-dir", str(tmp_path / "cache"),
           "--out", str(out), "--metrics-file", str(tmp_path / "m.prom")]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = pd.read_csv(out).set_index("canary")
    assert rows.loc["control", "state"] == "SUCCEEDED" and rows.loc["control", "paged"] == "[]"
    assert rows.loc["frozen_sync", "state"] == "FAILED(platform_fault)"
    assert rows.loc["oversized_lr", "state"] == "FAILED(algorithmic_non_convergence)"
    assert rows.loc[["frozen_sync", "oversized_lr"], "fired_at"].notna().all()
    assert 'rlapi_alerts_total{alert="sync_stall",severity="paging"} 1.0' in (tmp_path / "m.prom").read_text()


def test_unknown_canary_exits_2():
    res = subprocess.run([sys.executable, "-m", "rlhfops.cli", "canary", "--only", "meteor"],
                         capture_output=True, text=True)
    assert res.returncode == 2 and "--only: unknown canary 'meteor'" in res.stderr
