"""Discrete-event simulator: engine mechanics on hand-built workloads, the information boundary,
the early-stop wrapper, workload statistics, and the paper's headline results (E2, E4)."""

from __future__ import annotations

import numpy as np
import pytest
from hand_workloads import StopBelowBest, hand_workload

from scheduling.config import NoiseConfig, WorkloadConfig
from scheduling.engine import simulate
from scheduling.experiments import aggregate, load_experiment, run_units, units_for
from scheduling.jobview import InformationBoundaryError, JobView
from scheduling.metrics import job_table, summarize
from scheduling.policies import FIFO, EarlyStop, Policy, SRTFEst, parse_scheduler
from scheduling.workload import JOB_TYPES, _noise, checkpoint_grid, generate

# the engine's preemption loop is where a bug once grew a test process to ~15 GB: fail such a test at once
pytestmark = pytest.mark.memory_cap(4)


def rising(n: int = 4) -> list[tuple[float, float, float]]:
    return [((k + 1) / n, 0.4 + 0.1 * k, 2.0 - 0.1 * k) for k in range(n)]


def test_fifo_exact_times_on_a_two_gpu_cluster():
    # A (2 GPUs, 10 min) and B (1 GPU, 5 min) cannot share 2 GPUs; C (1 GPU) backfills beside B.
    wl = hand_workload([
        dict(arrival=0.0, gpus=2, duration=10.0, cps=rising(2), eval_minutes=1.0),
        dict(arrival=1.0, gpus=1, duration=5.0, cps=rising(1)),
        dict(arrival=2.0, gpus=1, duration=4.0, cps=rising(1)),
    ])
    res = simulate(wl, FIFO(), gpus=2)
    # A: 5 min train + 1 eval + 5 min train + 1 eval = 12
    assert res.end[0] == pytest.approx(12.0)
    assert res.end[1] == pytest.approx(17.0)
    assert res.end[2] == pytest.approx(16.0)
    assert res.busy.tolist() == pytest.approx([12.0, 5.0, 4.0])


def test_srtf_preempts_with_overhead_and_keeps_trained_progress():
    long_job = dict(arrival=0.0, gpus=2, duration=100.0, est=100.0, cps=rising(1))
    short_job = dict(arrival=30.0, gpus=2, duration=10.0, est=10.0, cps=rising(1))
    wl = hand_workload([long_job, short_job])
    res = simulate(wl, SRTFEst(), gpus=2, overhead=2.0)
    assert res.end[1] == pytest.approx(40.0)  # starts at once: remaining 10 < 70
    # long job: 30 done, resumes at 40, pays 2 min overhead, trains the remaining 70
    assert res.end[0] == pytest.approx(112.0)
    assert res.preemptions.tolist() == [1, 0]
    assert res.busy[0] == pytest.approx(30.0 + 72.0)


def test_non_preemptive_policy_never_preempts_and_capacity_is_respected():
    cfg = WorkloadConfig(jobs=300)
    wl = generate(cfg, 7)
    for spec in ("FIFO", "SJF-Est", "SRTF-Est", "LossAware", "EvalSched", "EvalStop+SRTF"):
        res = simulate(wl, parse_scheduler(spec), cfg.gpus)
        assert np.all(res.end > wl.arrival), spec  # every job finished
        # GPU-minutes used can never exceed capacity over the makespan
        assert float(np.sum(wl.gpus * res.busy)) <= cfg.gpus * (res.makespan - wl.arrival.min()) + 1e-6
        if spec in ("FIFO", "SJF-Est"):
            assert res.preemptions.sum() == 0
        # a job holds its GPUs at least for its own training and evals (before any early stop)
        done = ~res.stopped
        n_cp = np.diff(wl.cp_start)
        need = wl.duration + n_cp * wl.eval_minutes
        assert np.all(res.busy[done] >= need[done] - 1e-6), spec


def test_jobview_hides_the_truth():
    v = JobView(3, "rlhf", 1, 8, 0.0, 210.0)
    for hidden in ("duration", "true_duration", "hacking", "label", "peak_progress", "remaining"):
        with pytest.raises(InformationBoundaryError):
            getattr(v, hidden)
    with pytest.raises(AttributeError):
        v.__dict__  # noqa: B018 - slots only: no back door to arbitrary attributes
    assert v.est_remaining == 210.0


