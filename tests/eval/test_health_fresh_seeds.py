"""The run-health thresholds held to a bar on data never used to tune them, from both sides.

`configs/alerts.yaml` was tuned, and its false-positive rates recorded, on the synthetic fleet with seed 0
(2000 healthy runs x 1000 steps). Here the same generator draws fresh fleets from seeds that no threshold,
recorded rate or other test uses, and every alert must
- stay quiet on healthy runs: its false-positive rate is no higher than what the recorded rate allows
  (a one-sided 99.9% binomial bound around the recorded rate's 95% upper confidence limit), and at most 1%
  for a paging alert (the catalog's own bar: reward_band k 3 was rejected at 4.5%);
- fire on the runs with its own fault (recall >= 0.95), not before the fault's onset, and within a bounded
  delay after it.
"""

from __future__ import annotations

import pytest
from scipy import stats

from eval.health import ALERTS, Catalog, load_alerts_config, synthetic_fleet

#: seeds never used to tune or record anything (the shipped rates come from seed 0; other tests use 3, 11)
FRESH_SEEDS = (1013, 2027)
N_HEALTHY, N_FAULTY, N_STEPS = 1000, 700, 1000
PAGING_FPR_BAR = 0.01
MIN_RECALL = 0.95
#: steps after onset by which the alert must have fired (the fleet's faults at full strength; measured
#: delays on the fresh seeds are at most ~40% of these: reward_band 2, kl_blowup 29, entropy_collapse 81,
#: reward_hacking 214, dead_run 130, grad_norm_spike 41, rollout_drift 29, sync_stall 9; the off-policy pair, set
#: before looking at these seeds from the rules: low_ess ~12 steps of decay + 3 of persistence, carried_length_drift
#: within the second complete 20-step window after onset; the group pair likewise: flat_groups 5 steps of
#: persistence once at least 97% of the groups are flat (a few steps at 16 groups), group_spread_collapse
#: 15 * ln(11) ~ 36 steps of a decay from at most ~1.1x the early level to a tenth of it + 5 of persistence)
MAX_DELAY = {"reward_band": 10, "kl_blowup": 60, "entropy_collapse": 160, "reward_hacking": 350,
             "dead_run": 250, "grad_norm_spike": 100, "rollout_drift": 60, "sync_stall": 15,
             "low_ess": 30, "carried_length_drift": 60, "flat_groups": 30, "group_spread_collapse": 80}


@pytest.fixture(scope="module")
def config():
    return load_alerts_config()


@pytest.fixture(scope="module")
def catalog(config):
    return Catalog.from_config(config)


def allowed_false_positives(recorded_rate: float, recorded_runs: int, n: int) -> int:
    """How many of n fresh healthy runs may fire, given the rate recorded on `recorded_runs` runs."""
    k = round(recorded_rate * recorded_runs)
    p_hi = stats.beta.ppf(0.95, k + 1, recorded_runs - k)  # Clopper-Pearson 95% upper limit
    return int(stats.binom.ppf(0.999, n, p_hi))


def test_allowed_false_positives_is_a_real_bound():
    assert allowed_false_positives(0.0, 2000, 1000) <= 6
    assert 8 <= allowed_false_positives(0.005, 2000, 1000) <= 20
    assert allowed_false_positives(0.005, 2000, 1000) < allowed_false_positives(0.05, 2000, 1000)


def test_recorded_rates_meet_the_bar(config):
    """An upper bound on what may be recorded: retuning to a noisy threshold and re-recording its rate
    (which keeps tests/eval/test_health_config.py green) fails here."""
    for name, a in config.alerts.items():
        if a.severity == "paging":
            assert a.false_positive_rate.rate <= PAGING_FPR_BAR, name


@pytest.mark.parametrize("seed", FRESH_SEEDS)
def test_false_positive_rate_on_fresh_healthy_runs(config, catalog, seed):
    series, _, _ = synthetic_fleet(N_HEALTHY, N_STEPS, seed=seed, fault_frac=0.0)
    first = catalog.scan(series)
    for name in ALERTS:
        fired = int((first[name] >= 0).sum())
        rec = config.alerts[name].false_positive_rate
        assert fired <= allowed_false_positives(rec.rate, rec.healthy_runs, N_HEALTHY), (name, fired)
        if config.alerts[name].severity == "paging":
            assert fired / N_HEALTHY <= PAGING_FPR_BAR, (name, fired)


@pytest.mark.parametrize("seed", FRESH_SEEDS)
def test_recall_and_delay_on_fresh_faulty_runs(config, catalog, seed):
    series, kind, onset = synthetic_fleet(N_FAULTY, N_STEPS, seed=seed, fault_frac=1.0)
    first = catalog.scan(series)
    for name in ALERTS:
        own = kind == name
        assert own.sum() >= 50
        f, o = first[name][own], onset[own]
        early = (f >= 0) & (f < o)
        caught = (f >= o) & (f <= o + MAX_DELAY[name])
        rec = config.alerts[name].false_positive_rate  # firing before the fault is a false alarm
        assert early.sum() <= allowed_false_positives(rec.rate, rec.healthy_runs, int(own.sum())), name
        assert caught.mean() >= MIN_RECALL, (name, caught.mean())
