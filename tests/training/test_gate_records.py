"""The eval gate's per-prompt records with common random numbers (training/gate.py, Trainer.gate/extend_gate):
the same checkpoint scored twice gives identical records, two checkpoints share each prompt's sampling seed, the
records' mean is the gate's reported mean (recomputed here from the CSV), and the extension batches stay within
their budget and in held-out order."""

import csv
import math

import numpy as np
import pytest

from training.config import TrainConfig
from training.gate import GATE_RECORDS, RECORD_COLUMNS, batch_seed, heldout_batches
from training.task import gold_score
from training.trace import export_prompt_records
from training.trainer import Trainer, gold_eval, latest_checkpoint


def tiny(cache_dir, **over) -> TrainConfig:
    raw = {
        "seed": 5, "steps": 4, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 16, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 8,
                 "long_mean_len": 10.0},
        "ppo": {"batch_size": 4, "max_new_tokens": 16, "num_ppo_epochs": 2, "num_mini_batches": 2},
        "oppo": {"chunk_size": 4, "tune_chunk": False, "delta_init": 2, "delta_window": 1},
        "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 8, "eval_extra_batch": 4,
    }
    raw.update(over)
    return TrainConfig.model_validate(raw)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def run(cache, tmp_path_factory):
    """A 4-step run with gates at steps 2 and 4, its run directory and step records."""
    out = tmp_path_factory.mktemp("run")
    trainer = Trainer(tiny(cache), overlap="none", out_dir=out, resume=False)
    recs = list(trainer.run(4))
    return trainer, out, recs


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_records_file_matches_the_gate_means(run):
    trainer, out, recs = run
    rows = _rows(out / GATE_RECORDS)
    assert tuple(rows[0]) == RECORD_COLUMNS
    gates = [r for r in recs if not math.isnan(r.gold_eval)]
    assert [r.step for r in gates] == [2, 4]
    for rec in gates:
        mine = [r for r in rows if int(r["step"]) == rec.step]
        assert sorted(int(r["prompt_id"]) for r in mine) == list(range(8))
        golds = np.array([float(r["gold_score"]) for r in mine])
        # independent recomputation of the gate's reported mean and SE from the file
        assert golds.mean() == pytest.approx(rec.gold_eval, abs=1e-5)
        assert golds.std(ddof=1) / math.sqrt(len(golds)) == pytest.approx(rec.gold_eval_se, abs=1e-5)
        assert all(np.isfinite(float(r["proxy_score"])) and int(r["response_len"]) >= 1 for r in mine)


def test_same_checkpoint_twice_identical_and_checkpoints_share_seeds(run):
    trainer, out, _ = run
    ckpt = latest_checkpoint(out)
    a = gold_eval(ckpt)
    b = gold_eval(ckpt)
    assert a.records == b.records  # CRN: the same checkpoint scored twice gives the same per-prompt records
    # and it reads what the trainer's gate read at step 4 (the default seed is the run's gate seed)
    assert [r.gold_score for r in a.records] == pytest.approx([r.gold_score for r in trainer.gate_records[4]],
                                                              abs=1e-6)
    rows = _rows(out / GATE_RECORDS)
    seeds = {(int(r["step"]), int(r["prompt_id"])): int(r["seed"]) for r in rows}
    for pid in range(8):
        assert seeds[(2, pid)] == seeds[(4, pid)] == batch_seed(5, 0)
    # the two checkpoints differ (training moved the policy), so equal records are not a constant scorer
    assert [r["proxy_score"] for r in rows if r["step"] == "2"] != [r["proxy_score"] for r in rows if r["step"] == "4"]


def test_gold_of_the_sampled_text_is_the_record(cache):
    """The gold column is gold_score of the response sampled with the gate's seed (recomputed from the text)."""
    from training.trainer import generate

    cfg = tiny(cache)
    trainer = Trainer(cfg, overlap="none", out_dir=None, resume=False)
    ev = trainer.score_batch(0)
    prompts = trainer.prompts.heldout[:8]
    responses = generate(trainer.actor, trainer.tok, prompts, cfg.ppo.max_new_tokens, cfg.ppo.temperature,
                         seed=batch_seed(cfg.seed, 0))
    expect = [gold_score(p, trainer.tok.decode(r), cfg.task) for p, r in zip(prompts, responses, strict=True)]
    assert [r.gold_score for r in ev.records] == pytest.approx(expect)
    assert [r.response_len for r in ev.records] == [len(r) for r in responses]


def test_extension_batches_and_budget(cache, tmp_path):
    cfg = tiny(cache, eval_extra_budget=16)  # two batches of 4 prompts for two checkpoints
    assert [list(b) for b in heldout_batches(16, 8, 4)] == [list(range(8)), [8, 9, 10, 11], [12, 13, 14, 15]]
    trainer = Trainer(cfg, overlap="none", out_dir=tmp_path, resume=False)
    list(trainer.run(4))
    got, secs = trainer.extend_gate((2, 4))
    assert sorted(got) == [2, 4] and secs > 0
    assert [r.prompt_id for r in got[2]] == [8, 9, 10, 11] and {r.seed for r in got[4]} == {batch_seed(5, 1)}
    # the extension of step 2 (its weights kept in memory) equals scoring its saved checkpoint on those prompts
    ckpt = gold_eval(tmp_path / "checkpoints" / "step-000002", trainer.prompts.heldout[8:12], cfg,
                     seed=batch_seed(5, 1))
    assert [r.gold_score for r in got[2]] == pytest.approx([r.gold_score for r in ckpt.records])
    got2, _ = trainer.extend_gate((2, 4))
    assert [r.prompt_id for r in got2[4]] == [12, 13, 14, 15] and trainer.extra_evals == 16
    assert trainer.extend_gate((2, 4)) == ({}, 0.0)  # budget (and pool) spent: nothing more
    rows = _rows(tmp_path / GATE_RECORDS)
    assert sum(r["step"] == "2" for r in rows) == 16  # 8 gate prompts + two extensions of 4


def test_export_prompt_records(run, tmp_path):
    _, out, _ = run
    n = export_prompt_records(out / GATE_RECORDS, tmp_path / "prompts.csv", run_id="r9")
    rows = _rows(tmp_path / "prompts.csv")
    assert n == 16 == len(rows) and {r["run_id"] for r in rows} == {"r9"}
    assert tuple(rows[0]) == RECORD_COLUMNS
