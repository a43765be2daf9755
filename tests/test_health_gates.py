"""Eval gates: schedule, mean and standard error, frozen-evaluator discipline, history -> EvalStop."""

import math

import numpy as np
import pytest

from eval.detectors import make_detector
from eval.gates import (
    EvalGate,
    Evaluator,
    EvaluatorMutated,
    EvaluatorNotFrozen,
    GateSchedule,
    HeldOutEvaluator,
    mean_and_se,
)


class QualityPolicy:
    """A stand-in policy whose 'quality' the evaluator can read; the gate never looks inside."""

    def __init__(self, quality: float):
        self.quality = quality


def noisy_scores(policy: QualityPolicy, items):
    return [policy.quality + 0.1 * ((i * 7919) % 11 - 5) / 5 for i in items]


def make_gate(every=10, total=100):
    ev = HeldOutEvaluator(items=list(range(50)), generate=noisy_scores, score=lambda item, out: out)
    return EvalGate(ev, GateSchedule(every_steps=every), total_steps=total)


def test_schedule_every_steps_and_fraction():
    s = GateSchedule(every_steps=10)
    assert [t for t in range(1, 41) if s.due(t, 40)] == [10, 20, 30, 40]
    f = GateSchedule(every_fraction=0.25, at_end=False)
    assert [t for t in range(1, 101) if f.due(t, 100)] == [25, 50, 75, 100]
    # a fraction that does not divide the run evenly still gates once per crossing
    g = GateSchedule(every_fraction=0.3, at_end=True)
    assert [t for t in range(1, 11) if g.due(t, 10)] == [3, 6, 9, 10]
    with pytest.raises(ValueError, match="every_steps or every_fraction"):
        GateSchedule()


def test_mean_and_standard_error_match_scipy():
    from scipy import stats

    scores = np.random.default_rng(0).normal(0.5, 0.2, 200)
    mean, se, n = mean_and_se(scores)
    assert n == 200 and mean == pytest.approx(scores.mean())
    assert se == pytest.approx(stats.sem(scores))
    assert math.isnan(mean_and_se([1.0])[1])
    with pytest.raises(ValueError, match="non-finite"):
        mean_and_se([1.0, math.nan])


def test_gate_runs_on_schedule_and_history_feeds_evalstop():
    gate = make_gate(every=10, total=100)
    assert isinstance(gate.evaluator, Evaluator)
    qualities = [0.2, 0.4, 0.6, 0.5, 0.3, 0.35, 0.2, 0.1, 0.1, 0.05]  # peaks at the 3rd gate
    results = []
    for step in range(1, 101):
        r = gate.maybe_evaluate(step, QualityPolicy(qualities[(step - 1) // 10]))
        if r is not None:
            results.append(r)
    assert [r.step for r in results] == list(range(10, 101, 10))
    assert results[2].score == pytest.approx(0.6, abs=0.05) and results[2].se > 0 and results[2].n == 50
    assert results[0].progress == pytest.approx(0.1)
    stop, best = gate.decide(make_detector("evalstop", k=2))
    assert (stop, best) == (50, 30)  # two declines after the peak at step 30; keeps step 30
    assert [c.eval_score for c in gate.checkpoints()] == [r.score for r in results]


def test_gate_refuses_a_mutated_evaluator():
    gate = make_gate()
    gate.evaluate(10, QualityPolicy(0.5))
    gate.evaluator.items = gate.evaluator.items[:-1]  # someone edits the held-out set mid-run
    with pytest.raises(EvaluatorMutated):
        gate.evaluate(20, QualityPolicy(0.5))


def test_gate_refuses_an_evaluator_sharing_parameters_with_the_policy():
    torch = pytest.importorskip("torch")
    policy = torch.nn.Linear(4, 1)

    class ModelJudge:
        name = "judge"

        def __init__(self, model):
            self.model = model

        def __call__(self, pol):
            with torch.no_grad():
                return self.model(torch.ones(8, 4)).squeeze(-1).tolist()

    EvalGate(ModelJudge(torch.nn.Linear(4, 1)), GateSchedule(every_steps=1)).evaluate(1, policy)  # fine
    shared = EvalGate(ModelJudge(policy), GateSchedule(every_steps=1))
    with pytest.raises(EvaluatorNotFrozen):
        shared.evaluate(1, policy)
    # and a judge whose weights the optimiser changed is caught by the fingerprint
    judge_model = torch.nn.Linear(4, 1)
    gate = EvalGate(ModelJudge(judge_model), GateSchedule(every_steps=1))
    with torch.no_grad():
        judge_model.weight.add_(1.0)
    with pytest.raises(EvaluatorMutated):
        gate.evaluate(1, policy)
