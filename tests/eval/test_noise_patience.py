"""NoisePatience (eval/patience.py), the default detector, against hand-computed stops and a plain re-implementation.

The oracle here recomputes the rule from its definition with numpy (its own noise estimate: MAD of second
differences / sqrt 6, floored by the gate's SE), independently of eval.detectors.RunNoise."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from eval.calibrate import calibrate
from eval.detectors import DEFAULT_DETECTOR, Checkpoint, make_detector
from eval.patience import WARMUP, NoisePatience
from eval.traces import load_trace, runs_from_trace, verdicts

NAN = float("nan")


def first_stop(det, evals, rewards=None, se=NAN, progress=None) -> int:
    m = det.start()
    for i, e in enumerate(evals):
        cp = Checkpoint(step=float(i), eval_score=float(e), eval_se=se,
                        reward=NAN if rewards is None else float(rewards[i]),
                        progress=NAN if progress is None else float(progress[i]))
        if m.observe(cp):
            return i
    return -1


def oracle_sigma(y: np.ndarray, se: float) -> float:
    d2 = y[2:] - 2 * y[1:-1] + y[:-2]
    dev = np.abs(d2 - np.median(d2))
    mad = np.median(dev)
    sd = (1.482602218505602 * mad if mad > 0 else math.sqrt(math.pi / 2) * dev.mean()) / math.sqrt(6)
    return max(sd, se) if se > 0 else sd


def oracle_stop(evals, patience, z, drawdown, rewards=None, se=NAN, fast_window=0, fast_ratio=1.0,
                mean_window=0) -> int:
    """The rule from its definition (long runs; no gate phase: runs without an SE, or judged after WARMUP): the
    patience window at bar z (mean_window w: the mean of the last w evals against the best mean of w earlier
    consecutive evals, in SDs of a difference of two means), and on a run with a proxy the deep-drop window at bar
    fast_ratio * z."""
    y = np.asarray(evals, dtype=float)
    windows = [(patience, z)] + ([(fast_window, fast_ratio * z)] if fast_window and rewards is not None else [])
    for t in range(WARMUP - 1, len(y)):
        seen = y[: t + 1]
        if len(seen) <= max(patience, mean_window):
            continue
        sigma = oracle_sigma(seen, se)
        if not sigma > 0:
            continue
        if rewards is not None:
            w = np.asarray(rewards[t + 1 - patience: t + 1], dtype=float)
            if np.polyfit(np.arange(len(w)), w, 1)[0] <= 0:
                continue
        best, low = seen.max(), seen.min()
        if mean_window and len(seen) >= 2 * mean_window:
            w = mean_window
            earlier = [seen[i:i + w].mean() for i in range(len(seen) - 2 * w + 1)]
            drop = max(earlier) - seen[-w:].mean()
            if drop > drawdown * (best - low) and drop / (sigma * math.sqrt(2 / w)) > z:
                return t
        for width, bar in windows[1:] if mean_window else windows:
            drop = best - seen[-width:].max()
            if drop > drawdown * (best - low) and drop / sigma > bar:
                return t
    return -1


# a rise to 10, a fall to 3-4 from index 8 on
HAND = [0, 2, 4, 6, 8, 10, 9.5, 9, 3, 4, 3, 4, 3, 4]


def test_hand_computed_stops():
    # z = 0: the noise only has to be positive, so the stop is where the last `patience` evals all sit more than
    # half the range (10 - 0) below the best 10, i.e. their max < 5: indices 8-10 for patience 3 (max 4)
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.5), HAND) == 10
    assert first_stop(NoisePatience(patience=2, z=0.0, drawdown=0.5), HAND) == 9  # 3, 4
    # a 70% drawdown needs the last evals below 3: never (3 is not below 3)
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.7), HAND) == -1
    # a proxy that falls over the window is a collapse, not hacking; a rising one is the signature
    rising, falling = list(range(14)), list(range(7)) + [6 - k for k in range(7)]
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.5, fast_window=0), HAND, rewards=rising) == 10
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.5), HAND, rewards=falling) == -1


def test_hand_computed_deep_drop_stops():
    # with a rising proxy the deep-drop window (1 checkpoint) stops at the first eval below half the range: HAND[8]
    rising = list(range(14))
    det = NoisePatience(patience=3, z=0.0, drawdown=0.5, fast_window=1, fast_ratio=3.0)
    assert first_stop(det, HAND, rewards=rising) == 8
    # without a proxy there is no deep-drop path: the patience rule's index 10
    assert first_stop(det, HAND) == 10
    # a proxy that falls over the patience window is a collapse: neither path
    falling = list(range(7)) + [6 - k for k in range(7)]
    assert first_stop(det, HAND, rewards=falling) == -1
    # its bar is fast_ratio * z: at index 8 the drop is 10 - 3 = 7 noise-units over the own noise of HAND[:9]
    sigma = oracle_sigma(np.array(HAND[:9], dtype=float), NAN)
    for ratio in (1.0, 2.5, 4.0):
        at_bar = 7 / sigma / ratio
        assert first_stop(NoisePatience(patience=3, z=at_bar * 0.999, drawdown=0.5, fast_window=1, fast_ratio=ratio),
                          HAND, rewards=rising) == 8
        assert first_stop(NoisePatience(patience=3, z=at_bar * 1.001, drawdown=0.5, fast_window=1, fast_ratio=ratio),
                          HAND, rewards=rising) != 8
    # a wider deep-drop window needs its evals all below the line: 3, 4 first at index 9
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.5, fast_window=2), HAND, rewards=rising) == 9


def test_hand_computed_mean_window_stops():
    # means of 2: the earlier windows of HAND peak at (10 + 9.5) / 2 = 9.75; the last two evals' mean first sits
    # more than half the range (10 - 0) below it at index 9 ((3 + 4) / 2 = 3.5: a drop of 6.25), where every eval
    # of a 2-window is not yet below 5 until the same index (patience 2 above); means of 3 at index 10
    assert first_stop(NoisePatience(patience=2, z=0.0, drawdown=0.5, mean_window=2), HAND) == 9
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.5, mean_window=3), HAND) == 10
    # a 65% drawdown: the mean of 3 falls 9.5 - 10/3 = 6.17 below the best earlier mean (10+9.5+9)/3 = 9.5 at
    # index 10 (under 6.5), and 9.5 - 11/3 = 5.83 at 11; the min rule with patience 3 needs evals below 3.5: never
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.65, mean_window=3), HAND) == -1
    # one lucky eval in the window holds the min rule off, not the mean: a 9 at index 9 keeps every 3-window from
    # sitting below 5 until index 12, while the mean of (3, 9, 3) = 5 is already 4.5 below the best mean 9.5
    lucky = HAND[:9] + [9, 3, 3, 3, 3]
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.4), lucky) == 12
    assert first_stop(NoisePatience(patience=3, z=0.0, drawdown=0.4, mean_window=3), lucky) == 10
    # the bar: at index 10 of HAND the drop of 3-means is 9.5 - 10/3 over sigma * sqrt(2/3)
    sigma = oracle_sigma(np.array(HAND[:11], dtype=float), NAN)
    at_bar = (9.5 - 10 / 3) / (sigma * math.sqrt(2 / 3))
    assert first_stop(NoisePatience(patience=3, z=at_bar * 0.999, drawdown=0.5, mean_window=3), HAND) == 10
    assert first_stop(NoisePatience(patience=3, z=at_bar * 1.001, drawdown=0.5, mean_window=3), HAND) != 10
    with pytest.raises(ValueError, match="mean_window"):
        NoisePatience(mean_window=-1)


def test_deep_drop_window_must_be_shorter_than_patience():
    with pytest.raises(ValueError, match="fast_window"):
        NoisePatience(patience=3, fast_window=3)
    with pytest.raises(ValueError, match="fast_ratio"):
        NoisePatience(fast_ratio=0.5)
    # the noise bar: at index 10 the drop is 10 - 4 = 6 and the own noise of HAND[:11] is oracle_sigma
    sigma = oracle_sigma(np.array(HAND[:11], dtype=float), NAN)
    assert first_stop(NoisePatience(patience=3, z=6 / sigma * 0.999, drawdown=0.5), HAND) == 10
    assert first_stop(NoisePatience(patience=3, z=6 / sigma * 1.001, drawdown=0.5), HAND) != 10


def random_runs(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    runs = []
    for _ in range(n):
        k = int(rng.integers(10, 40))
        peak = int(rng.integers(3, k))
        t = np.arange(k)
        clean = np.minimum(t, peak) - rng.uniform(0, 2) * np.maximum(t - peak, 0)
        runs.append(clean + rng.normal(0, rng.uniform(0.1, 3.0), k))
    return runs


def test_matches_a_plain_reimplementation():
    det = NoisePatience(patience=4, z=1.5, drawdown=0.3)
    runs = random_runs(120, seed=7)
    stops = [first_stop(det, y) for y in runs]
    assert stops == [oracle_stop(y, 4, 1.5, 0.3) for y in runs]
    assert 10 < sum(s >= 0 for s in stops) < 110  # the comparison is not vacuous
    # with a gate SE the noise is floored by it (runs judged from WARMUP on: no progress, no gate-phase stop)
    for se in (0.5, 5.0):
        assert [first_stop(det, y, se=se) for y in runs] == [oracle_stop(y, 4, 1.5, 0.3, se=se) for y in runs]


def test_runs_with_a_proxy_match_a_plain_reimplementation():
    rng = np.random.default_rng(23)
    runs = random_runs(150, seed=19)
    # proxies that rise with noise (the patience slope test passes on some windows, fails on others)
    proxies = [np.cumsum(rng.normal(0.3, 1.0, len(y))) for y in runs]
    for fast_window, fast_ratio in ((1, 2.5), (2, 1.5)):
        det = NoisePatience(patience=4, z=1.5, drawdown=0.3, fast_window=fast_window, fast_ratio=fast_ratio)
        stops = [first_stop(det, y, rewards=r) for y, r in zip(runs, proxies, strict=True)]
        want = [oracle_stop(y, 4, 1.5, 0.3, rewards=r, fast_window=fast_window, fast_ratio=fast_ratio)
                for y, r in zip(runs, proxies, strict=True)]
        assert stops == want
        # the deep-drop path changes some verdicts here (the comparison covers it)
        slow = [oracle_stop(y, 4, 1.5, 0.3, rewards=r) for y, r in zip(runs, proxies, strict=True)]
        assert sum(a != b for a, b in zip(stops, slow, strict=True)) >= 5


@pytest.mark.parametrize("mean_window,fast_window", [(2, 0), (3, 1), (4, 0)])
def test_the_mean_rule_matches_a_plain_reimplementation(mean_window, fast_window):
    rng = np.random.default_rng(31)
    runs = random_runs(150, seed=29)
    proxies = [np.cumsum(rng.normal(0.3, 1.0, len(y))) for y in runs]
    det = NoisePatience(patience=3, z=1.5, drawdown=0.3, fast_window=fast_window, fast_ratio=2.0,
                        mean_window=mean_window)
    for rewards in (None, proxies):
        got = [first_stop(det, y, rewards=None if rewards is None else rewards[i]) for i, y in enumerate(runs)]
        want = [oracle_stop(y, 3, 1.5, 0.3, rewards=None if rewards is None else rewards[i],
                            fast_window=fast_window, fast_ratio=2.0, mean_window=mean_window)
                for i, y in enumerate(runs)]
        assert got == want
        assert 10 < sum(s >= 0 for s in got) < 140  # not vacuous
    # the mean rule changes verdicts against the every-eval rule on these runs (the comparison covers it)
    every = [oracle_stop(y, 3, 1.5, 0.3) for y in runs]
    assert sum(a != b for a, b in zip(every, [first_stop(det, y) for y in runs], strict=True)) >= 10


@pytest.mark.parametrize("a,b", [(2.0**-7, 0.0), (2.0**5, -17.0), (1e-3, 1e3), (250.0, 0.1)])
def test_affine_change_of_units_gives_the_same_verdicts(a, b):
    det = make_detector(DEFAULT_DETECTOR)
    runs = random_runs(80, seed=11)
    base = [first_stop(det, y) for y in runs]
    assert base == [first_stop(det, a * y + b) for y in runs]
    # short gated runs (the simulator's 7 checkpoints, judged on the SE from half-way): the SE scales too
    rng = np.random.default_rng(3)
    progress = np.linspace(1 / 7, 1.0, 7)
    short = [np.r_[np.linspace(0, 1, 4), 1 - np.linspace(0.1, 0.4, 3)] + rng.normal(0, 0.05, 7) for _ in range(60)]
    gated = [first_stop(det, y, se=0.05, progress=progress) for y in short]
    assert gated == [first_stop(det, a * y + b, se=0.05 * a, progress=progress) for y in short]
    assert any(s >= 0 for s in base) and any(s >= 0 for s in gated)


def test_short_gated_runs_use_the_divergence_gate_test_from_gate_from_on():
    det = make_detector(DEFAULT_DETECTOR)
    gate = make_detector("divergence", window=det.window, z=det.z_gate, short_ratio=det.short_ratio)
    rng = np.random.default_rng(5)
    progress = np.linspace(1 / 7, 1.0, 7)
    compared = 0
    for _ in range(200):
        y = np.r_[np.linspace(0, 1, 4), 1 - np.linspace(0.1, 0.4, 3)] + rng.normal(0, 0.08, 7)
        g = first_stop(gate, y, se=0.08)
        # the gate test's first stop counts once the trainer reports gate_from of its steps done
        want = g if g >= 0 and progress[g] >= det.gate_from else -1
        if g >= 0 and progress[g] < det.gate_from:
            continue  # the divergence monitor would have stopped earlier; later stops are not its first
        assert first_stop(det, y, se=0.08, progress=progress) == want
        compared += 1
        # unknown progress (NaN): a short run is never stopped on the gate test
        assert first_stop(det, y, se=0.08) == -1
    assert compared > 150


def write_trace(path, runs: dict[str, list[float]], direction: str | None = None, se: float | None = None) -> None:
    rows = []
    for run_id, ys in runs.items():
        for i, y in enumerate(ys):
            row = {"run_id": run_id, "step": 10 * i, "eval_score": y}
            if direction:
                row["direction"] = direction
            if se is not None:
                row["eval_se"] = se
            rows.append(row)
    pd.DataFrame(rows).to_csv(path, index=False)


def test_trace_without_eval_se_is_judged_on_its_own_noise(tmp_path):
    runs = {f"r{i}": list(y) for i, y in enumerate(random_runs(40, seed=13))}
    write_trace(tmp_path / "t.csv", runs)
    df = load_trace(tmp_path / "t.csv")
    assert "eval_se" not in df.columns
    det = make_detector(DEFAULT_DETECTOR)
    v = verdicts(det, runs_from_trace(df)).set_index("run_id")
    for run_id, ys in runs.items():
        want = oracle_stop(ys, det.patience, det.z, det.drawdown)
        assert v.loc[run_id, "stopped"] == int(want >= 0), run_id
        if want >= 0:
            assert v.loc[run_id, "stop_step"] == 10 * want


def test_lower_is_better_metric_is_declared_not_guessed(tmp_path):
    # a validation loss that falls to a minimum then rises (over-fitting): flipped, it is HAND
    loss = [20 - y for y in HAND]
    det = NoisePatience(patience=3, z=0.0, drawdown=0.5)
    write_trace(tmp_path / "lower.csv", {"run": loss}, direction="lower")
    declared = verdicts(det, runs_from_trace(load_trace(tmp_path / "lower.csv")))
    assert declared.stop_step.tolist() == [100.0]  # index 10, as HAND
    assert declared.best_eval_score.tolist() == [10.0]  # the lowest loss is the kept checkpoint
    # undeclared, the same column reads as higher-is-better: the rise of the loss is then an improvement
    write_trace(tmp_path / "plain.csv", {"run": loss})
    assert verdicts(det, runs_from_trace(load_trace(tmp_path / "plain.csv"))).stop_step.tolist() != [100.0]
    # and --direction lower on the plain file is the same as the column
    assert verdicts(det, runs_from_trace(load_trace(tmp_path / "plain.csv"), "lower")).stop_step.tolist() == [100.0]


def test_calibrate_fits_z_to_the_target_on_a_small_fleet():
    runs = random_runs(50, seed=17)
    fleet = [[Checkpoint(step=float(i), eval_score=float(e)) for i, e in enumerate(y)] for y in runs]
    base = {"patience": 4, "drawdown": 0.3}
    fitted = calibrate("noisepatience", fleet, target=0.1, base={**NoisePatience().params(), **base})
    # oracle: each run's critical z is its largest drop/sigma where the rule's other conditions hold
    crit = []
    for y in runs:
        y = np.asarray(y, dtype=float)
        c = 0.0
        for t in range(WARMUP - 1, len(y)):
            seen = y[: t + 1]
            sigma, best, low, recent = oracle_sigma(seen, NAN), seen.max(), seen.min(), seen[-4:].max()
            if sigma > 0 and best - recent > 0.3 * (best - low):
                c = max(c, (best - recent) / sigma)
        crit.append(c)
    allowed = int(0.1 * len(runs))
    assert fitted["z"] == pytest.approx(sorted(crit, reverse=True)[allowed] + 1e-6, abs=1e-5)
    det = NoisePatience(**fitted)
    stopped = sum(first_stop(det, y) >= 0 for y in runs)
    assert stopped <= allowed
    assert sum(first_stop(NoisePatience(**{**fitted, "z": fitted["z"] - 1e-4}), y) >= 0 for y in runs) > stopped
