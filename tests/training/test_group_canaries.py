"""The group methods' canary on real tiny runs: a grpo job (2 groups of 2 completions a step) whose reward service
returns a constant from step `FAULT_AT` on has every group flat, and the catalog built for its algorithm (the
`canary` profile, as `rlhfops canary`) pages `flat_groups` exactly `persist` steps later and moves the run state;
the same job without the fault stays quiet and succeeds. A few seconds each: the tiny config of the trainer tests,
not the canary command's 32-sample jobs (those are `grpo_control` / `grpo_constant_reward` in
training/benches/canaries.py,
run by tests/training/test_faults_canaries.py)."""

from __future__ import annotations

import math

import pytest

from eval.states import RunState
from tests.training.tiny_job import tiny_config
from training.job.lifecycle import JobSpec, run_job

STEPS, FAULT_AT = 12, 3
#: flat_groups' persistence (configs/alerts.yaml): the constant reward's first flat step is FAULT_AT + 1
PERSIST = 5


def grpo_job(cache, fault: str) -> JobSpec:
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, algorithm="grpo", ppo={"group_size": 2}, steps=STEPS,
                      fault={"kind": fault, "at_step": FAULT_AT})
    return JobSpec(tenant="canary", name=f"grpo-{fault}", config=cfg, run_id=f"grpo-{fault}", overlap="none",
                   alert_profile="canary", run_through_pause=fault != "none")


def test_constant_reward_pages_flat_groups_on_a_tiny_grpo_run(cache):
    out = run_job(grpo_job(cache, "constant_reward"))
    assert out.error is None
    flats = [r["group_flat_frac"] for r in out.records]
    assert flats[FAULT_AT:] == [1.0] * (STEPS - FAULT_AT)  # every group flat from the fault on
    assert all(f < 1.0 for f in flats[:FAULT_AT])  # ... and not before it (continuous reward-model scores)
    sup = out.supervisor
    assert sup.monitor.catalog.algorithm == "grpo" and sup.monitor.catalog.not_evaluated == {}
    fired = {e.alert: e for e in sup.events}
    assert fired["flat_groups"].step == FAULT_AT + PERSIST and fired["flat_groups"].severity == "paging"
    assert "all-equal rewards" in fired["flat_groups"].detail
    assert min(e.step for e in sup.events) == FAULT_AT + PERSIST  # nothing paged before the groups went flat
    assert any(s.state is RunState.DEGRADED for s in sup.machine.history)
    assert out.status.state is RunState.FAILED


def test_healthy_tiny_grpo_run_stays_quiet(cache):
    out = run_job(grpo_job(cache, "none"))
    assert out.error is None
    assert len(out.records) == STEPS
    assert all(not math.isnan(r["group_flat_frac"]) and not math.isnan(r["group_reward_std"]) for r in out.records)
    assert out.supervisor.events == []
    assert out.status.state is RunState.SUCCEEDED


def test_a_ppo_run_does_not_evaluate_the_group_alerts(cache):
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, steps=2)
    out = run_job(JobSpec(tenant="canary", name="ppo", config=cfg, run_id="ppo", overlap="none"))
    assert out.error is None
    catalog = out.supervisor.monitor.catalog
    assert catalog.algorithm == "ppo"
    assert catalog.not_evaluated == dict.fromkeys(
        ("flat_groups", "group_spread_collapse"), "not evaluated: no groups (one completion per prompt)")
    assert all(math.isnan(r["group_flat_frac"]) for r in out.records)


@pytest.mark.parametrize("fault", ["none", "constant_reward"])
def test_metrics_csv_rows_give_the_same_alerts(cache, tmp_path, fault):
    """A run directory's metrics.csv read back (what a resumed job replays) carries the group figures to the
    catalog: the replay pages exactly what the live run paged."""
    from dataclasses import replace

    from training.job.lifecycle import make_supervisor, read_history, replay

    spec = replace(grpo_job(cache, fault), out_dir=tmp_path / "run", run_id=f"grpo-{fault}-dir")
    live = run_job(spec)
    fresh = make_supervisor(spec)
    replay(read_history(spec.out_dir, STEPS), fresh, charge=False)
    assert [(e.alert, e.step) for e in fresh.events] == [(e.alert, e.step) for e in live.supervisor.events]
    assert bool(live.supervisor.events) == (fault != "none")


def test_a_job_request_builds_its_catalog_for_its_algorithm(tmp_path):
    """The platform's entry (`JobRequest.checked`, what rlhf-job and the rounds start from) builds the catalog for the
    request's algorithm too, not ppo's for every job."""
    from training.job.request import parse_request

    grpo = parse_request({"out_root": str(tmp_path), "overrides": {"algorithm": "grpo", "ppo.group_size": 4}})
    catalog = grpo.checked().catalog
    assert catalog.algorithm == "grpo" and {"flat_groups", "group_spread_collapse"} <= set(catalog.alerts)
    ppo = parse_request({"out_root": str(tmp_path)}).checked().catalog
    assert ppo.algorithm == "ppo" and "flat_groups" in ppo.not_evaluated
