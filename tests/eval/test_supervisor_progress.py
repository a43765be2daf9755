"""The live gate sees how far a run is through its planned steps: the default detector judges a short run (fewer
checkpoints than its own-noise warm-up) only from half-way through its planned length, so a live job's
supervisor must pass `progress` = step / planned steps with every checkpoint. Without it the default would never
stop a short live job."""

from __future__ import annotations

import math

import pytest


def _records(gate_every: int, n_steps: int):
    """A run whose held-out score falls steeply at every gate (SE 0.01) while the proxy reward climbs: every
    window of the slope test is a clear divergence, so the only thing that decides the stop step is progress."""
    from training.metrics import StepRecord

    recs = []
    for t in range(1, n_steps + 1):
        gated = t % gate_every == 0
        recs.append(StepRecord(
            step=t, policy_version=t, reward_mean=0.1 * t, gold_eval=1.0 - 0.1 * t if gated else math.nan,
            gold_eval_se=0.01 if gated else math.nan, kl=0.0, entropy=2.0, grad_norm=1.0, response_len_mean=40.0,
            truncation_rate=0.0, unparseable_rate=0.0, phase_seconds={"rollout": 1.0}, tokens_generated=64,
            tokens_trained=32))
    return recs


def _paused_at(planned_steps, gate_every=3, n_steps=18):
    from eval.detectors import DEFAULT_DETECTOR, make_detector
    from eval.health import Catalog
    from eval.states import RunState
    from eval.supervisor import RunSupervisor

    sup = RunSupervisor("run-p", "acme", Catalog({}).start(tenant="acme"), make_detector(DEFAULT_DETECTOR),
                        planned_steps=planned_steps)
    sup.begin()
    for rec in _records(gate_every, n_steps):
        sup.observe(rec)
        if sup.machine.state is RunState.PAUSED_BY_GATE:
            return rec.step
    return None


@pytest.mark.parametrize("planned, expected", [
    (18, 9),    # checkpoints at 3, 6, 9, ...: 9 / 18 is the first at half-way
    (36, 18),   # 18 / 36
    (24, 12),   # 12 / 24
])
def test_a_short_live_run_is_stopped_from_half_its_planned_steps(planned, expected):
    assert _paused_at(planned, n_steps=planned) == expected


def test_without_a_planned_length_the_short_run_phase_never_stops():
    assert _paused_at(None) is None
