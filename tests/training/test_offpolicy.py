"""Off-policy correction oracles (training/algorithms/core_algos.py: importance weights, ESS, the corrected surrogate;
the trainer's recorded behaviour log-probs and its corrected update).

1. No staleness: the importance weights are exactly 1 and the tis / decoupled losses and gradients equal standard
   PPO, both against `policy_loss` and against a plain cleanrl-style clipped surrogate written here.
2. A hand-built two-version batch: weights, ESS and the two corrected losses and their gradients computed by hand.
3. The trainer: the behaviour log-probs it records are what the policy version that sampled each token gives in
   a full forward (kept copies of the actor per step); with correction on and no carried tokens its update
   equals plain PPO; with carried tokens its loss and gradients equal a re-implementation that weights each
   token by pi_prox/pi_behav from full forwards.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from training.algorithms import core_algos as P
from training.job.config import TrainConfig
from training.trainer import Trainer


def plain_clipped_surrogate(new_lp, old_lp, adv, clip):
    """cleanrl's ppo.py policy loss over a flat vector of tokens (no mask, no weights)."""
    ratio = torch.exp(new_lp - old_lp)
    return torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - clip, 1 + clip)).mean()


# ------------------------------------------------------------------------------------------------------
# 1. no staleness: weights 1, corrected == standard PPO


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_no_staleness_weights_are_one_and_loss_and_gradient_equal_ppo(correction):
    g = torch.Generator().manual_seed(0)
    old = torch.log_softmax(torch.randn(3, 5, 7, generator=g), -1)[..., 0]  # log-probs of some tokens
    adv = torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]], dtype=torch.float32)
    shift = 0.3 * torch.randn(3, 5, generator=g)  # some tokens inside, some outside the clip range
    w = P.importance_weights(old, old.clone(), mask, cap=2.0, correction=correction)
    assert torch.equal(w, mask)  # exactly 1 on every real token, 0 on padding

    new_a = (old + shift).requires_grad_(True)
    new_b = (old + shift).requires_grad_(True)
    new_c = (old + shift).requires_grad_(True)
    corrected, st = P.corrected_policy_loss(new_a, old, old.clone(), adv, mask, 0.2, 2.0, correction)
    standard, st_std = P.policy_loss(new_b, old, adv, mask, 0.2)
    m = mask.bool()
    plain = plain_clipped_surrogate(new_c[m], old[m], adv[m], 0.2)
    assert float(st["clip_frac"]) > 0  # the clip is really exercised
    assert float(corrected.detach()) == float(standard.detach())
    assert float(corrected) == pytest.approx(float(plain), abs=1e-7)
    corrected.backward()
    standard.backward()
    plain.backward()
    assert torch.equal(new_a.grad, new_b.grad)
    assert torch.allclose(new_a.grad, new_c.grad, atol=1e-8)
    assert float(new_a.grad.abs().sum()) > 0


# ------------------------------------------------------------------------------------------------------
# 2. a hand-built two-version batch


def two_version_batch():
    """Four tokens of one row: two sampled by the current policy (pi_behav == pi_prox) and two carried over from
    the previous version, whose pi_behav differs: pi_prox/pi_behav = 1, 1, 0.4/0.2 = 2, 0.1/0.2 = 0.5."""
    prox = torch.log(torch.tensor([[0.5, 0.25, 0.4, 0.1]]))
    behav = torch.log(torch.tensor([[0.5, 0.25, 0.2, 0.2]]))
    adv = torch.tensor([[1.0, -1.0, 2.0, 4.0]])
    return prox, behav, adv, torch.ones(1, 4)


def test_two_version_batch_weights_and_ess_by_hand():
    prox, behav, _, mask = two_version_batch()
    raw = torch.exp(prox - behav)
    assert torch.allclose(raw, torch.tensor([[1.0, 1.0, 2.0, 0.5]]))
    # ESS = (sum w)^2 / (n sum w^2) = 4.5^2 / (4 * (1 + 1 + 4 + 0.25)) = 20.25 / 25
    assert P.effective_sample_size(raw, mask) == pytest.approx(0.81)
    # cap 1.5: tis truncates 2 -> 1.5; decoupled drops the token over the cap
    tis = P.importance_weights(prox, behav, mask, 1.5, "tis")
    dec = P.importance_weights(prox, behav, mask, 1.5, "decoupled")
    assert torch.allclose(tis, torch.tensor([[1.0, 1.0, 1.5, 0.5]]))
    assert torch.allclose(dec, torch.tensor([[1.0, 1.0, 0.0, 0.5]]))
    assert P.effective_sample_size(tis, mask) == pytest.approx(4.0**2 / (4 * (1 + 1 + 2.25 + 0.25)))
    # one token carrying all the weight: ESS = 1/n; padding does not count
    assert P.effective_sample_size(torch.tensor([[3.0, 0.0, 0.0, 9.0]]), torch.tensor([[1, 1, 1, 0]])) == (
        pytest.approx(1 / 3))
    assert torch.equal(P.importance_weights(prox, behav, mask, 1.5, "none"), mask)


