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


def test_a_checkpoint_fills_the_view_and_the_round_itself_never_stops_a_job():
    live = _round(est=[8], gpus=[1], slots=1)
    live.to_start()
    observe = live.observer(0, total_steps=8)
    m = {"gold_eval": 0.5, "gold_eval_se": 0.02, "reward_mean": 0.1, "loss_policy": -0.3}
    assert observe(2, m) is None
    v = live.views[0]
    assert (v.attained, v.progress, v.eval_history, v.eval_se) == (2.0, 0.25, [0.5], 0.02)
    # the stub policy's own stop rule says stop here; the round leaves stopping to the job's supervisor
    assert observe(4, {**m, "gold_eval": 0.4}) is None
    assert v.progress_history == [0.25, 0.5] and v.loss_history == [-0.3, -0.3] and not math.isnan(v.eval_se)


def _record(step: int, gold: float):
    from training.metrics import StepRecord

    return StepRecord(step=step, policy_version=step, reward_mean=0.1 * step, gold_eval=gold, gold_eval_se=0.01,
                      kl=0.01, entropy=1.0, grad_norm=1.0, loss_policy=-0.1, response_len_mean=10.0,
                      truncation_rate=0.0, unparseable_rate=0.0)


def test_the_job_supervisor_runs_the_rounds_detector_and_the_round_reads_its_verdict():
    from eval.health import Catalog
    from eval.supervisor import RunSupervisor
    from scheduling.live import LiveRound
    from scheduling.policies import parse_scheduler

    live = LiveRound(parse_scheduler("EvalStop(k=2)+FIFO"), [JobView(0, "rlhf", 0, 1, 0.0, 8.0)], [1], 1)
    live.to_start()
    sup = RunSupervisor("r", "acme", Catalog({}).start(tenant="acme"))
    observe = live.observer(0, total_steps=8)
    observe.attach(sup)
    assert sup.gate_detector is live.gate_detector and sup.gate_detector.name == "evalstop"
    sup.begin()
    # EvalStop k=2: the second consecutive decline (0.5 -> 0.4 -> 0.3, at step 6) pauses the job, in its supervisor
    for step, gold in ((2, 0.5), (4, 0.4), (6, 0.3)):
        sup.observe(_record(step, gold))
        if sup.machine.state.value == "PAUSED_BY_GATE":
            break
        assert observe(step, _record(step, gold).flat()) is None
    verdict = observe.verdict()
    assert verdict["state"].startswith("PAUSED_BY_GATE") and verdict["step"] == 6
    assert verdict["evidence"]["detector"] == "evalstop" and verdict["evidence"]["params"]["k"] == 2
    # a job whose request named its own gate keeps it
    own = RunSupervisor("s", "acme", Catalog({}).start(tenant="acme"), gate_detector=live.gate_detector.__class__())
    live.supervise(0, own)
    assert own.gate_detector is not live.gate_detector


def test_the_paired_evidence_names_the_comparison_that_stopped_the_job():
    from eval.paired import PairedStop
    from scheduling.live import evidence_of

    det = PairedStop(alpha=0.02, margin=0.0, min_prompts=10)
    monitor = det.start()
    prompts = [str(i) for i in range(40)]
    base = {p: 0.1 * (i % 7) for i, p in enumerate(prompts)}
    assert not monitor.observe_scores(2, base)
    assert monitor.observe_scores(4, {p: v - 1.0 + 0.01 * (i % 3) for i, (p, v) in enumerate(base.items())})
    ev = evidence_of(det, monitor)
    (c,) = ev["comparisons"]
    diffs = [0.01 * (i % 3) - 1.0 for i in range(40)]
    assert (c["reference_step"], c["step"], c["prompts"]) == (2.0, 4.0, 40)
    assert c["mean_diff"] == pytest.approx(sum(diffs) / 40) and c["upper"] < 0 and ev["kept_step"] == 2.0
    assert ev["detector"] == "paired" and ev["params"]["alpha"] == 0.02


def test_the_evidence_of_a_relative_margin_is_its_contrast():
    """relative_margin 0.2, three checkpoints on 8 prompts: step 10 is 0.4 below step 5, which gained 1.0 over step
    0; the contrast y10 - 0.8 y5 - 0.2 y0 has mean -0.2 (worked by hand in tests/eval/test_paired_rule.py) and its
    t bound at 0.02 / 36 on 8 prompts, SD sqrt(13.12e-4 / 7), is what fired and what the line reports."""
    from scipy import stats

    from eval.paired import PairedStop
    from scheduling.live import describe_evidence, evidence_of

    det = PairedStop(alpha=0.02, min_prompts=4, relative_margin=0.2)
    monitor = det.start()
    b = [0.0, 1.0, 2.0, 3.0] * 2
    e1 = [0.01, -0.01] * 4
    e2 = [0.01, 0.01, -0.01, -0.01] * 2
    assert not monitor.observe_scores(0, b)
    assert not monitor.observe_scores(5, [x + 1.0 + e for x, e in zip(b, e1, strict=True)])
    assert monitor.observe_scores(10, [x + 0.6 + e for x, e in zip(b, e2, strict=True)])
    ev = evidence_of(det, monitor)
    (c,) = ev["comparisons"]  # only the pair (5, 10) fired: against step 0 the contrast is +0.6
    upper = -0.2 + stats.t.isf(0.02 / 36, 7) * math.sqrt(13.12e-4 / 7) / math.sqrt(8)
    assert c["reference_step"] == 5.0 and c["contrast_mean"] == pytest.approx(-0.2)
    assert c["contrast_upper"] == pytest.approx(upper) and ev["first_step"] == 0.0 and ev["kept_step"] == 5.0
    assert describe_evidence(ev) == (f"step 10 is 0.400 below step 5 on 8 paired prompts, 0.200 beyond 0.2 x its "
                                     f"gain over step 0, upper bound {upper:+.3f} below -margin (0) at level "
                                     f"{0.02 / 12:.1e}; paired keeps step 5")


def test_a_pause_is_described_by_its_difference_bound_prompts_and_reference():
    from scheduling.live import describe_evidence

    ev = {"detector": "paired", "params": {"alpha": 0.02, "margin": 0.05}, "kept_step": 12.0,
          "comparisons": [{"reference_step": 10.0, "step": 16.0, "prompts": 64, "mean_diff": -0.2, "lower": -0.4,
                           "upper": -0.06, "alpha": 1e-4},
                          {"reference_step": 12.0, "step": 16.0, "prompts": 96, "mean_diff": -0.378, "lower": -0.7,
                           "upper": -0.125, "alpha": 2.2e-4}]}
    # the comparison with the lowest upper bound is the one described
    assert describe_evidence(ev) == ("step 16 is 0.378 below step 12 on 96 paired prompts, upper bound -0.125 below "
                                     "-margin (0.05) at level 2.2e-04; paired keeps step 12")
    assert describe_evidence({"detector": "evalstop", "params": {"k": 2}}) == "evalstop(k=2) said stop"
    assert describe_evidence(None) == "none recorded"


def test_a_job_bigger_than_the_pool_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"jobs\[1\]\.gpus: 3 does not fit a pool of 2 slots"):
        _round(est=[1, 2], gpus=[1, 3], slots=2)
