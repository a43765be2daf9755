"""Hand-built simulator workloads for the engine and policy tests: each job written out as a dict, so the expected
schedule can be derived by hand from the test's own numbers."""

from __future__ import annotations

import numpy as np

from scheduling.jobview import JobView
from scheduling.workload import JOB_TYPES, Workload


def hand_workload(jobs: list[dict]) -> Workload:
    """Jobs as dicts: arrival, duration, gpus (default 1), est (default the duration), eval_minutes, type, tenant,
    hacking, and `cps`: per checkpoint (progress, eval, loss), (progress, eval, loss, noise-free eval) or (progress,
    eval, loss, noise-free eval, proxy reward); the proxy reward defaults to a rise from 0 to 1 over all checkpoints."""
    n = len(jobs)
    cp_start = np.zeros(n + 1, dtype=np.int64)
    cp_start[1:] = np.cumsum([len(j["cps"]) for j in jobs])
    flat = [c for j in jobs for c in j["cps"]]
    return Workload(
        arrival=np.array([j["arrival"] for j in jobs], float),
        job_type=np.array([JOB_TYPES.index(j.get("type", "rlhf")) for j in jobs], np.int8),
        tenant=np.array([j.get("tenant", 0) for j in jobs], np.int16),
        gpus=np.array([j.get("gpus", 1) for j in jobs], np.int32),
        duration=np.array([j["duration"] for j in jobs], float),
        eval_minutes=np.array([j.get("eval_minutes", 0.0) for j in jobs], float),
        hacking=np.array([j.get("hacking", False) for j in jobs], bool),
        peak_progress=np.full(n, np.nan),
        cp_start=cp_start,
        cp_progress=np.array([c[0] for c in flat], float),
        cp_eval=np.array([c[1] for c in flat], float),
        cp_loss=np.array([c[2] for c in flat], float),
        cp_reward=np.array([c[4] if len(c) > 4 else r for c, r in zip(flat, np.linspace(0.0, 1.0, len(flat)),
                                                                       strict=True)], float),
        cp_clean=np.array([c[3] if len(c) > 3 else c[1] for c in flat], float),
        eval_se=np.full(n, 0.02),
        est_duration=np.array([j.get("est", j["duration"]) for j in jobs], float),
    )


class StopBelowBest:
    """A history-only stop rule without a batch form (the engine replays it job by job), mixed into a base policy:
    stop a job whose eval fell 0.05 under its best."""

    def on_checkpoint(self, view: JobView) -> bool:
        return view.eval_history[-1] < max(view.eval_history) - 0.05

    @property
    def stop_reads_history_only(self) -> bool:
        return True
