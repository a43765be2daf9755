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
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor, clip: float,
    ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate (OPPO paper Eq. 2), as a loss to minimise; token-level masked mean (TRL's loss_type
    "dapo"/"bnpo": every token of the batch weighs the same). With `ref_logprobs` and kl_coef > 0, kl_coef times the
    per-token k3 KL is added inside the mean (GRPO's KL in the loss, TRL's `beta`)."""
    logratio = logprobs - old_logprobs
    ratio = logratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    per_token, kl = _with_kl(torch.maximum(pg1, pg2), logprobs, ref_logprobs, mask, kl_coef)
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((pg2 > pg1).float(), mask),
            # cleanrl's low-variance estimator of KL(old || new): (r - 1) - log r
            "approx_kl": masked_mean((ratio - 1) - logratio, mask),
        }
        if kl is not None:
            stats["kl_loss"] = masked_mean(kl, mask)
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


def group_advantages(rewards: torch.Tensor, group_size: int, kind: str, scale_rewards: str = "group") -> torch.Tensor:
    """Critic-free sequence advantages over consecutive groups of `group_size` samples of one prompt.

    grpo: r - mean of the group, divided by (the group's unbiased std + 1e-4) under scale_rewards "group" (Shao et
    al. 2024; TRL's GRPOTrainer) or not under "none" (Dr. GRPO, Liu et al. 2025);
    rloo: r - mean of the group's other members (Ahmadian et al. 2024, TRL's RLOOTrainer).
    A NaN reward is a sample with no score (its reward function raised or returned None): it is left out of its
    group's mean, std and baselines and gets advantage 0, as TRL does, so it pushes its tokens neither way. A group
    with fewer than two scored members has no baseline: every advantage in it is 0.
    """
    r = rewards.reshape(-1, group_size).double()
    scored = ~torch.isnan(r)
    n = scored.sum(1, keepdim=True)
    r0 = torch.where(scored, r, torch.zeros_like(r))
    total = r0.sum(1, keepdim=True)
    if kind == "grpo":
        mean = total / n.clamp(min=1)
        adv = r0 - mean
        if scale_rewards == "group":
            var = (torch.where(scored, r0 - mean, torch.zeros_like(r)) ** 2).sum(1, keepdim=True) / (n - 1).clamp(min=1)
            adv = adv / (var.sqrt() + 1e-4)
        elif scale_rewards != "none":
            raise ValueError(f"unknown scale_rewards {scale_rewards!r} (choose from: group, none)")
    elif kind == "rloo":
        adv = r0 - (total - r0) / (n - 1).clamp(min=1)
    else:
        raise ValueError(f"unknown advantage kind {kind!r} (choose from: grpo, rloo)")
    adv = torch.where(scored & (n >= 2), adv, torch.zeros_like(adv))
    return adv.reshape(-1).to(rewards.dtype)


def group_stats(rewards: torch.Tensor, group_size: int) -> tuple[float, float]:
    """(share of groups whose scored rewards are all equal, mean within-group std of the scored rewards), over the
    groups with at least two scored members: a flat group carries no learning signal (DAPO's reason for dynamic
    sampling). NaN when no group has two scored members."""
    r = rewards.reshape(-1, group_size).double()
    flat, spread = [], []
    for row in r:
        got = row[~torch.isnan(row)]
        if len(got) < 2:
            continue
        flat.append(bool((got == got[0]).all()))
        spread.append(float(got.std()))
    if not flat:
        return float("nan"), float("nan")
    return float(sum(flat) / len(flat)), float(sum(spread) / len(spread))


def _with_kl(
    per_token: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor | None, mask: torch.Tensor,
    kl_coef: float,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A surrogate's per-token loss plus kl_coef times the k3 KL (the KL in the loss), and that KL; unchanged and None
    when no KL is paid (no reference log-probs, or kl_coef 0)."""
    if ref_logprobs is None or not kl_coef:
        return per_token, None
    kl = k3_kl(logprobs, ref_logprobs, mask)
    return per_token + kl_coef * kl, kl


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman 2020; GRPO's loss term): exp(d) - d - 1 with
    d = log pi_ref - log pi; never negative, differentiable in `logprobs`. With `mask`, d is 0 on padding *before* the
    exponential: a padding column's log-prob can sit below -88 (exp overflows float32), and masking after would
    give inf * 0 = NaN in the loss and its gradient."""
    d = ref_logprobs - logprobs
    if mask is not None:
        d = torch.where(mask.bool(), d, torch.zeros_like(d))
    return d.exp() - d - 1


# ---- off-policy correction for carried tokens (inter-step overlap) -------------------------------------
#
# Three policies meet in one update once responses are carried across steps:
#   pi_behav: the policy that sampled token t (an older version for a carried token),
#   pi_prox:  the policy at the start of this update (the "proximal" policy; a fresh token's pi_behav),
#   pi_theta: the policy being optimised.
# The clipped surrogate assumes tokens were sampled from the policy its ratio is taken against. For a carried
# token they were sampled from pi_behav, so the expectation needs the importance weight pi_prox / pi_behav.
# Unbounded weights have unbounded variance, hence a cap C. Where the ratio is centred and what the cap does
# are the two choices:
#   "tis" (token-level truncated importance sampling, as verl's rollout correction and Yao et al. 2025):
#         L_t = min(pi_old / pi_behav, C) * clipped_surrogate(pi_theta / pi_old),   pi_old = pi_prox here;
#         a token above the cap keeps weight C (biased, bounded variance).
#   "decoupled" (AReaL, Fu et al. 2025, Eq. 5; its `behav_imp_weight_cap`):
#         L_t = (pi_prox / pi_behav) * clipped_surrogate(pi_theta / pi_prox);
#         a token whose weight exceeds C is dropped from the loss (it would dominate the batch).
# Both divide by the number of trained tokens, so with pi_behav == pi_prox (no staleness) the weights are 1
# and both are exactly `policy_loss`.

CORRECTIONS = ("none", "tis", "decoupled")


def importance_weights(
    prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, mask: torch.Tensor, cap: float, correction: str
) -> torch.Tensor:
    """Per-token weights applied to the surrogate: "tis" min(w, cap), "decoupled" w where w <= cap else 0,
    "none" 1; w = pi_prox / pi_behav. Zero on padding. No gradient flows through them (both inputs are data)."""
    w = (prox_logprobs - behav_logprobs).detach().exp()
    if correction == "tis":
        w = w.clamp(max=cap)
    elif correction == "decoupled":
        w = torch.where(w <= cap, w, torch.zeros_like(w))
    elif correction == "none":
        w = torch.ones_like(w)
    else:
        raise ValueError(f"unknown correction {correction!r} (choose from: {', '.join(CORRECTIONS)})")
    return w * mask


def effective_sample_size(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """Normalised ESS of importance weights over the masked tokens: (sum w)^2 / (n * sum w^2), in (0, 1];
    1 when every weight is equal (on-policy), 1/n when one token carries all the weight. NaN with no tokens."""
    w = weights[mask.bool()].double()
    if w.numel() == 0 or float((w * w).sum()) == 0.0:
        return float("nan")
    return float(w.sum() ** 2 / (w.numel() * (w * w).sum()))


def corrected_policy_loss(
    logprobs: torch.Tensor, prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, advantages: torch.Tensor,
    mask: torch.Tensor, clip: float, cap: float, correction: str,
    ref_logprobs: torch.Tensor | None = None, kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate against pi_prox, each token weighted by `importance_weights` (see above); a KL in the
    loss (as `policy_loss`) is added unweighted: it is a penalty on the policy being optimised, not an estimate
    under the sampling policy."""
    logratio = logprobs - prox_logprobs
    ratio = logratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - clip, 1.0 + clip)
    weights = importance_weights(prox_logprobs, behav_logprobs, mask, cap, correction)
    per_token, kl = _with_kl(weights * torch.maximum(pg1, pg2), logprobs, ref_logprobs, mask, kl_coef)
    # token-level mean over the trained tokens, not over sum(w): weights of 1 give back `policy_loss`
    loss = masked_mean(per_token, mask)
    with torch.no_grad():
        stats = {
            "clip_frac": masked_mean((pg2 > pg1).float(), mask),
            "approx_kl": masked_mean((ratio - 1) - logratio, mask),
        }
        if kl is not None:
            stats["kl_loss"] = masked_mean(kl, mask)
    return loss, stats
