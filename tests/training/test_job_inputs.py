"""A job's inputs (training/inputs/job_inputs.py, training/job/config.py): the synthetic task stays the default and
every shipped config reads as before; a dataset task's paths are the config folder's; the kinds that cannot go together
are refused in one line; a user's real GSM8K files (a few rows written by hand in GSM8K's format) run under
configs/ppo-arith.yaml with nothing else changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from common.errors import BadInput
from training.job.config import resolve_config

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (REPO / "configs").glob("ppo-*.yaml") if p.name != "ppo-arith.yaml")

#: GSM8K's own format, written by hand (the first training problem of GSM8K's train split, and two in its style)
GSM8K_ROWS = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How "
                 "many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether "
               "in April and May.\n#### 72"},
    {"question": "A baker makes 3 trays of 12 muffins and sells 20 of them. How many muffins are left?",
     "answer": "The baker makes 3*12 = <<3*12=36>>36 muffins.\nThere are 36-20 = <<36-20=16>>16 left.\n#### 16"},
    {"question": "Tickets cost $1,200 for a group of 4. How much does one ticket cost?",
     "answer": "One ticket costs 1200/4 = $<<1200/4=300>>300.\n#### 300"},
]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_reads_as_the_synthetic_task_with_its_proxy_and_gold_gate(path):
    from common.config import load_config
    from training.job.config import TrainConfig

    cfg = load_config(TrainConfig, path)  # the model alone (the 0.5B shape is over this machine's memory)
    assert (cfg.task.kind, cfg.reward.kind, cfg.gate.kind) == ("synthetic", "proxy", "gold")
    raw = yaml.safe_load(path.read_text())
    # the proxy's shape fields are the top-level `reward:` block as written
    for key, value in (raw.get("reward") or {}).items():
        assert getattr(cfg.reward, key) == value


def test_a_dataset_task_refuses_the_synthetic_tasks_own_scorers(tmp_path):
    data = {"kind": "dataset", "train": "t.jsonl", "heldout": "h.jsonl"}
    with pytest.raises(BadInput, match=r"reward: a dataset task needs reward.kind function"):
        resolve_config({"task": data})
    with pytest.raises(BadInput, match=r"gate: a dataset task needs gate.kind function"):
        resolve_config({"task": data, "reward": {"kind": "function", "ref": "gsm8k:strict_match"}})


def test_task_reward_model_path_says_where_it_moved():
    with pytest.raises(BadInput, match=r"moved: write reward: \{kind: model, path: '/x/rm'\}") as err:
        resolve_config({"task": {"reward_model_path": "/x/rm"}})
    assert "\n" not in str(err.value)


def test_an_unknown_kind_is_refused_naming_the_field():
    with pytest.raises(BadInput, match=r"reward"):
        resolve_config({"reward": {"kind": "oracle"}})
    with pytest.raises(BadInput, match=r"gate"):
        resolve_config({"gate": {"kind": "judge"}})


def test_dataset_paths_are_read_from_the_config_files_folder(tmp_path, monkeypatch):
    job = tmp_path / "tenant" / "job"
    (job / "data").mkdir(parents=True)
    _jsonl(job / "data" / "train.jsonl", GSM8K_ROWS)
    _jsonl(job / "data" / "heldout.jsonl", GSM8K_ROWS[:1])
    (job / "job.yaml").write_text(yaml.safe_dump({
        "task": {"kind": "dataset", "train": "data/train.jsonl", "heldout": "data/heldout.jsonl",
                 "prompt_key": "question"},
        "reward": {"kind": "function", "ref": "gsm8k:flexible_extract"},
        "gate": {"kind": "function", "ref": "gsm8k:strict_match"}, "eval_prompts": 1}))
    monkeypatch.chdir(tmp_path)  # elsewhere: the paths must not be read against the working directory
    cfg = resolve_config(job / "job.yaml")
    assert Path(cfg.task.train) == (job / "data" / "train.jsonl").resolve()
    assert Path(cfg.config_dir) == job.resolve()


def test_a_missing_data_file_is_bad_input_naming_the_field(tmp_path):
    from training.inputs.job_inputs import check_inputs

    cfg = resolve_config(REPO / "configs" / "ppo-arith.yaml", {"task.train": str(tmp_path / "nope.jsonl")})
    with pytest.raises(BadInput, match=r"task.train: .*nope.jsonl"):
        check_inputs(cfg)


def test_more_eval_prompts_than_held_out_rows_is_bad_input(tmp_path):
    from training.inputs.job_inputs import check_inputs

    train, held = _jsonl(tmp_path / "train.jsonl", GSM8K_ROWS), _jsonl(tmp_path / "test.jsonl", GSM8K_ROWS[:2])
    cfg = resolve_config(REPO / "configs" / "ppo-arith.yaml", {"task.train": str(train), "task.heldout": str(held)})
    with pytest.raises(BadInput, match=r"eval_prompts: 200 is more than the 2 prompts of task.heldout"):
        check_inputs(cfg)


def test_real_gsm8k_files_train_under_the_arith_config_changing_only_the_paths(tmp_path):
    """A user's GSM8K files (GSM8K's columns and answer format) under configs/ppo-arith.yaml: only `train`,
    `heldout` (and, to keep the test short, the sizes) change. The rows reach the reward with their `answer` column:
    the reference completion scored by the built-in reward is 1, and the trainer runs a step on them."""
    from training.inputs.job_inputs import check_inputs
    from training.inputs.rewards import builtin
    from training.trainer import Trainer

    train, held = _jsonl(tmp_path / "train.jsonl", GSM8K_ROWS), _jsonl(tmp_path / "test.jsonl", GSM8K_ROWS)
    cfg = resolve_config(REPO / "configs" / "ppo-arith.yaml", {
        "task.train": str(train), "task.heldout": str(held), "eval_prompts": 3, "task.sft_steps": 2, "steps": 1,
        "ppo.batch_size": 4, "ppo.max_new_tokens": 8, "cache_dir": str(tmp_path / "cache"),
        "policy.hidden_size": 32, "policy.intermediate_size": 64, "policy.num_layers": 1, "eval_every": 1})
    check_inputs(cfg)
    trainer = Trainer(cfg, "none")
    rows = list(range(trainer.inputs.n_train))
    columns = trainer.inputs.columns("train", rows)
    assert columns["answer"] == [r["answer"] for r in GSM8K_ROWS]
    prompts = [trainer.inputs.prompt("train", i) for i in rows]
    assert prompts == [r["question"] for r in GSM8K_ROWS]
    assert builtin(cfg.reward.ref)(prompts, columns["answer"], **columns) == [1.0, 1.0, 1.0]
    (record,) = list(trainer.run(1))
    assert record.samples_trained == 4 and 0.0 <= record.gold_eval <= 1.0