def test_a_policy_that_peeks_fails_the_simulation():
    class Cheater(Policy):
        name = "Cheater"

        def priority(self, view: JobView) -> float:
            return view.duration  # the true duration: not observable

    wl = generate(WorkloadConfig(jobs=5), 1)
    with pytest.raises(InformationBoundaryError):
        simulate(wl, Cheater(), 64)


def test_evalstop_stops_on_k_declines_keeps_best_and_frees_gpus():
    hack_evals = [(0.25, 0.4, 2.0), (0.5, 0.6, 1.5), (0.75, 0.5, 1.4), (1.0, 0.45, 1.35)]
    wl = hand_workload([
        dict(arrival=0.0, gpus=2, duration=100.0, cps=hack_evals, hacking=True),
        dict(arrival=1.0, gpus=2, duration=10.0, cps=rising(1)),
    ])
    res_es = simulate(wl, parse_scheduler("EvalStop+FIFO"), gpus=2)
    res_base = simulate(wl, FIFO(), gpus=2)
    # two declines (0.6 -> 0.5 -> 0.45) land at progress 1.0: flagged, nothing saved
    assert res_es.stopped[0] and res_es.stop_progress[0] == 1.0 and res_es.saved_minutes[0] == 0
    assert res_es.best_eval[0] == 0.6
    # k=1 stops at the first decline (progress 0.75): 25 minutes saved, GPUs handed to the next job
    res_k1 = simulate(wl, parse_scheduler("EvalStop(k=1)+FIFO"), gpus=2)
    assert res_k1.stopped[0] and res_k1.stop_progress[0] == 0.75
    assert res_k1.end[0] == pytest.approx(75.0)
    assert res_k1.saved_minutes[0] == pytest.approx(25.0)
    assert res_k1.end[1] == pytest.approx(85.0)
    assert res_base.end[1] == pytest.approx(110.0)
    assert not res_k1.stopped[1]


def test_early_stop_wrapper_delegates_ranking_and_names_like_the_paper():
    pol = parse_scheduler("StopAt0.65+SRTF")
    assert isinstance(pol, EarlyStop) and pol.name == "StopAt0.65+SRTF" and pol.preemptive
    assert isinstance(pol.base, SRTFEst)
    assert parse_scheduler("EvalStop+SRTF").name == "EvalStop+SRTF"
    assert parse_scheduler("EvalStop(k=3)+SJF").name == "EvalStop(k=3)+SJF"
    v = JobView(0, "rlhf", 0, 4, 0.0, 210.0)
    v.attained = 10.0
    assert pol.priority(v) == SRTFEst().priority(v) == 200.0
    for bad in ("EvalStop+Nope", "Magic", "Eval-Stop+SRTF", "EvalStop(k)+SRTF"):
        with pytest.raises(ValueError):
            parse_scheduler(bad)


def test_stopat_applies_to_rlhf_only():
    pol = parse_scheduler("StopAt0.5+FIFO")
    lora = JobView(0, "lora", 0, 1, 0.0, 35.0)
    lora.eval_history, lora.loss_history, lora.progress = [0.5], [1.0], 0.6
    assert pol.on_checkpoint(lora) is False
    rl = JobView(1, "rlhf", 0, 4, 0.0, 210.0)
    rl.eval_history, rl.loss_history, rl.reward_history, rl.progress = [0.5], [1.0], [0.3], 0.6
    assert pol.on_checkpoint(rl) is True


def test_checkpoint_grid_includes_final_model():
    assert checkpoint_grid(0.15).tolist() == pytest.approx([0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0])
    assert checkpoint_grid(0.2).tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])


def test_workload_follows_appendix_a():
    wl = generate(WorkloadConfig(jobs=4000), 3)
    for t, name in enumerate(JOB_TYPES):
        sel = wl.job_type == t
        spec = getattr(WorkloadConfig(), name)
        assert spec.duration_min[0] <= wl.duration[sel].min() and wl.duration[sel].max() <= spec.duration_min[1]
        assert set(np.unique(wl.gpus[sel])) == set(range(spec.gpus[0], spec.gpus[1] + 1))
    rl = wl.job_type == 2
    assert abs(wl.hacking[rl].mean() - 0.6) < 0.03 and not wl.hacking[~rl].any()
    peaks = wl.peak_progress[wl.hacking]
    assert peaks.min() >= 0.55 and peaks.max() <= 0.75
    # hacking runs end below their best; LoRA evals are noiseless and monotone
    ends = wl.cp_start[1:] - 1
    best = np.maximum.reduceat(wl.cp_eval, wl.cp_start[:-1])
    assert np.all(wl.cp_eval[ends][wl.hacking] < best[wl.hacking] - 0.1)
    lora = np.flatnonzero(wl.job_type == 0)[:50]
    for i in lora:
        assert np.all(np.diff(wl.cp_eval[wl.cp_start[i]:wl.cp_start[i + 1]]) > 0)
    # arrivals are Poisson: exponential gaps with the configured rate
    gaps = np.diff(wl.arrival)
    assert abs(gaps.mean() - 2.0) < 0.1


