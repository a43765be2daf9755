"""The off-policy faults, exactly, and their canaries (training/benches/canaries.py CANARIES: behaviour_mismatch,
duplicated_carry): each fault changes what it should (checked against numbers the test derives itself), and each
canary, a real small PPO run, fires its alert soon after the fault and moves the run state (slow)."""

from __future__ import annotations

import math

import pytest

from training.job.config import TrainConfig
from training.trainer import Trainer


def fault_config(cache_dir, max_new_tokens=16, **fault) -> TrainConfig:
    return TrainConfig.model_validate({
        "seed": 2, "steps": 6, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 150,
                 "long_mean_len": 10.0},
        "ppo": {"batch_size": 6, "max_new_tokens": max_new_tokens, "num_ppo_epochs": 1, "num_mini_batches": 1},
        "oppo": {"tune_chunk": False, "adaptive_delta": False, "delta_init": 3},
        "checkpoint_every": 100, "eval_every": 100, "eval_prompts": 8,
        "fault": {"kind": "none", **fault},
    })


def test_duplicated_carry_appends_the_carried_tokens_again(warm_start_cache):
    max_new = 64
    tr = Trainer(fault_config(warm_start_cache, max_new, kind="duplicated_carry", at_step=1), "inter")
    list(tr.run(1))  # step 0: fault not active yet, the buffer is carried as generated
    before = {s.uid: (list(s.response_ids), list(s.behav_logprobs)) for s in tr.buffer}
    assert any(ids for ids, _ in before.values())
    real_rollout_buffer = []
    real_update = tr._ppo_update

    def spy(samples):
        real_rollout_buffer.extend(tr.buffer)
        return real_update(samples)

    tr._ppo_update = spy
    list(tr.run(2))  # step 1: what is carried out of this step is doubled
    doubled = 0
    for s in real_rollout_buffer:
        assert len(s.response_ids) == len(s.versions) == len(s.behav_logprobs)
        half = len(s.response_ids) // 2
        if s.response_ids and len(s.response_ids) < max_new - 1:  # not cut at the length budget
            assert len(s.response_ids) % 2 == 0
            assert s.response_ids[:half] == s.response_ids[half:]
            assert s.behav_logprobs[:half] == s.behav_logprobs[half:]
            doubled += 1
    assert doubled > 0


def test_behaviour_mismatch_samples_at_factor_times_the_temperature(warm_start_cache):
    tr = Trainer(fault_config(warm_start_cache, kind="behaviour_mismatch", factor=3.0, at_step=1), "none")
    seen = []
    real_sync = tr._sync

    def sync():
        out = real_sync()
        seen.append(tr.engine.temperature)
        return out

    tr._sync = sync
    recs = list(tr.run(3))
    t = tr.cfg.ppo.temperature
    assert seen == [t, 3.0 * t, 3.0 * t]
    assert recs[0].is_ess == 1.0 and recs[0].is_weight_max == 1.0  # on-policy before the fault
    assert recs[1].is_ess < 0.99 and recs[2].is_weight_max > 1.0  # behaviour != proximal afterwards


@pytest.fixture(scope="module")
def canary_cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("canary-cache"))


#: `rlhfops canary --quick`'s defaults; the alerts must fire within these steps of the fault
CANARY_STEPS, FAULT_AT = 60, 8
WINDOW = {"behaviour_mismatch": 10, "duplicated_carry": 20}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WINDOW))
def test_overlap_canary(canary_cache, name):
    from eval.health import Catalog
    from training.benches.canaries import CANARIES, run_canary

    canary = {c.name: c for c in CANARIES}[name]
    catalog = Catalog.from_file(None, algorithm="ppo", profile="canary")
    r = run_canary(canary, CANARY_STEPS, FAULT_AT, canary_cache, catalog)
    assert r["error"] == ""
    assert not math.isnan(r["fired_at"]) and FAULT_AT < r["fired_at"] <= FAULT_AT + WINDOW[name], r
    assert canary.expected in r["paged"]
    assert any(s.startswith(("DEGRADED", "PAUSED_BY_GATE")) for s in r["states"]), r["states"]
    assert r["ok"], r
