"""Each scheduler policy's ranking on a hand workload, against the order and the completion times derived by hand
in the comments (1 GPU unless said, restart overhead 2 min); saved compute with non-zero eval minutes; the
simulator's best-checkpoint bookkeeping on ties ("ties go to the earlier checkpoint").

Aggregate orderings ("A's JCT beats B's") hold for a uniformly broken policy too; these pin the exact times. Every
scenario runs on both engine paths (coalesced checkpoints and one event per checkpoint): each must match the hand
numbers, not merely each other."""

from __future__ import annotations

import numpy as np
import pytest
from hand_workloads import StopBelowBest, hand_workload

from scheduling.engine import simulate
from scheduling.jobview import JobView
from scheduling.metrics import job_table, summarize
from scheduling.policies import FIFO, EvalSched, LossAware, SJFEst, SRTFEst, parse_scheduler

# tiny workloads: a runaway (a preemption ping-pong grows the event heap without end) fails in seconds, not minutes
pytestmark = pytest.mark.memory_cap(1)

BOTH_PATHS = pytest.mark.parametrize("coalesce", [True, False], ids=["coalesced", "eager"])


def one_cp(**job) -> dict:
    return {"cps": [(1.0, 0.5, 1.0)], **job}


def quarters(evals, losses=(2.0, 1.9, 1.8, 1.7), clean=None) -> list[tuple]:
    clean = clean or evals
    return [((k + 1) / 4, evals[k], losses[k], clean[k]) for k in range(4)]


# ------------------------------------------------------------------------------------------ FIFO and SJF-Est
# A blocker X holds the GPU until 11 (10 min training + 1 min eval). A arrives at 1 (estimate 50, truly 3 min), B at 2
# (estimate 5, truly 8 min); each has one checkpoint with a 1-minute eval.
#   FIFO:    A 11 -> 15, B 15 -> 24                      JCT A 14, B 22
#   SJF-Est: B (estimate 5 < 50) 11 -> 20, A 20 -> 24    JCT A 23, B 18   (by the estimate, not the true duration)
FIFO_SJF_JOBS = [one_cp(arrival=0.0, duration=10.0, est=10.0, eval_minutes=1.0),
                 one_cp(arrival=1.0, duration=3.0, est=50.0, eval_minutes=1.0),
                 one_cp(arrival=2.0, duration=8.0, est=5.0, eval_minutes=1.0)]


@BOTH_PATHS
@pytest.mark.parametrize("policy, ends", [(FIFO(), [11.0, 15.0, 24.0]), (SJFEst(), [11.0, 24.0, 20.0])],
                         ids=["FIFO", "SJF-Est"])