@pytest.mark.parametrize(("correction", "weights"),
                         [("tis", [1.0, 1.0, 1.5, 0.5]), ("decoupled", [1.0, 1.0, 0.0, 0.5])])
def test_two_version_batch_loss_and_gradient_by_hand(correction, weights):
    prox, behav, adv, mask = two_version_batch()
    new = prox.clone().requires_grad_(True)  # pi_theta == pi_prox: ratio 1, inside the clip range
    loss, st = P.corrected_policy_loss(new, prox, behav, adv, mask, 0.2, 1.5, correction)
    # per token -w * A * ratio, token mean: tis (-1 + 1 - 3 - 2) / 4, decoupled (-1 + 1 + 0 - 2) / 4
    want = sum(-w * a for w, a in zip(weights, [1.0, -1.0, 2.0, 4.0], strict=True)) / 4
    assert float(loss) == pytest.approx(want)
    loss.backward()
    # d/d log pi_theta of -w A exp(log pi_theta - log pi_prox) at ratio 1 is -w A, over 4 tokens
    assert torch.allclose(new.grad, torch.tensor([[-w * a / 4 for w, a in zip(weights, [1.0, -1.0, 2.0, 4.0],
                                                                                strict=True)]]))
    assert float(st["clip_frac"]) == 0.0


def test_clip_is_centred_on_the_proximal_policy_not_the_behaviour_one():
    """A carried token whose pi_theta moved 30% above pi_prox (A > 0) is clipped against pi_prox: no gradient
    through it, whatever pi_behav was."""
    prox = torch.log(torch.tensor([[0.2]]))
    behav = torch.log(torch.tensor([[0.4]]))  # w = 0.5
    new = torch.log(torch.tensor([[0.26]])).requires_grad_(True)
    loss, st = P.corrected_policy_loss(new, prox, behav, torch.tensor([[1.0]]), torch.ones(1, 1), 0.2, 2.0, "tis")
    assert float(loss) == pytest.approx(-0.5 * 1.2)  # -w * A * clip(1.3, 0.8, 1.2)
    loss.backward()
    assert float(new.grad) == 0.0 and float(st["clip_frac"]) == 1.0


def test_unknown_correction_is_refused():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="correction"):
        P.importance_weights(x, x, torch.ones(1, 2), 2.0, "vtrace")


# ------------------------------------------------------------------------------------------------------
# 3. the trainer


def offpolicy_config(cache_dir, correction="decoupled", **oppo) -> TrainConfig:
    return TrainConfig.model_validate({
        "seed": 5, "steps": 4, "cache_dir": str(cache_dir),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 60,
                 "long_mean_len": 10.0},
        # clipping disabled (1e6 is the config's bound) so raw gradients compare
        "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1, "num_mini_batches": 1,
                "kl_coef": 0.1, "max_grad_norm": 1e6},
        "oppo": {"chunk_size": 3, "tune_chunk": False, "delta_init": 2, "adaptive_delta": False,
                 "correction": correction, "is_cap": 1.5, **oppo},
        "checkpoint_every": 100, "eval_every": 100, "eval_prompts": 8,
    })


