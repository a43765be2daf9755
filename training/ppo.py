"""PPO math on right-padded (batch, T) response tensors, in the spirit of cleanrl's ppo.py.

Conventions (TRL PPOTrainer / OpenRLHF): token t of a response is action a_t in state s_t = prompt +
tokens before t. values[t] = V(s_t); logprobs[t] = log pi(a_t | s_t); the episode ends after the last
real token, so V(s_T) = 0. The sequence score from the reward model lands on the last real token and
a per-token KL penalty (k1 estimator, log pi_old - log pi_ref) is subtracted from every token's reward.
"""

from __future__ import annotations

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    mask = mask.to(x.dtype)
    if dim is None:
        return (x * mask).sum() / mask.sum().clamp(min=1)
    return (x * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    mean = masked_mean(x, mask)
    n = mask.sum().clamp(min=2)
    return ((x - mean) ** 2 * mask).sum() / (n - 1)  # unbiased, as TRL's masked_var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out * mask


def kl_penalised_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards r_t = -kl_coef * (logp_t - ref_logp_t), plus the score on the last real token.

    Returns (rewards, per-token k1 KL), both zero on padding.
    """
    kl = (logprobs - ref_logprobs) * mask
    rewards = -kl_coef * kl
    last = (mask.sum(1) - 1).clamp(min=0).long()
    rewards[torch.arange(rewards.shape[0]), last] += scores
    return rewards * mask, kl


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation, OPPO paper Eq. 1:  delta_t = r_t + gamma V_{t+1} - V_t,
    A_t = sum_l (gamma lam)^l delta_{t+l}; returns R_t = A_t + V_t. Padding has A = R = 0."""
    values = values * mask
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    last = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in reversed(range(T)):
        next_v = values[:, t + 1] if t + 1 < T else torch.zeros_like(last)
        next_v = next_v * (mask[:, t + 1] if t + 1 < T else 0)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last * (mask[:, t + 1] if t + 1 < T else 0)
        adv[:, t] = last * mask[:, t]
    return adv, (adv + values) * mask


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (OPPO paper Eq. 2), as a loss to minimise; token-level masked mean."""
    logratio = logprobs - old_logprobs
    ratio = logratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    loss = masked_mean(torch.maximum(pg1, pg2), mask)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((pg2 > pg1).float(), mask),
            # cleanrl's low-variance estimator of KL(old || new): (r - 1) - log r
            "approx_kl": masked_mean((ratio - 1) - logratio, mask),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float
) -> torch.Tensor:
    """0.5 * max((V - R)^2, (clip(V, V_old +- clip) - R)^2), token-level masked mean (TRL, cleanrl)."""
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(logits, -1)
    return -(logp.exp() * logp).sum(-1)


def group_advantages(rewards: torch.Tensor, group_size: int, kind: str) -> torch.Tensor:
    """Critic-free sequence advantages over consecutive groups of `group_size` samples of one prompt.

    grpo: (r - mean_group) / (std_group + 1e-4) (Shao et al. 2024); rloo: r - mean of the other k-1
    samples (Ahmadian et al. 2024, TRL's RLOOTrainer).
    """
    r = rewards.view(-1, group_size)
    if kind == "grpo":
        adv = (r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)
    elif kind == "rloo":
        adv = r - (r.sum(1, keepdim=True) - r) / (group_size - 1)
    else:
        raise ValueError(f"unknown advantage kind {kind!r}")
    return adv.reshape(-1)
