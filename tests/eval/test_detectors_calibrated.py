"""Self-calibrating detectors: affine invariance, the run's own noise estimate, declared direction,
usefulness scores, calibration to a false-stop rate, refusals, and the simulator bars on fresh seeds."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from eval.detectors import Checkpoint, make_detector, robust_diff_sigma
from eval.traces import detection_quality, runs_from_trace, verdicts
from rlhfops.cli import app

NOISE_AWARE = ["divergence", "patience", "cusum", "bocpd"]
#: the shipped own-noise bar is calibrated on very smooth public curves and stops nothing on these small
#: synthetic fleets; the tests pin one that does, independent of configs/detectors.yaml
PINNED = {"divergence": {"z_own": 1.0}}


def fleet(seed: int, runs: int = 40, n: int = 30, se: float | None = None) -> pd.DataFrame:
    """Healthy (rising, plateauing) and hacking (rise, then fall while the proxy still rises) runs."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(runs):
        hack = r % 3 == 0
        p = np.linspace(0.0, 1.0, n)
        if hack:
            pk = rng.uniform(0.4, 0.7)
            clean = np.where(p < pk, 1 - (1 - p / pk) ** 2, 1 - 0.8 * (p - pk) / (1 - pk))
        else:
            clean = 1 - np.exp(-p / rng.uniform(0.2, 0.5))
        ev = clean + rng.normal(0.0, 0.06, n)
        for i in range(n):
            row = {"run_id": f"run{r}", "step": 10 * i, "eval_score": ev[i], "reward": p[i], "label": int(hack)}
            if se is not None:
                row["eval_se"] = se
            rows.append(row)
    return pd.DataFrame(rows)


def stop_indices(name: str, df: pd.DataFrame) -> list[int]:
    v = verdicts(make_detector(name, **PINNED.get(name, {})), runs_from_trace(df))
    steps = v["stop_step"].to_numpy()
    return [-1 if math.isnan(s) else int(s) for s in steps]


@pytest.mark.parametrize("name", NOISE_AWARE + ["evalstop"])
@pytest.mark.parametrize("with_se", [False, True])
def test_verdicts_are_invariant_to_affine_changes_of_units(name, with_se):
    df = fleet(3, runs=24, se=0.06 if with_se else None)
    base = stop_indices(name, df)
    assert len(set(base)) > 2  # a spread of stop steps, some runs not stopped: the check has teeth
    for a, b in [(0.01, -5.0), (37.0, 1000.0)]:
        moved = df.copy()
        moved["eval_score"] = a * df["eval_score"] + b
        if with_se:
            moved["eval_se"] = a * df["eval_se"]  # the gate's SE is in the metric's units too
        assert stop_indices(name, moved) == base, (a, b)


def test_own_noise_estimate_is_the_mad_of_second_differences():
    rng = np.random.default_rng(0)
    evals = (np.linspace(0, 3, 25) + rng.normal(0, 0.2, 25)).tolist()
    d2 = [evals[i + 1] - 2 * evals[i] + evals[i - 1] for i in range(1, len(evals) - 1)]
    med = statistics.median(d2)
    want = 1.482602218505602 * statistics.median([abs(x - med) for x in d2]) / math.sqrt(6)
    assert robust_diff_sigma(evals) == pytest.approx(want, rel=1e-12)
    # a linear trend alone is not noise; a large sample of white noise gives its SD back
    assert robust_diff_sigma(np.linspace(0, 5, 20).tolist()) == pytest.approx(0.0, abs=1e-12)
    assert robust_diff_sigma(np.random.default_rng(1).normal(0, 0.3, 4000).tolist()) == pytest.approx(0.3, rel=0.05)


