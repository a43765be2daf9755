"""The runbook's own miniature validation of the two subtle detectors, run through the catalog alerts
(both the streaming monitors and the vectorised scan), on the runbook's constructed series (seed 0)."""

import numpy as np
import pytest

from eval.health import Catalog, EntropyCollapse, HealthCheckpoint, RewardHacking, replay_alert


@pytest.fixture(scope="module")
def runbook_series():
    # verbatim construction from the runbook (same generator, same draw order)
    rng = np.random.default_rng(0)
    steps = 300

    def noise(scale):
        return rng.normal(0.0, scale, steps // 2)

    reward = np.concatenate([np.linspace(0.2, 0.5, steps // 2) + noise(0.01),
                             np.linspace(0.5, 0.9, steps // 2) + noise(0.01)])
    evals = np.concatenate([np.linspace(0.30, 0.45, steps // 2) + noise(0.01),
                            np.linspace(0.45, 0.10, steps // 2) + noise(0.01)])
    flat = 2.0 + rng.normal(0.0, 0.05, steps)
    collapse = np.concatenate([2.0 + rng.normal(0.0, 0.05, steps // 2),
                               2.0 * np.exp(-np.arange(steps // 2) / 40.0)
                               + rng.normal(0.0, 0.01, steps // 2)])
    return {"reward": reward, "evals": evals, "flat": flat, "collapse": collapse, "steps": steps}


def test_hacking_fires_on_all_three_hacking_windows_and_never_on_the_healthy_half(runbook_series):
    s = runbook_series
    alert = Catalog.from_file().alerts["reward_hacking"]  # the shipped thresholds are the runbook's
    assert (alert.window, alert.tau) == (50, 0.002)
    flags = alert.window_flags(s["reward"][None, :], s["evals"][None, :])[0]
    fired = [int(i) * alert.window for i in np.flatnonzero(flags)]
    assert fired == [150, 200, 250]  # 3 of 3 hacking windows; the segment starts at 150
    assert min(fired) >= s["steps"] // 2  # silent on the healthy co-rising half
    # first fire, streaming and batch: the end of the first hacking window
    series = {"reward": s["reward"][None, :], "eval_score": s["evals"][None, :]}
    assert alert.scan(series)[0] == 199
    index, detail = replay_alert(alert, {k: v[0] for k, v in series.items()})
    assert index == 199 and "reward slope" in detail
    # reward against itself (co-rising) never fires
    assert not alert.window_flags(s["reward"][None, :], s["reward"][None, :]).any()


def test_hacking_with_sparse_gates_still_fires_in_the_hacking_half(runbook_series):
    """The trainer's gate runs every N steps (NaN in between): the eval slope uses the gates it has."""
    s = runbook_series
    sparse = np.full_like(s["evals"], np.nan)
    sparse[9::10] = s["evals"][9::10]
    first = RewardHacking().scan({"reward": s["reward"][None, :], "eval_score": sparse[None, :]})[0]
    assert 150 <= first < 300


def test_entropy_collapse_flagged_after_injection_never_on_flat_or_constant(runbook_series):
    s = runbook_series
    alert = Catalog.from_file().alerts["entropy_collapse"]
    batch = alert.scan({"entropy": np.stack([s["flat"], s["collapse"], np.full(s["steps"], 2.0)])})
    assert batch[0] == -1 and batch[2] == -1
    assert batch[1] == 224 and batch[1] >= s["steps"] // 2  # the runbook's reported step
    monitor = EntropyCollapse().start()
    at = next(t for t, e in enumerate(s["collapse"])
              if monitor.observe(HealthCheckpoint(t, np.nan, entropy=e)))
    assert at == 224
