"""Every catalog alert: the vectorised `scan` gives the same first-fire index as streaming its monitor."""

import numpy as np
import pytest

from eval.health import ALERTS, Catalog, replay_alert, synthetic_fleet


def random_fleet(seed: int, n_runs: int = 60, n_steps: int = 260) -> dict[str, np.ndarray]:
    """Random walks with jumps, trends, exact plateaus, NaN holes, sparse evals and ragged run ends,
    so that every alert both fires and stays quiet on some runs."""
    rng = np.random.default_rng(seed)
    shape = (n_runs, n_steps)

    def walk(scale):
        steps = rng.normal(0, scale, shape)
        jumps = (rng.random(shape) < 0.01) * rng.normal(0, 20 * scale, shape)
        trend = rng.normal(0, scale / 3, (n_runs, 1))
        return np.cumsum(steps + jumps + trend, axis=1)

    series = {
        "step": np.broadcast_to(np.arange(n_steps, dtype=float), shape).copy(),
        "reward": walk(0.02),
        "eval_score": walk(0.02),
        "kl": np.abs(walk(0.01)),
        "entropy": 2.0 + walk(0.05),
        "grad_norm": np.exp(rng.normal(0, 0.4, shape)),
        "response_len": 50 + walk(2.0),
        "truncation_rate": np.clip(0.05 + walk(0.01), 0, 1),
        "unparseable_rate": np.clip(0.02 + walk(0.01), 0, 1),
        "gpu_seconds": np.where(rng.random((n_runs, 1)) < 0.2, 0.0, 1.0) * np.ones(shape),
        "staleness": np.abs(walk(0.3)),
        "reward_std": np.where(rng.random((n_runs, 1)) < 0.5, 0.0, 0.2) * np.ones(shape),
    }
    flat_runs = rng.random(n_runs) < 0.15  # exactly flat reward and KL (dead-run material)
    series["reward"][flat_runs] = 0.3
    series["kl"][flat_runs] = 0.0
    series["eval_score"][:, rng.random(n_steps) < 0.8] = np.nan  # sparse gates
    for name in ("reward", "entropy", "grad_norm", "response_len"):
        holes = rng.random(shape) < 0.01
        series[name][holes & (rng.random((n_runs, 1)) < 0.3)] = np.nan
    ends = rng.integers(n_steps // 3, n_steps + 1, n_runs)  # ragged: NaN padding after the run ends
    # the off-policy signals, drawn after the others so their series stay as they were: ESS walks down from 1,
    # carried and fresh lengths walk apart, and carried is missing on some steps (no carried sample trained)
    series["is_ess"] = np.clip(1.0 - np.abs(walk(0.03)), 0.0, 1.0)
    series["len_fresh"] = np.abs(30 + walk(1.0)) + 1.0
    series["len_carried"] = series["len_fresh"] * np.exp(walk(0.05))
    series["len_carried"][rng.random(shape) < 0.1] = np.nan
    # the group signals, drawn after the others: the flat share walks around a level of its run's (some runs spend
    # stretches above 0.9), the spread walks down on some runs, and a step may report neither (NaN)
    series["group_flat_frac"] = np.clip(rng.uniform(0.3, 0.95, (n_runs, 1)) + walk(0.03), 0.0, 1.0)
    series["group_reward_std"] = np.abs(0.5 + walk(0.02)) * np.where(rng.random((n_runs, 1)) < 0.3, 0.0, 1.0)
    for name in ("group_flat_frac", "group_reward_std"):
        series[name][rng.random(shape) < 0.02] = np.nan
    pad = np.arange(n_steps)[None, :] >= ends[:, None]
    for arr in series.values():
        arr[pad] = np.nan
    return series


SHIPPED = Catalog.from_file().alerts


@pytest.mark.parametrize("name", list(ALERTS))
@pytest.mark.parametrize("seed, source", [(0, "defaults"), (1, "defaults"), (2, "shipped")])
def test_scan_matches_streaming(name, seed, source):
    alert = ALERTS[name]() if source == "defaults" else SHIPPED[name]
    series = random_fleet(seed)
    first = alert.scan(series)
    runs = [{k: v[r] for k, v in series.items()} for r in range(len(first))]
    streamed = np.array([replay_alert(alert, run)[0] for run in runs])
    np.testing.assert_array_equal(first, streamed)
    # the comparison means something only if the alert both fires and stays quiet on some runs
    assert (first >= 0).any() and (first < 0).any(), (name, first)


def test_dead_run_reward_spread_gate_matches_streaming():
    from eval.health import DeadRun

    alert = DeadRun(max_reward_std=0.05)
    series = random_fleet(4)
    first = alert.scan(series)
    streamed = [replay_alert(alert, {k: v[r] for k, v in series.items()})[0] for r in range(len(first))]
    np.testing.assert_array_equal(first, streamed)
    ungated = DeadRun().scan(series)
    spread = series["reward_std"][:, 0] > 0.05
    assert (first[spread] == -1).all() and (ungated[spread] >= 0).any()  # the spread gate bites
    assert (first[~spread] >= 0).any()


@pytest.mark.parametrize("spacing", [1.0, 5.0])
def test_catalog_scan_matches_streaming_on_synthetic_fleet(spacing):
    """Chunked, threaded catalog scan == per-run streaming, also for a trace recorded every 5 steps."""
    series, kind, _ = synthetic_fleet(40, 400, seed=3, fault_frac=0.8)
    catalog = Catalog.defaults().at_spacing(spacing)
    scanned = catalog.scan(series, workers=2)
    for name, alert in catalog.alerts.items():
        streamed = [replay_alert(alert, {k: v[r] for k, v in series.items()})[0] for r in range(40)]
        np.testing.assert_array_equal(scanned[name], streamed, err_msg=name)
    assert sum(int((f >= 0).sum()) for f in scanned.values()) > 10
