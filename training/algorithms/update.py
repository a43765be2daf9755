"""The PPO update of one step: the step's samples packed into length-sorted micro-batches, the proximal log-probs
recomputed when the engine was not the actor, rewards and advantages, then the clipped (optionally off-policy
corrected) epochs over the actor and critic.

`PPOUpdate` is a mixin of `training.trainer.Trainer`: it reads the trainer's `cfg`, `actor`, `critic`, optimisers,
`tok`, `engine`, `shuffle_gen`, `step`, `grouped`, `group_size`, `device`, `world` (its ranks: `size`, `sum`,
`reduce_grads`; no-ops on one rank) and its `_score`, `_fault_active`, `_owned` and `autocast`. The samples'
per-token tensors are assembled on the CPU; the micro-batches and the tensors the loss reads go to the models'
device; forwards run under the job's autocast, log-softmax and losses in float32.
"""

from __future__ import annotations

from math import nan as NAN
from typing import TYPE_CHECKING

import numpy as np
import torch

from training.algorithms import core_algos as P

if TYPE_CHECKING:  # the rollout's record, named for the type checker only: the math imports no project module
    from training.rollout.streaming import Sample


class PPOUpdate:
    def _engine_is_actor(self) -> bool:
        """Whether the rollout's log-probs are the actor's at the start of this step (the proximal policy's):
        the engine holds the actor itself at the trainer's temperature. Otherwise (a frozen sync, a
        temperature mismatch, an out-of-process engine) they are recomputed."""
        return (getattr(self.engine, "model", None) is self.actor
                and getattr(self.engine, "temperature", None) == self.cfg.ppo.temperature)

    @torch.no_grad()
    def _proximal_logprobs(self, samples: list[Sample], T: int) -> torch.Tensor:
        """log pi_prox(token) for every trained token: one forward of the actor as it stands before the update."""
        out = torch.zeros(len(samples), T)
        for micro in _micro_batches(list(range(len(samples))), samples):
            ids, attn, p_w, t_w = self._pack(micro, samples)
            pos = (attn.cumsum(1) - 1).clamp(min=0)
            with self.autocast():
                logits = self.actor(input_ids=ids, attention_mask=attn, position_ids=pos).logits
            logits = logits[:, p_w - 1 : p_w - 1 + t_w].float() / self.cfg.ppo.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, p_w:, None]).squeeze(-1).cpu()
            for r, i in enumerate(micro):
                L = len(samples[i].seq.response_ids)
                out[i, :L] = lp[r, :L]
        return out


    def _ppo_update(self, samples: list[Sample]) -> dict:
        cfg = self.cfg.ppo
        n = len(samples)
        T = max(len(s.seq.response_ids) for s in samples)
        mask = torch.zeros(n, T)
        old_lp, ref_lp, values = torch.zeros(n, T), torch.zeros(n, T), torch.zeros(n, T)
        versions = torch.zeros(n, T, dtype=torch.long)
        behav_lp = torch.zeros(n, T)
        for i, s in enumerate(samples):
            L = len(s.seq.response_ids)
            mask[i, :L] = 1
            old_lp[i, :L] = s.old_logprobs
            # no reference model (kl_coef 0): the KL term is 0 whichever way it is paid
            ref_lp[i, :L] = s.ref_logprobs if s.ref_logprobs is not None else s.old_logprobs
            behav_lp[i, :L] = s.behav_logprobs if s.behav_logprobs is not None else s.old_logprobs
            if s.values is not None:
                values[i, :L] = s.values
            versions[i, :L] = torch.tensor(s.seq.versions)
        scores = torch.tensor([self._score(s) for s in samples], dtype=torch.float32)
        # the KL either joins the reward (k1 per token: ppo, rloo) or the loss (k3: grpo's beta); kl_in_loss is the
        # coefficient the loss adds it with
        kl_in_loss = cfg.kl_coef if cfg.kl_in == "loss" else 0.0
        rewards, kl = P.kl_penalised_rewards(scores, old_lp, ref_lp, mask, cfg.kl_coef - kl_in_loss)
        group_flat = group_spread = NAN
        if self.grouped:
            seq_reward = rewards.sum(1)  # NaN for a member with no score: advantage 0 (group_advantages)
            adv = P.group_advantages(seq_reward, self.group_size, self.cfg.algorithm, cfg.scale_rewards)[:, None] * mask
            group_flat, group_spread = P.group_stats(scores, self.group_size)
            rewards = torch.nan_to_num(rewards)
            returns = torch.zeros_like(adv)
        else:
            adv, returns = P.gae(rewards, values, mask, cfg.gamma, cfg.lam)
        adv_raw = adv
        if cfg.whiten_advantages:
            adv = P.masked_whiten(adv, mask)
        train_mask = mask.clone()
        staleness = (self.step - versions).float()
        if self.cfg.oppo.max_staleness is not None:
            train_mask = train_mask * (staleness <= self.cfg.oppo.max_staleness).float()
        # off-policy correction (training/algorithms/core_algos.py): pi_prox is the actor before this update
        correction, is_cap = self.cfg.oppo.correction, self.cfg.oppo.is_cap
        prox_lp = old_lp if self._engine_is_actor() else self._proximal_logprobs(samples, T)
        raw_w = (prox_lp - behav_lp).exp() * train_mask  # before any cap: how off-policy the batch is
        lr_mult = self.cfg.fault.factor if self._fault_active("lr_spike") else 1.0
        for group in self.actor_opt.param_groups:
            group["lr"] = cfg.actor_lr * lr_mult
        if self.critic_opt:
            for group in self.critic_opt.param_groups:
                group["lr"] = cfg.critic_lr * lr_mult

        # the per-token tensors the loss reads, on the models' device (the statistics below read the CPU ones)
        dev = self.device
        old_lp_d, prox_lp_d, behav_lp_d, adv_d, train_mask_d = (
            t.to(dev) for t in (old_lp, prox_lp, behav_lp, adv, train_mask))
        ref_lp_d = ref_lp.to(dev) if kl_in_loss else None  # only the KL in the loss reads it per micro-batch
        values_d, returns_d = values.to(dev), returns.to(dev)
        acc: dict[str, list[float]] = {k: [] for k in ("loss_policy", "loss_value", "clip_frac", "approx_kl",
                                                        "entropy", "grad_norm", "kl_loss")}
        self.actor.train(True)
        mb_size = n // cfg.num_mini_batches
        for _ in range(cfg.num_ppo_epochs):
            perm = torch.randperm(n, generator=self.shuffle_gen, device="cpu").tolist()
            for start in range(0, n, mb_size):
                idx = perm[start : start + mb_size]
                n_tok = float(train_mask[idx].sum().clamp(min=1))
                self.actor_opt.zero_grad(set_to_none=True)
                if self.critic_opt:
                    self.critic_opt.zero_grad(set_to_none=True)
                sums = {"loss_policy": 0.0, "loss_value": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0,
                        "kl_loss": 0.0}
                # on several ranks this rank back-propagates its own samples of the minibatch; `w` divides by the
                # minibatch's global token count (n_tok), so the gradients summed over ranks are the full batch's
                for micro in _micro_batches(self._owned(idx, samples), samples):
                    ids, attn, p_w, t_w = self._pack(micro, samples)
                    tmask = train_mask_d[micro, :t_w]
                    w = float(train_mask[micro, :t_w].sum()) / n_tok
                    pos = (attn.cumsum(1) - 1).clamp(min=0)
                    with self.autocast():  # the forward only; the log-softmax and the loss in float32
                        logits = self.actor(input_ids=ids, attention_mask=attn, position_ids=pos).logits
                    logits = logits[:, p_w - 1 : p_w - 1 + t_w].float() / cfg.temperature
                    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, p_w:, None]).squeeze(-1)
                    ref_mb = ref_lp_d[micro, :t_w] if ref_lp_d is not None else None
                    if correction == "none":
                        pg_loss, st = P.policy_loss(lp, old_lp_d[micro, :t_w], adv_d[micro, :t_w], tmask,
                                                    cfg.cliprange, ref_mb, kl_in_loss)
                    else:
                        pg_loss, st = P.corrected_policy_loss(lp, prox_lp_d[micro, :t_w], behav_lp_d[micro, :t_w],
                                                              adv_d[micro, :t_w], tmask, cfg.cliprange, is_cap,
                                                              correction, ref_mb, kl_in_loss)
                    ent = P.masked_mean(P.entropy_from_logits(logits.detach()), tmask)
                    loss = pg_loss
                    if cfg.ent_coef:
                        loss = loss - cfg.ent_coef * P.masked_mean(P.entropy_from_logits(logits), tmask)
                    (loss * w).backward()
                    sums["loss_policy"] += float(pg_loss.detach()) * w
                    sums["clip_frac"] += float(st["clip_frac"]) * w
                    sums["approx_kl"] += float(st["approx_kl"]) * w
                    sums["entropy"] += float(ent) * w
                    sums["kl_loss"] += float(st.get("kl_loss", 0.0)) * w
                    if self.critic is not None:
                        with self.autocast():
                            hidden = self.critic.base_model(input_ids=ids, attention_mask=attn,
                                                            position_ids=pos).last_hidden_state
                            vpred = self.critic.score(hidden[:, p_w - 1 : p_w - 1 + t_w]).squeeze(-1)
                        vf = P.value_loss(vpred.float(), values_d[micro, :t_w], returns_d[micro, :t_w], tmask,
                                          cfg.cliprange_value)
                        (cfg.vf_coef * vf * w).backward()
                        sums["loss_value"] += float(vf.detach()) * w
                if self.world.size > 1:
                    self.world.reduce_grads(self.actor.parameters())
                    if self.critic is not None:
                        self.world.reduce_grads(self.critic.parameters())
                    sums = dict(zip(sums, self.world.sum(list(sums.values())), strict=True))
                gn = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), cfg.max_grad_norm)
                self.actor_opt.step()
                if self.critic_opt:
                    torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.max_grad_norm)
                    self.critic_opt.step()
                for k, v in sums.items():
                    acc[k].append(v)
                acc["grad_norm"].append(float(gn))
        self.actor.train(False)
        out = {k: float(np.mean(v)) if v else NAN for k, v in acc.items()}
        if self.critic is None:
            out["loss_value"] = NAN
        if not kl_in_loss:
            out["kl_loss"] = NAN
        out["group_flat_frac"], out["group_reward_std"] = group_flat, group_spread
        out["kl"] = float(kl.sum(1).mean())
        out["adv_mean"] = float(P.masked_mean(adv_raw, mask))
        out["adv_std"] = float(P.masked_var(adv_raw, mask).sqrt())
        out["ret_mean"] = float(P.masked_mean(returns, mask)) if self.critic is not None else float(
            P.masked_mean(rewards.sum(1, keepdim=True).expand_as(mask), mask))
        out["tokens_trained"] = int(train_mask.sum())
        out["staleness_mean"] = float(P.masked_mean(staleness, mask))
        trained = train_mask.bool()
        if trained.any():
            out["staleness_max"] = float(staleness[trained].max())
            out["stale_frac"] = float((staleness[trained] > 0).float().mean())
            out["is_ess"] = P.effective_sample_size(raw_w, train_mask)
            out["is_weight_mean"] = float(raw_w[trained].mean())
            out["is_weight_max"] = float(raw_w[trained].max())
        out["scores"] = scores.tolist()
        return out

    def _pack(self, micro: list[int], samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """Prompts left-padded to width P, responses right-padded to width T: response token t sits in
        column P + t and is predicted by column P - 1 + t."""
        seqs = [samples[i].seq for i in micro]
        p_w = max(len(s.prompt_ids) for s in seqs)
        t_w = max(len(s.response_ids) for s in seqs)
        pad = self.tok.pad_id
        rows = [[pad] * (p_w - len(s.prompt_ids)) + s.prompt_ids + s.response_ids + [pad] * (t_w - len(s.response_ids))
                for s in seqs]
        ids = torch.tensor(rows, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, s in enumerate(seqs):
            attn[r, p_w - len(s.prompt_ids) : p_w + len(s.response_ids)] = 1
        return ids.to(self.device), attn.to(self.device), p_w, t_w


def _micro_batches(idx: list[int], samples: list[Sample], token_budget: int = 8192) -> list[list[int]]:
    """Split a minibatch into length-sorted micro-batches so short responses are not padded to the
    longest one (long-tailed lengths make padding the dominant cost otherwise). Same gradient: each
    micro-batch's token-mean loss is weighted by its share of the minibatch's tokens."""
    order = sorted(idx, key=lambda i: len(samples[i].seq.response_ids) + len(samples[i].seq.prompt_ids))
    out, cur = [], []
    for i in order:
        width = len(samples[i].seq.response_ids) + len(samples[i].seq.prompt_ids)
        if cur and width * (len(cur) + 1) > token_budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out
