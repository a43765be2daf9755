"""A stop is reversible on the platform round too: a job the scheduler's early-stop wrapper stops is paused
(PAUSED_BY_GATE) with its best checkpoint kept; the round run again with `resume_paused=True` continues only that
job, from the kept checkpoint, and the round's files keep every charge of both segments.

Oracles: the stop step is where StopAt0.5 must fire (the first checkpoint at half the planned steps, computed here
from the job config's gate interval); the steps each segment ran come from the run directory's `metrics.csv`, the
trainer's own per-step rows, counted by the test."""

from __future__ import annotations

import json
import uuid

import pandas as pd
import pytest

from common.errors import BadInput


@pytest.mark.slow
def test_a_round_resumes_the_job_its_scheduler_paused(prefect_server, mlflow_store, tmp_path, warm_start_cache,
                                                       tiny_platform_job):
    from flows.platform_round import platform_job_config, platform_round
    from training.job.lifecycle import JOB_DONE

    steps = 8
    gate_every = platform_job_config(steps, str(warm_start_cache))["eval_every"]
    first_half = next(s for s in range(gate_every, steps + 1, gate_every) if s / steps >= 0.5)
    jobs = [{"tenant": "globex", "name": "paused", "overrides": tiny_platform_job}]
    out = tmp_path / "round"
    common = dict(jobs=jobs, slots=1, steps=steps, out_dir=str(out), cache_dir=str(warm_start_cache),
                  retry_delay_s=0.1, slot_limit=f"gpu-slots-test-{uuid.uuid4().hex[:8]}")

    first = platform_round(scheduler="StopAt0.5+FIFO", **common)["jobs"].iloc[0]
    assert first.decision == "stopped" and first.state.startswith("PAUSED_BY_GATE(")
    assert first.stopped_at == first_half
    done = json.loads((out / "globex" / "paused" / JOB_DONE).read_text())
    kept = done["best_step"]
    assert done["paused_step"] == first_half and kept in range(gate_every, first_half + 1, gate_every)

    second = platform_round(scheduler="FIFO", resume_paused=True, **common)["jobs"].iloc[0]
    assert second.decision == "completed" and second.state == "SUCCEEDED"
    assert second.resumed_from_step == kept

    metrics = pd.read_csv(out / "globex" / "paused" / "metrics.csv")
    assert list(metrics.step) == list(range(1, steps + 1))  # continued from the kept checkpoint: no step twice
    ledger = pd.read_csv(out / "ledger.csv").groupby("run_id").steps.sum()
    assert ledger[first.run_id] == first_half  # the first round ran steps 1..first_half
    assert ledger[second.run_id] == steps - kept  # the resumed one ran kept+1..steps, the replayed ones not again
    rows = pd.read_csv(out / "jobs.csv")
    assert list(zip(rows.tenant, rows.job, rows.state, strict=True)) == [("globex", "paused", "SUCCEEDED")]

    with pytest.raises(BadInput, match="resume_paused: no job of this round is paused"):
        platform_round(scheduler="FIFO", resume_paused=True, **common)
