"""`rlhfops train --gpus 2`: the local launcher (rank 0 is the command's process, rank 1 a spawned one, gloo on
127.0.0.1) trains with rank 0 alone writing metrics.csv and checkpoints; a rank that dies mid-run ends the job at
the next collective with one line naming it, exit 1, nothing left running."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tiny_job import tiny_config

REPO = Path(__file__).resolve().parents[2]
RLHFOPS = [str(Path(sys.executable).parent / "rlhfops")]


def _config(tmp_path, cache, **over) -> Path:
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, steps=3, **over)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"config_dir"}), sort_keys=False))
    return path


def _train(args, tmp_path, timeout_s=20):
    env = {**os.environ, "PYTHONPATH": str(REPO), "RLHFOPS_COLLECTIVE_TIMEOUT_S": str(timeout_s)}
    t = time.monotonic()
    done = subprocess.run([*RLHFOPS, "train", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    return done, time.monotonic() - t


def test_two_ranks_train_and_rank_0_alone_writes(tmp_path, cache):
    done, _ = _train([str(_config(tmp_path, cache)), "--gpus", "2", "--out", "run"], tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert {r["world_size"] for r in rows} == {"2"}
    assert all(float(r["rank_idle_s"]) >= 0 for r in rows)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-000002", "step-000003"]


def test_a_rank_that_dies_ends_the_job_in_one_line_naming_it(tmp_path, cache):
    cfg = _config(tmp_path, cache, fault={"kind": "rank_exit", "at_step": 1, "rank": 1})
    done, _ = _train([str(cfg), "--gpus", "2", "--out", "run"], tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if "failed" in ln]
    assert len(lines) == 1 and "rank 1 exited with code 3 in step 2" in lines[0], done.stdout[-2000:]
    # the default max_rank_restarts 1: restarted once (one line says so), then failed at the same rank and step
    assert "(restarted 1 time from the last checkpoint: max_rank_restarts 1)" in lines[0], done.stdout[-2000:]
    assert sum("restarting from the last checkpoint" in ln for ln in done.stdout.splitlines()) == 1
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.slow
def test_a_rank_that_hangs_ends_the_job_within_the_timeout(tmp_path, cache):
    cfg = _config(tmp_path, cache, fault={"kind": "rank_hang", "at_step": 1, "rank": 1})
    done, wall = _train([str(cfg), "--gpus", "2", "--out", "run"], tmp_path, timeout_s=10)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if "failed" in ln]
    assert len(lines) == 1 and "rank 1 hung in step 2" in lines[0], done.stdout[-2000:]
    assert wall < 300
