"""Trainer end to end on a tiny config: every overlap mode, resume-identical metrics, faults, eval gate,
trace export, CLI bad input."""

import csv
import math
import os

import pytest
import yaml
from tiny_job import tiny_config

from common.errors import BadInput
from training.job.config import TrainConfig, load_config
from training.metrics import StepRecord
from training.trace import TRACE_COLUMNS, export_trace
from training.trainer import Trainer, gold_eval, latest_checkpoint, train

TIMING = {"wall_s", "phase_rollout_s", "phase_score_s", "phase_sync_s", "phase_optim_s", "phase_eval_s"}


def tiny(cache_dir, **over) -> TrainConfig:
    return tiny_config(cache_dir, **{"seed": 3, "n_heldout_prompts": 8, **over})


@pytest.mark.parametrize("overlap", ["none", "intra", "inter", "full"])
def test_every_mode_yields_complete_records(cache, overlap):
    recs = list(train(tiny(cache), overlap=overlap, steps=3))
    assert [r.step for r in recs] == [1, 2, 3]
    for r in recs:
        assert isinstance(r, StepRecord)
        assert r.samples_trained == 4 and r.tokens_trained > 0 and r.tokens_generated > 0
        for f in ("reward_mean", "kl", "entropy", "grad_norm", "clip_frac", "approx_kl", "adv_std", "loss_policy",
                  "loss_value", "response_len_mean"):
            assert math.isfinite(getattr(r, f)), f
        assert r.phase_seconds["rollout"] > 0 and r.phase_seconds["optim"] > 0
        assert (r.chunk_size > 0) == (overlap in ("intra", "full"))
    assert math.isfinite(recs[1].gold_eval) and math.isnan(recs[0].gold_eval)  # gate every 2 steps
    if overlap in ("inter", "full"):
        assert recs[0].delta == 2 and all(r.deferred >= 0 for r in recs)
    else:
        assert all(r.delta == 0 and r.deferred == 0 for r in recs)


def _rows(path):
    with open(path) as f:
        return [{k: v for k, v in r.items() if k not in TIMING} for r in csv.DictReader(f)]


@pytest.mark.parametrize("overlap", ["full", "none"])
def test_killed_run_resumes_with_identical_metrics(cache, tmp_path, overlap):
    cfg = tiny(cache)
    list(train(cfg, overlap=overlap, out_dir=tmp_path / "a", steps=5))
    # "kill" run b during step 4: its last checkpoint is step 2's... then a fresh process-like Trainer resumes
    gen = train(cfg, overlap=overlap, out_dir=tmp_path / "b", steps=5)
    for rec in gen:
        if rec.step == 3:
            break
    gen.close()
    assert latest_checkpoint(tmp_path / "b").name == "step-000002"
    resumed = Trainer(cfg, overlap, tmp_path / "b")
    assert resumed.step == 2
    list(resumed.run(5))
    a, b = _rows(tmp_path / "a" / "metrics.csv"), _rows(tmp_path / "b" / "metrics.csv")
    assert [r["step"] for r in b] == ["1", "2", "3", "4", "5"]
    assert a == b


def test_checkpoint_gold_eval_and_trace(cache, tmp_path):
    cfg = tiny(cache)
    recs = list(train(cfg, overlap="full", out_dir=tmp_path, steps=4))
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.name == "step-000004" and (ckpt / "actor" / "config.json").is_file()
    ev = gold_eval(ckpt, seed=4)
    assert ev.n == 8 and -2.0 <= ev.mean <= 1.0 and ev.se >= 0
    live = gold_eval(Trainer(cfg, "full", tmp_path).actor, config=cfg, seed=4)
    assert live.mean == pytest.approx(ev.mean)  # the checkpoint holds the trained policy
    assert recs[-1].gold_eval == pytest.approx(gold_eval(ckpt).mean)  # the default seed is the run's gate seed
    n = export_trace(tmp_path / "metrics.csv", tmp_path / "trace.csv", run_id="r1", label=1)
    with open(tmp_path / "trace.csv") as f:
        rows = list(csv.DictReader(f))
    assert n == 2 and tuple(rows[0]) == TRACE_COLUMNS
    assert [r["step"] for r in rows] == ["2", "4"] and rows[0]["label"] == "1"
    summary = (tmp_path / "summary.json").read_text()
    assert "deferral_histogram" in summary



def test_an_extra_gate_between_steps_leaves_training_untouched(cache):
    """The paired gate sets of the corpus (a second gate scoring the live policy after every step) rest on this:
    the gate samples with its own generator, so scoring the policy changes nothing that training draws."""
    cfg = tiny(cache, eval_every=1)
    plain = list(Trainer(cfg, overlap="none", out_dir=None, resume=False).run(4))
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    scored, extra = [], []
    for rec in trainer.run(4):
        scored.append(rec)
        extra.append(gold_eval(trainer.actor, trainer.inputs.heldout_prompts(range(4)), cfg, tok=trainer.tok,
                               seed=10**6 + rec.step))
    assert all(e.n == 4 and e.response_len_mean > 0 for e in extra)  # the extra gate really sampled responses
    for a, b in zip(plain, scored, strict=True):
        for f in ("reward_mean", "kl", "loss_policy", "grad_norm", "gold_eval", "gold_eval_se"):
            assert getattr(a, f) == getattr(b, f), f
