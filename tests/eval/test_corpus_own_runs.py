"""data/curves/build_own_runs.py: the grid is what SOURCE.md says, every run's config validates, and the
committed own-PPO traces (when present) hold exactly that grid. No training here (the runs take ~40 min)."""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("build_own_runs", REPO / "data" / "curves" / "build_own_runs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


own = _load_script()


def test_grid_is_ten_variants_by_four_seeds_with_unique_ids():
    runs = own.grid()
    assert len(runs) == 40
    assert len({r[0] for r in runs}) == 40
    assert Counter(seed for _, _, seed in runs) == {0: 10, 1: 10, 2: 10, 3: 10}


def test_every_run_config_applies_its_overrides_and_keeps_the_rest():
    base = own.run_config({}, 0)
    seen = set()
    for run_id, overrides, seed in own.grid():
        cfg = own.run_config(overrides, seed)
        assert cfg.seed == seed and cfg.steps == own.STEPS and cfg.eval_every == own.EVAL_EVERY
        assert cfg.oppo.torch_threads == 1
        ppo = overrides["ppo"]
        assert (cfg.ppo.kl_coef, cfg.ppo.actor_lr) == (ppo["kl_coef"], ppo["actor_lr"])
        # a nested override must not wipe the sibling fields of its section (configs/ppo-healthy.yaml sets these
        # away from the pydantic defaults: 256 vs 160 new tokens, 2 vs 4 epochs, 2 vs 1 mini-batches)
        assert (cfg.ppo.max_new_tokens, cfg.ppo.num_ppo_epochs, cfg.ppo.num_mini_batches) == (256, 2, 2)
        assert cfg.task.long_mean_len == base.task.long_mean_len == 100
        gameable = "fault" in overrides
        assert (cfg.fault.kind == "gameable_reward") == gameable and run_id.startswith("own/game") == gameable
        seen.add((cfg.ppo.kl_coef, cfg.ppo.actor_lr, cfg.fault.kind))
    assert len(seen) == 10


def test_parse_range_and_its_errors():
    assert own._parse_range("0-2,7", 40) == [0, 1, 2, 7]
    with pytest.raises(SystemExit, match="--runs"):
        own._parse_range("3-x", 40)
    with pytest.raises(SystemExit, match="0..39"):
        own._parse_range("38-40", 40)


def test_fresh_seeds_are_new():
    """The fresh set's seeds were never in the corpus grid, and it trains the same variants."""
    assert not set(own.FRESH_SEEDS) & set(own.SEEDS)
    assert {r[0].split("/")[1] for r in own.grid(fresh=True)} == {r[0].split("/")[1] for r in own.grid()}


def test_holdout_seeds_are_new_and_add_gameable_runs():
    """The holdout set's seeds are in neither earlier set; it trains the grid on 4 of them (40 runs) and the two
    gameable-proxy variants on 8 more (16 runs)."""
    holdout = own.grid(holdout=True)
    seeds = {seed for _, _, seed in holdout}
    assert not seeds & (set(own.SEEDS) | set(own.FRESH_SEEDS))
    assert len(holdout) == len({r[0] for r in holdout}) == 10 * 4 + 2 * 8
    per_variant = Counter(r[0].split("/")[1] for r in holdout)
    assert {v for v, n in per_variant.items() if n == 12} == {"game40-kl0.05-lr3e-4", "game40-kl0.2-lr3e-4"}
    assert set(per_variant.values()) == {4, 12}


def test_gate128_reruns_holdout_runs_with_a_bigger_gate_only():
    holdout = {run_id.split("/", 1)[1]: (overrides, seed) for run_id, overrides, seed in own.grid(holdout=True)}
    gate = own.grid(gate128=True)
    assert len(gate) == 40
    for run_id, overrides, seed in gate:
        prefix, rest = run_id.split("/", 1)
        assert prefix == "own-gate128"
        base_overrides, base_seed = holdout[rest]
        assert seed == base_seed
        assert overrides == {**base_overrides, "eval_prompts": 128}
        cfg, base = own.run_config(overrides, seed), own.run_config(base_overrides, seed)
        assert cfg.eval_prompts == 2 * base.eval_prompts
        assert cfg.model_dump(exclude={"eval_prompts"}) == base.model_dump(exclude={"eval_prompts"})


def test_committed_gate128_runs_train_the_same_as_their_holdout_twins():
    """The gate samples with its own generator, so a bigger gate must leave training untouched: the proxy reward
    and KL of every step match the holdout twin's, while the gate's SE shrinks."""
    path = REPO / "data" / "curves" / "own_ppo_gate128" / "traces.csv"
    if not path.exists():
        pytest.skip("own_ppo_gate128/traces.csv not assembled yet")
    import pandas as pd

    gate = pd.read_csv(path)
    base = pd.read_csv(REPO / "data" / "curves" / "own_ppo_holdout" / "traces.csv")
    gate["twin"] = gate["run_id"].str.replace("own-gate128/", "own-holdout/", regex=False)
    both = gate.merge(base, left_on=["twin", "step"], right_on=["run_id", "step"], suffixes=("", "_base"))
    assert len(both) == len(gate)
    for col in ("reward", "kl", "loss"):
        assert np.allclose(both[col], both[f"{col}_base"], rtol=1e-5, atol=1e-7, equal_nan=True), col
    ratio = (both["eval_se"] / both["eval_se_base"]).median()
    assert 0.6 < ratio < 0.85  # about 1/sqrt(2)


def test_gate256_runs_are_new_seeds_with_a_bigger_gate_and_a_twin():
    gate = own.grid(gate256=True)
    earlier = {seed for kw in ({}, {"fresh": True}, {"holdout": True}) for _, _, seed in own.grid(**kw)}
    assert not {seed for _, _, seed in gate} & earlier
    assert len(gate) == len({r[0] for r in gate}) == 10 * 4 + 2 * 8
    for run_id, overrides, seed in gate:
        cfg = own.run_config(overrides, seed)
        assert cfg.eval_prompts == cfg.task.n_heldout_prompts == 256
        assert own.twin_id(run_id).startswith("own-twin64/") and own.twin_id(run_id).split("/", 1)[1] == \
            run_id.split("/", 1)[1]
        plain = {k: v for k, v in overrides.items() if k not in ("eval_prompts", "task")}
        assert (run_id.split("/")[1], plain) in own.VARIANTS


@pytest.mark.parametrize("sources", [("own_ppo_gate256", "own_ppo_twin64"), ("own_ppo_sealed256", "own_ppo_sealed64"),
                                     ("own_ppo_sealed8_256", "own_ppo_sealed8_64")])
def test_committed_two_gate_runs_and_their_twins_score_the_same_training(sources):
    """The twin gate scores the same run: every training column matches row for row, the gate's SE is about twice
    the 256-prompt gate's (sqrt(256 / 64)), and the two gates' means differ by no more than their noise."""
    paths = [REPO / "data" / "curves" / s / "traces.csv" for s in sources]
    if not all(p.exists() for p in paths):
        pytest.skip(f"{' / '.join(sources)} not assembled yet")
    import pandas as pd

    gate, twin = (pd.read_csv(p) for p in paths)
    gate["twin"] = gate["run_id"].map(own.twin_id)
    both = gate.merge(twin, left_on=["twin", "step"], right_on=["run_id", "step"], suffixes=("", "_twin"))
    assert len(both) == len(gate) == len(twin)
    for col in ("reward", "kl", "loss", "entropy", "grad_norm", "response_len"):
        assert np.allclose(both[col], both[f"{col}_twin"], equal_nan=True), col
    assert 1.8 < (both["eval_se_twin"] / both["eval_se"]).median() < 2.2
    z = (both["eval_score_twin"] - both["eval_score"]) / np.hypot(both["eval_se"], both["eval_se_twin"])
    assert abs(z.mean()) < 0.2 and 0.7 < z.std() < 1.3  # two unbiased measurements of one policy


def test_sealed_set_has_the_gate256_design_on_seeds_no_other_set_uses():
    sealed, gate = own.grid(sealed=True), own.grid(gate256=True)
    earlier = {seed for kw in ({}, {"fresh": True}, {"holdout": True}, {"gate256": True})
               for _, _, seed in own.grid(**kw)}
    assert not {seed for _, _, seed in sealed} & earlier
    assert len(sealed) == len({r[0] for r in sealed}) == len(gate)
    assert [(r[0].split("/")[1], r[1]) for r in sealed] == [(r[0].split("/")[1], r[1]) for r in gate]
    assert all(own.twin_id(r[0]).startswith("own-sealed64/") for r in sealed)
    assert own.twin_id("own-holdout/kl0.2-lr3e-4/seed8") is None


def test_the_set_sealed_for_v8_has_the_two_gate_design_on_new_seeds():
    sealed8, gate = own.grid(sealed8=True), own.grid(gate256=True)
    earlier = {seed for kw in ({}, {"fresh": True}, {"holdout": True}, {"gate256": True}, {"sealed": True})
               for _, _, seed in own.grid(**kw)}
    assert not {seed for _, _, seed in sealed8} & earlier
    assert len(sealed8) == len({r[0] for r in sealed8}) == len(gate)
    assert [(r[0].split("/")[1], r[1]) for r in sealed8] == [(r[0].split("/")[1], r[1]) for r in gate]
    assert all(own.twin_id(r[0]).startswith("own-sealed8-64/") for r in sealed8)


@pytest.mark.parametrize("source, kw", [
    ("own_ppo", {}), ("own_ppo_fresh", {"fresh": True}), ("own_ppo_holdout", {"holdout": True}),
    ("own_ppo_gate128", {"gate128": True}), ("own_ppo_gate256", {"gate256": True}),
    ("own_ppo_twin64", {"gate256": True}), ("own_ppo_sealed256", {"sealed": True}),
    ("own_ppo_sealed64", {"sealed": True}), ("own_ppo_sealed8_256", {"sealed8": True}),
    ("own_ppo_sealed8_64", {"sealed8": True})])
def test_committed_own_traces_hold_the_grid(source, kw):
    """The run ids and checkpoint counts of every committed own-PPO set."""
    path = REPO / "data" / "curves" / source / "traces.csv"
    if not path.exists():
        pytest.skip(f"{source}/traces.csv not assembled yet")
    with path.open() as f:
        rows = list(csv.DictReader(f))
    per_run = Counter(r["run_id"] for r in rows)
    ids = {r[0] for r in own.grid(**kw)}
    twin = source.endswith(("twin64", "sealed64", "sealed8_64"))
    assert set(per_run) == ({own.twin_id(i) for i in ids} if twin else ids)
    expected = own.STEPS // own.EVAL_EVERY + 1  # step 0 and every EVAL_EVERY steps
    assert set(per_run.values()) == {expected}
    for r in rows:
        assert float(r["eval_se"]) > 0
        assert (r["reward"] == "") == (r["step"] == "0")
