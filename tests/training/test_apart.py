"""`placement: reward_apart` (training/distributed/apart.py): the reward and reference models on a process of their
own, fed every decoded chunk by the policy rank(s), give the colocated job's result at the same seed; a scorer
process that dies ends the job in one line naming it.

The oracle is the colocated job (whose streamed scores equal one full-sequence pass: test_training_engine.py): the
same `IncrementalScorer` code on the same columns, on one torch thread in both placements, so the scores, the
reference log-probs and every metric agree bit for bit here; the tolerance allowed (relative 1e-6) is for a machine
whose kernels round differently in another process, not a difference in the math."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import torch
from test_ranks import run_ranks
from tiny_job import tiny_config

from common.errors import BadInput
from training.distributed.apart import ApartScorers, ScorerFailed
from training.distributed.plan import check_world
from training.trainer import Trainer

#: metrics of a step that are timings (they differ between any two runs)
TIMINGS = ("wall_s", "rank_idle_s", "reward_fn_cpu_s")


def _config(cache, algorithm: str, placement: str, **over):
    extra = {"algorithm": algorithm, "ppo": {"group_size": 2, "batch_size": 4}} if algorithm != "ppo" else {}
    return tiny_config(cache, seed=1, n_heldout_prompts=8, placement=placement, eval_every=100, **extra, **over)


def _run(cfg, overlap: str, steps: int = 3):
    """Train; returns (trainer, records, every step's samples as (uid, score, ref log-probs))."""
    trainer = Trainer(cfg, overlap)
    seen: list = []
    update = trainer._ppo_update

    def ppo_update(samples):
        seen.append([(s.seq.uid, s.score, None if s.ref_logprobs is None else s.ref_logprobs.clone())
                     for s in samples])
        return update(samples)

    trainer._ppo_update = ppo_update
    if trainer.apart is not None:  # count the sessions the scorer process served
        trainer.apart.sessions = 0
        opened = trainer.apart.session

        def session():
            trainer.apart.sessions += 1
            return opened()

        trainer.apart.session = session
    return trainer, list(trainer.run(steps)), seen


def _numbers(rec) -> dict[str, float]:
    out = {}
    for k, v in rec.flat().items():
        if k in TIMINGS or "seconds" in k or k.startswith("phase") or k.endswith("_s"):
            continue
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[k] = float(v)
    return out


#: both algorithms and both streamed modes, in two runs of each placement (the other two pairs added 40 s to CI)
@pytest.mark.parametrize("algorithm,overlap", [("ppo", "full"), ("grpo", "intra")])
def test_reward_apart_gives_the_colocated_metrics(cache, algorithm, overlap):
    home, rec_home, seen_home = _run(_config(cache, algorithm, "colocated"), overlap)
    apart, rec_apart, seen_apart = _run(_config(cache, algorithm, "reward_apart"), overlap)
    # apart, the policy process runs no reward or reference model: the scorer process scored every rollout
    assert home.apart is None and set(home.scorers) >= {"reward"}
    assert isinstance(apart.apart, ApartScorers) and not {"ref", "reward"} & set(apart.scorers)
    assert apart.apart.sessions == 3 and apart.apart.proc is None and apart.apart.conn is None  # closed, reaped
    assert ("ref" in apart.apart.names) == (algorithm == "ppo")  # grpo pays no KL here: no reference model
    for a, b in zip(seen_home, seen_apart, strict=True):
        assert [u for u, _, _ in a] == [u for u, _, _ in b]
        assert np.allclose([s for _, s, _ in a], [s for _, s, _ in b], rtol=1e-6, atol=0)
        for (_, _, ra), (_, _, rb) in zip(a, b, strict=True):
            assert (ra is None) == (rb is None)
            if ra is not None:
                assert torch.allclose(ra, rb, rtol=1e-6, atol=1e-7)
    assert len(rec_home) == len(rec_apart) == 3
    for r1, r2 in zip(rec_home, rec_apart, strict=True):
        m1, m2 = _numbers(r1), _numbers(r2)
        assert m1.keys() == m2.keys()
        for k in m1:
            if np.isnan(m1[k]):
                assert np.isnan(m2[k]), k
            else:
                assert np.isclose(m1[k], m2[k], rtol=1e-6, atol=1e-9), (k, m1[k], m2[k])
    if overlap == "full":
        assert sum(r.deferred for r in rec_home) > 0  # carried units were re-prefilled apart too


def test_two_ranks_share_one_scorer_process(cache):
    """World 2 with the scorer apart (one process serving both ranks) trains as world 1 colocated."""
    over = {"algorithm": "grpo", "ppo": {"group_size": 2, "batch_size": 8}, "sampling": "keyed", "eval_every": 100}
    _, rec1 = run_ranks(tiny_config(cache, seed=0, n_heldout_prompts=8, **over), "intra", 1, 2)
    two, rec2 = run_ranks(tiny_config(cache, seed=0, n_heldout_prompts=8, placement="reward_apart", **over),
                          "intra", 2, 2)
    assert [r.samples_trained for r in rec1] == [r.samples_trained for r in rec2]
    assert np.allclose([r.reward_mean for r in rec1], [r.reward_mean for r in rec2], rtol=1e-5, atol=1e-7)
    assert np.allclose([r.loss_policy for r in rec1], [r.loss_policy for r in rec2], rtol=1e-4, atol=1e-6)
    assert all(t.apart.conn is None for t in two)


def test_a_killed_scorer_process_ends_the_job_in_one_line(cache):
    trainer = Trainer(_config(cache, "ppo", "reward_apart"), "intra")
    run = trainer.run(3)
    next(run)
    pid = trainer.apart.proc.pid
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ScorerFailed) as err:
        next(run)
    text = str(err.value)
    assert text == ("the scorer process (placement reward_apart) was killed by signal 9 in step 2; the policy ranks "
                    "stopped")
    assert trainer.apart.proc is None and trainer.apart.conn is None


