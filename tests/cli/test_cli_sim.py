"""The CLI contract for the simulator side: outputs, file formats, exit codes on bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from scheduling.experiments import SUMMARY_COLUMNS

RLHFOPS = [sys.executable, "-m", "rlhfops.cli"]


def run(*args, cwd=None):
    return subprocess.run([*RLHFOPS, *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_simulate_writes_contract_files(tmp_path):
    out = tmp_path / "e2"
    r = run("simulate", "E2", "--seeds", "42,123", "--jobs", "60", "--out", str(out), "--plots")
    assert r.returncode == 0, r.stderr
    summary = pd.read_csv(out / "summary.csv")
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert set(summary.scheduler) >= {"SRTF-Est", "EvalStop+SRTF", "StopAt0.65+SRTF", "LossPlateau+SRTF"}
    assert (summary.n_seeds == 2).all()
    jobs = pd.read_csv(out / "jobs.csv")
    assert len(jobs) == 9 * 2 * 60
    assert (out / "E2.png").stat().st_size > 10_000
    assert "EvalStop+SRTF" in r.stdout


def test_simulate_variants_and_set_override(tmp_path):
    r = run("simulate", "E7", "--seeds", "42", "--jobs", "40", "--set", "workload.eval_noise.kind=ar1",
            "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary.variant.nunique() == 5


@pytest.mark.parametrize("args, needle", [
    (["simulate", "E9"], "experiment 'E9'"),
    (["simulate", "E2", "--set", "workload.gpuz=3"], "workload.gpuz"),
    (["simulate", "E2", "--set", "workload.gpus=lots"], "workload.gpus"),
    (["simulate", "E2", "--seeds", "1,x"], "--seeds"),
    (["simulate", "E2", "--gpus", "4"], "exceeds the cluster"),
    (["detect", "missing.csv"], "no such file"),
    (["detect", "t.csv", "--detector", "nope"], "unknown detector"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, args, needle):
    (tmp_path / "t.csv").write_text("run_id,step,eval_score\na,1,0.5\n")
    r = run(*args, cwd=tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_bad_experiment_yaml_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: X\nschedulers: [SRTF-Est]\nworkload: {mix: {lora: 1, dpo: 0, rlhf: 0}, jobz: 3}\n")
    r = run("simulate", str(bad))
    assert r.returncode == 2 and "workload.jobz" in r.stderr
    bad.write_text("name: X\nschedulers: [SRTF-Est, EvalStop+Nope]\n")
    r = run("simulate", str(bad))
    assert r.returncode == 2 and "schedulers" in r.stderr and "Nope" in r.stderr


def test_detect_cli_prints_quality_and_writes_verdicts(tmp_path):
    rows = []
    for i in range(6):
        hack = i % 2
        ev = [0.2, 0.5, 0.4, 0.3] if hack else [0.2, 0.3, 0.4, 0.5]
        # 4 checkpoints are too few for a run's own noise estimate: the gate's SE gives the scale
        rows += [{"run_id": f"r{i}", "step": s, "eval_score": e, "eval_se": 0.02, "label": hack}
                 for s, e in enumerate(ev)]
    pd.DataFrame(rows).sample(frac=1, random_state=1).to_csv(tmp_path / "t.csv", index=False)
    r = run("detect", str(tmp_path / "t.csv"), "--out", str(tmp_path / "v.csv"))
    assert r.returncode == 0, r.stderr
    v = pd.read_csv(tmp_path / "v.csv")
    assert list(v.columns)[:7] == ["run_id", "stopped", "stop_step", "best_step", "best_eval_score",
                                   "final_eval_score", "label"]  # DESIGN's columns first; usefulness after
    assert "100.0%" in r.stdout


def test_bench_sim_quick_json(tmp_path):
    out = tmp_path / "b.json"
    r = run("bench", "sim", "--quick", "--jobs", "20000", "--gpus", "512", "--out", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    for key in ("matrix_wall_s", "million_jobs_wall_s", "million_jobs_peak_rss_mib", "events_per_s"):
        assert key in data
    assert data["large"]["jobs"] == 20000 and data["events_per_s"] > 0 and data["matrix_runs"] == 84
