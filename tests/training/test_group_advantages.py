"""Critic-free advantages (training/algorithms/core_algos.py `group_advantages`, `group_stats`, `k3_kl`) against
numbers worked out by hand: every expected value below is a literal, derived in the comment above it, never a second
call of the code under test.

GRPO (Shao et al. 2024; TRL's GRPOTrainer): A_i = (r_i - mean_g) / (std_g + 1e-4), std_g the group's *unbiased*
standard deviation (torch's default, as TRL's `rewards.view(-1, G).std(dim=1)`). Dr. GRPO (scale_rewards none):
A_i = r_i - mean_g. RLOO: A_i = r_i - mean of the group's other members. A NaN reward is a sample with no score:
it gets 0 and is left out of its group's mean, std and baselines; a group with fewer than two scored members is
all zeros.
"""

from __future__ import annotations

import math

import pytest
import torch

from training.algorithms import core_algos as P

NAN = float("nan")


def adv(rewards, group_size, kind="grpo", scale="group"):
    """group_advantages on float64 rewards (the tight tolerances below need the precision), as a list."""
    return P.group_advantages(torch.tensor(rewards, dtype=torch.float64), group_size, kind, scale).tolist()


def close(got, want, tol=1e-9):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, abs=tol), (got, want)


# ---- GRPO, scale_rewards "group" -----------------------------------------------------------------------------

def test_grpo_half_ones():
    # [1, 0, 0, 1]: mean 0.5, deviations +-0.5; unbiased var = 4 * 0.25 / (4 - 1) = 1/3, std = 0.5773502691896257;
    # A = +-0.5 / (0.5773502691896257 + 1e-4) = +-0.8658754297607016
    # (without the epsilon it would be sqrt(3)/2 = 0.8660254; with the biased std 0.5 / 0.5001 = 0.9998)
    close(adv([1, 0, 0, 1], 4), [0.8658754297607016, -0.8658754297607016, -0.8658754297607016,
                                  0.8658754297607016])


def test_grpo_one_winner():
    # [0, 0, 0, 1]: mean 0.25, deviations (-0.25, -0.25, -0.25, 0.75); sum of squares 3 * 0.0625 + 0.5625 = 0.75,
    # unbiased var 0.75 / 3 = 0.25, std 0.5; A = dev / 0.5001 = -0.4999000199960008 (x3), 1.4997000599880024
    close(adv([0, 0, 0, 1], 4), [-0.4999000199960008] * 3 + [1.4997000599880024])


def test_grpo_ties_get_equal_advantages():
    # [3, 3, 0]: mean 2, deviations (1, 1, -2); sum of squares 6, unbiased var 6 / 2 = 3, std sqrt(3) = 1.7320508;
    # A = (1, 1, -2) / (1.7320508075688772 + 1e-4) = 0.5773169377806823 (x2), -1.1546338755613645
    close(adv([3, 3, 0], 3), [0.5773169377806823, 0.5773169377806823, -1.1546338755613645])


def test_grpo_all_equal_group_is_zero():
    # every deviation from the mean is 0 and the std is 0: 0 / (0 + 1e-4) = 0 (the epsilon keeps it finite)
    close(adv([0.7, 0.7, 0.7, 0.7], 4), [0.0] * 4, tol=1e-9)
    close(adv([5.0, 5.0], 2), [0.0, 0.0], tol=0.0)


def test_grpo_two_groups_do_not_mix():
    # groups of 2: [10, 12] and [0, 1]. Group 1: mean 11, dev (-1, 1), var 2 / 1 = 2, std 1.4142136;
    # A = +-1 / (1.4142135623730951 + 1e-4) = +-0.7070567847218314. Group 2: mean 0.5, dev +-0.5, var 0.5,
    # std 0.7071068; A = +-0.5 / (0.7071067811865476 + 1e-4) = +-0.7070067953266834.
    # (one mean over all four, 5.75, would give every member of group 1 a positive advantage)
    close(adv([10, 12, 0, 1], 2), [-0.7070567847218314, 0.7070567847218314, -0.7070067953266834,
                                   0.7070067953266834])
    # the two groups of the first two tests, side by side: each keeps its own numbers
    close(adv([1, 0, 0, 1, 0, 0, 0, 1], 4), [0.8658754297607016, -0.8658754297607016, -0.8658754297607016,
                                             0.8658754297607016, -0.4999000199960008, -0.4999000199960008,
                                             -0.4999000199960008, 1.4997000599880024])


