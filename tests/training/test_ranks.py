"""A job on several ranks (training/distributed/) gives the one-rank result: the same samples, the full batch's
gradient, the same parameters after K steps, under on-policy PPO/GRPO and under inter-step overlap with carried
units. The ranks here are threads of the test process, each a Trainer joined to a real gloo group on 127.0.0.1 (the
launcher-agnostic training function; the spawn launcher has its own tests in test_ranks_launch.py).

The gradient oracle is not the trainer's code: each sample is forwarded alone (no padding, no micro-batches), GRPO's
advantage is written out with numpy, and the loss is the token mean of -A * ratio over the whole batch."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from tiny_job import tiny_config

from common.errors import BadInput
from training.distributed.launch import Rendezvous, free_port
from training.distributed.plan import assign_units, check_world, split_minibatch
from training.rollout.streaming import Sequence
from training.trainer import Trainer


def run_ranks(cfg, overlap: str, gpus: int, steps: int, out_dir=None, patch=None):
    """Train `steps` steps on `gpus` thread ranks (one plain Trainer at 1); returns (trainers, rank 0's records)."""
    if gpus == 1:
        trainers = [Trainer(cfg, overlap, out_dir)]
    else:
        port = free_port()
        trainers = [Trainer(cfg, overlap, out_dir, gpus=gpus, world=Rendezvous(r, gpus, "127.0.0.1", port))
                    for r in range(gpus)]
    if patch:
        for t in trainers:
            patch(t)
    records: list = [None] * len(trainers)
    errors: list = []

    def go(r):
        try:
            records[r] = list(trainers[r].run(steps))
        except BaseException as err:  # noqa: BLE001 - surfaced below
            errors.append(err)

    threads = [threading.Thread(target=go, args=(r,)) for r in range(len(trainers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=600)
    if errors:
        raise errors[0]
    return trainers, records[0]


def flat_params(module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def record_first_grads(store: dict):
    """Patch a trainer so its first optimizer step records the actor's gradient (after the all-reduce, before the
    step) and the step's samples."""
    def patch(trainer):
        opt_step, update = trainer.actor_opt.step, trainer._ppo_update

        def step(*a, **k):
            store.setdefault(trainer.world.rank, torch.cat([p.grad.reshape(-1).clone()
                                                            for p in trainer.actor.parameters()]))
            return opt_step(*a, **k)

        def ppo_update(samples):
            store.setdefault(("samples", trainer.world.rank), samples)
            store.setdefault(("before", trainer.world.rank),
                             {k: v.clone() for k, v in trainer.actor.state_dict().items()})
            return update(samples)

        trainer.actor_opt.step = step
        trainer._ppo_update = ppo_update
    return patch


def oracle_grpo_grad(trainer, samples, state) -> tuple[torch.Tensor, float]:
    """The full batch's GRPO gradient by hand: group-normalised advantages (numpy), every sample forwarded alone,
    loss = sum over all tokens of -A * exp(lp - old_lp) / all tokens. Also returns that loss."""
    model = trainer.actor
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(state)
    g = trainer.group_size
    by_group = sorted(samples, key=lambda s: (s.seq.group, s.seq.uid))
    r = np.array([s.score for s in by_group], dtype=np.float64).reshape(-1, g)
    adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4)).reshape(-1)
    model.zero_grad(set_to_none=True)
    n_tok = sum(len(s.seq.response_ids) for s in by_group)
    total = 0.0
    for a, s in zip(adv, by_group, strict=True):
        ids = torch.tensor([s.seq.prompt_ids + s.seq.response_ids])
        logits = model(input_ids=ids).logits[0].float()
        p = len(s.seq.prompt_ids)
        lp = torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, ids[0, p:, None]).squeeze(-1)
        loss = (-float(a) * (lp - s.old_logprobs).exp()).sum() / n_tok
        loss.backward()
        total += float(loss.detach())
    grad = torch.cat([p.grad.reshape(-1).clone() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    model.load_state_dict(saved)
    return grad, total


@pytest.fixture(scope="module")
def grpo_cfg(cache):
    return tiny_config(cache, seed=3, n_heldout_prompts=8, algorithm="grpo", sampling="keyed", eval_every=100,
                       ppo={"group_size": 2, "batch_size": 8, "num_ppo_epochs": 1, "num_mini_batches": 1,
                            "max_grad_norm": 1e6})


def test_world_2_gives_the_full_batch_gradient_and_the_same_parameters(grpo_cfg):
    got1, got2 = {}, {}
    one, rec1 = run_ranks(grpo_cfg, "none", 1, 3, patch=record_first_grads(got1))
    two, rec2 = run_ranks(grpo_cfg, "none", 2, 3, patch=record_first_grads(got2))
    samples = got1[("samples", 0)]
    # the same samples, drawn by sample and position, not by rank
    assert [(s.seq.uid, s.seq.response_ids) for s in samples] == \
        [(s.seq.uid, s.seq.response_ids) for s in got2[("samples", 0)]]
    assert {s.seq.rank for s in got2[("samples", 0)]} == {0, 1}  # both ranks rolled out and back-propagated
    oracle, loss_before = oracle_grpo_grad(one[0], samples, got1[("before", 0)])
    assert float(oracle.norm()) > 0
    assert rel(got1[0], oracle) < 1e-4
    for r in (0, 1):
        assert rel(got2[r], oracle) < 1e-4, f"rank {r}'s gradient is not the full batch's"
    # K = 3 steps: the same parameters on every rank and at both world sizes
    p1 = flat_params(one[0].actor)
    for t in two:
        assert rel(flat_params(t.actor), p1) < 1e-4
    assert [r.samples_trained for r in rec1] == [r.samples_trained for r in rec2]
    assert np.allclose([r.reward_mean for r in rec1], [r.reward_mean for r in rec2], atol=1e-6)
    assert [r.world_size for r in rec2] == [2, 2, 2] and all(r.rank_idle_s >= 0 for r in rec2)
    # both improve: the step-1 batch's surrogate loss is lower after the update than before it
    for t in (one[0], two[0]):
        after = {k: v.clone() for k, v in t.actor.state_dict().items()}
        _, loss_after = oracle_grpo_grad(t, samples, after)
        assert loss_after < loss_before


@pytest.mark.parametrize("algorithm,overlap", [("ppo", "full"), ("grpo", "inter")])
def test_inter_step_overlap_chooses_the_same_units_over_ranks(cache, algorithm, overlap):
    over = {"algorithm": algorithm, "ppo": {"group_size": 2, "batch_size": 8}} if algorithm == "grpo" else {}
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, sampling="keyed", eval_every=100, **over)
    one, rec1 = run_ranks(cfg, overlap, 1, 3)
    two, rec2 = run_ranks(cfg, overlap, 2, 3)
    assert [(r.samples_trained, r.deferred, r.tokens_generated) for r in rec1] == \
        [(r.samples_trained, r.deferred, r.tokens_generated) for r in rec2]
    assert sum(r.deferred for r in rec1) > 0  # units were carried
    assert np.allclose([r.loss_policy for r in rec1], [r.loss_policy for r in rec2], rtol=1e-4, atol=1e-6)
    # carried units stay on their rank and every rank's carry is in every rank's buffer
    assert [(s.uid, s.response_ids) for s in one[0].buffer] == [(s.uid, s.response_ids) for s in two[0].buffer]
    assert [s.uid for s in two[0].buffer] == [s.uid for s in two[1].buffer]
    for t in two:
        assert rel(flat_params(t.actor), flat_params(one[0].actor)) < 1e-4


def test_resume_at_another_world_size(cache, tmp_path):
    """A checkpoint of a 2-rank run (with carried units) resumes on 1 rank and continues as the uninterrupted 1-rank
    run does; and a 1-rank checkpoint resumes on 2."""
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, sampling="keyed", eval_every=100, steps=4)
    _, whole = run_ranks(cfg, "full", 1, 4)
    _, first = run_ranks(cfg, "full", 2, 2, out_dir=tmp_path / "a")
    assert first[-1].deferred > 0
    _, rest = run_ranks(cfg, "full", 1, 4, out_dir=tmp_path / "a")
    _, first_b = run_ranks(cfg, "full", 1, 2, out_dir=tmp_path / "b")
    _, rest_b = run_ranks(cfg, "full", 2, 4, out_dir=tmp_path / "b")
    for part in (first + rest, first_b + rest_b):
        assert [r.step for r in part] == [1, 2, 3, 4]
        assert [(r.samples_trained, r.deferred, r.tokens_generated) for r in part] == \
            [(r.samples_trained, r.deferred, r.tokens_generated) for r in whole]
        assert np.allclose([r.reward_mean for r in part], [r.reward_mean for r in whole], atol=1e-5)


def _seq(uid, group, prompt_len, resp=0, rank=-1):
    return Sequence(uid=uid, group=group, prompt="p", prompt_ids=[1] * prompt_len, enqueued_step=0,
                    response_ids=[2] * resp, rank=rank)


def test_units_assigned_whole_balanced_and_carried_units_stay():
    # grpo groups of 2: group 0 carried on rank 1, the fresh ones by expected tokens
    seqs = [_seq(0, 0, 5, 20, rank=1), _seq(1, 0, 5, 3, rank=1)]
    seqs += [_seq(2 + k, 2 + 2 * (k // 2), 4 + 3 * (k // 2)) for k in range(6)]
    owners = assign_units(seqs, 2, expected_new=8.0)
    assert owners[0] == 1  # carried: stays
    for s in seqs:  # whole groups: one owner per group id
        assert owners[s.group] in (0, 1)
    load = [0.0, 0.0]
    for g, r in owners.items():
        load[r] += sum(len(s.prompt_ids) + max(len(s.response_ids), 8.0) for s in seqs if s.group == g)
    assert abs(load[0] - load[1]) <= max(len(s.prompt_ids) + 8 for s in seqs) * 2
    # a rank never gets half a group
    assert len(owners) == len({s.group for s in seqs})


def test_a_minibatch_is_split_over_the_ranks_by_tokens_each_sample_once():
    # by hand: costs 9, 7, 6, 5, 3 over 2 ranks, longest first to the least loaded: 9->0 (9, 0), 7->1 (9, 7),
    # 6->1 (9, 13), 5->0 (14, 13), 3->1 (14, 16)
    assert split_minibatch([40, 41, 42, 43, 44], [9, 7, 6, 5, 3], 2) == [[40, 43], [41, 42, 44]]
    rng = np.random.default_rng(0)
    for world in (2, 3, 4):
        idx = rng.permutation(64).tolist()
        costs = rng.integers(20, 400, size=64).tolist()
        parts = split_minibatch(idx, costs, world)
        assert sorted(i for p in parts for i in p) == sorted(idx)  # every sample on exactly one rank
        assert all(p == [i for i in idx if i in p] for p in parts)  # each part keeps the minibatch's order
        load = [sum(costs[idx.index(i)] for i in p) for p in parts]
        assert max(load) - min(load) <= max(costs)  # the greedy's bound
    assert split_minibatch([3, 1], [5, 5], 4) == [[3], [1], [], []]


def test_samples_cross_ranks_as_arrays_and_come_back_as_the_same_tensors():
    import pickle

    from training.distributed.ranks import _from_wire, _to_wire
    from training.rollout.streaming import Sample

    lp = torch.randn(5)
    kept = torch.randn(5).to(torch.bfloat16)  # no numpy dtype: crosses as a tensor
    s = Sample(_seq(7, 3, 4, 5), old_logprobs=lp, ref_logprobs=None, values=kept, score=0.5, behav_logprobs=lp * 2)
    wire = _to_wire([s])
    assert isinstance(wire[0].old_logprobs, np.ndarray) and wire[0].values is kept
    (back,) = _from_wire(pickle.loads(pickle.dumps(wire)))
    assert torch.equal(back.old_logprobs, lp) and torch.equal(back.behav_logprobs, lp * 2)
    assert back.ref_logprobs is None and torch.equal(back.values, kept) and back.seq == s.seq
    assert isinstance(s.old_logprobs, torch.Tensor)  # the rank's own sample is left as it was


def test_a_batch_that_does_not_divide_over_the_ranks_is_bad_input(cache):
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8)  # batch 4
    check_world(cfg, 2)
    with pytest.raises(BadInput, match=r"^ppo\.batch_size: .*3 ranks"):
        check_world(cfg, 3)
    grpo = tiny_config(cache, seed=0, n_heldout_prompts=8, algorithm="grpo", ppo={"group_size": 2, "batch_size": 6})
    with pytest.raises(BadInput, match=r"^ppo\.group_size: .*3 groups.*2 ranks"):
        check_world(grpo, 2)
    with pytest.raises(BadInput, match=r"^sampling: "):
        check_world(tiny_config(cache, seed=0, n_heldout_prompts=8, sampling="stream"), 2)
    with pytest.raises(BadInput, match=r"^engine: "):
        check_world(tiny_config(cache, seed=0, n_heldout_prompts=8, engine="continuous"), 2)


def test_a_reward_functions_figures_over_ranks_are_the_global_batchs():
    """Oracle by hand: rank 0 scored 6 samples with a mean of 0.5 for `reward_fn/f/mean`, rank 1 scored 2 with 1.0:
    the batch's mean is (6 x 0.5 + 2 x 1.0) / 8 = 0.625, not the ranks' plain mean 0.75 nor rank 0's 0.5. A name only
    one rank logged, or logged as NaN by the other, is that rank's value."""
    from training.distributed.ranks import reward_metrics_over_ranks

    got = reward_metrics_over_ranks([({"reward_fn/f/mean": 0.5, "reward_fn/len": 3.0}, 6),
                                     ({"reward_fn/f/mean": 1.0, "reward_fn/len": float("nan"), "reward_fn/x": 2.0}, 2)])
    assert got == {"reward_fn/f/mean": 0.625, "reward_fn/len": 3.0, "reward_fn/x": 2.0}
    assert reward_metrics_over_ranks([({}, 4), ({}, 4)]) == {}