def test_a_run_without_se_is_judged_on_its_own_noise_not_a_fixed_default():
    # the same shape at two scales: a fixed absolute SE (the old 0.02) would stop the large one only
    shape = [0.0, 0.5, 0.8, 1.0, 1.05, 1.1, 1.08, 1.12, 1.1, 1.11, 1.09, 1.1, 1.06, 1.0, 0.9, 0.75, 0.6]
    for scale in (0.01, 100.0):
        m = make_detector("divergence", z_own=1.0).start()
        fired = [m.observe(Checkpoint(step=i, eval_score=scale * e, reward=float(i))) for i, e in enumerate(shape)]
        assert not any(fired[:12]) and any(fired), scale  # quiet on the plateau, stops on the fall


runner = CliRunner()


def write(tmp_path, df, name="trace.csv"):
    path = tmp_path / name
    df.to_csv(path, index=False)
    return str(path)


def test_detect_without_eval_se_says_the_noise_is_estimated(tmp_path):
    df = fleet(5, runs=9)
    res = runner.invoke(app, ["detect", write(tmp_path, df), "--out", str(tmp_path / "v.csv")])
    assert res.exit_code == 0, res.output
    assert "noise is estimated from each run" in res.output and "useful recall" in res.output
    df["eval_se"] = 0.06
    res = runner.invoke(app, ["detect", write(tmp_path, df), "--out", str(tmp_path / "v.csv")])
    assert res.exit_code == 0 and "estimated from each run" not in res.output


def test_lower_is_better_metric_is_declared_not_guessed(tmp_path):
    df = fleet(7, runs=15)
    want = stop_indices("divergence", df)
    loss = df.assign(eval_score=5.0 - 2.0 * df["eval_score"])  # a loss: lower is better
    # declared in the trace or on the command line: the same verdicts as the higher-is-better original
    assert stop_indices("divergence", loss.assign(direction="lower")) == want
    assert [int(s) if s == s else -1 for s in verdicts(make_detector("divergence", z_own=1.0), runs_from_trace(
        loss, direction="min")).stop_step] == want
    # not declared: read as higher-is-better, a different (wrong) answer
    assert stop_indices("divergence", loss) != want
    res = runner.invoke(app, ["detect", write(tmp_path, loss), "--detector", "divergence", "--direction", "lower",
                              "--param", "z_own=1",
                              "--out", str(tmp_path / "v.csv")])
    assert res.exit_code == 0, res.output
    v = pd.read_csv(tmp_path / "v.csv")
    ids = list(dict.fromkeys(df.run_id))
    got = dict(zip(v.run_id, (int(s) if s == s else -1 for s in v.stop_step), strict=True))
    assert [got[r] for r in ids] == want
    # the kept checkpoint is the lowest loss seen, reported in the trace's own units
    first = loss[loss.run_id == v.run_id[0]]
    upto = first[first.step <= (v.stop_step[0] if v.stopped[0] else first.step.max())]
    assert v.best_eval_score[0] == pytest.approx(upto.eval_score.min())