def test_a_hung_scorer_process_ends_the_job_within_the_timeout(cache):
    trainer = Trainer(_config(cache, "grpo", "reward_apart"), "intra")
    run = trainer.run(3)
    next(run)
    proc = trainer.apart.proc
    trainer.apart.timeout_s = 2.0
    os.kill(proc.pid, signal.SIGSTOP)  # alive, silent
    with pytest.raises(ScorerFailed) as err:
        next(run)
    assert str(err.value) == ("the scorer process (placement reward_apart) hung in step 2: no answer within the 2 s "
                              "collective timeout")
    assert trainer.apart.proc is None and not proc.is_alive()  # reaped: killed, not left stopped


def test_reward_apart_is_checked_before_any_work(cache):
    check_world(_config(cache, "ppo", "reward_apart"), 1)
    check_world(_config(cache, "ppo", "reward_apart"), 2)
    with pytest.raises(BadInput, match=r"^placement: 'reward_apart' .*engine: 'continuous'"):
        check_world(_config(cache, "ppo", "reward_apart", engine="continuous"), 1)


def test_a_scorer_process_that_exits_fails_the_cli_job_in_one_line(tmp_path, cache):
    from test_ranks_launch import _config as job_yaml
    from test_ranks_launch import _train

    cfg = job_yaml(tmp_path, cache, placement="reward_apart", fault={"kind": "scorer_exit", "at_step": 1})
    done, _ = _train([str(cfg), "--overlap", "intra", "--out", "run"], tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [ln for ln in done.stdout.splitlines() if "failed" in ln]
    assert len(lines) == 1, done.stdout[-2000:]
    assert "the scorer process (placement reward_apart) exited with code 3 in step 2" in lines[0], lines[0]
    assert "Traceback" not in done.stdout + done.stderr
