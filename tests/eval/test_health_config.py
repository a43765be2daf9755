"""Thresholds file: validation (exit 2 naming the field), routing, and recorded false-positive rates."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from common.errors import BadInput
from eval.health import (
    ALERTS,
    DEFAULT_ALERTS_FILE,
    Catalog,
    load_alerts_config,
    measure_false_positive_rates,
    synthetic_fleet,
)


def cli(*args):
    cmd = [sys.executable, "-m", "rlhfops.cli", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_shipped_file_has_all_alerts_with_fpr_records():
    cfg = load_alerts_config()
    # the runbook's seven rows plus the weight-sync stall (run mechanics) the frozen-sync canary needs, plus the
    # off-policy pair of inter-step overlap (low importance-weight ESS, carried-vs-fresh length drift), plus the pair
    # of the group methods (flat reward groups, group reward-spread collapse)
    assert set(cfg.alerts) == set(ALERTS) and len(ALERTS) == 12
    assert all(a.false_positive_rate is not None for a in cfg.alerts.values())


def test_recorded_false_positive_rates_are_current():
    """The FPR next to each threshold is what the thresholds give now (re-measure after tuning)."""
    cfg = load_alerts_config()
    runs = {a.false_positive_rate.healthy_runs for a in cfg.alerts.values()}
    assert len(runs) == 1
    measured = measure_false_positive_rates(Catalog.from_config(cfg), n_runs=runs.pop())
    for name, acfg in cfg.alerts.items():
        assert acfg.false_positive_rate.rate == pytest.approx(measured[name], abs=5e-5), name


def write(tmp_path, mutate):
    raw = yaml.safe_load(DEFAULT_ALERTS_FILE.read_text())
    mutate(raw)
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda r: r["alerts"].__setitem__("reward_spike", {"severity": "paging"}), "alerts.reward_spike"),
        (lambda r: r["alerts"]["kl_blowup"]["params"].__setitem__("cieling", 2),
         "alerts.kl_blowup.params.cieling"),
        (lambda r: r["alerts"]["dead_run"].__setitem__("severity", "loud"), "alerts.dead_run.severity"),
        (lambda r: r["alerts"]["entropy_collapse"]["params"].__setitem__("alpha", 3),
         "alerts.entropy_collapse.params"),
        (lambda r: r["alerts"]["kl_blowup"]["params_by_algorithm"]["grpo"].__setitem__("ceiling", -1),
         "alerts.kl_blowup.params_by_algorithm.grpo"),
        (lambda r: r.pop("version"), "version"),
    ],
)
def test_bad_thresholds_name_the_field(tmp_path, mutate, field):
    with pytest.raises(BadInput, match=f"'{field}"):
        load_alerts_config(write(tmp_path, mutate))


def test_malformed_yaml_and_cli_exit_code_2(tmp_path):
    bad = tmp_path / "alerts.yaml"
    bad.write_text("version: 1\nalerts: {kl_blowup: {params: [1, 2}\n")
    with pytest.raises(BadInput, match="not valid YAML at line"):
        load_alerts_config(bad)
    trace = tmp_path / "t.csv"
    frame = pd.DataFrame({"run_id": ["a"] * 3, "step": [1, 2, 3], "eval_score": [0.1, 0.2, 0.3]})
    frame.to_csv(trace, index=False)
    res = cli("health", trace, "--alerts", bad)
    assert res.returncode == 2 and "not valid YAML" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = cli("health", trace, "--only", "reward_spike")
    assert res.returncode == 2 and "--only: unknown alert 'reward_spike'" in res.stderr


def test_demotion_per_algorithm_and_tenant_and_per_algorithm_params(tmp_path):
    def mutate(r):
        r["alerts"]["dead_run"]["demote"] = {"algorithms": ["grpo"], "tenants": ["acme"]}

    cfg = load_alerts_config(write(tmp_path, mutate))
    ppo, grpo = Catalog.from_config(cfg, algorithm="ppo"), Catalog.from_config(cfg, algorithm="grpo")
    assert ppo.severity("dead_run", "globex") == "paging"
    assert ppo.severity("dead_run", "acme") == "advisory"
    assert grpo.severity("dead_run", "globex") == "advisory"
    assert ppo.severity("grad_norm_spike", "globex") == "advisory"  # advisory in the shipped file
    # grpo reports the same per-sequence KL as ppo, so it has ppo's ceiling; without an algorithm, the base value
    assert ppo.alerts["kl_blowup"].ceiling == 6.0 and grpo.alerts["kl_blowup"].ceiling == 6.0
    assert grpo.alerts["kl_blowup"].slope_cap == 0.3
    assert Catalog.from_config(cfg).alerts["kl_blowup"].ceiling == 1.0


def test_health_cli_writes_alerts_csv(tmp_path):
    series, kind, _ = synthetic_fleet(24, 400, seed=11, fault_frac=0.6)
    n_runs, n_steps = series["step"].shape
    df = pd.DataFrame({k: v.ravel() for k, v in series.items()})
    df.insert(0, "run_id", np.repeat([f"run/{i}" for i in range(n_runs)], n_steps))
    df["tenant"] = np.repeat(["acme" if i % 2 else "globex" for i in range(n_runs)], n_steps)
    df = df.sample(frac=1.0, random_state=1)  # rows in any order
    trace = tmp_path / "trace.csv"
    df.to_csv(trace, index=False)
    alerts_yaml = write(tmp_path, lambda r: r["alerts"]["dead_run"].update(demote={"tenants": ["acme"]}))
    out = tmp_path / "alerts.csv"
    res = cli("health", trace, "--alerts", alerts_yaml, "--out", out)
    assert res.returncode == 0, res.stderr
    assert "reward_hacking" in res.stdout
    alerts = pd.read_csv(out)
    assert list(alerts.columns) == ["run_id", "alert", "severity", "fired_step", "detail"]
    expected = Catalog.from_file().scan(series)
    for name, first in expected.items():
        got = alerts[alerts.alert == name].set_index("run_id")["fired_step"].to_dict()
        want = {f"run/{r}": float(first[r]) for r in np.flatnonzero(first >= 0)}  # step == row index here
        assert got == want, name
    # each injected fault was caught by its own alert
    for r in np.flatnonzero(kind != "healthy"):
        assert ((alerts.run_id == f"run/{r}") & (alerts.alert == kind[r])).any(), (r, kind[r])
    dead = alerts[alerts.alert == "dead_run"]
    tenant = {f"run/{i}": "acme" if i % 2 else "globex" for i in range(n_runs)}
    assert all((row.severity == "advisory") == (tenant[row.run_id] == "acme") for row in dead.itertuples())
    assert dead.detail.str.contains("flat within noise").all()


def test_health_cli_missing_column_exit_2(tmp_path):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"run_id": ["a"], "step": [1]}).to_csv(trace, index=False)
    res = cli("health", trace)
    assert res.returncode == 2 and "eval_score" in res.stderr


def test_canary_profile_overlays_windows_and_is_validated(tmp_path):
    canary = Catalog.from_file(profile="canary")
    assert canary.alerts["dead_run"].window < Catalog.from_file().alerts["dead_run"].window
    with pytest.raises(BadInput, match="no profile 'nightly'"):
        Catalog.from_file(profile="nightly")
    path = write(tmp_path, lambda r: r["profiles"]["canary"]["dead_run"].update(windw=3))
    with pytest.raises(BadInput, match="'profiles.canary.dead_run.windw'"):
        load_alerts_config(path)


def test_ppo_kl_blowup_leaves_a_healthy_climb_to_half_the_ceiling_and_pages_a_runaway():
    """The per-sequence KL of the default round's healthy job at config seed 2 (recorded: a climb of about 0.17 a
    step to 3.4, half the PPO ceiling of 6.0) does not page; a run that crosses the ceiling for two steps does, at
    the second (hand-read from the series)."""
    from types import SimpleNamespace

    from eval.health import Catalog

    healthy = [0.0, 0.0, 0.0, 0.1, 1.1, 0.3, 0.8, 1.6, 2.0, 2.1, 1.2, 1.9, 2.2, 2.8, 2.9, 3.0, 3.4, 3.0, 2.3, 2.2,
               2.6, 2.9, 3.1, 3.0]
    runaway = [0.0, 0.1, 0.6, 1.8, 2.6, 2.4, 7.3, 8.5]
    alert = Catalog.from_file(None, algorithm="ppo").alerts["kl_blowup"]
    for series, fires_at in ((healthy, None), (runaway, 8)):
        mon = alert.start()
        fired = [step for step, kl in enumerate(series, 1)
                 if mon.observe(SimpleNamespace(step=step, kl=kl))]
        assert (fired[0] if fired else None) == fires_at, fired