def test_fifo_and_sjf_order_two_waiting_jobs(policy, ends, coalesce):
    wl = hand_workload(FIFO_SJF_JOBS)
    res = simulate(wl, policy, gpus=1, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx(ends)
    assert res.preemptions.tolist() == [0, 0, 0]
    jct = job_table(wl, res)["jct"]
    assert jct.tolist() == pytest.approx([e - a for e, a in zip(ends, [0.0, 1.0, 2.0], strict=True)])


@BOTH_PATHS
def test_sjf_ties_go_to_the_earlier_arrival(coalesce):
    jobs = [one_cp(arrival=0.0, duration=10.0, est=10.0), one_cp(arrival=1.0, duration=3.0, est=5.0),
            one_cp(arrival=2.0, duration=8.0, est=5.0)]
    res = simulate(hand_workload(jobs), SJFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx([10.0, 13.0, 21.0])


# ------------------------------------------------------------------------------------------------- SRTF-Est
# A arrives at 0 (20 min, estimate 20); B arrives at 5 (4 min) with estimate `est`. At 5, A's estimated remaining
# time is 20 - 5 = 15: B preempts A only if it ranks strictly better (est < 15).
#   est 14: B 5 -> 9; A resumes at 9, pays 2 min overhead, trains its last 15: ends 26; A held the GPU 5 + 17 = 22
#   est 15: a tie: no preemption. A ends 20, B 20 -> 24
#   est 18: ranks worse than A's remaining 15 (though better than A's whole estimate 20): A 20, B 24
@BOTH_PATHS
@pytest.mark.parametrize("est, ends, preempted, busy_a", [(14.0, [26.0, 9.0], [1, 0], 22.0),
                                                         (15.0, [20.0, 24.0], [0, 0], 20.0),
                                                         (18.0, [20.0, 24.0], [0, 0], 20.0)])
def test_srtf_preempts_only_on_a_strictly_shorter_remaining_estimate(est, ends, preempted, busy_a, coalesce):
    jobs = [one_cp(arrival=0.0, duration=20.0, est=20.0), one_cp(arrival=5.0, duration=4.0, est=est)]
    res = simulate(hand_workload(jobs), SRTFEst(), gpus=1, overhead=2.0, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx(ends)
    assert res.preemptions.tolist() == preempted
    assert res.busy[0] == pytest.approx(busy_a)


# ------------------------------------------------------------------------------------------------ LossAware
# A (arrives 0, 40 min, checkpoints every 10 min) losses 2.0, 1.0, 0.9, 0.85; B (arrives 15, 40 min) losses
# 3.0, 2.9, 2.8, 2.7. Rank: -(relative loss drop of the last interval); fewer than two checkpoints ranks first.
#   15: B arrives (rank -inf); A also has one checkpoint (-inf): a tie, no preemption.
#   20: A's 2nd checkpoint: drop 50% -> -0.5, worse than B's -inf: B preempts A (A has trained 20 min).
#   40: B's 2nd checkpoint: drop 0.1/3 -> -0.033, worse than waiting A's -0.5: A preempts B (B trained 20).
#   40: A resumes: 2 min overhead + 10 -> 3rd checkpoint at 52 (drop 10% -> -0.1, still better than B's -0.033);
#       4th at 62: A ends at 62.  B resumes at 62: 2 + 10 -> 74, + 10 -> 84.
LOSS_JOBS = [dict(arrival=0.0, duration=40.0, est=40.0, cps=quarters([0.5] * 4, (2.0, 1.0, 0.9, 0.85))),
             dict(arrival=15.0, duration=40.0, est=40.0, cps=quarters([0.5] * 4, (3.0, 2.9, 2.8, 2.7)))]


@BOTH_PATHS
def test_loss_aware_gives_the_gpu_to_the_faster_improving_job(coalesce):
    res = simulate(hand_workload(LOSS_JOBS), LossAware(), gpus=1, overhead=2.0, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx([62.0, 84.0])
    assert res.preemptions.tolist() == [1, 1]
    assert res.busy.tolist() == pytest.approx([20.0 + 22.0, 20.0 + 22.0])


def view(loss=(), evals=(), est=100.0, attained=0.0) -> JobView:
    v = JobView(0, "rlhf", 0, 1, 0.0, est)
    v.loss_history, v.eval_history, v.attained = list(loss), list(evals), attained
    return v


def test_loss_aware_rank_by_hand():
    p = LossAware().priority
    assert p(view([])) == p(view([2.0])) == -np.inf
    assert p(view([9.0, 2.0, 1.0])) == pytest.approx(-0.5)  # the last interval only: (2 - 1) / 2
    assert p(view([2.0, 3.0])) == pytest.approx(0.5)  # a rising loss ranks behind
    assert p(view([-2.0, -3.0])) == pytest.approx(-0.5)  # relative to |prev|
    assert p(view([0.0, -1.0])) == pytest.approx(-1e12)  # prev 0: divided by the 1e-12 floor


# ------------------------------------------------------------------------------------------------ EvalSched
# A (arrives 0, 40 min, estimate 40) evals 0.5, 0.6, then `third`, 0.5; B arrives at 5 (20 min, estimate 100,
# checkpoints at 10 and 20 min of training). SRTF-Est order: at 5 A's remaining 35 < 100, B waits.
#   third = 0.55 (below the peak 0.6): at 30 A is post-peak and goes behind B: B 30 -> 50; A resumes at 50,
#           2 min overhead + 10 -> ends 62.                         JCT A 62, B 45
#   third = 0.60 (equal to the peak: not below it): no penalty; A ends 40, B 40 -> 60.   JCT A 40, B 55
@BOTH_PATHS
@pytest.mark.parametrize("third, ends, preempted", [(0.55, [62.0, 50.0], [1, 0]), (0.60, [40.0, 60.0], [0, 0])],
                         ids=["post-peak", "plateau"])
def test_evalsched_sends_a_post_peak_job_behind_every_other(third, ends, preempted, coalesce):
    jobs = [dict(arrival=0.0, duration=40.0, est=40.0, cps=quarters([0.5, 0.6, third, 0.5])),
            dict(arrival=5.0, duration=20.0, est=100.0, cps=[(0.5, 0.4, 1.0), (1.0, 0.5, 0.9)])]
    res = simulate(hand_workload(jobs), EvalSched(), gpus=1, overhead=2.0, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx(ends)
    assert res.preemptions.tolist() == preempted


def test_evalsched_rank_by_hand():
    p = EvalSched().priority
    assert p(view(evals=[], est=100.0, attained=30.0)) == 70.0  # SRTF-Est before any eval
    assert p(view(evals=[0.4], est=100.0, attained=30.0)) == 70.0
    assert p(view(evals=[0.4, 0.6], est=100.0, attained=30.0)) == 70.0  # rising
    assert p(view(evals=[0.6, 0.6], est=100.0, attained=30.0)) == 70.0  # at its peak (a tie is not below it)
    assert p(view(evals=[0.6, 0.5], est=100.0, attained=30.0)) == 70.0 + 1e9  # post-peak at its 2nd eval
    assert p(view(evals=[0.3, 0.9, 0.5, 0.8], est=100.0, attained=130.0)) == 1e9  # remaining floors at 0


def test_srtf_and_sjf_rank_by_hand():
    assert SRTFEst().priority(view(est=100.0, attained=30.0)) == 70.0
    assert SRTFEst().priority(view(est=100.0, attained=130.0)) == 0.0
    assert SJFEst().priority(view(est=100.0, attained=30.0)) == 100.0
    v = JobView(0, "rlhf", 0, 1, 7.5, 100.0)
    assert FIFO().priority(v) == 7.5


# ------------------------------------------------- the EarlyStop wrapper, saved compute with eval minutes
# 2 GPUs, FIFO under StopAt0.5 (the paper's StopAt stops RLHF jobs only).
# A: RLHF, 2 GPUs, 40 min, 3-minute evals at 1/4, 1/2, 3/4, 1: lands 13, 26 -> stopped at 26 (progress 0.5).
#    Saved per GPU: the training it skipped (0.5 x 40 = 20) + the two evals it skipped (2 x 3 = 6) = 26 min.
# B: DPO, 2 GPUs, 20 min, 2-minute evals at 1/2 and 1: out of StopAt's scope; starts at 26: 38, ends 50.
# Planned GPU-minutes: A 2 x (40 + 4 x 3) = 104, B 2 x (20 + 2 x 2) = 48; saved fraction 2 x 26 / 152.
STOP_JOBS = [dict(arrival=0.0, gpus=2, duration=40.0, eval_minutes=3.0, cps=quarters([0.5, 0.7, 0.6, 0.4])),
             dict(arrival=1.0, gpus=2, duration=20.0, eval_minutes=2.0, type="dpo",
                  cps=[(0.5, 0.4, 1.0), (1.0, 0.5, 0.9)])]


@BOTH_PATHS
def test_early_stop_wrapper_saved_compute_with_eval_minutes(coalesce):
    wl = hand_workload(STOP_JOBS)
    res = simulate(wl, parse_scheduler("StopAt0.5+FIFO"), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx([26.0, 50.0])
    assert res.stopped.tolist() == [True, False]
    assert res.saved_minutes.tolist() == pytest.approx([20.0 + 6.0, 0.0])
    assert res.busy.tolist() == pytest.approx([26.0, 24.0])
    jobs = job_table(wl, res)
    assert jobs["saved_gpu_minutes"].tolist() == pytest.approx([52.0, 0.0])
    assert jobs["planned_gpu_minutes"].tolist() == pytest.approx([104.0, 48.0])
    assert jobs["gpu_minutes"].tolist() == pytest.approx([52.0, 48.0])
    assert jobs["checkpoints"].tolist() == [2, 2]
    assert jobs["jct"].tolist() == pytest.approx([26.0, 49.0])
    assert summarize(jobs, tenants=1)["saved_frac"] == pytest.approx(52.0 / 152.0)
    # the base alone runs A to the end: 4 x (10 + 3) = 52, then B 52 -> 76, nothing saved
    base = simulate(wl, FIFO(), gpus=2, coalesce=coalesce)
    assert base.end.tolist() == pytest.approx([52.0, 76.0]) and not base.saved_minutes.any()


@BOTH_PATHS
def test_the_eval_a_job_ends_at_is_its_final_eval(coalesce):
    """The jobs above: under StopAt0.5+FIFO A ends at its 2nd checkpoint (eval 0.7), B at its last (0.5); under FIFO
    alone A runs to its last (0.4)."""
    wl = hand_workload(STOP_JOBS)
    assert simulate(wl, parse_scheduler("StopAt0.5+FIFO"), gpus=2, coalesce=coalesce).final_eval.tolist() == [0.7, 0.5]
    assert simulate(wl, FIFO(), gpus=2, coalesce=coalesce).final_eval.tolist() == [0.4, 0.5]


@BOTH_PATHS
def test_early_stop_at_the_last_checkpoint_saves_nothing(coalesce):
    # StopAt1 fires at A's final checkpoint: stopped (it keeps its best, not its final model) but nothing is saved
    wl = hand_workload(STOP_JOBS[:1])
    res = simulate(wl, parse_scheduler("StopAt1+FIFO"), gpus=2, coalesce=coalesce)
    assert res.stopped.tolist() == [True] and res.end.tolist() == pytest.approx([52.0])
    assert res.saved_minutes.tolist() == [0.0]
    assert job_table(wl, res)["stop_phase"].tolist() == ["at_end"]


# ------------------------------------------------------------------------------- best checkpoint: ties
# Evals 0.5, 0.7, 0.7, 0.4: the best is the 2nd checkpoint (flat index 1), not the tied 3rd. The noise-free evals
# differ at the tie (0.7 vs 0.6), so the checkpoint a stopped job keeps shows in its regret and kept quality.
TIE = quarters([0.5, 0.7, 0.7, 0.4], clean=[0.5, 0.7, 0.6, 0.4])


@BOTH_PATHS
def test_simulator_best_checkpoint_tie_goes_to_the_earlier(coalesce):
    wl = hand_workload([dict(arrival=0.0, duration=40.0, cps=TIE, hacking=True)])
    finished = simulate(wl, FIFO(), gpus=1, coalesce=coalesce)
    assert finished.best_index.tolist() == [1] and finished.best_eval.tolist() == [0.7]
    assert finished.end_index.tolist() == [3]
    # StopAt0.75 stops at the 3rd checkpoint (flat index 2) and keeps the 2nd: regret 0.7 - 0.7 = 0, whereas the
    # tied 3rd would have cost 0.1; kept quality (0.7 - 0.4) / (0.7 - 0.4) = 1; the true peak (a tie in nothing)
    # is index 1, so the detection delay is 2 - 1 = 1 checkpoint
    stopped = simulate(wl, parse_scheduler("StopAt0.75+FIFO"), gpus=1, coalesce=coalesce)
    assert stopped.stopped.tolist() == [True] and stopped.end_index.tolist() == [2]
    assert stopped.best_index.tolist() == [1]
    jobs = job_table(wl, stopped)
    assert jobs["regret"].tolist() == pytest.approx([0.0])
    assert jobs["quality_kept"].tolist() == pytest.approx([1.0])
    assert jobs["detection_delay"].tolist() == [1] and jobs["stop_phase"].tolist() == ["after_peak"]


@BOTH_PATHS
def test_true_peak_tie_goes_to_the_earlier_checkpoint(coalesce):
    # noise-free evals 0.5, 0.7, 0.7, 0.4: the true peak is index 1; a stop at index 2 is one checkpoint late
    wl = hand_workload([dict(arrival=0.0, duration=40.0, hacking=True,
                        cps=quarters([0.5, 0.7, 0.6, 0.4], clean=[0.5, 0.7, 0.7, 0.4]))])
    res = simulate(wl, parse_scheduler("StopAt0.75+FIFO"), gpus=1, coalesce=coalesce)
    jobs = job_table(wl, res)
    assert jobs["detection_delay"].tolist() == [1]
    assert jobs["regret"].tolist() == pytest.approx([0.0])  # kept index 1 (eval 0.7 > 0.6): clean 0.7 = the peak


# ------------------------------------------------------------------------------------------ the scheduler names
BASE_NAMES = "EvalSched, FIFO, LossAware, SJF, SJF-Est, SRTF, SRTF-Est"


@pytest.mark.parametrize("spec, message", [
    ("Magic", f"unknown scheduler 'Magic' (bases: {BASE_NAMES})"),
    ("EvalStop+Nope", f"unknown base scheduler 'Nope' in 'EvalStop+Nope' (bases: {BASE_NAMES})"),
    ("Eval-Stop+SRTF",
     "cannot parse detector 'Eval-Stop' in 'Eval-Stop+SRTF' (e.g. EvalStop, StopAt0.65, EvalStop(k=3))"),
    ("EvalStop(k)+SRTF", "detector argument 'k' in 'EvalStop(k)+SRTF' must be key=value"),
    ("EvalStop(=3)+SRTF", "detector argument '=3' in 'EvalStop(=3)+SRTF' must be key=value"),
    # a doubled '=' is read as key 'k' and value '=3', which is not a number (split at the last '=' instead, the
    # key 'k=' would pass here and fail later in the detector with a message that names neither)
    ("EvalStop(k==3)+SRTF",
     "detector argument 'k==3' in 'EvalStop(k==3)+SRTF': '=3' is not a number (write key=value, e.g. EvalStop(k=3))"),
])
def test_a_bad_scheduler_name_is_refused_with_the_whole_message(spec, message):
    with pytest.raises(ValueError) as err:
        parse_scheduler(spec)
    assert str(err.value) == message


def test_scheduler_names_build_the_policy_and_detector_they_name():
    from eval.stop_rules import EvalStop, StopAt
    from scheduling.policies import EarlyStop, _number

    assert type(parse_scheduler("  SRTF-Est ")) is SRTFEst and type(parse_scheduler("SRTF")) is SRTFEst
    assert type(parse_scheduler("SJF")) is SJFEst and type(parse_scheduler("EvalSched")) is EvalSched
    stop = parse_scheduler("StopAt0.4+SJF-Est")
    assert type(stop) is EarlyStop and type(stop.base) is SJFEst and type(stop.detector) is StopAt
    assert stop.detector.p == 0.4 and stop.job_types == ("rlhf",) and stop.name == "StopAt0.4+SJF"
    es = parse_scheduler("EvalStop3+LossAware")
    assert type(es.detector) is EvalStop and es.detector.k == 3 and es.job_types is None
    assert es.name == "EvalStop(k=3)+LossAware" and es.preemptive and not es.rank_never_worsens
    assert parse_scheduler("EvalStop( k = 4 )+FIFO").detector.k == 4
    assert (_number("3"), type(_number("3")), _number("0.25"), type(_number("0.25"))) == (3, int, 0.25, float)


def test_a_name_splits_at_its_first_plus_and_a_detector_takes_several_arguments():
    """The detector is what comes before the first '+', the base everything after it (so a second '+' makes an unknown
    base, named whole); the arguments in parentheses are separated by commas, each `key=value`."""
    with pytest.raises(ValueError) as err:
        parse_scheduler("EvalStop+SRTF+FIFO")
    assert str(err.value) == f"unknown base scheduler 'SRTF+FIFO' in 'EvalStop+SRTF+FIFO' (bases: {BASE_NAMES})"
    paired = parse_scheduler("Paired(margin=0.1,alpha=0.05)+SRTF")
    assert (paired.detector.margin, paired.detector.alpha) == (0.1, 0.05) and type(paired.base) is SRTFEst


# ------------------------------------------------------------------------------------------ progress reports
@pytest.mark.parametrize("jobs, reported", [(3, [1, 2, 3]), (200, list(range(2, 201, 2))),
                                            (250, list(range(2, 251, 2)))])
@BOTH_PATHS
def test_progress_is_reported_every_hundredth_of_the_jobs(jobs, reported, coalesce):
    """`progress(n_done)` after every max(1, jobs // 100) finished jobs: 200 one-minute jobs arriving a minute apart on
    one GPU end one by one, so the reports are 2, 4, ..., 200 (every job for 3 jobs; every 2nd of 250: 250 // 100)."""
    seen = []
    wl = hand_workload([one_cp(arrival=float(k), duration=1.0) for k in range(jobs)])
    res = simulate(wl, FIFO(), gpus=1, progress=seen.append, coalesce=coalesce)
    assert seen == reported
    assert res.end.tolist() == [float(k + 1) for k in range(jobs)]  # each ends as the next arrives


# ------------------------------------------------------------------------------- planned stops, job by job
def test_planned_stops_by_hand_with_jobs_of_no_one_and_several_checkpoints():
    """StopAt0.5+FIFO's batch plan (the flat index of the checkpoint each job stops at, -1 never) over: an RLHF job
    with no checkpoint (-1), one with a single checkpoint at progress 1 (stopped there: flat 0), one with quarters
    (stopped at progress 0.5: flat 1 + 1 = 2), a LoRA job with quarters (out of StopAt's scope: -1) and an RLHF job
    whose checkpoints stop short of 0.5 (-1). FIFO, which never stops a job, plans -1 for each."""
    from scheduling.jobview import CheckpointSeries
    from scheduling.workload import JOB_TYPES

    lora = dict(type="lora", cps=quarters([0.5] * 4))
    jobs = [dict(cps=[]), dict(cps=[(1.0, 0.5, 1.0)]), dict(cps=quarters([0.5] * 4)), lora,
            dict(cps=[(0.1, 0.5, 1.0), (0.3, 0.5, 1.0)])]
    wl = hand_workload([dict(arrival=0.0, duration=1.0, **j) for j in jobs])
    series = CheckpointSeries(job_type=wl.job_type, cp_start=wl.cp_start, progress=wl.cp_progress,
                              eval_score=wl.cp_eval, loss=wl.cp_loss, reward=wl.cp_reward, eval_se=wl.eval_se)
    plan = parse_scheduler("StopAt0.5+FIFO").plan_stops(series, JOB_TYPES)
    assert plan.tolist() == [-1, 0, 2, -1, -1] and plan.dtype == np.int64
    never = FIFO().plan_stops(series, JOB_TYPES)
    assert never.tolist() == [-1] * 5 and never.dtype == np.int64


# ----------------------------------------------------------------------------------- simulate's defaults
@BOTH_PATHS
def test_simulate_defaults_by_hand(coalesce):
    """The defaults a caller gets without naming them: preemption overhead 2 min, quality bar 0.3, minimum relative
    gain 0.01. SRTF on 1 GPU: B (4 min) arrives at 5 and preempts A (20 min, 15 left); B ends at 9; A resumes at 9,
    pays 2 min and trains 15: ends at 26. C alone (checkpoints every 10 min, no eval time): evals 0.25 (under the
    bar), 0.35 (useful: 0.35 >= 0.25 + 0.01 x 0.25), 0.352 (< 0.35 x 1.01 = 0.3535), 0.355 (< 0.352 x 1.01 =
    0.35552): first useful at 20, busy 20 then."""
    pre = simulate(hand_workload([one_cp(arrival=0.0, duration=20.0, est=20.0), one_cp(arrival=5.0, duration=4.0)]),
                   SRTFEst(), gpus=1, coalesce=coalesce)
    assert pre.end.tolist() == [26.0, 9.0] and pre.preemptions.tolist() == [1, 0]
    c = simulate(hand_workload([dict(arrival=0.0, duration=40.0, cps=quarters([0.25, 0.35, 0.352, 0.355]))]), FIFO(),
                 gpus=1, coalesce=coalesce)
    assert c.first_useful.tolist() == [20.0] and c.busy_at_useful.tolist() == [20.0] and c.end.tolist() == [40.0]


@BOTH_PATHS
def test_an_early_stop_policy_run_twice_judges_each_job_afresh(coalesce):
    """EvalStop(k=1) stops a 100-minute job (checkpoints every 25 min, evals 0.4, 0.6, 0.5, 0.45) at its first decline:
    0.5 at minute 75, 25 minutes saved. The same policy object simulated again gives the same: a finished job's
    monitor is dropped (`forget`), so job 0 of the second run does not start from the first run's 0.6."""
    wl = hand_workload([dict(arrival=0.0, duration=100.0, cps=[(0.25, 0.4, 2.0), (0.5, 0.6, 1.5), (0.75, 0.5, 1.4),
                                                               (1.0, 0.45, 1.35)])])
    policy = parse_scheduler("EvalStop(k=1)+FIFO")
    for _ in range(2):
        res = simulate(wl, policy, gpus=1, coalesce=coalesce)
        assert res.stopped.tolist() == [True] and res.end.tolist() == [75.0] and res.saved_minutes.tolist() == [25.0]
    assert policy._monitors == {}


@BOTH_PATHS
def test_divergence_tells_a_collapse_from_reward_hacking_by_the_proxy_reward(coalesce):
    """Evals rise to 0.8 at the half-way checkpoint and fall to 0.25. With the proxy reward rising all along (reward
    hacking's signature) Divergence stops the job after the peak; with the proxy falling with the eval (a collapse,
    not hacking) it lets the job run to its end (80 min). Both engine paths must pass the reward to the rule."""
    evals = [0.2, 0.4, 0.6, 0.8, 0.7, 0.55, 0.4, 0.25]

    def job(rewards):
        return dict(arrival=0.0, duration=80.0,
                    cps=[((k + 1) / 8, e, 1.0, e, r) for k, (e, r) in enumerate(zip(evals, rewards, strict=True))])

    hacked = simulate(hand_workload([job([0.1 * k for k in range(8)])]), parse_scheduler("Divergence+FIFO"), gpus=1,
                      coalesce=coalesce)
    assert hacked.stopped.tolist() == [True] and 0.5 < hacked.stop_progress[0] < 1.0
    collapsed = simulate(hand_workload([job([0.8 - 0.1 * k for k in range(8)])]), parse_scheduler("Divergence+FIFO"),
                         gpus=1, coalesce=coalesce)
    assert collapsed.stopped.tolist() == [False] and collapsed.end.tolist() == [80.0]


@BOTH_PATHS
def test_backfill_is_on_by_default_and_a_job_too_big_for_the_cluster_is_refused(coalesce):
    """FIFO on 2 GPUs: A (1 GPU, 10 min) at 0; B (2 GPUs, 5 min) at 1 waits for A; C (1 GPU, 3 min) at 2 does not fit
    behind B but fits beside A: backfilled at 2, ends at 5; B runs 10-15. Without backfill C waits for B (15-18)."""
    wl = hand_workload([one_cp(arrival=0.0, duration=10.0), one_cp(arrival=1.0, duration=5.0, gpus=2),
                        one_cp(arrival=2.0, duration=3.0)])
    assert simulate(wl, FIFO(), gpus=2, coalesce=coalesce).end.tolist() == [10.0, 15.0, 5.0]
    assert simulate(wl, FIFO(), gpus=2, backfill=False, coalesce=coalesce).end.tolist() == [10.0, 15.0, 18.0]
    with pytest.raises(ValueError) as err:
        simulate(hand_workload([one_cp(arrival=0.0, duration=1.0, gpus=3)]), FIFO(), gpus=2, coalesce=coalesce)
    assert str(err.value) == "a job needs 3 GPUs but the cluster has 2"


class StopBelowBestBy(StopBelowBest, FIFO):
    """FIFO placement, the history-only stop 0.05 under the best."""


@BOTH_PATHS
def test_a_replayed_rule_stops_only_the_jobs_it_names(coalesce):
    """FIFO base, three jobs one after the other on 1 GPU (checkpoints every 10 min). Job 0 (flat checkpoints 0, 1:
    0.5, 0.6) never falls: it runs to its end at 20, not stopped. Job 1 (flat 2-5: 0.5, 0.7, 0.6, 0.4) falls 0.1 under
    its best at its third checkpoint: stopped at 20 + 30 = 50, 10 minutes saved; its kept checkpoint is flat 3 (0.7).
    Job 2 never reaches the bar: no useful checkpoint, so nothing is busy at a useful one."""
    wl = hand_workload([dict(arrival=0.0, duration=20.0, cps=[(0.5, 0.5, 1.0), (1.0, 0.6, 1.0)]),
                        dict(arrival=1.0, duration=40.0, cps=quarters([0.5, 0.7, 0.6, 0.4])),
                        dict(arrival=2.0, duration=10.0, cps=[(1.0, 0.1, 1.0)])])
    res = simulate(wl, StopBelowBestBy(), gpus=1, coalesce=coalesce)
    assert res.stopped.tolist() == [False, True, False] and res.end.tolist() == [20.0, 50.0, 60.0]
    assert res.saved_minutes.tolist() == [0.0, 10.0, 0.0] and res.best_index.tolist() == [1, 3, 6]
    assert res.busy_at_useful.tolist() == [20.0, 20.0, 0.0] and np.isnan(res.first_useful[2])


@BOTH_PATHS
def test_a_job_stopped_at_its_very_first_checkpoint(coalesce):
    """StopAt0.25 stops job 0 (40 min, checkpoints every 10) at its first checkpoint, flat index 0: it ends at 10 with
    30 minutes saved; job 1 (one checkpoint) then runs 10-15. Events: 2 arrivals + 2 landings = 4."""
    wl = hand_workload([dict(arrival=0.0, duration=40.0, cps=quarters([0.5, 0.6, 0.7, 0.8])),
                        dict(arrival=1.0, duration=5.0, type="lora", cps=[(1.0, 0.5, 1.0)])])
    res = simulate(wl, parse_scheduler("StopAt0.25+FIFO"), gpus=1, coalesce=coalesce)
    assert res.stopped.tolist() == [True, False] and res.end.tolist() == [10.0, 15.0]
    assert res.end_index.tolist() == [0, 4] and res.saved_minutes.tolist() == [30.0, 0.0] and res.events == 4


class RecordingRule(FIFO):
    """A history-only rule without a batch form that never stops: it records the fixed fields of each view it sees."""

    def __init__(self):
        self.seen, self.histories = set(), set()

    def on_checkpoint(self, view: JobView) -> bool:
        self.seen.add((view.job_id, view.job_type, view.tenant, view.gpus, view.arrival, view.est_duration,
                       view.eval_se))
        self.histories.add((view.job_id, view.attained, view.progress, tuple(view.eval_history),
                            tuple(view.loss_history), tuple(view.reward_history), tuple(view.progress_history)))
        return False

    @property
    def stop_reads_history_only(self) -> bool:
        return True


@BOTH_PATHS
def test_a_replayed_rule_sees_each_jobs_own_fixed_fields_and_an_empty_workload_is_empty(coalesce):
    """The views a history-only rule judges (replayed job by job on the coalesced path, live on the other) carry each
    job's fixed fields and, at each checkpoint, the service (progress x 10 min) and the histories so far."""
    rule = RecordingRule()
    wl = hand_workload([dict(arrival=0.5, duration=10.0, est=12.0, gpus=2, tenant=3,
                             cps=[(0.5, 0.5, 2.0, 0.5, 0.1), (1.0, 0.6, 1.5, 0.6, 0.2)]),
                        dict(arrival=1.5, duration=10.0, est=7.0, type="lora", cps=[(1.0, 0.7, 1.0, 0.7, 0.3)])])
    simulate(wl, rule, gpus=2, coalesce=coalesce)
    assert rule.seen == {(0, "rlhf", 3, 2, 0.5, 12.0, 0.02), (1, "lora", 0, 1, 1.5, 7.0, 0.02)}
    assert rule.histories == {(0, 5.0, 0.5, (0.5,), (2.0,), (0.1,), (0.5,)),
                              (0, 10.0, 1.0, (0.5, 0.6), (2.0, 1.5), (0.1, 0.2), (0.5, 1.0)),
                              (1, 10.0, 1.0, (0.7,), (1.0,), (0.3,), (1.0,))}
    empty = simulate(hand_workload([]), FIFO(), gpus=1, coalesce=coalesce)
    assert (empty.events, empty.makespan, len(empty.end)) == (0, 0.0, 0)


@BOTH_PATHS
def test_a_job_preempted_during_an_eval_resumes_with_no_training_left_before_it(coalesce):
    """SRTF, 1 GPU. A (3 min, checkpoints at progress 0.1, 0.3, 1; 1-min evals): trains 0.3, eval lands at 1.3;
    trains 0.6 to 1.9 and is evaluating when B (0.5 min) arrives at 2.0 and preempts it (A has 3 - 0.9 = 2.1 left).
    A keeps the 0.9 it trained (0.3 + 0.6 in floats: an ulp above 0.3 x 3, which must not count as training left)
    and loses the eval in flight. B runs 2.0-2.5; A resumes at 2.5: 2 min overhead, no training, the 1-min eval
    again (5.5), then 2.1 min and its last eval: ends at 8.6."""
    wl = hand_workload([dict(arrival=0.0, duration=3.0, eval_minutes=1.0, cps=[(0.1, 0.5, 1.0), (0.3, 0.6, 1.0),
                                                                              (1.0, 0.7, 1.0)]),
                        one_cp(arrival=2.0, duration=0.5)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.preemptions.tolist() == [1, 0] and res.end[1] == 2.5
    assert res.end[0] == pytest.approx(8.6, abs=1e-9)


@pytest.mark.parametrize("short", [66, 70])
@BOTH_PATHS
def test_a_long_run_of_finished_jobs_does_not_hide_a_running_one_from_eviction(short, coalesce):
    """SRTF, 1 GPU: `short` one-minute jobs back to back (job k runs k to k + 1) leave their entries in the running
    heap, which is compacted once stale entries outnumber live ones (with 66, exactly when X starts). X (100 min)
    starts at `short`; Y (1 min) arrives 5 min later and must still find X to evict: Y runs for 1 min, X resumes after
    2 min overhead with 95 min left: X ends at short + 5 + 1 + 2 + 95."""
    jobs = [one_cp(arrival=float(k), duration=1.0) for k in range(short)]
    jobs += [one_cp(arrival=float(short), duration=100.0), one_cp(arrival=short + 5.0, duration=1.0)]
    res = simulate(hand_workload(jobs), SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == [float(k + 1) for k in range(short)] + [short + 103.0, short + 6.0]
    assert res.preemptions.tolist() == [0] * short + [1, 0]


@BOTH_PATHS
def test_an_eval_exactly_at_the_quality_bar_is_useful(coalesce):
    """The bar is inclusive: a single checkpoint at 0.3 (the default bar) after 10 min is useful then."""
    res = simulate(hand_workload([dict(arrival=0.0, duration=10.0, cps=[(1.0, 0.3, 1.0)])]), FIFO(), gpus=1,
                   coalesce=coalesce)
    assert res.first_useful.tolist() == [10.0] and res.busy_at_useful.tolist() == [10.0]


@BOTH_PATHS
def test_a_preemption_at_the_instant_an_eval_lands_keeps_that_eval(coalesce):
    """SRTF, 1 GPU. A (20 min, checkpoints at 0.5 and 1, 1-min evals) trains 0-10, its eval lands at 11. B (4 min)
    arrives at 11 and preempts A, whose checkpoint has just landed: B runs 11-15; A resumes at 15, pays 2 min, trains
    10 and evaluates 1: ends at 28, busy 11 + 13 = 24 min, its first useful checkpoint at 11."""
    wl = hand_workload([dict(arrival=0.0, duration=20.0, eval_minutes=1.0, cps=[(0.5, 0.5, 1.0), (1.0, 0.6, 1.0)]),
                        one_cp(arrival=11.0, duration=4.0)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == [28.0, 15.0] and res.busy.tolist() == [24.0, 4.0]
    assert res.first_useful.tolist() == [11.0, 15.0] and res.preemptions.tolist() == [1, 0]


@BOTH_PATHS
def test_a_preempted_job_is_credited_its_training_not_its_eval_time(coalesce):
    """As the preemption-during-an-eval case above, plus C (2.05 min) arriving at 2.2 while B runs. A was preempted
    with 0.9 of its 3 min trained (the 0.1 min of eval it had done is no training): 2.1 left, so C (2.05) goes first
    when B ends at 2.5: C 2.5-4.55; A resumes at 4.55: 2 min overhead, its eval again (7.55), 2.1 min and an eval:
    10.65."""
    wl = hand_workload([dict(arrival=0.0, duration=3.0, eval_minutes=1.0, cps=[(0.1, 0.5, 1.0), (0.3, 0.6, 1.0),
                                                                              (1.0, 0.7, 1.0)]),
                        one_cp(arrival=2.0, duration=0.5), one_cp(arrival=2.2, duration=2.05)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == pytest.approx([10.65, 2.5, 4.55], abs=1e-9)


@BOTH_PATHS
def test_usefulness_counts_a_gain_of_exactly_the_minimum(coalesce):
    """min_improvement 0.5 (exact in binary): after 0.5, an eval of 0.75 = 0.5 + 0.5 x 0.5 is useful (busy 20 then);
    0.8 after it is not (needs 1.125)."""
    wl = hand_workload([dict(arrival=0.0, duration=30.0, cps=[(1 / 3, 0.5, 1.0), (2 / 3, 0.75, 1.0), (1.0, 0.8, 1.0)])])
    res = simulate(wl, FIFO(), gpus=1, min_improvement=0.5, coalesce=coalesce)
    assert res.busy_at_useful.tolist() == [20.0] and res.first_useful.tolist() == [10.0]


@BOTH_PATHS
def test_eviction_takes_only_the_gpus_the_head_needs(coalesce):
    """SRTF, 3 GPUs: A (1 GPU, 100 min) and B (1 GPU, 90 min) run from 0; C (2 GPUs, 5 min) arrives at 10 with 1 GPU
    free: it needs 1 more, so only the worst runner is evicted: A (90 left, B 80). C runs 10-15; A resumes at 15, pays
    2 min and trains its 90: ends at 107; B is never touched: ends at 90."""
    wl = hand_workload([one_cp(arrival=0.0, duration=100.0), one_cp(arrival=0.0, duration=90.0),
                        one_cp(arrival=10.0, duration=5.0, gpus=2)])
    res = simulate(wl, SRTFEst(), gpus=3, coalesce=coalesce)
    assert res.end.tolist() == [107.0, 90.0, 15.0] and res.preemptions.tolist() == [1, 0, 0]


@BOTH_PATHS
def test_a_head_that_cannot_evict_still_lets_a_smaller_job_backfill_and_live_service_counts(coalesce):
    """SRTF, 2 GPUs. A (1 GPU, 10) runs 0-10. B (2 GPUs, 50) arrives at 1: it cannot evict A (10 ranks better) and
    waits. C (1 GPU, 60) arrives at 2: B still cannot evict, but C fits beside A and is backfilled at 2. At 10 A ends;
    B (50) evicts C, whose key is refreshed with its live service (60 - 8 = 52, still worse): B runs 10-60. C resumes
    at 60 (2 min overhead). D (2 GPUs, 42) arrives at 70 with 1 GPU free: C has trained 8 + (70 - 60 - 2) = 16, so
    44 left > 42: C is evicted again (counting its overhead as service would give 40 and keep it). D runs 70-112; C
    resumes at 112, pays 2 and trains its 44 left: ends at 158."""
    wl = hand_workload([one_cp(arrival=0.0, duration=10.0), one_cp(arrival=1.0, duration=50.0, gpus=2),
                        one_cp(arrival=2.0, duration=60.0), one_cp(arrival=70.0, duration=42.0, gpus=2)])
    res = simulate(wl, SRTFEst(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [10.0, 60.0, 158.0, 112.0] and res.preemptions.tolist() == [0, 0, 2, 0]
    seen = PreemptionsSeen()  # the same ranking; C's one checkpoint shows its two preemptions
    simulate(wl, seen, gpus=2, coalesce=coalesce)
    assert sorted(seen.seen) == [(0, 0), (1, 0), (2, 2), (3, 0)]


class PreemptionsSeen(SRTFEst):
    """SRTF that records, at each checkpoint, how many preemptions the job's view shows."""

    def __init__(self):
        self.seen = []

    def on_checkpoint(self, view: JobView) -> bool:
        self.seen.append((view.job_id, view.preemptions))
        return False


def test_a_policy_sees_each_jobs_preemptions():
    """The preemption-during-an-eval case: A's checkpoints at 1.3 (before), 5.5 and 8.6 (after its one preemption);
    B's at 2.5."""
    wl = hand_workload([dict(arrival=0.0, duration=3.0, eval_minutes=1.0, cps=[(0.1, 0.5, 1.0), (0.3, 0.6, 1.0),
                                                                              (1.0, 0.7, 1.0)]),
                        one_cp(arrival=2.0, duration=0.5)])
    policy = PreemptionsSeen()
    simulate(wl, policy, gpus=1)
    assert policy.seen == [(0, 0), (1, 0), (0, 1), (0, 1)]


@BOTH_PATHS
def test_eviction_counts_the_gpus_of_every_victim(coalesce):
    """SRTF, 2 GPUs: A (1 GPU, 100 min) and B (1 GPU, 90 min) run from 0; C (2 GPUs, 5 min) arrives at 10 and needs
    both: A then B are evicted (1 + 1 GPUs). C runs 10-15; both resume at 15 with 2 min overhead: B (80 left) ends at
    97, A (90 left) at 107."""
    wl = hand_workload([one_cp(arrival=0.0, duration=100.0), one_cp(arrival=0.0, duration=90.0),
                        one_cp(arrival=10.0, duration=5.0, gpus=2)])
    res = simulate(wl, SRTFEst(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [107.0, 97.0, 15.0] and res.preemptions.tolist() == [1, 1, 0]


@BOTH_PATHS
def test_one_pass_backfills_every_job_that_fits(coalesce):
    """FIFO, 4 GPUs: A (2 GPUs, 10) and X (2 GPUs, 5) run from 0; B (4 GPUs, 5) at 1, C and D (1 GPU, 3 each) at 2
    and 3 wait behind B. X ends at 5: B still does not fit, C and D both do: both run 5-8. A ends at 10 and B runs
    10-15."""
    wl = hand_workload([one_cp(arrival=0.0, duration=10.0, gpus=2), one_cp(arrival=0.0, duration=5.0, gpus=2),
                        one_cp(arrival=1.0, duration=5.0, gpus=4), one_cp(arrival=2.0, duration=3.0),
                        one_cp(arrival=3.0, duration=3.0)])
    res = simulate(wl, FIFO(), gpus=4, coalesce=coalesce)
    assert res.end.tolist() == [10.0, 5.0, 15.0, 8.0, 8.0]


# ------------------------------------------------------------------ eviction scans over stale running-heap keys
@BOTH_PATHS
def test_a_finished_job_left_on_top_of_the_running_heap_does_not_end_the_eviction_scan(coalesce):
    """SRTF, 1 GPU. X (estimate 1000, truly 1 min) runs 0-1 and leaves the worst key (1000) in the running heap. A (100
    min) starts at 2. B (10 min) arrives at 10: the scan drops X's stale key and goes on to A (98 - 8 = 92 left,
    worse than 10): A is evicted. B runs 10-20; A resumes at 20, pays 2 min and trains its 92: ends at 114."""
    wl = hand_workload([one_cp(arrival=0.0, duration=1.0, est=1000.0), one_cp(arrival=2.0, duration=100.0),
                        one_cp(arrival=10.0, duration=10.0)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == [1.0, 114.0, 20.0] and res.preemptions.tolist() == [0, 1, 0]


@BOTH_PATHS
def test_a_running_job_whose_key_was_refreshed_stays_visible_when_the_running_heap_is_compacted(coalesce):
    """SRTF, 2 GPUs. X (1000 min) and B (20 min) start at 0. H (estimate 992, 1 min) arrives at 10 with no GPU free:
    X's key (1000, from its start) is refreshed with its 10 min of service to 990, better than 992: no eviction, and X
    now holds its second running-heap key. H runs 20-21 after B. Then 66 one-minute jobs run back to back on the
    second GPU (job k from 21 + k), each leaving a stale key: when the 66th starts (86) the heap (B's, H's, 65 stale
    and 1 live short key, X's) holds 69 > 2 x 2 + 64 keys and is compacted: X's key must survive. Y (1 min) arrives at
    86.5 with no GPU free: X (1000 - 86.5 = 913.5 left) is evicted; Y runs 86.5-87.5. X restarts at 87 on the GPU the
    last short frees, pays 2 min and trains its 913.5: ends at 1002.5."""
    short = 66
    jobs = [one_cp(arrival=0.0, duration=1000.0), one_cp(arrival=0.0, duration=20.0),
            one_cp(arrival=10.0, duration=1.0, est=992.0)]
    jobs += [one_cp(arrival=21.0 + k, duration=1.0) for k in range(short)] + [one_cp(arrival=86.5, duration=1.0)]
    res = simulate(hand_workload(jobs), SRTFEst(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [1002.5, 20.0, 21.0] + [22.0 + k for k in range(short)] + [87.5]
    assert res.preemptions.tolist() == [1] + [0] * (short + 3)


@BOTH_PATHS
def test_eviction_during_a_restart_overhead_credits_no_service(coalesce):
    """SRTF, 1 GPU, restart overhead 2 min. A (100 min) runs 0-10; P (5 min) evicts it at 10 and runs 10-15. A
    restarts at 15 with 90 left and pays its overhead until 17. H (estimate 89.5, 10 min) arrives at 16: A has trained
    nothing since 15 (the overhead is no service, and none is taken back), so its 90 is worse than 89.5: A is evicted
    again. H runs 16-26; A restarts at 26, pays 2 and trains 90: ends at 118, having held the GPU 10 + 1 + 92 = 103."""
    wl = hand_workload([one_cp(arrival=0.0, duration=100.0), one_cp(arrival=10.0, duration=5.0),
                        one_cp(arrival=16.0, duration=10.0, est=89.5)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == [118.0, 15.0, 26.0] and res.preemptions.tolist() == [2, 0, 0]
    assert res.busy.tolist() == [103.0, 5.0, 10.0]


@BOTH_PATHS
def test_a_failed_eviction_during_a_restart_overhead_leaves_the_job_its_true_rank(coalesce):
    """SRTF, 3 GPUs, restart overhead 2 min. E (2 GPUs, estimate 30, truly 16 min) and C (1 GPU, 100 min) start at 0.
    P (5 min) arrives at 10 and evicts C (90 left): P runs 10-15, C restarts at 15 and pays its overhead until 17.
    H (2 GPUs, 50 min) arrives at 15.5: it would need C's GPU and one of E's, but E (14.5 left) ranks better: no
    eviction, H waits. E ends at 16: H runs 16-66. N (estimate 90.25, 10 min) arrives at 16.5, still within C's
    overhead: C has 90 left (no service since 15, none taken back by the failed scan), better than 90.25: no eviction.
    C ends at 17 + 90 = 107; N runs 66-76 (the first GPUs free)."""
    wl = hand_workload([one_cp(arrival=0.0, duration=16.0, est=30.0, gpus=2), one_cp(arrival=0.0, duration=100.0),
                        one_cp(arrival=10.0, duration=5.0), one_cp(arrival=15.5, duration=50.0, gpus=2),
                        one_cp(arrival=16.5, duration=10.0, est=90.25)])
    res = simulate(wl, SRTFEst(), gpus=3, coalesce=coalesce)
    assert res.end.tolist() == [16.0, 107.0, 15.0, 66.0, 76.0]
    assert res.preemptions.tolist() == [0, 1, 0, 0, 0]


@BOTH_PATHS
def test_service_in_the_first_minute_of_a_segment_counts_at_an_eviction_check(coalesce):
    """SRTF, 1 GPU. A (100 min) starts at 0; B (estimate 99.75, 10 min) arrives at 0.5, when A has 99.5 left: A ranks
    better and keeps the GPU (ends 100); B runs 100-110."""
    wl = hand_workload([one_cp(arrival=0.0, duration=100.0), one_cp(arrival=0.5, duration=10.0, est=99.75)])
    res = simulate(wl, SRTFEst(), gpus=1, coalesce=coalesce)
    assert res.end.tolist() == [100.0, 110.0] and res.preemptions.tolist() == [0, 0]


@BOTH_PATHS
def test_gpus_an_eviction_frees_beyond_the_heads_need_go_to_the_next_waiting_job_at_once(coalesce):
    """SRTF, 2 GPUs. A (2 GPUs, 100 min) starts at 0. D (1 GPU, estimate 96, 20 min) arrives at 5: A's 95 left ranks
    better, D waits. B (1 GPU, 5 min) arrives at 10 and evicts A (90 left), which frees 2 GPUs for B's 1: in the same
    pass A (90, the best waiting) does not fit in the one left and cannot evict B, so D is backfilled at 10. At 15 B
    ends: A needs one more GPU and D (96 - 5 = 91 left) ranks worse: D is evicted. A restarts at 15, pays 2, trains
    90: ends 107; D restarts at 107, pays 2, trains its 15 left: ends 124."""
    wl = hand_workload([one_cp(arrival=0.0, duration=100.0, gpus=2), one_cp(arrival=5.0, duration=20.0, est=96.0),
                        one_cp(arrival=10.0, duration=5.0)])
    res = simulate(wl, SRTFEst(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [107.0, 124.0, 15.0] and res.preemptions.tolist() == [1, 1, 0]
    assert res.busy.tolist() == [10.0 + 92.0, 5.0 + 17.0, 5.0]


# EvalSched (one event per checkpoint on both paths): J (1 GPU, 40 min, checkpoints every 10 min, evals 0.5, 0.6, 0.55,
# 0.5) goes post-peak at 30: its rank jumps from 40 - 30 = 10 to 10 + 1e9 and a second running-heap key is pushed,
# leaving its first (40, from its start at 0) behind, stale. K (1 GPU, 60 min) runs 0-60 beside it on 2 GPUs.
POST_PEAK_J = dict(arrival=0.0, duration=40.0, cps=quarters([0.5, 0.6, 0.55, 0.5]))


@BOTH_PATHS
def test_a_stale_key_from_before_a_restart_never_makes_the_job_a_victim_twice(coalesce):
    """As above, plus W (estimate 200, 10 min), waiting since 5 (K's 55 and J's 35 rank better). At 30 post-peak J is
    evicted for W (W 30-40) and restarts at 40 (overhead until 42). H (2 GPUs, 30 min) arrives at 41: J (still 1e9 +
    10: no service in its overhead) is a victim for one GPU, but K (19 left) ranks better than H's 30, and J's stale
    first key must not count J a second time: no eviction. J ends at 42 + 10 = 52, K at 60; H runs 60-90."""
    wl = hand_workload([POST_PEAK_J, one_cp(arrival=0.0, duration=60.0), one_cp(arrival=5.0, duration=10.0, est=200.0),
                        one_cp(arrival=41.0, duration=30.0, gpus=2)])
    res = simulate(wl, EvalSched(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [52.0, 60.0, 40.0, 90.0] and res.preemptions.tolist() == [1, 0, 0, 0]


@BOTH_PATHS
def test_a_refreshed_key_never_revives_a_stale_one(coalesce):
    """As above without W. H (2 GPUs, 30 min) arrives at 35: J's key (10 + 1e9 from 30) is refreshed with its 5 min of
    service since (5 + 1e9) and J is a victim for one GPU; K (60 - 35 = 25 left) ranks better than H: no eviction, and
    J's stale first key (40) must not come back to count J twice. J ends at 40, K at 60; H runs 60-90."""
    wl = hand_workload([POST_PEAK_J, one_cp(arrival=0.0, duration=60.0), one_cp(arrival=35.0, duration=30.0, gpus=2)])
    res = simulate(wl, EvalSched(), gpus=2, coalesce=coalesce)
    assert res.end.tolist() == [40.0, 60.0, 90.0] and res.preemptions.tolist() == [0, 0, 0]


def test_parse_base_gives_the_base_without_building_the_stop_rule(monkeypatch):
    """The live round's base policy: `Paired+SRTF` -> SRTF-Est, a bare base as it is; no detector is made (the jobs'
    requests carry the rule); a wrong base is named."""
    import scheduling.policies as P

    monkeypatch.setattr(P, "make_detector", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    assert type(P.parse_base("Paired(margin=0.05)+SRTF-Est")) is SRTFEst
    assert type(P.parse_base("EvalStop+FIFO")) is FIFO and type(P.parse_base("FIFO")) is FIFO
    with pytest.raises(ValueError, match="unknown base scheduler 'LIFO'"):
        P.parse_base("EvalStop+LIFO")
