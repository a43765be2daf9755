"""The group methods' alerts (eval/health/group_alerts.py: flat_groups, group_spread_collapse) on hand-written step
rows whose firing step is known, with the shipped thresholds (configs/alerts.yaml), both the streaming monitor fed
the trainer's StepRecords and the vectorised scan; and which alerts a catalog evaluates for which algorithm (no
critic alert on grpo/rloo, no group alert on ppo), in the catalog and in `rlhfops health`.
The real runs (a tiny grpo job with a constant reward, and its healthy control) are in
tests/training/test_group_canaries.py."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from eval.health import ALERTS, Catalog, HealthAlert, HealthCheckpoint, not_evaluated_reason
from training.metrics import StepRecord

NAN = float("nan")
GROUP_ALERTS = ("flat_groups", "group_spread_collapse")


def shipped(name: str, algorithm: str = "grpo", profile: str | None = None) -> HealthAlert:
    return Catalog.from_file(None, algorithm=algorithm, profile=profile).alerts[name]


def fires_at(alert: HealthAlert, rows: list[dict]) -> int:
    """Stream StepRecords with these fields through the alert's monitor (as the live supervisor does): the index of
    the first row it fires on, or -1; and check the vectorised scan of the same rows agrees."""
    mon = alert.start()
    streamed = -1
    for i, fields in enumerate(rows):
        rec = StepRecord(step=i + 1, policy_version=i + 1, reward_mean=0.5, **fields)
        if mon.observe(HealthCheckpoint.from_step_record(rec)):
            streamed = i
            break
    series = {"step": np.arange(1.0, len(rows) + 1)[None, :]}
    for key in ("group_flat_frac", "group_reward_std"):
        series[key] = np.array([[r.get(key, NAN) for r in rows]])
    assert int(alert.scan(series)[0]) == streamed, (alert.name, streamed)
    return streamed


def flat_rows(values: list[float]) -> list[dict]:
    return [{"group_flat_frac": v} for v in values]


def spread_rows(values: list[float]) -> list[dict]:
    return [{"group_reward_std": v} for v in values]


# --------------------------------------------------------------------------- flat_groups (> 0.9 for 5 steps)
@pytest.mark.parametrize("values, expected", [
    # four steps above the bar, then a step below: not yet; the next five-step run fires on its fifth step
    ([0.2, 0.95, 0.95, 0.95, 0.95, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], 10),
    ([0.9] * 20, -1),  # at the bar is not above it
    ([0.85] * 20, -1),  # nor is a run that is 85% flat
    ([0.91] * 5, 4),
    ([1.0, 1.0, 1.0, 1.0, NAN, 1.0, 1.0, 1.0, 1.0, 1.0], 9),  # a step without the figure breaks the run
    ([NAN] * 20, -1),  # a ppo run reports none
    ([0.0, 0.5, 0.85, 0.6] * 10, -1),  # a healthy run: many flat groups, never nine in ten for long
])
def test_flat_groups_fires_on_the_fifth_step_above_the_bar(values, expected):
    assert fires_at(shipped("flat_groups"), flat_rows(values)) == expected


def test_flat_groups_reads_the_flat_share_not_the_spread():
    """All groups flat (share 1.0) with a spread that stays up would be impossible in a real run, but it tells the
    two figures apart: the flat share pages, the spread does not matter to it."""
    rows = [{"group_flat_frac": 1.0, "group_reward_std": 0.5}] * 6
    assert fires_at(shipped("flat_groups"), rows) == 4
    rows = [{"group_flat_frac": 0.0, "group_reward_std": 0.0}] * 30
    assert fires_at(shipped("flat_groups"), rows) == -1


# --------------------------------------------------------------------------- group_spread_collapse
#: the shipped early window (20 steps), as exact binary fractions: its mean is exactly 1.0, so the bar is exactly 0.1
EARLY = [0.5, 1.5] * 10


@pytest.mark.parametrize("values, expected", [
    (EARLY + [0.1] * 4 + [0.5] + [0.1] * 5, 29),  # at the bar counts (<=); four low steps are not yet five
    (EARLY + [0.1000001] * 30, -1),  # just above a tenth of the early level
    (EARLY + [0.3] * 40, -1),  # a healthy shrink (groups going flat as prompts get solved)
    (EARLY[:3] + [NAN] + EARLY[3:] + [0.05] * 5, 25),  # a NaN neither sets the early level nor counts
    (EARLY[:3] + [NAN] + EARLY[3:] + [0.05, 0.05, NAN, 0.05, 0.05, 0.05, 0.05, 0.05], 28),  # ... and breaks the run
    ([1.5] * 10 + [0.05] * 10 + [1.5] * 20, -1),  # low steps inside the early window are not judged
    ([0.0] * 20 + [0.0] * 5, 24),  # an early level of 0 (no signal from the start): 5 steps of 0 after it
    ([NAN] * 40, -1),
])
def test_group_spread_collapse_against_the_early_level(values, expected):
    alert = shipped("group_spread_collapse")
    assert (alert.window, alert.frac, alert.persist) == (20, 0.1, 5)  # what the rows above are written for
    assert fires_at(alert, spread_rows(values)) == expected


def test_group_spread_collapse_reads_the_spread_not_the_flat_share():
    rows = [{"group_reward_std": v, "group_flat_frac": 0.0} for v in EARLY + [0.01] * 5]
    assert fires_at(shipped("group_spread_collapse"), rows) == 24
    rows = [{"group_reward_std": 1.0, "group_flat_frac": 1.0}] * 40
    assert fires_at(shipped("group_spread_collapse"), rows) == -1


def test_canary_profile_shortens_the_early_window_only():
    alert = shipped("group_spread_collapse", profile="canary")
    assert (alert.window, alert.frac, alert.persist) == (5, 0.1, 5)
    assert fires_at(alert, spread_rows([1.0] * 5 + [0.0] * 5)) == 9


# --------------------------------------------------------------------------- which alerts apply to which algorithm
NO_GROUPS = "not evaluated: no groups (one completion per prompt)"


def test_group_alerts_are_not_evaluated_on_ppo_and_are_on_grpo_and_rloo():
    ppo = Catalog.from_file(None, algorithm="ppo")
    assert not set(GROUP_ALERTS) & set(ppo.alerts)
    assert ppo.not_evaluated == dict.fromkeys(GROUP_ALERTS, NO_GROUPS)
    assert set(ppo.alerts) == set(ALERTS) - set(GROUP_ALERTS)
    for algorithm in ("grpo", "rloo"):
        cat = Catalog.from_file(None, algorithm=algorithm, profile="canary")
        assert set(cat.alerts) == set(ALERTS) and cat.not_evaluated == {}  # the shipped catalog has no critic alert
        assert cat.at_spacing(2.0).not_evaluated == {} and cat.for_algorithm("ppo").not_evaluated == ppo.not_evaluated
        assert cat.for_algorithm("ppo").profile == "canary"
    assert set(Catalog.from_file().alerts) == set(ALERTS)  # no algorithm given: every alert (the fleet measurements)


class ValueLossBlowup(HealthAlert):
    """A critic alert for the test: it would read the value function's loss, which a critic-free run lacks."""

    name = "value_loss_blowup"
    needs = ("loss",)
    requires = "critic"
    title = reason = first_response = "test"
    window_params = ()

    def start(self):
        raise AssertionError("a critic alert must not be started on a critic-free run")


