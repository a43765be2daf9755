"""`scheduling/live.py: LiveRound`, the live platform's placement loop, against hand-worked schedules."""

from __future__ import annotations

import math

import pytest

from scheduling.jobview import JobView


class ShortestEstimateFirst:
    """A stub policy: priority = estimated duration; stops a job whose second gate score is below its first."""

    name = "stub"

    def priority(self, view):
        return view.est_duration

    def on_checkpoint(self, view):
        h = view.eval_history
        return len(h) >= 2 and h[-1] < h[0]


def _round(est, gpus, slots):
    from scheduling.live import LiveRound

    views = [JobView(i, "rlhf", 0, g, 0.0, float(e)) for i, (e, g) in enumerate(zip(est, gpus, strict=True))]
    return LiveRound(ShortestEstimateFirst(), views, gpus, slots)


def test_jobs_start_by_priority_while_the_slots_last_and_a_big_job_does_not_block_a_small_one():
    live = _round(est=[30, 10, 20, 5], gpus=[1, 2, 1, 1], slots=2)
    # by priority: 3 (5), 1 (10, needs 2), 2 (20), 0 (30); 3 takes one slot, 1 does not fit, 2 takes the other
    assert live.to_start() == [3, 2] and live.free == 0
    live.finished(3)
    assert live.to_start() == [0]  # job 1 still needs 2 slots; job 0 fits the freed one
    live.finished(2)
    live.finished(0)
    assert live.to_start() == [1] and live.free == 0
    live.finished(1)
    assert live.done and live.order == [3, 2, 0, 1] and live.free == 2


def test_a_checkpoint_fills_the_view_and_a_stop_comes_back_as_a_reason():
    live = _round(est=[8], gpus=[1], slots=1)
    live.to_start()
    observe = live.observer(0, total_steps=8)
    m = {"gold_eval": 0.5, "gold_eval_se": 0.02, "reward_mean": 0.1, "loss_policy": -0.3}
    assert observe(2, m) is None
    v = live.views[0]
    assert (v.attained, v.progress, v.eval_history, v.eval_se) == (2.0, 0.25, [0.5], 0.02)
    reason = observe(4, {**m, "gold_eval": 0.4})
    assert reason is not None and "step 4" in reason and "stub" in reason
    assert v.progress_history == [0.25, 0.5] and v.loss_history == [-0.3, -0.3] and not math.isnan(v.eval_se)


def test_a_job_bigger_than_the_pool_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"jobs\[1\]\.gpus: 3 does not fit a pool of 2 slots"):
        _round(est=[1, 2], gpus=[1, 3], slots=2)
