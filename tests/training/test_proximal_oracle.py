"""The off-policy path an out-of-process engine takes, against independent oracles.

Whenever the engine is not the actor itself at the trainer's temperature (a frozen sync, a temperature mismatch,
vLLM), the trainer recomputes the proximal log-probs with `Trainer._proximal_logprobs`. Here:
1. its output equals, for every trained token, one plain forward of the actor per sample on prompt + response
   (no padding, no micro-batching) with log_softmax(logits / temperature) taken at the response positions, at a
   temperature other than 1 and with samples of different prompt and response lengths;
2. in a step whose engine samples at another temperature (the `behaviour_mismatch` fault), the surrogate is
   handed those proximal log-probs, and the truncated importance weights it applies are min(pi_prox / pi_behav,
   cap) computed here by hand from the oracle's pi_prox and the recorded pi_behav.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tiny_job import tiny_config

from training.algorithms import core_algos as P
from training.models import format_prompt
from training.rollout.streaming import Sample, Sequence
from training.trainer import Trainer

TEMPERATURE = 0.7


@torch.no_grad()
def oracle_logprobs(actor, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log pi(response[t] | prompt + response[:t]) from one forward of the unpadded sequence."""
    ids = torch.tensor([prompt + response])
    logits = actor(input_ids=ids).logits[0].float() / temperature
    pred = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    return torch.log_softmax(pred, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def _config(cache, **over):
    return tiny_config(cache, seed=9, n_heldout_prompts=8, eval_every=100,
                       ppo={"temperature": TEMPERATURE, "max_new_tokens": 14}, **over)


def _spy_updates(tr: Trainer) -> dict:
    """Keeps the samples and a copy of the actor (the proximal policy) at the start of each update."""
    seen: dict = {}
    real = tr._ppo_update

    def update(samples):
        seen["samples"], seen["actor"] = list(samples), copy.deepcopy(tr.actor).eval()
        return real(samples)

    tr._ppo_update = update
    return seen


def test_proximal_logprobs_equal_one_plain_forward_per_sample(cache):
    tr = Trainer(_config(cache), "full")
    list(tr.run(1))  # the actor has moved off the base policy
    # responses of different lengths after prompts of different lengths (left and right padding in one batch)
    gen = torch.Generator().manual_seed(3)
    prompts = sorted((tr.inputs.prompt("train", i) for i in range(12)), key=len)[::3]
    samples = []
    for k, (prompt, n) in enumerate(zip(prompts, [13, 1, 7, 4], strict=True)):
        resp = torch.randint(3, tr.tok.vocab_size, (n,), generator=gen).tolist()
        seq = Sequence(uid=k, group=k, prompt=prompt, prompt_ids=tr.tok.encode(format_prompt(prompt)),
                       enqueued_step=0, response_ids=resp, versions=[0] * n)
        samples.append(Sample(seq=seq, old_logprobs=torch.zeros(n), ref_logprobs=torch.zeros(n), values=None,
                              score=0.0))
    lengths = [len(s.seq.response_ids) for s in samples]
    assert len({len(s.seq.prompt_ids) for s in samples}) > 1
    T = max(lengths) + 2  # wider than any response: the tail must stay 0
    got = tr._proximal_logprobs(samples, T)
    assert got.shape == (len(samples), T)
    for i, s in enumerate(samples):
        want = oracle_logprobs(tr.actor, s.seq.prompt_ids, s.seq.response_ids, TEMPERATURE)
        L = len(want)
        assert torch.allclose(got[i, :L].cpu(), want, atol=1e-5), i
        assert torch.equal(got[i, L:].cpu(), torch.zeros(T - L))
    # the oracle is sharp: the same forward at temperature 1, or shifted by one token, is far from it
    s = max(samples, key=lambda x: len(x.seq.response_ids))
    want = oracle_logprobs(tr.actor, s.seq.prompt_ids, s.seq.response_ids, TEMPERATURE)
    assert (oracle_logprobs(tr.actor, s.seq.prompt_ids, s.seq.response_ids, 1.0) - want).abs().max() > 1e-3


@pytest.mark.parametrize("correction", ["tis", "decoupled"])
def test_mismatched_engine_weights_are_capped_ratios_of_the_oracle(cache, correction, monkeypatch):
    cap = 1.05  # the tiny policy is near uniform: its ratios sit within a few per cent of 1
    cfg = _config(cache, fault={"kind": "behaviour_mismatch", "at_step": 0, "factor": 3.0},
                  oppo={"correction": correction, "is_cap": cap})
    tr = Trainer(cfg, "inter")
    list(tr.run(1))
    seen = _spy_updates(tr)
    calls = []
    real_loss = P.corrected_policy_loss

    def spy_loss(logprobs, prox, behav, adv, mask, clip, cap_, corr, *rest):
        calls.append((prox.detach().clone(), behav.clone(), mask.clone(), cap_, corr,
                      P.importance_weights(prox, behav, mask, cap_, corr)))
        return real_loss(logprobs, prox, behav, adv, mask, clip, cap_, corr, *rest)

    monkeypatch.setattr(P, "corrected_policy_loss", spy_loss)
    rec = next(tr.run(2))
    assert not tr._engine_is_actor()  # the recomputed path ran
    samples, actor = seen["samples"], seen["actor"]
    oracle = [oracle_logprobs(actor, s.seq.prompt_ids, s.seq.response_ids, TEMPERATURE) for s in samples]
    behav = [s.behav_logprobs for s in samples]
    # the engine sampled at 3x the temperature: its log-probs are not the proximal ones
    assert max(float((o - b).abs().max()) for o, b in zip(oracle, behav, strict=True)) > 1e-2
    assert calls and all(c[3] == cap and c[4] == correction for c in calls)
    matched = 0
    for prox, beh, mask, _, _, weights in calls:
        for r in range(prox.shape[0]):
            L = int(mask[r].sum())
            # which sample this row is: the one whose oracle and recorded behaviour log-probs it carries
            hits = [i for i, o in enumerate(oracle) if len(o) == L and torch.allclose(prox[r, :L].cpu(), o, atol=1e-5)
                    and torch.allclose(beh[r, :L].cpu(), behav[i], atol=1e-6)]
            assert len(hits) >= 1, "the surrogate was handed log-probs that are not the proximal policy's"
            i = hits[0]
            for t in range(L):
                ratio = math.exp(float(oracle[i][t]) - float(behav[i][t]))
                want = min(ratio, cap) if correction == "tis" else (ratio if ratio <= cap else 0.0)
                assert float(weights[r, t]) == pytest.approx(want, rel=1e-5, abs=1e-7)
            matched += 1
    assert matched == len(samples) * cfg.ppo.num_ppo_epochs
    # the record's raw weights (before the cap) are the oracle's too
    raw = torch.cat([torch.exp(o - b) for o, b in zip(oracle, behav, strict=True)]).double()
    assert rec.is_weight_max == pytest.approx(float(raw.max()), rel=1e-5)
    assert rec.is_ess == pytest.approx(float(raw.sum() ** 2 / (len(raw) * (raw**2).sum())), rel=1e-5)
    assert (raw > cap).any() and (raw < cap).any()  # the cap bites on some tokens and not on others