def test_critic_alerts_are_not_evaluated_on_critic_free_runs(monkeypatch):
    from eval.health import AlertConfig, AlertsConfig
    from eval.health import catalog as catalog_module
    from eval.health import config as config_module

    registry = {**ALERTS, ValueLossBlowup.name: ValueLossBlowup}
    monkeypatch.setattr(catalog_module, "ALERTS", registry)
    monkeypatch.setattr(config_module, "ALERTS", registry)
    config = AlertsConfig(version=1, alerts={"value_loss_blowup": AlertConfig(), "flat_groups": AlertConfig()})
    for algorithm in ("grpo", "rloo"):
        cat = Catalog.from_config(config, algorithm=algorithm)
        assert cat.not_evaluated == {"value_loss_blowup": "not evaluated: no critic"}
        assert list(cat.alerts) == ["flat_groups"]
        live = cat.start(tenant="acme")  # the critic alert's monitor is never started
        assert list(live.monitors) == ["flat_groups"]
    ppo = Catalog.from_config(config, algorithm="ppo")
    assert list(ppo.alerts) == ["value_loss_blowup"] and ppo.not_evaluated == {"flat_groups": NO_GROUPS}
    assert not_evaluated_reason(ValueLossBlowup, "grpo") == "not evaluated: no critic"
    assert not_evaluated_reason(ValueLossBlowup, "ppo") is None
    assert not_evaluated_reason(ValueLossBlowup, None) is None  # unknown algorithm: evaluated
    assert not_evaluated_reason(ValueLossBlowup, "dpo") is None


def test_what_each_algorithm_has_matches_the_trainer():
    """eval/ does not import training/: its table of what each algorithm's runs report is checked here against the
    trainer's own (a critic: `uses_critic`; groups: every algorithm but ppo samples several completions a prompt)."""
    from eval.health import ALGORITHM_HAS
    from training.job.config import ALGORITHMS, TrainConfig, uses_critic

    assert set(ALGORITHM_HAS) == set(ALGORITHMS)
    for algorithm in ALGORITHMS:
        cfg = TrainConfig.model_validate({"algorithm": algorithm})
        assert ("critic" in ALGORITHM_HAS[algorithm]) == uses_critic(cfg), algorithm
        assert ("groups" in ALGORITHM_HAS[algorithm]) == (algorithm != "ppo"), algorithm


def test_health_cli_skips_what_does_not_apply_and_reads_the_group_columns(tmp_path):
    """`rlhfops health --algorithm`: ppo runs get the group alerts skipped with the reason; grpo runs have them
    evaluated from the trace's group columns (a run whose groups go flat at step 10 fires flat_groups at step 14)."""
    n = 40
    flat = np.where(np.arange(n) >= 10, 1.0, 0.2)
    frame = pd.DataFrame({"run_id": "r", "step": np.arange(n), "eval_score": "", "group_flat_frac": flat,
                          "group_reward_std": np.where(flat == 1.0, 0.0, 0.4)})
    trace = tmp_path / "t.csv"
    frame.to_csv(trace, index=False)
    out = tmp_path / "alerts.csv"

    def health(algorithm):
        cmd = [sys.executable, "-m", "rlhfops.cli", "health", str(trace), "--algorithm", algorithm, "--out", str(out),
               "--only", ",".join(GROUP_ALERTS)]
        res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
        assert res.returncode == 0, res.stderr
        return res.stdout, pd.read_csv(out)

    stdout, alerts = health("ppo")
    assert alerts.empty and stdout.count("not evaluated: no groups") == 2
    stdout, alerts = health("grpo")
    assert "not evaluated" not in stdout
    assert alerts.set_index("alert")["fired_step"].to_dict() == {"flat_groups": 14.0, "group_spread_collapse": 24.0}