@pytest.mark.parametrize("kind", ["gaussian", "student_t", "ar1"])
def test_noise_models_keep_sigma(kind):
    rng = np.random.default_rng(0)
    x = _noise(rng, NoiseConfig(kind=kind, sigma=0.05, df=5.0, rho=0.7), 20000, 10)
    assert x.std() == pytest.approx(0.05, rel=0.05)
    lag1 = np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1]
    if kind == "ar1":
        assert lag1 == pytest.approx(0.7, abs=0.03)
    else:
        assert abs(lag1) < 0.03
    if kind == "student_t":  # heavy tails: excess kurtosis well above the Gaussian's 0
        z = x.ravel() / x.std()
        assert np.mean(z**4) - 3 > 1.0


def test_metrics_detection_counts_use_all_negatives():
    wl = generate(WorkloadConfig(jobs=200), 42)
    res = simulate(wl, parse_scheduler("StopAt0.5+SRTF"), 64)
    m = summarize(job_table(wl, res), 5)
    rl = wl.job_type == 2
    assert m["stopped"] == rl.sum()  # every RLHF job, nothing else
    assert m["recall"] == 1.0
    assert m["precision"] == pytest.approx(wl.hacking.sum() / rl.sum())
    assert m["fpr"] == pytest.approx((rl & ~wl.hacking).sum() / (~wl.hacking).sum())


@pytest.fixture(scope="module")
def e2_summary():
    cfg = load_experiment("E2")
    per_seed, jobs = run_units(units_for(cfg), workers=1)
    return aggregate(per_seed, jobs).set_index("scheduler")


def test_e2_reproduces_table1_acceptance(e2_summary):
    s = e2_summary
    es = s.loc["EvalStop+SRTF"]
    assert es.precision >= 0.95 and es.recall >= 0.95 and es.fpr <= 0.03
    assert s.loc["StopAt0.65+SRTF"].fpr >= 0.5 and s.loc["StopAt0.5+SRTF"].fpr >= 0.5
    assert s.loc["LossPlateau+SRTF"].recall <= 0.6
    assert es.jct_mean < s.loc["SRTF-Est"].jct_mean and es.jct_p_value < 0.05
    assert es.wasted_frac < s.loc["SRTF-Est"].wasted_frac
    # the paper's orderings: SRTF-Est beats FIFO; LossAware and EvalSched are worse than SRTF-Est
    assert s.loc["SRTF-Est"].jct_mean < s.loc["FIFO"].jct_mean
    assert s.loc["LossAware"].jct_mean > s.loc["SRTF-Est"].jct_mean
    assert s.loc["EvalSched"].jct_mean > s.loc["SRTF-Est"].jct_mean
    assert s.n_seeds.unique().tolist() == [5]


def test_e4_evalstop_improves_every_base():
    cfg = load_experiment("E4")
    per_seed, jobs = run_units(units_for(cfg), workers=1)
    s = aggregate(per_seed, jobs).set_index("scheduler")
    for base, wrapped in [("FIFO", "EvalStop+FIFO"), ("SJF-Est", "EvalStop+SJF"), ("SRTF-Est", "EvalStop+SRTF"),
                          ("LossAware", "EvalStop+LossAware")]:
        assert s.loc[wrapped].jct_mean < s.loc[base].jct_mean, base
        assert s.loc[wrapped].wasted_frac < s.loc[base].wasted_frac, base
        assert s.loc[wrapped].precision >= 0.95 and s.loc[wrapped].fpr <= 0.03, base


