"""The gate a job runs: a rule that spends its error budget over planned looks (the paired rule's `horizon`) gets the
job's own number of judged checkpoints, on a copy, so a platform round's shared detector is never changed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _spec(steps: int, eval_every: int):
    from training.job.lifecycle import JobSpec

    return JobSpec(tenant="acme", name="gate", config=SimpleNamespace(steps=steps, eval_every=eval_every))


@pytest.mark.parametrize(("steps", "every", "warmup", "looks"), [
    (24, 2, 0, 11),   # 12 checkpoints, the first is a reference only
    (12, 2, 0, 5),    # the round's short job
    (24, 2, 3, 9),    # a warm-up of 3: the first 3 are references only
    (25, 4, 0, 5),    # 6 checkpoints (steps 4..24)
])
def test_the_paired_rule_gets_the_jobs_judged_checkpoints_as_its_horizon(steps, every, warmup, looks):
    from eval.paired import PairedStop
    from training.job.lifecycle import planned_gate

    shared = PairedStop(warmup=warmup)
    fitted = planned_gate(shared, _spec(steps, every))
    assert fitted.horizon == looks and fitted is not shared
    assert shared.horizon == 0  # the round's detector is left as it was


def test_a_given_horizon_and_other_rules_are_left_alone():
    from eval.paired import PairedStop
    from eval.stop_rules import EvalStop
    from training.job.lifecycle import planned_gate

    own = PairedStop(horizon=7)
    assert planned_gate(own, _spec(24, 2)) is own
    evalstop = EvalStop(k=2)
    assert planned_gate(evalstop, _spec(24, 2)) is evalstop
    assert planned_gate(None, _spec(24, 2)) is None
    assert planned_gate(PairedStop(), _spec(2, 2)).horizon == 0  # one checkpoint: nothing to judge, nothing planned


def test_the_supervisor_spends_alpha_evenly_over_the_planned_looks():
    """The job's supervisor (the one builder, with a round's shared detector) judges its 3rd checkpoint (k = 2 earlier
    ones, the 2nd judged look) at level alpha / (horizon + 1) / k = 0.02 / 12 / 2, by hand."""
    from eval.paired import PairedStop
    from training.job.lifecycle import make_supervisor

    shared = PairedStop(alpha=0.02)
    sup = make_supervisor(_spec(24, 2), gate=shared)
    assert sup.gate_detector.horizon == 11 and shared.horizon == 0
    scores = {str(i): 0.1 * (i % 5) for i in range(64)}
    for step in (2, 4, 6):
        sup.gate_monitor.observe_scores(step, scores)
    assert [c.alpha for c in sup.gate_monitor.comparisons] == pytest.approx([0.02 / 12 / 2] * 2)