def test_grpo_nan_member_is_left_out():
    # [1, NaN, 0, 0]: scored (1, 0, 0), n = 3, mean 1/3, dev (2/3, -1/3, -1/3); sum of squares 4/9 + 1/9 + 1/9 = 2/3,
    # unbiased var (2/3) / 2 = 1/3, std 0.5773502691896257;
    # A = (2/3, -1/3, -1/3) / 0.5774502691896257 = 1.1545005730142688, -0.5772502865071344 (x2); the NaN member 0
    got = adv([1, NAN, 0, 0], 4)
    close(got, [1.1545005730142688, 0.0, -0.5772502865071344, -0.5772502865071344])
    assert not any(math.isnan(g) for g in got)


def test_grpo_group_with_one_scored_member_is_all_zero():
    # no baseline without a second scored member; the neighbouring group is unaffected (its numbers as above)
    close(adv([NAN, 2.0, NAN, NAN, 1, 0, 0, 1], 4), [0.0] * 4 + [0.8658754297607016, -0.8658754297607016,
                                                                -0.8658754297607016, 0.8658754297607016])
    close(adv([NAN, NAN], 2), [0.0, 0.0], tol=0.0)
    close(adv([NAN, 3.0], 2, "rloo"), [0.0, 0.0], tol=0.0)


# ---- Dr. GRPO: scale_rewards "none" ---------------------------------------------------------------------------

def test_dr_grpo_is_centred_only():
    # r - group mean, no division: [1, 0, 0, 1] - 0.5; [0, 0, 0, 1] - 0.25
    close(adv([1, 0, 0, 1, 0, 0, 0, 1], 4, scale="none"), [0.5, -0.5, -0.5, 0.5, -0.25, -0.25, -0.25, 0.75],
          tol=1e-12)
    # with a NaN member: scored (4, 1, 1), mean 2 -> (2, -1, -1), the NaN member 0
    close(adv([4, 1, NAN, 1], 4, scale="none"), [2.0, -1.0, 0.0, -1.0], tol=1e-12)


def test_unknown_scale_rewards_is_refused():
    # TRL also has "batch" (one std over the whole batch); the config offers group and none only
    with pytest.raises(ValueError, match="unknown scale_rewards 'batch'.*group, none"):
        P.group_advantages(torch.tensor([1.0, 0.0]), 2, "grpo", "batch")


# ---- RLOO: leave-one-out baseline -----------------------------------------------------------------------------

def test_rloo_leave_one_out_baseline():
    # [3, 1, 0, 2]: baseline_i = mean of the other three
    #   r0 = 3: (1 + 0 + 2) / 3 = 1    -> 2
    #   r1 = 1: (3 + 0 + 2) / 3 = 5/3  -> -2/3
    #   r2 = 0: (3 + 1 + 2) / 3 = 2    -> -2
    #   r3 = 2: (3 + 1 + 0) / 3 = 4/3  -> 2/3
    # (a baseline that includes the sample itself, the mean 1.5, would give 1.5, -0.5, -1.5, 0.5)
    close(adv([3, 1, 0, 2], 4, "rloo"), [2.0, -2 / 3, -2.0, 2 / 3], tol=1e-12)
    # groups of 2: the baseline is the other member: [1, 0] -> (1, -1); [5, 5] -> (0, 0)
    close(adv([1, 0, 5, 5], 2, "rloo"), [1.0, -1.0, 0.0, 0.0], tol=1e-12)


def test_rloo_nan_member_is_left_out():
    # [3, NaN, 0, 2]: scored (3, 0, 2), n = 3, each baseline the mean of the other two scored members
    #   r0 = 3: (0 + 2) / 2 = 1   -> 2
    #   r2 = 0: (3 + 2) / 2 = 2.5 -> -2.5
    #   r3 = 2: (3 + 0) / 2 = 1.5 -> 0.5;   the NaN member 0
    close(adv([3, NAN, 0, 2], 4, "rloo"), [2.0, 0.0, -2.5, 0.5], tol=1e-12)


def test_dtype_is_kept():
    out = P.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, "grpo")
    assert out.dtype == torch.float32
    assert out.tolist() == pytest.approx([0.8658754297607016, -0.8658754297607016, -0.8658754297607016,
                                          0.8658754297607016], abs=1e-6)


# ---- group_stats ---------------------------------------------------------------------------------------------

