"""One supervisor, one detector: one job spec run through the `rlhf-job` flow, a platform round and a sweep trial,
gated by the real EvalStop detector (k = 2, no stub), gets the same verdict at the same step.

The oracle is the job's own record, read by the test: the held-out gate scores in the run directory's
`metrics.csv`, on which EvalStop's rule (stop at the second consecutive decline) is re-applied here by hand; every
entry point must stop at that step. The three trainings share one config (the platform round's small job, chunk-size
tuning off so the overlap does not depend on timing), seed and warm start."""

from __future__ import annotations

import json
import math
import uuid

import pandas as pd
import pytest


def second_consecutive_decline(metrics_csv) -> int | None:
    """EvalStop(k=2) by hand: the first checkpoint whose gate score is below the previous one, which was itself below
    the one before."""
    m = pd.read_csv(metrics_csv)
    gates = [(int(s), float(g)) for s, g in zip(m.step, m.gold_eval, strict=True) if not math.isnan(float(g))]
    declines = 0
    for (_, prev), (step, cur) in zip(gates, gates[1:], strict=False):
        declines = declines + 1 if cur < prev else 0
        if declines == 2:
            return step
    return None


@pytest.mark.slow
def test_one_job_spec_gets_the_same_verdict_at_the_same_step_everywhere(prefect_server, mlflow_store, tmp_path,
                                                                         warm_start_cache):
    from flows.params import platform_job_config
    from flows.platform_round import platform_round
    from flows.rlhf_job import rlhf_job
    from sweeps.runner import SweepRunner
    from tasks.sweep import prepare
    from training.lifecycle import JOB_DONE

    # the default round's acme/healthy-kl job (the tiny test models score every response alike: no decline to see)
    steps = 12
    overrides = {"ppo.kl_coef": 0.2, "oppo.tune_chunk": False}
    base = platform_job_config(steps, str(warm_start_cache))

    # the platform round: the scheduler's detector gates the job through its supervisor
    rnd = platform_round(jobs=[{"tenant": "acme", "name": "same", "overrides": overrides}], scheduler="EvalStop+FIFO",
                         slots=1, steps=steps, out_dir=str(tmp_path / "round"), cache_dir=str(warm_start_cache),
                         retry_delay_s=0.1, slot_limit=f"gpu-slots-test-{uuid.uuid4().hex[:8]}")["jobs"].iloc[0]
    round_dir = tmp_path / "round" / "acme" / "same"
    expected = second_consecutive_decline(round_dir / "metrics.csv")
    assert expected is not None, "the tiny job never declined twice in a row: pick another seed"
    assert rnd.decision == "stopped" and rnd.stopped_at == expected
    done = json.loads((round_dir / JOB_DONE).read_text())
    assert done["paused_step"] == expected and done["detector"] == "evalstop"
    assert done["evidence"]["detector"] == "evalstop" and done["evidence"]["params"] == {"k": 2}

    # rlhf-job with the same config, the detector named in its request
    job = rlhf_job(request={"config": base, "overrides": overrides, "tenant": "acme", "name": "same", "steps": steps,
                            "overlap": "full", "detector": "evalstop", "out_root": str(tmp_path / "job"),
                            "run_dir": "."})
    assert job["state"].startswith("PAUSED_BY_GATE"), job["state"]
    assert json.loads((tmp_path / "job" / JOB_DONE).read_text())["paused_step"] == expected
    assert second_consecutive_decline(tmp_path / "job" / "metrics.csv") == expected

    # a sweep trial of the same job, the detector as its pruner
    fixed = {k: v for k, v in overrides.items() if k != "ppo.kl_coef"}
    spec, ledger = prepare({"name": "same", "base": base, "overrides": fixed, "overlap": "full",
                            "space": {"ppo.kl_coef": {"grid": [overrides["ppo.kl_coef"]]}}, "trials": 1,
                            "pruning": {"detector": "evalstop"}, "out_dir": str(tmp_path / "sweep")})
    summary = SweepRunner(spec, ledger=ledger, report=False).run()
    (trial,) = summary["trials"]
    assert trial["state"] == "pruned" and trial["pruned_at"] == expected, trial