def test_platform_default_detector_clears_the_noise_bar():
    """Issue bar with one configuration: sigma 0.08 P,R >= 0.90; sigma 0.12 >= 0.85; 20% hacking P >= 0.95;
    at the default noise no worse than EvalStop(k=2) on precision, recall, JCT and wasted compute."""
    from eval.detectors import DEFAULT_DETECTOR, make_detector

    default = f"{make_detector(DEFAULT_DETECTOR).label}+SRTF"
    scheds = ["EvalStop+SRTF", default]

    def quality(overrides):
        cfg = load_experiment("E2", {**overrides, "schedulers": scheds})
        per_seed, jobs = run_units(units_for(cfg), workers=1)
        return aggregate(per_seed, jobs).set_index("scheduler")

    s08 = quality({"workload.eval_noise.sigma": 0.08}).loc[default]
    assert s08.precision >= 0.90 and s08.recall >= 0.90
    s12 = quality({"workload.eval_noise.sigma": 0.12}).loc[default]
    assert s12.precision >= 0.85 and s12.recall >= 0.85
    assert quality({"workload.hack_fraction": 0.2}).loc[default].precision >= 0.95
    base = quality({})
    ours, es = base.loc[default], base.loc["EvalStop+SRTF"]
    assert ours.precision >= es.precision and ours.recall >= es.recall
    assert ours.jct_mean <= es.jct_mean and ours.wasted_frac <= es.wasted_frac


class CountingSRTF(SRTFEst):
    """SRTF-Est that counts how often the engine asks for a rank."""

    def __init__(self):
        self.calls = 0

    def priority(self, view: JobView) -> float:
        self.calls += 1
        return super().priority(view)


@pytest.mark.parametrize("gpus", [24, 64, 256])
def test_coalesced_checkpoints_give_exactly_the_per_checkpoint_results(gpus):
    # Few GPUs: long queues, many preemptions, checkpoints caught up for eviction; many GPUs: no queue.
    wl = generate(WorkloadConfig(jobs=400), 11)
    specs = ["FIFO", "SJF-Est", "SRTF-Est", "EvalStop+SRTF", "StopAt0.65+SRTF", "LossPlateau+SRTF",
             "Divergence+SRTF", "CUSUM+SJF", "EvalStop(k=1)+FIFO"]
    for spec in specs:
        fast = simulate(wl, parse_scheduler(spec), gpus)
        ref = simulate(wl, parse_scheduler(spec), gpus, coalesce=False)
        for field in ("end", "stopped", "stop_progress", "busy", "busy_at_useful", "first_useful", "best_eval",
                      "best_index", "end_index", "final_eval", "saved_minutes", "preemptions"):
            np.testing.assert_array_equal(getattr(fast, field), getattr(ref, field), err_msg=f"{spec}: {field}")
        assert (fast.events, fast.makespan) == (ref.events, ref.makespan), spec
    # the coalesced path really ran: running jobs were not re-ranked at every checkpoint
    lazy, eager = CountingSRTF(), CountingSRTF()
    simulate(wl, lazy, gpus)
    simulate(wl, eager, gpus, coalesce=False)
    assert lazy.calls < eager.calls
    if gpus == 24:
        assert simulate(wl, SRTFEst(), gpus).preemptions.sum() > 20  # the eviction path was exercised


def test_policies_that_read_live_state_keep_one_event_per_checkpoint():
    class StopWhenPreempted(Policy):
        def priority(self, view: JobView) -> float:
            return view.arrival

        def on_checkpoint(self, view: JobView) -> bool:
            return view.preemptions > 0  # reads scheduling state, not just the checkpoint series

    assert not StopWhenPreempted().stop_reads_history_only
    assert Policy().stop_reads_history_only  # never stops
    assert parse_scheduler("EvalStop+SRTF").stop_reads_history_only
    assert parse_scheduler("EvalStop+SRTF").rank_never_worsens
    assert not parse_scheduler("EvalStop+LossAware").rank_never_worsens
    assert not parse_scheduler("EvalSched").rank_never_worsens


def test_a_custom_history_only_policy_is_replayed_job_by_job_with_the_same_results():
    class StopBelowBestSRTF(StopBelowBest, SRTFEst):
        name = "StopBelowBest"

    wl = generate(WorkloadConfig(jobs=300), 5)
    assert StopBelowBestSRTF().plan_stops(None, JOB_TYPES) is None  # no batch form: the per-job replay path
    fast = simulate(wl, StopBelowBestSRTF(), 32)
    ref = simulate(wl, StopBelowBestSRTF(), 32, coalesce=False)
    assert fast.stopped.sum() > 10
    for field in ("end", "stopped", "busy", "best_index", "end_index", "preemptions", "first_useful"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(ref, field), err_msg=field)
