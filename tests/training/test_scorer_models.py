"""A tenant's own reward model and gate model (`reward: {kind: model, path}`, `gate: {kind: model, path}`): local
sequence-classification checkpoints (one label). Each trained sample's reward, and each held-out prompt's gate score,
equals an independent full forward pass of that checkpoint over the prompt as the job renders it (its bytes and a
newline) and the response: the head's output at the last token (transformers' own pooling of a lone sequence). Reward
and gate are two different checkpoints, so a job that scores with the wrong one fails. A path that is not a
checkpoint exits 2 naming the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from cli_helpers import run_cli_output

#: GSM8K-format rows (question, answer ending in "#### N")
ROWS = [{"question": f"Tom has {a} apples and buys {b} more. How many now?",
         "answer": f"{a} + {b} = {a + b}. #### {a + b}"} for a in range(1, 7) for b in range(2, 6)]
TRAIN, HELDOUT = ROWS[:18], ROWS[18:]


def _checkpoint(path: Path, seed: int) -> Path:
    """A tiny LlamaForSequenceClassification (num_labels=1) over the byte tokenizer, its head scaled up so scores
    differ visibly between sequences, saved with the tokenizer."""
    from training.inputs.tokenizer import make_tokenizer
    from training.job.config import ModelConfig
    from training.models import build_scorer

    tok = make_tokenizer()
    torch.manual_seed(seed)
    model = build_scorer(ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tok, 256)
    assert type(model).__name__ == "LlamaForSequenceClassification" and model.config.num_labels == 1
    torch.nn.init.normal_(model.score.weight, std=1.0)
    model.save_pretrained(path)
    tok.hf.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scorers")
    return {"reward": _checkpoint(root / "rm", seed=11), "gate": _checkpoint(root / "gate-rm", seed=12)}


def _job(folder: Path, reward: dict, gate: dict, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    (folder / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELDOUT))
    cfg = {"steps": 2, "cache_dir": str(folder / "cache"),
           "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
           "task": {"kind": "dataset", "train": "train.jsonl", "heldout": "heldout.jsonl", "prompt_key": "question",
                    "sft_key": "answer", "max_prompt_tokens": 64, "sft_steps": 4},
           "reward": reward, "gate": gate,
           "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1},
           "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 4, **over}
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Oracle:
    """A checkpoint's score of (prompt text, response ids), computed apart from the platform: the job's rendering
    written out (the byte tokenizer's ids are a byte's value + 3; a dataset prompt is followed by a newline), one
    sequence per plain forward of AutoModelForSequenceClassification, no padding, no cache; with no pad id set,
    transformers pools a lone sequence at its last token."""

    def __init__(self, path: Path):
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
        self.model.config.pad_token_id = None

    @staticmethod
    def prompt_ids(prompt: str) -> list[int]:
        return [b + 3 for b in (prompt + "\n").encode("utf-8")]

    @torch.no_grad()
    def __call__(self, prompt: str, response_ids: list[int]) -> float:
        ids = torch.tensor([self.prompt_ids(prompt) + list(response_ids)])
        return float(self.model(input_ids=ids).logits[0, 0])


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-4 + 1e-4 * abs(b)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("overlap", ["none", "full"])
def test_a_reward_model_and_a_gate_model_score_as_a_plain_forward_of_their_checkpoints(tmp_path, checkpoints, overlap,
                                                                                        monkeypatch):
    """Two steps of a dataset job with `reward: {kind: model}` and `gate: {kind: model}` (paths relative to the config's
    folder). Under `none` the reward model scores the finished rows in one padded pass; under `full` it reads the
    rollout chunk by chunk with its cache while the actor decodes, and samples carried over a step are scored whole."""
    import shutil

    from training.evaluation import generate
    from training.gate import HeldoutScorer, batch_seed
    from training.job.config import load_config
    from training.trainer import Trainer

    folder = tmp_path / "tenant"
    folder.mkdir()
    shutil.copytree(checkpoints["reward"], folder / "rm")
    shutil.copytree(checkpoints["gate"], folder / "gate-rm")
    config = _job(folder, {"kind": "model", "path": "rm"}, {"kind": "model", "path": "gate-rm"})
    monkeypatch.chdir(tmp_path)  # not the config's folder: the paths are read against it
    trained: list[list[tuple]] = []
    carried: list[bool] = []
    update = Trainer._ppo_update

    def record_update(self, samples):
        trained.append([(s.seq.prompt, list(s.seq.prompt_ids), list(s.seq.response_ids), s.score) for s in samples])
        carried.extend(s.seq.enqueued_step < self.step for s in samples)
        return update(self, samples)

    gate_calls: list[tuple] = []
    score = HeldoutScorer.score

    def record_gate(self, prompts, texts, responses, rows):
        out = score(self, prompts, texts, responses, rows)
        gate_calls.append((list(prompts), [list(r) for r in responses], list(rows), list(out)))
        return out

    monkeypatch.setattr(Trainer, "_ppo_update", record_update)
    monkeypatch.setattr(HeldoutScorer, "score", record_gate)
    trainer = Trainer(load_config(config), overlap, out_dir=None, resume=False)
    records = list(trainer.run())

    reward, gate = Oracle(checkpoints["reward"]), Oracle(checkpoints["gate"])
    assert [r.step for r in records] == [1, 2] and len(trained) == 2
    questions = {r["question"] for r in TRAIN}
    for step, samples in enumerate(trained):
        assert len(samples) == 4
        for prompt, prompt_ids, response_ids, got in samples:
            assert prompt in questions and prompt_ids == Oracle.prompt_ids(prompt)
            want = reward(prompt, response_ids)
            assert _close(got, want), (step, prompt, response_ids, got, want)
        assert _close(records[step].reward_mean, sum(reward(p, r) for p, _, r, _ in samples) / len(samples))
    assert len({s[3] for batch in trained for s in batch}) > 1  # the scores differ: the oracle is not a constant
    assert any(carried) == (overlap == "full")  # under full, step 2 trains samples begun in step 1

    # the gate at step 2: one record per held-out prompt, its score the gate checkpoint's (the proxy column the reward
    # model's) on the response the gate sampled, which its fixed seed reproduces from the policy
    (prompts, responses, rows, scores), = gate_calls
    gate_records = trainer.gate_records[2]
    assert [r.prompt_id for r in gate_records] == rows == [0, 1, 2, 3]
    assert prompts == [HELDOUT[i]["question"] for i in rows]
    assert responses == generate(trainer.actor, trainer.tok, prompts, 12, trainer.cfg.ppo.temperature,
                                 seed=batch_seed(trainer.cfg.seed, 0), render=trainer.inputs.render)
    for rec, prompt, response in zip(gate_records, prompts, responses, strict=True):
        assert rec.response_len == len(response)
        assert _close(rec.gold_score, gate(prompt, response)), (prompt, rec.gold_score, gate(prompt, response))
        assert _close(rec.proxy_score, reward(prompt, response))
    assert not any(_close(gate(p, r), reward(p, r)) for p, r in zip(prompts, responses, strict=True))
    assert _close(records[1].gold_eval, sum(r.gold_score for r in gate_records) / len(gate_records))


@pytest.mark.parametrize("role", ["reward", "gate"])
@pytest.mark.parametrize("what", ["missing", "a data file", "a folder without config.json", "config.json only"])
def test_a_path_that_is_not_a_checkpoint_exits_2_naming_the_field(tmp_path, checkpoints, capsys, monkeypatch, role,
                                                                    what):
    folder = tmp_path / "tenant"
    good = {"kind": "model", "path": str(checkpoints[role])}
    bad_path = {"missing": "nowhere", "a data file": "train.jsonl", "a folder without config.json": "empty",
                "config.json only": "bare"}[what]
    (folder / "empty").mkdir(parents=True)
    (folder / "bare").mkdir()
    (folder / "bare" / "config.json").write_text(json.dumps({"model_type": "llama", "num_labels": 1}))
    scorers = {"reward": good, "gate": {"kind": "model", "path": str(checkpoints["gate"])}}
    scorers[role] = {"kind": "model", "path": bad_path}
    config = _job(folder, scorers["reward"], scorers["gate"])
    code, _out, err = run_cli_output(["train", config, "--out", tmp_path / "run"], capsys, monkeypatch)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, err
    assert len(lines) == 1 and f"{role}.path" in lines[0] and bad_path in lines[0], err
    assert not (tmp_path / "run" / "metrics.csv").exists()