def test_faults_change_what_they_should(cache):
    base = list(train(tiny(cache), overlap="none", steps=3))
    const = list(train(tiny(cache, fault={"kind": "constant_reward", "at_step": 0}), overlap="none", steps=3))
    assert all(r.reward_mean == 0.0 and r.reward_std == 0.0 for r in const)
    assert any(r.reward_mean != 0.0 for r in base)
    frozen = list(train(tiny(cache, fault={"kind": "frozen_sync", "at_step": 1}), overlap="none", steps=4))
    assert frozen[-1].staleness_mean > 0  # tokens now come from the stale policy version 1
    spike = list(train(tiny(cache, fault={"kind": "lr_spike", "at_step": 0, "factor": 300.0}), overlap="none",
                       steps=3))
    # the first update at 300x the learning rate moves the policy far more than the base's (at the last step a
    # diverged policy can have collapsed to near-deterministic answers whose KL reads ~0, depending on the warm start)
    assert max(r.approx_kl for r in spike) > 10 * max(r.approx_kl for r in base)
    game = list(train(tiny(cache, fault={"kind": "gameable_reward", "bonus": 5.0}), overlap="none", steps=2))
    assert game[0].reward_mean >= base[0].reward_mean


def test_grpo_mode_runs_without_critic(cache):
    recs = list(train(tiny(cache, algorithm="grpo", ppo={"group_size": 2}), overlap="full", steps=2))
    assert all(r.samples_trained == 4 and math.isnan(r.loss_value) for r in recs)


def test_bad_config_is_one_line_bad_input(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"ppo": {"batch_sise": 4}}))
    with pytest.raises(Exception, match="batch_sise"):
        load_config(p)
    with pytest.raises(BadInput, match="not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(BadInput, match="overlap: .both."):
        Trainer(tiny(tmp_path), "both")


def test_cli_train_bad_overlap_exits_2(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "c.yaml"
    p.write_text("steps: 1\n")
    res = subprocess.run([sys.executable, "-m", "rlhfops.cli", "train", str(p), "--overlap", "sideways"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "overlap: 'sideways'" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_bench_reports_every_mode_and_ratio(cache, tmp_path):
    from training.benches.oppo import bench_oppo, plot_bench

    res = bench_oppo(tiny(cache), steps=6, smooth=2, target_frac=0.3)
    assert set(res["modes"]) == {"none", "intra", "inter", "full"}
    for m in res["modes"].values():
        for key in ("time_to_reward_s", "steps_to_reward", "samples_per_s", "final_reward"):
            assert key in m
        assert m["samples_per_s"] > 0 and len(m["reward_curve"]) == 6
    assert res["modes"]["none"]["steps_to_reward"] is not None  # the target comes from the sequential run
    # intra streams the same responses as sequential: identical trajectory (same seed, same samples)
    assert res["modes"]["intra"]["reward_curve"] == pytest.approx(res["modes"]["none"]["reward_curve"], abs=1e-4)
    assert set(res["speedup"]) == {"intra", "inter", "full"}
    assert 0 <= res["workload"]["frac_ge_4x_median"] <= 1
    # the priority it ran at is the one this process has (a load average alone does not say what the bench got)
    assert res["load"]["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    plot_bench(res, tmp_path / "b.png")
    assert (tmp_path / "b.png").stat().st_size > 0


def test_bench_runs_another_algorithm_against_the_reference_targets(cache):
    """`bench oppo --also-config`: GRPO's sequential and full columns beside PPO's modes, judged against sequential
    PPO's targets, GRPO's columns training their own config."""
    from training.benches.oppo import DEFAULT_VARIANTS, bench_oppo, config_variants

    grpo = tiny(cache, algorithm="grpo", ppo={"group_size": 2})
    res = bench_oppo(tiny(cache), steps=6, smooth=2, target_frac=0.3,
                     variants=DEFAULT_VARIANTS + config_variants(grpo))
    assert list(res["modes"]) == ["none", "intra", "inter", "full", "grpo/none", "grpo/full"]
    ppo_target = res["per_seed"]["none"][0]["target_gold"]
    assert all(res["per_seed"][m][0]["target_gold"] == ppo_target for m in ("grpo/none", "grpo/full"))
    assert res["modes"]["intra"]["reward_curve"] == pytest.approx(res["modes"]["none"]["reward_curve"], abs=1e-4)
    assert res["modes"]["grpo/none"]["reward_curve"] != pytest.approx(res["modes"]["none"]["reward_curve"], abs=1e-4)
    assert res["variants"][4]["config"]["algorithm"] == "grpo" and "config" not in res["variants"][0]


def test_model_name_or_path_trains_from_a_local_checkpoint(cache, tmp_path):
    list(train(tiny(cache), overlap="none", out_dir=tmp_path / "a", steps=2))
    path = str(latest_checkpoint(tmp_path / "a") / "actor")
    cfg = tiny(cache, policy={"model_name_or_path": path})
    tr = Trainer(cfg, "full")
    assert tr.tok.vocab_size == 259
    recs = list(tr.run(2))
    assert len(recs) == 2 and all(math.isfinite(r.reward_mean) for r in recs)