def full_logprobs(model, prompt, response, temperature=1.0):
    ids = torch.tensor([prompt + response])
    logits = model(ids).logits[0] / temperature
    pred = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    return torch.log_softmax(pred, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


class StepSpy:
    """Keeps the actor as it was at the start of every step and the samples each update trained on."""

    def __init__(self, tr: Trainer):
        self.actors: dict[int, torch.nn.Module] = {}
        self.samples: dict[int, list] = {}
        real_sync, real_update = tr._sync, tr._ppo_update

        def sync():
            self.actors[tr.step] = copy.deepcopy(tr.actor).eval()
            return real_sync()

        def update(samples):
            self.samples[tr.step] = list(samples)
            return real_update(samples)

        tr._sync, tr._ppo_update = sync, update


def test_recorded_behaviour_logprobs_come_from_the_version_that_sampled(warm_start_cache):
    tr = Trainer(offpolicy_config(warm_start_cache, correction="none"), "full")
    spy = StepSpy(tr)
    records = list(tr.run(4))
    carried = 0
    for step, samples in spy.samples.items():
        for s in samples:
            resp, versions = s.seq.response_ids, s.seq.versions
            assert len(s.behav_logprobs) == len(resp) == len(versions)
            with torch.no_grad():
                for v in set(versions):
                    want = full_logprobs(spy.actors[v], s.seq.prompt_ids, resp)
                    idx = torch.tensor([t for t, x in enumerate(versions) if x == v])
                    assert torch.allclose(s.behav_logprobs[idx], want[idx], atol=1e-5), (step, v)
                # old_logprobs are the proximal (start-of-step) policy's, carried tokens included
                assert torch.allclose(s.old_logprobs, full_logprobs(spy.actors[step], s.seq.prompt_ids, resp),
                                      atol=1e-5)
            carried += sum(v < step for v in versions)
    assert carried > 0  # the carried path ran
    # the record's staleness view agrees with the versions the test reads itself
    for rec in records:
        toks = [(rec.step - 1) - v for s in spy.samples[rec.step - 1] for v in s.seq.versions]
        assert rec.staleness_max == max(toks)
        assert rec.stale_frac == pytest.approx(sum(t > 0 for t in toks) / len(toks))


def reference_policy_update(samples, actor, cfg, correction):
    """Policy loss and actor gradients of one update, one sequence at a time: plain GAE advantages from the
    rollout's values and rewards, pi_prox and pi_behav from the samples, each token weighted as the correction
    says (weights computed here from their definition, not with training.algorithms.core_algos)."""
    c, cap = cfg.ppo, cfg.oppo.is_cap
    new_lp, prox_lp, weights, advs = [], [], [], []
    for s in samples:
        resp = s.seq.response_ids
        rewards = [-c.kl_coef * float(a - b) for a, b in zip(s.old_logprobs, s.ref_logprobs, strict=True)]
        rewards[-1] += s.score
        adv, last = [0.0] * len(rewards), 0.0
        for t in reversed(range(len(rewards))):
            nv = float(s.values[t + 1]) if t + 1 < len(rewards) else 0.0
            last = rewards[t] + c.gamma * nv - float(s.values[t]) + c.gamma * c.lam * last
            adv[t] = last
        new_lp.append(full_logprobs(actor, s.seq.prompt_ids, resp, c.temperature))
        prox_lp.append(s.old_logprobs)
        w = []
        for p, b in zip(s.old_logprobs.tolist(), s.behav_logprobs.tolist(), strict=True):
            r = math.exp(p - b)
            if correction == "tis":
                w.append(min(r, cap))
            elif correction == "decoupled":
                w.append(r if r <= cap else 0.0)
            else:
                w.append(1.0)
        weights.append(torch.tensor(w))
        advs.append(torch.tensor(adv))
    new_lp, prox_lp, w, adv = torch.cat(new_lp), torch.cat(prox_lp), torch.cat(weights), torch.cat(advs)
    adv = (adv - adv.mean()) / torch.sqrt(adv.var(unbiased=True) + 1e-8)
    ratio = torch.exp(new_lp - prox_lp)
    loss = (w * torch.max(-adv * ratio, -adv * torch.clamp(ratio, 1 - c.cliprange, 1 + c.cliprange))).mean()
    actor.zero_grad()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in actor.named_parameters() if p.grad is not None}
    return float(loss.detach()), grads, w


@pytest.mark.parametrize(("overlap", "correction"), [("none", "decoupled"), ("full", "decoupled"), ("full", "tis")])
def test_trainer_update_matches_a_plain_reimplementation(warm_start_cache, overlap, correction):
    """Step 3's update (the actor has moved, so carried tokens in `full` have pi_prox != pi_behav): loss and raw
    actor gradients equal `reference_policy_update`. Sequential PPO has no carried tokens, so there the
    corrected update is plain PPO and every weight is 1."""
    cfg = offpolicy_config(warm_start_cache, correction=correction)
    tr = Trainer(cfg, overlap)
    list(tr.run(2))
    seen: dict = {}
    real_update, real_step = tr._ppo_update, tr.actor_opt.step

    def spy_update(samples):
        seen["samples"], seen["actor"] = samples, copy.deepcopy(tr.actor)
        return real_update(samples)

    def spy_step(*a, **k):
        seen["grads"] = {n: p.grad.clone() for n, p in tr.actor.named_parameters() if p.grad is not None}
        return real_step(*a, **k)

    tr._ppo_update, tr.actor_opt.step = spy_update, spy_step
    rec = next(tr.run(3))
    pg, grads, w = reference_policy_update(seen["samples"], seen["actor"].train(True), cfg, correction)
    assert rec.loss_policy == pytest.approx(pg, abs=1e-5)
    assert set(grads) == set(seen["grads"])
    for name, g in grads.items():
        assert torch.allclose(seen["grads"][name], g, atol=1e-5, rtol=1e-3), name
    assert sum(float(g.abs().sum()) for g in grads.values()) > 1e-4
    if overlap == "none":
        assert torch.equal(w, torch.ones_like(w)) and rec.is_ess == 1.0 and rec.stale_frac == 0.0
    else:
        assert (w != 1.0).any() and rec.stale_frac > 0  # the weights really differ from 1 here
        raw = torch.cat([torch.exp(s.old_logprobs - s.behav_logprobs) for s in seen["samples"]]).double()
        assert rec.is_ess == pytest.approx(float(raw.sum() ** 2 / (len(raw) * (raw**2).sum())), rel=1e-6)
        assert rec.is_weight_max == pytest.approx(float(raw.max()), rel=1e-6)
