"""A tenant's job folder as a new user writes one, outside the repository: GSM8K-format train and held-out files, the
tenant's own reward module (`my_reward.py`, with a function that checks its columns against the tenant's copy of the
rows, one that starts failing at step 3, and an exact-match gate), and a tiny dataset config naming them. Shared by
the tests of every entry point a tenant's job goes through (train, the rlhf-job flow and deployment, a round, a
sweep)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

#: questions and answers the tenant's reward function checks its columns against (an independent oracle of the row
#: alignment: the trainer never sees this mapping)
ROWS = [{"question": f"What is {a} plus {b}?", "answer": f"{a}+{b} = <<{a}+{b}={a + b}>>{a + b}\n#### {a + b}",
         "difficulty": a % 3} for a in range(1, 9) for b in range(1, 4)]

REWARD = '''
import json, os
ROWS = {r["question"]: r for r in json.load(open("rows.json"))}

def score(prompts, completions, answer, difficulty, **_):
    out = []
    for p, c, a, d in zip(prompts, completions, answer, difficulty):
        if ROWS[p]["answer"] != a or ROWS[p]["difficulty"] != d:   # the columns must be the prompt's own row
            raise AssertionError(f"misaligned row for {p!r}")
        out.append(1.0 if len(c) % 2 else 0.0)
    return out

def flaky(prompts, completions, trainer_state, **_):
    # good for the first two steps, then raises on every sample (TRL's global_step: the steps completed before)
    if trainer_state.global_step >= 2:
        raise ValueError("the answer checker crashed")
    return [0.5] * len(completions)

def exact(prompts, completions, answer, **_):
    return [float(c.strip().endswith(a.split("#### ")[-1])) for c, a in zip(completions, answer)]
'''


def write_job(folder: Path, reward_ref: str, **over) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[:20]))
    (folder / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS[20:]))
    (folder / "rows.json").write_text(json.dumps(ROWS))
    (folder / "my_reward.py").write_text(REWARD)
    cfg = {"steps": 4, "cache_dir": str(folder / "cache"),
           "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
           "task": {"kind": "dataset", "train": "train.jsonl", "heldout": "heldout.jsonl", "prompt_key": "question",
                    "sft_key": "answer", "max_prompt_tokens": 64, "sft_steps": 4},
           "reward": {"kind": "function", "ref": reward_ref, "timeout_s": 60},
           "gate": {"kind": "function", "ref": "my_reward.py:exact"},
           "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1},
           "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 4}
    for k, v in over.items():
        cfg[k] = {**cfg.get(k, {}), **v} if isinstance(v, dict) else v
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
