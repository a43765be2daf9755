"""A stop is reversible on the live path: `rlhf_job` paused by its gate detector ends PAUSED_BY_GATE with its best
checkpoint kept and registered; the same job with `resume_paused` on continues from that checkpoint's step and
ends SUCCEEDED; MLflow tags, `job.json` and `ledger.csv` record the pause and the resume, each step charged once.

Oracles: the steps and phase seconds in the run directory's `metrics.csv` (the trainer's own per-step rows),
counted by the test, and the state sequence written out by hand."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from infra import tracking as T

TINY_JOB = {"task.n_pairs": 200, "task.sft_steps": 60, "ppo.batch_size": 16, "ppo.max_new_tokens": 24}


@pytest.mark.slow
def test_rlhf_job_paused_by_the_gate_resumes_from_its_kept_checkpoint(prefect_server, mlflow_store, tmp_path,
                                                                      warm_start_cache, monkeypatch, stop_third_early):
    """Two 10-step flow runs on one run directory, about 2 minutes here."""
    import eval.detectors
    from flows.nightly import nightly_job_config
    from flows.rlhf_job import JOB_DONE, rlhf_job

    monkeypatch.setattr(eval.detectors, "make_detector", lambda name, **kw: stop_third_early())
    raw = nightly_job_config(10, str(warm_start_cache))
    raw.update(eval_every=2, checkpoint_every=2)
    out = tmp_path / "job"
    job = {"config": raw, "overrides": TINY_JOB, "out_root": str(out), "run_dir": "."}
    first = rlhf_job(request=job, return_state=True)
    assert first.is_completed(), first.message
    s1 = first.result()
    assert "paused at step 6" in s1["reason"] and "resume" in s1["reason"]
    assert s1["state"].startswith("PAUSED_BY_GATE(") and s1["decision"] == "stopped" and s1["decided_by"] == "gate"
    assert s1["history"] == ["QUEUED", "PROVISIONING", "RUNNING", s1["state"]]
    done = json.loads((out / JOB_DONE).read_text())
    kept = done["best_step"]
    assert done["paused_step"] == 6 and kept == s1["best"]["step"] and kept in (2, 4, 6)
    assert s1["registry"] is not None  # the kept checkpoint is registered
    run1 = T.client().get_run(s1["run_id"])
    assert run1.info.status == "FINISHED" and run1.data.tags["final_state"] == "PAUSED_BY_GATE"

    second = rlhf_job(request={**job, "resume_paused": True}, return_state=True)
    assert second.is_completed(), second.message
    s2 = second.result()
    paused_label = s1["history"][-1]
    assert s2["history"] == ["QUEUED", "PROVISIONING", "RUNNING", paused_label, "RUNNING", "SUCCEEDED"]
    assert s2["resumed_from"]["best_step"] == kept and s2["resumed_from"]["run_id"] == s1["run_id"]
    assert f"resumed from the checkpoint at step {kept}" in s2["reason"]
    tags = T.client().get_run(s2["run_id"]).data.tags
    assert tags["resumed_from_run"] == s1["run_id"] and tags["resumed_from_step"] == str(kept)

    metrics = pd.read_csv(out / "metrics.csv")
    assert list(metrics.step) == list(range(1, 11))  # continued from the kept checkpoint: no step twice
    ledger = pd.read_csv(out / "ledger.csv").set_index("run_id")
    assert ledger.loc[s1["run_id"], "steps"] == 6  # the first segment ran steps 1-6
    assert ledger.loc[s2["run_id"], "steps"] == 10 - kept  # the second ran kept+1..10, the replayed ones not again
    phase_cols = [c for c in metrics.columns if c.startswith("phase_") and c.endswith("_s")]
    ran_again = metrics[metrics.step > kept]
    assert ledger.loc[s2["run_id"], "gpu_seconds"] == pytest.approx(ran_again[phase_cols].sum().sum(), abs=1e-4)

    again = rlhf_job(request={**job, "resume_paused": True}, return_state=True)
    assert again.is_failed() and "resume_paused:" in again.message  # nothing paused left to resume
