"""The early-stop detector interface: hand-computed series, batch scan == streaming, trace replay."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from common.errors import BadInput
from eval.detectors import Checkpoint, Detector, EvalStop, LossPlateau, StopAt, make_detector
from eval.traces import detection_quality, load_trace, runs_from_trace, verdicts


def first_stop(det, evals, losses=None, progress=None):
    m = det.start()
    for i, e in enumerate(evals):
        cp = Checkpoint(step=i, eval_score=e, loss=losses[i] if losses else float("nan"),
                        progress=progress[i] if progress else float("nan"))
        if m.observe(cp):
            return i
    return None


def test_evalstop_counts_consecutive_declines_only():
    assert first_stop(EvalStop(2), [0.1, 0.3, 0.2, 0.25, 0.2, 0.1]) == 5
    assert first_stop(EvalStop(1), [0.1, 0.3, 0.2]) == 2
    assert first_stop(EvalStop(3), [0.5, 0.4, 0.3, 0.35, 0.3]) is None
    assert first_stop(EvalStop(2), [0.3, 0.3, 0.3, 0.3]) is None  # flat is not a decline
    assert first_stop(EvalStop(2), [0.5, float("nan"), 0.4, 0.3]) == 3  # missed eval: no evidence


def test_lossplateau_window_is_first_to_last_checkpoint():
    # improvement 1.0 -> 0.99 over a 3-checkpoint window is 1% < 2%: fires on the third checkpoint
    assert first_stop(LossPlateau(3, 0.02), [0] * 3, losses=[1.0, 0.995, 0.99]) == 2
    assert first_stop(LossPlateau(3, 0.02), [0] * 4, losses=[1.0, 0.9, 0.8, 0.79]) is None
    assert first_stop(LossPlateau(3, 0.02), [0] * 5, losses=[1.0, 0.9, 0.8, 0.79, 0.788]) == 4


def test_stopat_fires_at_first_checkpoint_past_p():
    assert first_stop(StopAt(0.65), [0] * 7, progress=[0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0]) == 4
    assert first_stop(StopAt(0.6), [0] * 7, progress=[0.15, 0.3, 0.45, 0.6, 0.75, 0.9, 1.0]) == 3


def test_make_detector_rejects_unknown_names_and_params():
    with pytest.raises(ValueError, match="unknown detector"):
        make_detector("magic")
    with pytest.raises(ValueError, match="bad parameter"):
        make_detector("evalstop", z=1)
    with pytest.raises(ValueError):
        make_detector("evalstop", k=0)


@pytest.mark.parametrize("det", [EvalStop(2), EvalStop(1), LossPlateau(3, 0.02), StopAt(0.5)])
def test_default_scan_matches_streaming(det):
    rng = np.random.default_rng(1)
    evals = rng.normal(0.5, 0.1, (40, 9))
    losses = 1.0 + np.cumsum(-np.abs(rng.normal(0.01, 0.02, (40, 9))), axis=1)
    progress = np.broadcast_to(np.linspace(0.1, 1.0, 9), (40, 9))
    got = det.scan({"eval_score": evals, "loss": losses, "progress": progress})
    for r in range(40):
        want = first_stop(det, evals[r].tolist(), losses[r].tolist(), progress[r].tolist())
        assert got[r] == (-1 if want is None else want)


@pytest.mark.parametrize("det", [EvalStop(2), EvalStop(3), StopAt(0.65)])
def test_vectorised_scan_matches_streaming_with_missed_evals(det):
    # missed evals (NaN) and NaN padding after a run's end leave the monitors' state unchanged
    rng = np.random.default_rng(7)
    evals = rng.normal(0.5, 0.1, (300, 12))
    evals[rng.random(evals.shape) < 0.15] = np.nan
    progress = np.broadcast_to(np.linspace(0.05, 1.0, 12), (300, 12)).copy()
    progress[rng.random(progress.shape) < 0.15] = np.nan
    got = det.scan({"eval_score": evals, "progress": progress})
    assert type(det).scan is not Detector.scan  # the vectorised form is under test
    fired = 0
    for r in range(300):
        want = first_stop(det, evals[r].tolist(), progress=progress[r].tolist())
        assert got[r] == (-1 if want is None else want), r
        fired += want is not None
    assert fired > 0 and len(set(got.tolist())) > 2  # a spread of answers, not one constant


def write_trace(tmp_path, rows) -> str:
    path = tmp_path / "trace.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_trace_replay_sorts_rows_and_keeps_odd_ids(tmp_path):
    rows = []
    series = {"run a,1": ([0.2, 0.5, 0.4, 0.3], 1), "ρ-2": ([0.2, 0.3, 0.4, 0.5], 0)}
    for rid, (ev, label) in series.items():
        for step, e in enumerate(ev):
            rows.append({"run_id": rid, "step": (step + 1) * 10, "eval_score": e, "label": label})
    rows = rows[::-1]  # unsorted
    df = load_trace(write_trace(tmp_path, rows))
    v = verdicts(EvalStop(2), runs_from_trace(df)).set_index("run_id")
    assert v.loc["run a,1"].stopped == 1 and v.loc["run a,1"].stop_step == 40
    assert v.loc["run a,1"].best_step == 20 and v.loc["run a,1"].best_eval_score == 0.5
    assert v.loc["ρ-2"].stopped == 0 and v.loc["ρ-2"].final_eval_score == 0.5
    q = detection_quality(v.reset_index())
    assert (q["precision"], q["recall"], q["fpr"]) == (1.0, 1.0, 0.0)


@pytest.mark.parametrize("rows, message", [
    ([{"run_id": "a", "step": 1}], "missing required column"),
    ([{"run_id": "a", "step": "x", "eval_score": 0.1}], "'step' line 2"),
    ([{"run_id": "a", "step": 1, "eval_score": 0.1, "label": 2}], "'label' line 2"),
    ([{"run_id": "a", "step": 1, "eval_score": 0.1}, {"run_id": "a", "step": 1, "eval_score": 0.2}], "repeats step"),
])
def test_bad_traces_name_the_problem(tmp_path, rows, message):
    with pytest.raises(BadInput, match=message):
        load_trace(write_trace(tmp_path, rows))


def test_cusum_accumulates_declines_in_se_units():
    # the gate's SE 0.1 is the noise while the run is too short for its own estimate: a fall of 0.1*sqrt(2)
    # is one unit; h=2 needs more than two units in total
    det = make_detector("cusum", h=2.0, drift=0.0)
    step = 0.9 * 0.1 * np.sqrt(2)  # 0.9 units per fall: 0.9, 1.8, then 2.7 > 2
    assert _stop_with_se(det, [1.0, 1.0 - step, 1.0 - 2 * step, 1.0 - 3 * step], se=0.1) == 3
    assert _stop_with_se(det, [1.0, 1.0 - step, 1.0, 1.0 - step, 1.0], se=0.1) is None  # rises reset it


def test_noise_aware_detectors_read_the_gates_se():
    evals = [0.30, 0.45, 0.55, 0.50, 0.46]  # a 0.05 then 0.04 fall after the peak
    for name in ("divergence", "cusum", "patience"):
        det = make_detector(name)
        quiet = _stop_with_se(det, evals, se=0.2)   # falls are well inside a noisy gate's error
        loud = _stop_with_se(det, evals, se=0.005)  # and far outside a precise gate's
        assert quiet is None and loud is not None, name


def _stop_with_se(det, evals, se):
    m = det.start()
    for i, e in enumerate(evals):
        if m.observe(Checkpoint(step=i, eval_score=e, reward=0.1 * i, eval_se=se)):
            return i
    return None


def test_bocpd_flags_a_regime_change_not_a_rising_run():
    det = make_detector("bocpd")
    se = 0.02
    rising = [0.2 + 0.05 * i for i in range(7)]
    hacking = [0.2, 0.3, 0.4, 0.45, 0.35, 0.25, 0.15]
    assert _stop_with_se(det, rising, se) is None
    assert _stop_with_se(det, hacking, se) in (4, 5, 6)


def test_divergence_needs_reward_up_when_reward_is_reported():
    det = make_detector("divergence")
    evals = [0.3, 0.5, 0.6, 0.5, 0.4, 0.3]
    m = det.start()
    fired = [m.observe(Checkpoint(step=i, eval_score=e, reward=1.0 - 0.1 * i, eval_se=0.02))
             for i, e in enumerate(evals)]
    assert not any(fired)  # proxy falling too: a collapse, not reward hacking
    assert _stop_with_se(det, evals, 0.02) is not None


@pytest.mark.parametrize("name", ["patience", "cusum", "bocpd", "divergence"])
def test_new_detectors_scan_matches_streaming(name):
    det = make_detector(name)
    rng = np.random.default_rng(2)
    evals = np.cumsum(rng.normal(0.0, 0.05, (30, 8)), axis=1)
    rewards = np.cumsum(np.abs(rng.normal(0.05, 0.02, (30, 8))), axis=1)
    got = det.scan({"eval_score": evals, "reward": rewards, "eval_se": np.full((30, 8), 0.03)})
    for r in range(30):
        m = det.start()
        want = -1
        for t in range(8):
            if m.observe(Checkpoint(step=t, eval_score=evals[r, t], reward=rewards[r, t], eval_se=0.03)):
                want = t
                break
        assert got[r] == want


def test_trace_eval_se_column_reaches_the_detectors(tmp_path):
    rows = [{"run_id": "r", "step": i, "eval_score": e, "eval_se": 0.2, "reward": 0.1 * i}
            for i, e in enumerate([0.3, 0.45, 0.55, 0.50, 0.46])]
    runs = runs_from_trace(load_trace(write_trace(tmp_path, rows)))
    assert runs[0].checkpoints[0].eval_se == 0.2
    # the same falls stop the run with a precise gate but not with this noisy one
    assert verdicts(make_detector("divergence"), runs).stopped.tolist() == [0]
    for r in rows:
        r["eval_se"] = 0.005
    runs = runs_from_trace(load_trace(write_trace(tmp_path, rows)))
    assert verdicts(make_detector("divergence"), runs).stopped.tolist() == [1]
