"""PPO math against hand-computed values (training/algorithms/core_algos.py)."""

import math

import torch

from training.algorithms import core_algos as P


def test_gae_hand_computed_with_padding():
    rewards = torch.tensor([[1.0, 2.0, 3.0], [1.0, 2.0, 99.0]])
    values = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = P.gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # row 0: delta_2 = 3 - 1.5 = 1.5; delta_1 = 2 + .9*1.5 - 1 = 2.35; A_1 = 2.35 + .72*1.5 = 3.43
    #        delta_0 = 1 + .9*1 - .5 = 1.4; A_0 = 1.4 + .72*3.43 = 3.8696
    # row 1 ends after token 1 (V(s_2) = 0, padding ignored): A_1 = 2 - 1 = 1; A_0 = 1.4 + .72 = 2.12
    expected = torch.tensor([[3.8696, 3.43, 1.5], [2.12, 1.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert torch.allclose(ret, (expected + values) * mask, atol=1e-5)


def test_gae_gamma_lam_one_is_return_minus_value():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.4, 0.6]])
    adv, ret = P.gae(rewards, values, torch.ones(1, 3), gamma=1.0, lam=1.0)
    assert torch.allclose(ret, torch.ones(1, 3))
    assert torch.allclose(adv, 1.0 - values)


def test_kl_penalised_rewards_puts_score_on_last_real_token():
    logp = torch.tensor([[-1.0, -2.0, 0.0]])
    ref = torch.tensor([[-1.5, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    rewards, kl = P.kl_penalised_rewards(torch.tensor([2.0]), logp, ref, mask, kl_coef=0.1)
    assert torch.allclose(kl, torch.tensor([[0.5, -1.0, 0.0]]))
    assert torch.allclose(rewards, torch.tensor([[-0.05, 2.1, 0.0]]))


def test_clipped_surrogate_hand_computed():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5]]))
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, st = P.policy_loss(logp, old, adv, torch.ones(1, 3), clip=0.2)
    # token 1: min(1.5, 1.2)*1 -> loss -1.2 (clipped); token 2: min(.5, .8) -> -0.5 (not clipped);
    # token 3: adv -1, ratio .5: max(0.5, 0.8) -> 0.8 (clipped)
    assert math.isclose(float(loss), (-1.2 - 0.5 + 0.8) / 3, abs_tol=1e-6)
    assert math.isclose(float(st["clip_frac"]), 2 / 3, abs_tol=1e-6)
    k3 = [(1.5 - 1) - math.log(1.5), (0.5 - 1) - math.log(0.5), (0.5 - 1) - math.log(0.5)]
    assert math.isclose(float(st["approx_kl"]), sum(k3) / 3, abs_tol=1e-6)


def test_policy_loss_ignores_masked_tokens():
    logp = torch.tensor([[0.0, 5.0]])
    loss, _ = P.policy_loss(logp, torch.zeros(1, 2), torch.ones(1, 2), torch.tensor([[1.0, 0.0]]), clip=0.2)
    assert math.isclose(float(loss), -1.0, abs_tol=1e-6)


def test_value_loss_clipped_hand_computed():
    v = torch.tensor([[2.0, 1.1]])
    old = torch.tensor([[1.0, 1.0]])
    ret = torch.tensor([[3.0, 1.0]])
    loss = P.value_loss(v, old, ret, torch.ones(1, 2), clip=0.2)
    # token 1: unclipped (2-3)^2 = 1, clipped (1.2-3)^2 = 3.24 -> 3.24; token 2: (1.1-1)^2 = .01 both
    assert math.isclose(float(loss), 0.5 * (3.24 + 0.01) / 2, abs_tol=1e-6)


def test_masked_whiten_zero_mean_unit_var():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    w = P.masked_whiten(x, m)
    assert math.isclose(float(P.masked_mean(w, m)), 0.0, abs_tol=1e-6)
    assert math.isclose(float(P.masked_var(w, m)), 1.0, abs_tol=1e-4)
    assert float(w[0, 3]) == 0.0


def test_group_advantages_rloo_and_grpo():
    r = torch.tensor([1.0, 2.0, 3.0, 6.0, 5.0, 5.0, 5.0, 5.0])
    rloo = P.group_advantages(r, 4, "rloo")
    assert torch.allclose(rloo[:4], torch.tensor([1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0]), atol=1e-6)
    assert torch.allclose(rloo[4:], torch.zeros(4))
    grpo = P.group_advantages(r, 4, "grpo")
    g = torch.tensor([1.0, 2.0, 3.0, 6.0])
    assert torch.allclose(grpo[:4], (g - 3.0) / (g.std() + 1e-4), atol=1e-5)


def test_entropy_of_uniform_is_log_vocab():
    assert math.isclose(float(P.entropy_from_logits(torch.zeros(7))), math.log(7), abs_tol=1e-6)