def test_group_stats_by_hand():
    # groups of 4:
    #   [1, 0, 0, 1]         not flat, unbiased std 0.5773502691896257 (above)
    #   [.5, .5, .5, .5]     flat, std 0
    #   [NaN, 3, NaN, NaN]   one scored member: not counted at all
    #   [2, NaN, 4, 6]       scored (2, 4, 6): not flat, mean 4, dev (-2, 0, 2), var 8 / 2 = 4, std 2
    # flat share 1 / 3; mean std (0.5773502691896257 + 0 + 2) / 3 = 0.859116756396542
    r = torch.tensor([1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5, NAN, 3, NAN, NAN, 2, NAN, 4, 6], dtype=torch.float64)
    flat, spread = P.group_stats(r, 4)
    assert flat == pytest.approx(1 / 3, abs=1e-12)
    assert spread == pytest.approx(0.859116756396542, abs=1e-12)


def test_group_stats_without_a_scorable_group_is_nan():
    flat, spread = P.group_stats(torch.tensor([NAN, 1.0, NAN, NAN]), 2)
    assert math.isnan(flat) and math.isnan(spread)


# ---- k3 KL ---------------------------------------------------------------------------------------------------

def test_k3_kl_by_hand():
    # k3 = exp(d) - d - 1, d = ref - logp:
    #   logp = ref:                       d = 0        -> 0
    #   logp = log .5, ref = log .25:     d = -log 2   -> 0.5 + log 2 - 1 = 0.1931471805599454
    #   logp = -2, ref = -1:              d = 1        -> e - 2 = 0.7182818284590451
    #   logp = -1, ref = -2:              d = -1       -> exp(-1) + 1 - 1 = 0.36787944117144233
    # (the sign matters: k3 is not symmetric in d, so swapping the arguments changes the last two)
    logp = torch.tensor([-0.3, math.log(0.5), -2.0, -1.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-0.3, math.log(0.25), -1.0, -2.0], dtype=torch.float64)
    kl = P.k3_kl(logp, ref)
    close(kl.tolist(), [0.0, 0.1931471805599454, 0.7182818284590451, 0.36787944117144233], tol=1e-12)
    # d k3 / d logp = 1 - exp(ref - logp): 0, 1 - 0.5, 1 - e, 1 - exp(-1)
    kl.sum().backward()
    close(logp.grad.tolist(), [0.0, 0.5, -1.718281828459045, 0.6321205588285577], tol=1e-12)


def test_k3_kl_is_never_negative():
    grid = torch.linspace(-8, 0, 33, dtype=torch.float64)
    logp, ref = torch.meshgrid(grid, grid, indexing="ij")
    kl = P.k3_kl(logp, ref)
    assert bool((kl >= 0).all())
    assert bool((kl[logp == ref] == 0).all())
    assert bool((kl[logp != ref] > 0).all())


def test_a_kl_in_the_loss_ignores_padding_whose_log_prob_would_overflow():
    """A padding column's log-prob below -88.7 made exp(ref - lp) overflow to inf, and inf * mask 0 = NaN in the loss
    and every gradient (a grpo run with kl_coef > 0 at temperature 0.08 went NaN at step 1). Loss and gradient by
    hand over the two real tokens: ratio 1 (lp == old), advantages 1, so the surrogate is -1 per token; the gradient of
    -mean(ratio) is -1/2 per token; k3 at d = ref - lp: d = -0.2 and -0.1, k3'(lp) = 1 - exp(d)."""
    lp = torch.tensor([[-1.0, -2.0, -100.0]], requires_grad=True)
    old = lp.detach().clone()
    ref = torch.tensor([[-1.2, -2.1, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    for loss_fn in (lambda: P.policy_loss(lp, old, torch.ones(1, 3), mask, 0.2, ref, 0.04),
                    lambda: P.corrected_policy_loss(lp, old, old, torch.ones(1, 3), mask, 0.2, 2.0, "tis", ref, 0.04)):
        lp.grad = None
        loss, _ = loss_fn()
        loss.backward()
        k3 = [math.exp(-0.2) + 0.2 - 1, math.exp(-0.1) + 0.1 - 1]
        assert float(loss) == pytest.approx(-1.0 + 0.04 * sum(k3) / 2, abs=1e-6)
        want = [-0.5 + 0.04 * (1 - math.exp(-0.2)) / 2, -0.5 + 0.04 * (1 - math.exp(-0.1)) / 2, 0.0]
        assert lp.grad[0].tolist() == pytest.approx(want, abs=1e-6)
