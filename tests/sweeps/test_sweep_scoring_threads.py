"""Two sweep trials score their checkpoints at the same time (one thread each): every checkpoint must get the score
it gets alone. transformers' `from_pretrained` is not thread-safe: without the runner's scoring lock, loads that
overlap get corrupted weights, so a trial's kept checkpoint depended on how its scoring overlapped the other
trial's. Oracle: the same checkpoints scored one after another in this thread, before any thread starts."""

from __future__ import annotations

import threading

import pytest
from sweep_helpers import BASE

from training.job.config import TrainConfig
from training.job.lifecycle import JobHooks, checkpoints
from training.trainer import Trainer


def varied_gold(prompt: str, text: str, cfg) -> float:
    """A world scorer that moves with every response (the tiny model's bytes are all unparseable to the real one)."""
    return (sum(text.encode()) % 11) / 5.0 - 1.0


def test_checkpoints_scored_in_two_trial_threads_get_their_sequential_scores(tmp_path, monkeypatch):
    from sweeps.runner import _TrialHooks

    monkeypatch.setattr("training.gate.gold_score", varied_gold)
    cfg = TrainConfig.model_validate({**BASE, "steps": 8})
    list(Trainer(cfg, overlap="none", out_dir=tmp_path, resume=False).run(8))
    ckpts = checkpoints(tmp_path)
    assert len(ckpts) == 4
    alone = {s["checkpoint"]: s["eval_score"] for s in JobHooks().score(None, ckpts)}
    assert len(set(alone.values())) > 1  # the checkpoints differ: a wrong load shows

    got: list[list[dict]] = [[], []]

    def trial(i: int) -> None:
        for _ in range(3):
            got[i] += _TrialHooks().score(None, ckpts if i == 0 else ckpts[::-1])

    threads = [threading.Thread(target=trial, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rows in got:
        assert len(rows) == 3 * len(ckpts)
        for r in rows:
            assert r["eval_score"] == pytest.approx(alone[r["checkpoint"]]), r
