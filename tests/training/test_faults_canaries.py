"""Fault injection, exactly: each fault changes what it should by the amount it should (checked per sample
against numbers the test derives itself), and the canaries (ppo's control + four faults, grpo's control + its
constant reward) fire the expected alert, inside the expected step window, and move the run state.

The per-fault tests share one tiny config and run a handful of steps; the canaries are real small PPO runs
(`rlhfops canary --quick`'s jobs, fewer steps), marked slow.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from training.job.config import TrainConfig
from training.trainer import Trainer


def fault_config(cache_dir, **fault) -> TrainConfig:
    return TrainConfig.model_validate({
        "seed": 2, "steps": 6, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 40,
                 "long_mean_len": 10.0},
        # one epoch, one minibatch: an on-policy update has approx_kl == 0 exactly (tests/training/test_oracle_ppo.py)
        "ppo": {"batch_size": 6, "max_new_tokens": 16, "num_ppo_epochs": 1, "num_mini_batches": 1},
        "oppo": {"tune_chunk": False, "adaptive_delta": False},
        "checkpoint_every": 100, "eval_every": 100, "eval_prompts": 8,
        "fault": {"kind": "none", **fault},
    })


class UpdateSpy:
    """Per step: the samples the update trained on (with the reward model's own score) and the scores the
    trainer used after fault injection."""

    def __init__(self, trainer: Trainer):
        self.steps: list[tuple[list, list[float]]] = []
        real = trainer._ppo_update

        def spy(samples):
            out = real(samples)
            self.steps.append((list(samples), list(out["scores"])))
            return out

        trainer._ppo_update = spy


def test_gameable_reward_adds_bonus_times_trigger_count(warm_start_cache):
    bonus, trigger = 0.75, "e"
    cfg = fault_config(warm_start_cache, kind="gameable_reward", bonus=bonus, trigger=trigger, at_step=1)
    tr = Trainer(cfg, "none")
    spy = UpdateSpy(tr)
    list(tr.run(3))
    (trigger_id,) = tr.tok.encode(trigger)
    counted = 0
    for step, (samples, used) in enumerate(spy.steps):
        for s, score in zip(samples, used, strict=True):
            count = s.seq.response_ids.count(trigger_id)  # counted on token ids, not on decoded text
            expected = bonus * count if step >= 1 else 0.0  # active from step 1 (`at_step`)
            assert score - s.score == pytest.approx(expected, abs=1e-6)
            counted += count if step >= 1 else 0
    assert counted > 0  # the trigger really occurred, so a no-op fault cannot pass


def test_constant_reward_has_zero_spread_while_the_reward_model_disagrees(warm_start_cache):
    tr = Trainer(fault_config(warm_start_cache, kind="constant_reward", at_step=0), "none")
    spy = UpdateSpy(tr)
    recs = list(tr.run(2))
    for rec, (samples, used) in zip(recs, spy.steps, strict=True):
        assert used == [0.0] * len(samples)
        assert rec.reward_mean == 0.0 and rec.reward_std == 0.0
        assert np.std([s.score for s in samples]) > 0  # the reward model itself would have given a spread


def test_nan_reward_makes_every_score_nan(warm_start_cache):
    tr = Trainer(fault_config(warm_start_cache, kind="nan_reward", at_step=0), "none")
    spy = UpdateSpy(tr)
    next(tr.run(1))
    assert all(math.isnan(x) for x in spy.steps[0][1])


def test_frozen_sync_version_lag_grows_one_per_step_and_breaks_on_policy(warm_start_cache):
    """From `at_step` = 1 the engine samples from a copy of the actor frozen at version 1: the trained tokens'
    policy-version lag is 0, 0, 1, 2, 3 over steps 1..5, and the update is no longer on-policy (approx_kl > 0
    with one epoch and one minibatch, where a healthy run has exactly 0)."""
    tr = Trainer(fault_config(warm_start_cache, kind="frozen_sync", at_step=1), "none")
    spy = UpdateSpy(tr)
    recs = list(tr.run(5))
    assert [r.staleness_mean for r in recs] == [0.0, 0.0, 1.0, 2.0, 3.0]
    for r, (samples, _) in zip(recs, spy.steps, strict=True):
        assert {v for s in samples for v in s.seq.versions} == {0 if r.step == 1 else 1}
    assert recs[0].approx_kl == pytest.approx(0.0, abs=1e-7)
    assert recs[1].approx_kl == pytest.approx(0.0, abs=1e-7)  # version 1 == the actor at step 2's update
    assert all(r.approx_kl > 1e-6 for r in recs[2:])


def test_lr_spike_multiplies_both_learning_rates_from_at_step(warm_start_cache):
    factor = 7.0
    cfg = fault_config(warm_start_cache, kind="lr_spike", at_step=2, factor=factor)
    tr = Trainer(cfg, "none")
    seen: list[tuple[float, float]] = []
    real = tr.actor_opt.step

    def step(*a, **k):
        seen.append((tr.actor_opt.param_groups[0]["lr"], tr.critic_opt.param_groups[0]["lr"]))
        return real(*a, **k)

    tr.actor_opt.step = step
    list(tr.run(4))
    a, c = cfg.ppo.actor_lr, cfg.ppo.critic_lr
    assert seen == [(a, c), (a, c), (a * factor, c * factor), (a * factor, c * factor)]


# ------------------------------------------------------------------------------------------------------
# canaries: real small PPO runs through the catalog and the run-state machine


#: canary -> (final state, at most how many steps after the fault starts its alert may fire). The bounds are
#: the quick canaries' measured firing steps (`rlhfops canary --quick`: sync_stall 10 steps after the fault,
#: kl_blowup 3, dead_run 42, reward_hacking 32) with a margin; sync_stall's is exact by construction
#: (lag > max_lag 4 from 5 steps after the freeze, persisting 5 steps), and so is flat_groups' on the grpo job
#: (every group flat from the first step after the fault, persisting 5 steps).
EXPECTED = {
    "frozen_sync": ("FAILED(platform_fault)", 10),
    "constant_reward": ("FAILED(algorithmic_non_convergence)", 50),
    "oversized_lr": ("FAILED(algorithmic_non_convergence)", 6),
    "gameable_reward": ("FAILED(algorithmic_non_convergence)", 45),
    "grpo_constant_reward": ("FAILED(algorithmic_non_convergence)", 5),
}
#: the healthy jobs that must stay quiet (ppo's and grpo's)
CONTROLS = ("control", "grpo_control")
#: `rlhfops canary --quick`'s defaults
CANARY_STEPS, FAULT_AT = 60, 8


@pytest.fixture(scope="module")
def canary_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("canary-cache"))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*CONTROLS, *EXPECTED])
def test_canary(canary_cache, name):
    from eval.health import Catalog
    from infra.ledger import Ledger, PriceTable
    from training.benches.canaries import CANARIES, run_canary

    canary = {c.name: c for c in CANARIES}[name]
    catalog = Catalog.from_file(None, algorithm="ppo", profile="canary")
    ledger = Ledger(PriceTable(gpu_hour={"cpu": "0.05"}))
    r = run_canary(canary, CANARY_STEPS, FAULT_AT, canary_cache, catalog, ledger=ledger)
    assert r["error"] == ""
    if name in CONTROLS:
        assert r["paged"] == [] and r["state"] == "SUCCEEDED" and math.isnan(r["fired_at"])
        assert r["steps_run"] == CANARY_STEPS
        assert not any(s.startswith(("DEGRADED", "PAUSED_BY_GATE")) for s in r["states"])
    else:
        state, window = EXPECTED[name]
        assert FAULT_AT < r["fired_at"] <= FAULT_AT + window, r  # not before the fault, and soon after it
        assert r["state"] == state, r
        assert any(s.startswith(("DEGRADED", "PAUSED_BY_GATE")) for s in r["states"]), r["states"]
        assert canary.expected in r["paged"]
        assert r["steps_run"] == r["fired_at"]  # a fault canary stops once its proof is in
    assert r["ok"], r
    assert ledger.run_totals()[f"canary-{name}"].steps == r["steps_run"]  # every step was charged once
