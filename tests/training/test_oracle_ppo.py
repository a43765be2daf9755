"""PPO update oracles: what the trainer's update must see and do, checked against facts that do not come
from the trainer's own code path.

1. On-policy fact: with one epoch and one minibatch, every update is the first one after the rollout, so
   the policy being trained *is* the policy that sampled. The ratio pi/pi_old is 1 for every token (so
   approx_kl == 0 and clip_frac == 0), and the critic's recomputed values equal the rollout's.
2. A plain re-implementation (cleanrl-style, one sequence at a time, no padding, no KV cache, no
   streaming): logprobs and values from one full forward of each prompt+response, the reward model's
   sequence-classification logit, the k1 KL penalty, GAE as a backward loop, whitening, the clipped
   surrogate and the clipped value loss. Its losses and gradients must equal the trainer's.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from training.algorithms import core_algos as P
from training.job.config import TrainConfig
from training.trainer import Trainer


def oracle_config(cache_dir, **ppo) -> TrainConfig:
    return TrainConfig.model_validate({
        "seed": 5, "steps": 3, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 60,
                 "long_mean_len": 10.0},
        "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1, "num_mini_batches": 1,
                "kl_coef": 0.1, **ppo},
        "oppo": {"chunk_size": 3, "tune_chunk": False, "delta_init": 2, "adaptive_delta": False},
        "checkpoint_every": 100, "eval_every": 100, "eval_prompts": 8,
    })


class Spy:
    """Records what the trainer's update hands to the loss functions (via the `training.algorithms.core_algos`
    module)."""

    def __init__(self, monkeypatch):
        self.policy_calls: list[tuple[torch.Tensor, ...]] = []
        self.value_calls: list[tuple[torch.Tensor, ...]] = []
        real_policy, real_value = P.policy_loss, P.value_loss

        def policy_loss(logprobs, old_logprobs, advantages, mask, clip, *rest):
            self.policy_calls.append((logprobs.detach().clone(), old_logprobs.clone(), mask.clone()))
            return real_policy(logprobs, old_logprobs, advantages, mask, clip, *rest)

        def value_loss(values, old_values, returns, mask, clip):
            self.value_calls.append((values.detach().clone(), old_values.clone(), mask.clone()))
            return real_value(values, old_values, returns, mask, clip)

        monkeypatch.setattr(P, "policy_loss", policy_loss)
        monkeypatch.setattr(P, "value_loss", value_loss)


@pytest.mark.parametrize("overlap", ["none", "full"])
def test_first_update_is_on_policy(warm_start_cache, monkeypatch, overlap):
    """Three steps, each a single update: ratio == 1, approx_kl == 0, clip_frac == 0, V_new == V_rollout.
    In `full` mode, later steps train on carried-over (deferred) responses re-prefilled under new weights."""
    spy = Spy(monkeypatch)
    tr = Trainer(oracle_config(warm_start_cache), overlap)
    records = list(tr.run(3))
    assert len(spy.policy_calls) == len(spy.value_calls) == 3  # one micro-batch per step here
    for rec, (lp, old, mask), (v, v_old, vmask) in zip(records, spy.policy_calls, spy.value_calls, strict=True):
        m = mask.bool()
        assert m.sum() > 0
        assert torch.allclose(lp[m].exp() / old[m].exp(), torch.ones(int(m.sum())), atol=1e-4), rec.step
        assert rec.approx_kl == pytest.approx(0.0, abs=1e-7)
        assert rec.clip_frac == 0.0
        assert torch.allclose(v[vmask.bool()], v_old[vmask.bool()], atol=1e-5)
    if overlap == "full":  # the carried-over path really ran: some trained sample waited a step
        assert tr.deferral_counts[1] > 0


# ------------------------------------------------------------------------------------------------------
# a direct re-implementation of one update


def full_forward_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log pi(a_t | prompt, a_<t) for every response token, from one forward over the unpadded sequence."""
    ids = torch.tensor([prompt + response])
    logits = model(ids).logits[0] / temperature
    predicted_by = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]  # position i predicts token i+1
    return torch.log_softmax(predicted_by, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def full_forward_values(critic, prompt: list[int], response: list[int]) -> torch.Tensor:
    """V(s_t) for every response token t: the head on the hidden state of the last token before t."""
    ids = torch.tensor([prompt + response])
    hidden = critic.base_model(ids).last_hidden_state[0]
    return critic.score(hidden[len(prompt) - 1 : len(prompt) - 1 + len(response)]).squeeze(-1)


def plain_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """cleanrl's backward loop for one episode that ends after the last token (V after it is 0)."""
    adv, last = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv


def reference_update(samples, actor, critic, reward_model, ref, cfg):
    """Losses and gradients of one PPO update over all samples (one minibatch, token-level means)."""
    c = cfg.ppo
    new_lp, old_lp, advs, v_new, v_old, rets = [], [], [], [], [], []
    for s in samples:
        prompt, resp = s.seq.prompt_ids, s.seq.response_ids
        with torch.no_grad():
            ref_lp = full_forward_logprobs(ref, prompt, resp, c.temperature)
            score = float(reward_model(torch.tensor([prompt + resp])).logits[0, 0])
        # what the rollout recorded is what a full forward gives (reference, reward model, critic)
        assert torch.allclose(ref_lp, s.ref_logprobs, atol=1e-5)
        assert score == pytest.approx(s.score, abs=1e-5)
        lp = full_forward_logprobs(actor, prompt, resp, c.temperature)
        values = full_forward_values(critic, prompt, resp)
        assert torch.allclose(lp.detach(), s.old_logprobs, atol=1e-5)
        assert torch.allclose(values.detach(), s.values, atol=1e-5)
        rewards = [-c.kl_coef * float(a - b) for a, b in zip(s.old_logprobs, ref_lp, strict=True)]
        rewards[-1] += score
        adv = plain_gae(rewards, s.values.tolist(), c.gamma, c.lam)
        new_lp.append(lp)
        old_lp.append(s.old_logprobs)
        advs.append(torch.tensor(adv))
        v_new.append(values)
        v_old.append(s.values)
        rets.append(torch.tensor(adv) + s.values)
    new_lp, old_lp, adv = torch.cat(new_lp), torch.cat(old_lp), torch.cat(advs)
    v_new, v_old, ret = torch.cat(v_new), torch.cat(v_old), torch.cat(rets)
    adv = (adv - adv.mean()) / torch.sqrt(adv.var(unbiased=True) + 1e-8)  # whiten over the batch's tokens
    ratio = torch.exp(new_lp - old_lp)
    pg_loss = torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.cliprange, 1 + c.cliprange)).mean()
    v_clipped = v_old + torch.clamp(v_new - v_old, -c.cliprange_value, c.cliprange_value)
    v_loss = 0.5 * torch.max((v_new - ret) ** 2, (v_clipped - ret) ** 2).mean()
    actor.zero_grad()
    critic.zero_grad()
    pg_loss.backward()
    (c.vf_coef * v_loss).backward()
    grads = {f"actor.{n}": p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    grads.update({f"critic.{n}": p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None})
    return float(pg_loss.detach()), float(v_loss.detach()), grads


@pytest.mark.parametrize(("temperature", "gamma", "lam"), [(1.0, 1.0, 0.95), (0.8, 0.9, 0.9)])
def test_one_update_matches_a_plain_reimplementation(warm_start_cache, temperature, gamma, lam):
    """Step 3 of a `full`-overlap run (the actor has moved off the reference, so the KL term is live, and a
    carried-over response is in the batch): the trainer's losses and raw gradients (clipping disabled)
    equal those of `reference_update` on the same samples and the same starting weights."""
    # 1e6 is the config's upper bound: far above any gradient norm of these tiny models, so nothing is clipped
    cfg = oracle_config(warm_start_cache, max_grad_norm=1e6, temperature=temperature, gamma=gamma, lam=lam)
    tr = Trainer(cfg, "full")
    list(tr.run(2))  # two steps: move the actor off the reference, leave unfinished responses in the buffer
    seen = {}
    real_update = tr._ppo_update

    def spy_update(samples):
        seen["samples"] = samples
        seen["actor"], seen["critic"] = copy.deepcopy(tr.actor), copy.deepcopy(tr.critic)
        return real_update(samples)

    def spy_step(opt, prefix, model, real_step):
        def step(*a, **k):
            seen.setdefault("grads", {}).update(
                {f"{prefix}.{n}": p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
            return real_step(*a, **k)
        return step

    tr._ppo_update = spy_update
    tr.actor_opt.step = spy_step(tr.actor_opt, "actor", tr.actor, tr.actor_opt.step)
    tr.critic_opt.step = spy_step(tr.critic_opt, "critic", tr.critic, tr.critic_opt.step)
    rec = next(tr.run(3))
    assert rec.step == 3
    # a response begun under one policy version and finished under the next is in the batch (a deferred
    # continuation, re-prefilled under the new weights), and lengths differ (padding matters)
    assert any(len(set(s.seq.versions)) == 2 for s in seen["samples"])
    assert len({len(s.seq.response_ids) for s in seen["samples"]}) > 1
    actor, critic = seen["actor"].train(True), seen["critic"]
    assert any(float((a.detach() - b).abs().max()) > 0 for a, b in
               zip(actor.parameters(), tr.ref.parameters(), strict=True))  # KL term is not trivially 0
    pg, vf, grads = reference_update(seen["samples"], actor, critic, tr.reward_model, tr.ref, cfg)
    assert rec.loss_policy == pytest.approx(pg, abs=1e-5)
    assert rec.loss_value == pytest.approx(vf, rel=1e-4, abs=1e-6)
    assert set(grads) == set(seen["grads"])
    for name, g in grads.items():
        assert torch.allclose(seen["grads"][name], g, atol=1e-5, rtol=1e-3), name
    total = math.sqrt(sum(float(g.pow(2).sum()) for k, g in grads.items() if k.startswith("actor.")))
    assert total > 1e-3  # the check compares real gradients, not zeros
    assert rec.grad_norm == pytest.approx(total, rel=1e-4)


# ------------------------------------------------------------------------------------------------------
# hand-computed values for the branches the mutation run (`make mutate`) found unchecked in
# training/algorithms/core_algos.py


def test_masked_mean_per_row_hand_computed():
    x = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # row means over real tokens: 1.5, 4; an all-padding row is 0 (no division by zero)
    assert torch.allclose(P.masked_mean(x, mask, dim=1), torch.tensor([1.5, 4.0, 0.0]))
    assert float(P.masked_mean(x, mask)) == pytest.approx(7.0 / 3)


def test_masked_var_is_unbiased_hand_computed():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(P.masked_var(x, mask)) == pytest.approx(2.0)  # ((1-2)^2 + (3-2)^2) / (2 - 1)
    x = torch.tensor([[1.0, 2.0, 6.0]])
    assert float(P.masked_var(x, torch.ones(1, 3))) == pytest.approx(7.0)  # (4 + 1 + 9) / 2


def test_masked_whiten_hand_computed_and_keep_mean():
    x = torch.tensor([[1.0, 3.0, 5.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # mean 3, unbiased var 4, sd 2
    assert torch.allclose(P.masked_whiten(x, mask), torch.tensor([[-1.0, 0.0, 1.0, 0.0]]), atol=1e-6)
    kept = P.masked_whiten(x, mask, shift_mean=False)
    assert torch.allclose(kept, torch.tensor([[2.0, 3.0, 4.0, 0.0]]), atol=1e-6)


def test_kl_penalised_rewards_score_on_each_rows_last_token():
    logp, ref = torch.zeros(2, 3), torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    rewards, _ = P.kl_penalised_rewards(torch.tensor([2.0, 5.0]), logp, ref, mask, kl_coef=0.1)
    assert torch.equal(rewards, torch.tensor([[0.0, 0.0, 2.0], [5.0, 0.0, 0.0]]))


def test_policy_loss_ratio_uses_old_logprobs():
    old = torch.log(torch.tensor([[0.5, 0.25]]))
    new = torch.log(torch.tensor([[0.55, 0.25]]))  # ratios 1.1 and 1.0, both inside the clip range
    loss, st = P.policy_loss(new, old, torch.tensor([[1.0, -2.0]]), torch.ones(1, 2), clip=0.2)
    assert float(loss) == pytest.approx((-1.1 + 2.0) / 2)
    assert float(st["clip_frac"]) == 0.0  # equal clipped and unclipped terms are not "clipped"
    assert float(st["approx_kl"]) == pytest.approx(((1.1 - 1) - math.log(1.1)) / 2, rel=1e-4)


def test_value_loss_clips_both_ways_hand_computed():
    old = torch.tensor([[1.0, 3.5]])
    v = torch.tensor([[0.0, 4.0]])  # token 1 moved down by 1 (clipped to 0.8), token 2 up by 0.5 (to 3.7)
    ret = torch.tensor([[0.0, 2.0]])
    loss = P.value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 1: max((0-0)^2, (0.8-0)^2) = 0.64; token 2: max((4-2)^2, (3.7-2)^2) = 4
    assert float(loss) == pytest.approx(0.5 * (0.64 + 4.0) / 2)


def test_entropy_is_per_position():
    logits = torch.tensor([[0.0, 0.0], [0.0, math.log(3.0)]])  # p = (1/2, 1/2) and (1/4, 3/4)
    want = [math.log(2), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    assert torch.allclose(P.entropy_from_logits(logits), torch.tensor(want), atol=1e-6)