@pytest.mark.parametrize("args, extra, message", [
    (["--direction", "sideways"], {}, "direction: 'sideways'"),
    ([], {"direction": "up"}, "column 'direction'"),
    (["--detector", "stopat"], {}, "detector 'stopat' needs column 'progress'"),
    (["--detector", "lossplateau"], {}, "detector 'lossplateau' needs column 'loss'"),
    (["--detector", "lossplateau"], {"loss": -0.01}, "needs a training loss"),
])
def test_bad_input_exits_2_naming_it(tmp_path, args, extra, message):
    df = fleet(1, runs=3).assign(**extra)
    res = subprocess.run([sys.executable, "-m", "rlhfops.cli", "detect", write(tmp_path, df), *args],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_usefulness_scores_by_hand():
    # gold peak at index 3; stop at index 5 keeps index 3 (best observed); range 1.0 - 0.0
    rows = [{"run_id": "h", "step": 10 * i, "eval_score": e, "label": 1}
            for i, e in enumerate([0.0, 0.5, 0.8, 1.0, 0.7, 0.6, 0.4, 0.2])]
    runs = runs_from_trace(pd.DataFrame(rows))

    class StopAtIndex:
        name, needs, threshold = "hand", (), None

        def __init__(self, at):
            self.at = at

        def start(self):
            at, seen = self.at, []

            class M:
                def observe(self, cp):
                    seen.append(cp)
                    return len(seen) - 1 == at
            return M()

    def row(at):
        return verdicts(StopAtIndex(at), runs).iloc[0]

    r = row(5)
    assert r.stop_phase == "after_peak" and r.delay == 2
    assert r.quality_kept == pytest.approx((1.0 - 0.2) / 1.0)
    assert r.compute_saved == pytest.approx((70 - 50) / 70)
    assert row(2).stop_phase == "before_peak" and row(2).quality_kept == pytest.approx(0.8 - 0.2)
    assert row(3).stop_phase == "after_peak" and row(3).delay == 0  # a stop at the peak keeps the peak
    assert row(7).stop_phase == "at_end" and row(7).compute_saved == 0.0
    q = detection_quality(pd.DataFrame([row(5), row(2), row(7)]))
    assert (q["useful"], q["early_stops"], q["end_stops"], q["recall"]) == (1, 1, 1, 1.0)
    assert q["losing_stops"] == 0  # no healthy run in this set


def test_a_false_stop_loses_quality_only_when_the_kept_checkpoint_is_worse_than_the_end():
    """Three healthy runs stopped at index 2: one dips and ends below its early best (the stop kept 0.6 > 0.5: no
    loss), two dip and end above it (kept 0.6 < 0.9 and < 0.7: losses); a fourth is never stopped."""
    rows = []
    for run_id, ys in (("ends-low", [0.0, 0.6, 0.2, 0.4, 0.5]), ("ends-high", [0.0, 0.6, 0.2, 0.7, 0.9]),
                       ("ends-higher", [0.0, 0.6, 0.5, 0.6, 0.7]), ("never", [0.0, 0.3, 0.6, 0.8, 1.0])):
        rows += [{"run_id": run_id, "step": 10 * i, "eval_score": y, "label": 0} for i, y in enumerate(ys)]
    runs = runs_from_trace(pd.DataFrame(rows))

    class StopDips:
        name, needs, threshold = "hand", (), None

        def start(self):
            class M:
                seen: list = []

                def observe(self, cp):
                    self.seen = [*self.seen, cp.eval_score]
                    return len(self.seen) == 3 and self.seen[-1] < self.seen[-2]
            return M()

    v = verdicts(StopDips(), runs).set_index("run_id")
    assert list(v.stopped) == [1, 1, 1, 0]
    assert v.loc["ends-low", "quality_kept"] == pytest.approx((0.6 - 0.5) / 0.6)
    assert v.loc["ends-high", "quality_kept"] == pytest.approx((0.6 - 0.9) / 0.9)
    q = detection_quality(v.reset_index())
    assert (q["fp"], q["losing_stops"], q["false_stop_rate"]) == (3, 2, pytest.approx(3 / 4))


def test_calibrate_on_a_small_fleet_hits_the_target_and_is_minimal(tmp_path):
    df = fleet(11, runs=30)
    healthy = df[df.label == 0]
    config = tmp_path / "detectors.yaml"
    res = runner.invoke(app, ["detect", "--calibrate", write(tmp_path, df), "--detector", "divergence",
                              "--target-fsr", "0.1", "--config", str(config)])
    assert res.exit_code == 0, res.output
    import yaml

    doc = yaml.safe_load(config.read_text())
    z_own = doc["detectors"]["divergence"]["params"]["z_own"]
    assert doc["version"] == 1 and "calibrated" in doc["changelog"][-1]
    runs = runs_from_trace(healthy)
    n, allowed = len(runs), math.floor(0.1 * len(runs))

    def stopped(z):
        det = make_detector("divergence", config=config, z_own=z)
        return int(verdicts(det, runs).stopped.sum())

    assert stopped(z_own) <= allowed  # the target holds on the fleet it was fitted to
    assert stopped(z_own * 0.98) > allowed  # and no lower threshold would have held it
    assert n == 20
    # the default detector reads the written config
    assert make_detector("divergence", config=config).z_own == z_own
