"""The OPPO-accelerated PPO trainer. Plain Python entry points for the CLI, Prefect flows and canaries.

Entry points (stable):
- `train(config, overlap="full", out_dir=None, steps=None, resume=True) -> Iterator[StepRecord]`
  runs PPO and yields one `training.metrics.StepRecord` per step. With `out_dir` it writes
  `out_dir/metrics.csv` (one row per step, `StepRecord.flat()`), checkpoints under
  `out_dir/checkpoints/step-NNNNNN/` every `checkpoint_every` steps (and at the end), and
  `out_dir/summary.json`; with `resume=True` it continues from the newest checkpoint there, and the
  resumed run's metrics are identical to an uninterrupted run's (timing fields aside).
- `Trainer(config, overlap, out_dir)` is the same thing as an object: `.run(steps)` yields records;
  `.checkpoints` lists the saved checkpoint paths; `.deferral_counts` holds the deferral histogram.
- `gold_eval(checkpoint_path_or_policy, prompts=None, config=None) -> GoldEval` scores a saved
  checkpoint (or a live policy) with the gold scorer on held-out prompts. Use it as an eval gate.
- `latest_checkpoint(out_dir)` finds the newest checkpoint of a run.

`overlap`: "none" (sequential PPO), "intra" (stream chunks to the scorers while decoding), "inter"
(overcommit B+Delta prompts, train on the first B to finish, defer the rest), "full" (both).

Fault injection for the health canaries (`fault:` block of the config; active from `fault.at_step`):
- `frozen_sync`: the generation engine keeps sampling from a frozen copy of the actor taken at
  `at_step` (a broken weight sync): approx-KL and clip fraction climb, reward stalls.
- `constant_reward`: every reward-model score is replaced by 0 (a dead reward service).
- `nan_reward`: every score is NaN (a corrupt reward service; the loss goes NaN).
- `lr_spike`: actor and critic learning rates are multiplied by `fault.factor`.
- `gameable_reward`: the proxy score gets `fault.bonus` per occurrence of `fault.trigger` in the
  response, which the gold scorer does not value: fast reward hacking.
- `behaviour_mismatch`: the engine samples at `fault.factor` times the configured temperature while the
  trainer assumes the configured one (an inference/training mismatch): the importance weights
  pi_prox/pi_behav spread and their effective sample size falls.
- `duplicated_carry`: a response carried to the next step has its tokens so far appended twice (a broken
  resume path), so carried samples grow longer than fresh ones.
Plain knobs do the rest: `ppo.kl_coef` small (see configs/ppo-hack.yaml) for over-optimisation,
`ppo.actor_lr` for an oversized learning rate.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml
from transformers.utils import logging as hf_logging

from common.errors import BadInput
from training import ppo as P
from training.config import TrainConfig
from training.continuous import ContinuousEngine, continuous_rollout
from training.engine import IncrementalScorer, TransformersEngine, left_pad
from training.gate import GATE_RECORDS, GateRecordsCSV, PromptRecord, batch_seed, heldout_batches, proxy_scores, summary
from training.metrics import NAN, StepRecord
from training.models import (
    Tokenizer,
    _max_positions,
    base_policy,
    build_causal_lm,
    build_scorer,
    format_prompt,
    frozen_copy,
    make_tokenizer,
    proxy_reward_model,
)
from training.oppo import ChunkTuner, DeltaController, deferral_histogram
from training.rollout import Sample, Sequence, rollout
from training.task import gold_score, make_prompts, parseable

OVERLAPS = ("none", "intra", "inter", "full")


def check_overlap(overlap: str) -> str:
    if overlap not in OVERLAPS:
        raise BadInput(f"overlap: '{overlap}' is not one of {', '.join(OVERLAPS)}")
    return overlap


@dataclass
class GoldEval:
    mean: float
    se: float
    n: int
    response_len_mean: float
    unparseable_rate: float
    #: one per prompt, in prompt order (training/gate.py)
    records: list[PromptRecord] = field(default_factory=list)


class Trainer:
    def __init__(self, config: TrainConfig, overlap: str = "full", out_dir: str | Path | None = None,
                 resume: bool = True, progress=None):
        self.cfg = cfg = config
        self.overlap = check_overlap(overlap)
        self.stream = overlap in ("intra", "full")
        self.overcommit = overlap in ("inter", "full")
        self.out_dir = Path(out_dir) if out_dir else None
        self.progress = progress  # optional callable(str) for long setup work
        if cfg.engine == "vllm" and not cfg.policy.model_name_or_path:
            raise BadInput("engine: 'vllm' needs policy.model_name_or_path (a checkpoint vLLM can load)")
        torch.set_num_threads(cfg.oppo.torch_threads)
        self.grouped = cfg.ppo.advantage != "gae"
        self.group_size = cfg.ppo.group_size if self.grouped else 1
        self.units_per_step = cfg.ppo.batch_size // self.group_size

        self._say("building tokenizer, base policy and proxy reward model (cached after the first run)")
        self.tok: Tokenizer = make_tokenizer(cfg.policy.model_name_or_path)
        self.prompts = make_prompts(cfg.task, cfg.seed)
        base = base_policy(cfg, self.tok)
        self.ref = frozen_copy(base)
        self.actor = base
        self.actor.train(False)
        self.reward_model = frozen_copy(proxy_reward_model(cfg, self.tok))
        self.critic = None
        if not self.grouped:
            self.critic = build_scorer(cfg.policy, self.tok, _max_positions(cfg))
            body = {k: v for k, v in base.state_dict().items() if not k.startswith("lm_head")}
            self.critic.load_state_dict(body, strict=False)
            torch.nn.init.zeros_(self.critic.score.weight)
            self.critic.train(False)
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.ppo.actor_lr, weight_decay=0.0)
        self.critic_opt = (torch.optim.AdamW(self.critic.parameters(), lr=cfg.ppo.critic_lr, weight_decay=0.0)
                           if self.critic is not None else None)
        if cfg.engine == "vllm":  # pragma: no cover - GPU only, never run here (see training/engine.py)
            from training.engine import VLLMEngine

            self.engine = VLLMEngine(cfg.policy.model_name_or_path, self.tok.eos_id, self.tok.pad_id,
                                     cfg.ppo.temperature)
        elif cfg.engine == "continuous" and self.overcommit:  # inter-step overlap refills rows (training/continuous.py)
            self.engine = ContinuousEngine(self.tok.eos_id, self.tok.pad_id, cfg.ppo.temperature,
                                           refill_min=cfg.oppo.refill_min)
        else:
            self.engine = TransformersEngine(self.tok.eos_id, self.tok.pad_id, cfg.ppo.temperature)
        self.scorers = {"ref": IncrementalScorer(self.ref, "logprob", cfg.ppo.temperature),
                        "reward": IncrementalScorer(self.reward_model, "reward")}
        if self.critic is not None:
            self.scorers["critic"] = IncrementalScorer(self.critic, "value")

        o = cfg.oppo
        self.delta_ctl = DeltaController(o.delta_init if self.overcommit else 0, o.delta_min if self.overcommit else 0,
                                         o.delta_max if self.overcommit else 0, o.delta_window, o.delta_rule,
                                         o.adaptive_delta and self.overcommit)
        self.tuner = ChunkTuner(o.chunk_size, o.chunk_candidates, o.tune_every, o.tune_chunk and self.stream)
        self.prompt_rng = np.random.default_rng([cfg.seed, 404])
        self.sample_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 1)
        self.shuffle_gen = torch.Generator().manual_seed(cfg.seed * 1000 + 2)
        self.buffer: list[Sequence] = []
        self.next_uid = 0
        self.step = 0  # number of completed PPO steps == policy version
        self.wall_s = 0.0
        self.deferral_counts: Counter = Counter()
        self.frozen_actor: torch.nn.Module | None = None
        self.checkpoints: list[Path] = []
        #: the eval gate's per-prompt records by step (this process's gates and extensions), the extension batches
        #: each step has had, the extra prompt evaluations spent, and the weights kept for `extend_gate`
        self.gate_records: dict[int, list[PromptRecord]] = {}
        self.gate_extended: dict[int, int] = {}
        self.extra_evals = 0
        self._gate_weights: dict[int, dict] = {}
        if self.out_dir and resume:
            ckpt = latest_checkpoint(self.out_dir)
            if ckpt is not None:
                self._say(f"resuming from {ckpt}")
                self.load_checkpoint(ckpt)

    def _say(self, msg: str) -> None:
        if self.progress:
            self.progress(msg)

    # ---- one step -------------------------------------------------------------------------------
    def _fill_buffer(self, units: int) -> None:
        have = len({s.group for s in self.buffer})
        while have < units:
            self.buffer += self._new_unit()
            have += 1

    def _new_unit(self) -> list[Sequence]:
        """One freshly drawn prompt: `group_size` sequences of it (one for PPO)."""
        prompt = self.prompts.train[int(self.prompt_rng.integers(len(self.prompts.train)))]
        ids = self.tok.encode(format_prompt(prompt))
        group = self.next_uid
        unit = []
        for _ in range(self.group_size):
            unit.append(Sequence(uid=self.next_uid, group=group, prompt=prompt, prompt_ids=ids,
                                 enqueued_step=self.step))
            self.next_uid += 1
        return unit

    def _fault_active(self, kind: str) -> bool:
        return self.cfg.fault.kind == kind and self.step >= self.cfg.fault.at_step

    def _sync(self) -> float:
        t = time.perf_counter()
        if self._fault_active("frozen_sync"):
            if self.frozen_actor is None:
                self.frozen_actor = frozen_copy(self.actor)
                self.frozen_version = self.step
            self.engine.sync(self.frozen_actor, self.frozen_version)
        else:
            self.engine.sync(self.actor, self.step)
        if hasattr(self.engine, "temperature"):  # behaviour_mismatch: the engine samples at another temperature
            mult = self.cfg.fault.factor if self._fault_active("behaviour_mismatch") else 1.0
            self.engine.temperature = self.cfg.ppo.temperature * mult
        return time.perf_counter() - t

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
            logits = self.actor(input_ids=ids, attention_mask=attn, position_ids=pos).logits
            logits = logits[:, p_w - 1 : p_w - 1 + t_w] / self.cfg.ppo.temperature
            lp = torch.log_softmax(logits, -1).gather(-1, ids[:, p_w:, None]).squeeze(-1)
            for r, i in enumerate(micro):
                L = len(samples[i].seq.response_ids)
                out[i, :L] = lp[r, :L]
        return out

    def _score(self, sample: Sample) -> float:
        score = sample.score
        if self._fault_active("constant_reward"):
            score = 0.0
        elif self._fault_active("nan_reward"):
            score = float("nan")
        elif self._fault_active("gameable_reward"):
            text = self.tok.decode(sample.seq.response_ids)
            score += self.cfg.fault.bonus * text.count(self.cfg.fault.trigger)
        return score

    def run(self, steps: int | None = None) -> Iterator[StepRecord]:
        """Train until `steps` total steps (default: config.steps); yields one record per step."""
        total = steps if steps is not None else self.cfg.steps
        writer = _MetricsCSV(self.out_dir / "metrics.csv", self.step) if self.out_dir else None
        self._gate_csv = GateRecordsCSV(self.out_dir / GATE_RECORDS, self.step) if self.out_dir else None
        try:
            while self.step < total:
                record = self.train_step()
                if writer:
                    writer.write(record)
                if self.out_dir and (self.step % self.cfg.checkpoint_every == 0 or self.step == total):
                    self.save_checkpoint()
                yield record
        finally:
            if writer:
                writer.close()
            if self.out_dir:
                self._write_summary()

    def train_step(self) -> StepRecord:
        cfg = self.cfg
        t_start = time.perf_counter()
        phases = {"rollout": 0.0, "score": 0.0, "sync": 0.0, "optim": 0.0, "eval": 0.0}
        phases["sync"] = self._sync()
        delta = self.delta_ctl.delta
        continuous = isinstance(self.engine, ContinuousEngine)
        if not continuous:  # the full-batch engine draws prompts as its rows free up
            self._fill_buffer(self.units_per_step + delta)
        chunk = self.tuner.chunk_for_step(self.step) if self.stream else cfg.ppo.max_new_tokens
        # torch's thread count is per process: set it every step, so trainers sharing a process (the bench's
        # interleaved runs) each run with their own setting; decode and scorer thread get one core each
        torch.set_num_threads(1 if self.stream else cfg.oppo.torch_threads)
        try:
            if continuous:
                out = continuous_rollout(
                    self.engine, self.scorers, self.buffer, self._new_unit,
                    slots=(self.units_per_step + delta) * self.group_size, pad_id=self.tok.pad_id,
                    units_needed=self.units_per_step, max_new_tokens=cfg.ppo.max_new_tokens,
                    generator=self.sample_gen, grouped=self.grouped, group_size=self.group_size,
                    score_at_once=self.stream, scorer_threads=1,
                )
            else:
                out = rollout(
                    self.engine, self.scorers, self.buffer, pad_id=self.tok.pad_id, units_needed=self.units_per_step,
                    max_new_tokens=cfg.ppo.max_new_tokens, chunk_size=chunk, stream=self.stream,
                    generator=self.sample_gen, grouped=self.grouped, scorer_threads=1,
                )
        finally:
            torch.set_num_threads(cfg.oppo.torch_threads)
        phases["rollout"], phases["score"] = out.decode_s, out.score_s
        if self.stream and not continuous:
            self.tuner.report(chunk, out.decode_s + out.score_s, out.tokens_generated)
        self.buffer = out.deferred
        if self._fault_active("duplicated_carry"):
            for s in self.buffer:  # the carried tokens appended twice, within the length budget
                keep = max(len(s.response_ids), min(2 * len(s.response_ids), cfg.ppo.max_new_tokens - 1))
                s.response_ids = (s.response_ids * 2)[:keep]
                s.versions = (s.versions * 2)[:keep]
                s.behav_logprobs = (s.behav_logprobs * 2)[:keep]
        samples = out.samples
        if self.grouped:  # keep group members adjacent for group advantages
            samples = sorted(samples, key=lambda s: (s.seq.group, s.seq.uid))
        for s in samples:
            self.deferral_counts[self.step - s.seq.enqueued_step] += 1
        self.last_response_lengths = [len(s.seq.response_ids) for s in samples]
        carried = [len(s.seq.response_ids) for s in samples if s.seq.enqueued_step < self.step]
        fresh = [len(s.seq.response_ids) for s in samples if s.seq.enqueued_step >= self.step]

        t = time.perf_counter()
        stats = self._ppo_update(samples)
        phases["optim"] = time.perf_counter() - t
        self.step += 1

        scores = np.array([st for st in stats.pop("scores")])
        record = StepRecord(step=self.step, policy_version=self.step, reward_mean=float(np.mean(scores)),
                            reward_std=float(np.std(scores)), **stats)
        texts = [self.tok.decode(s.seq.response_ids) for s in samples]
        record.response_len_mean = float(np.mean([len(s.seq.response_ids) for s in samples]))
        record.truncation_rate = float(np.mean([s.seq.truncated for s in samples]))
        record.unparseable_rate = float(np.mean([not parseable(x) for x in texts]))
        record.tokens_generated = out.tokens_generated
        record.samples_trained = len(samples)
        record.delta = delta
        record.chunk_size = chunk if self.stream and not continuous else 0
        record.deferred = len(self.buffer)
        record.decode_steps = out.decode_steps
        record.len_carried_mean = float(np.mean(carried)) if carried else NAN
        record.len_fresh_mean = float(np.mean(fresh)) if fresh else NAN
        if self.step % cfg.eval_every == 0:
            t = time.perf_counter()
            ev = self.gate()
            record.gold_eval, record.gold_eval_se = ev.mean, ev.se
            phases["eval"] = time.perf_counter() - t
        self.delta_ctl.update(record.reward_mean)
        record.phase_seconds = phases
        self.wall_s += time.perf_counter() - t_start
        record.wall_s = self.wall_s
        return record

    # ---- eval gate -----------------------------------------------------------------------------
    def _proxy_bonus(self, text: str) -> float:
        """What the gameable-reward fault adds to a response's proxy score (0 when the fault is off)."""
        if self._fault_active("gameable_reward"):
            return self.cfg.fault.bonus * text.count(self.cfg.fault.trigger)
        return 0.0

    def score_batch(self, batch: int, policy: torch.nn.Module | None = None) -> GoldEval:
        """Score held-out batch `batch` (0: the gate's prompts; 1, 2, ...: the extension batches) with its fixed
        sampling seed (common random numbers, training/gate.py): gold and proxy score per prompt."""
        cfg = self.cfg
        rng = heldout_batches(cfg.task.n_heldout_prompts, cfg.eval_prompts, cfg.eval_extra_batch)[batch]
        return gold_eval(policy if policy is not None else self.actor, [self.prompts.heldout[i] for i in rng], cfg,
                         tok=self.tok, seed=batch_seed(cfg.seed, batch), prompt_ids=list(rng),
                         reward_model=self.reward_model, proxy_bonus=self._proxy_bonus)

    def gate(self) -> GoldEval:
        """The eval gate at the current step: held-out batch 0, its per-prompt records kept (`gate_records`) and
        written to the run directory's gate_records.csv; the policy's weights are kept while an extension budget
        is set, so `extend_gate` can score this checkpoint again later."""
        ev = self.score_batch(0)
        self.gate_records[self.step] = list(ev.records)
        if self.cfg.eval_extra_budget > 0:
            self._gate_weights[self.step] = {k: v.detach().clone() for k, v in self.actor.state_dict().items()}
        if getattr(self, "_gate_csv", None) is not None:
            self._gate_csv.write(self.cfg.name, self.step, ev.records)
        return ev

    def _policy_at(self, step: int) -> torch.nn.Module:
        if step == self.step:
            return self.actor
        state = self._gate_weights.get(step)
        if state is None:
            ckpt = (self.out_dir / "checkpoints" / f"step-{step:06d}") if self.out_dir else None
            if ckpt is None or not (ckpt / "state.pt").is_file():
                raise ValueError(f"extend_gate: no weights kept for step {step} (not a gate of this process and "
                                 "no checkpoint there)")
            state = torch.load(ckpt / "state.pt", map_location="cpu", weights_only=False)["actor"]
        policy = frozen_copy(self.actor)
        policy.load_state_dict(state)
        return policy

    def extend_gate(self, steps: tuple[int, ...]) -> tuple[dict[int, list[PromptRecord]], float]:
        """Score the next extension batch of held-out prompts for the checkpoints at `steps` (a close decision: the
        current one and its reference), within `eval_extra_budget` prompt evaluations for the run. Returns
        ({step: the batch's records}, eval seconds spent); ({}, 0.0) when the budget or the held-out pool is spent.
        The records are appended to gate_records.csv; the seconds belong to the ledger's `eval` phase."""
        cfg = self.cfg
        batches = heldout_batches(cfg.task.n_heldout_prompts, cfg.eval_prompts, cfg.eval_extra_batch)
        steps = tuple(dict.fromkeys(int(s) for s in steps))
        have = {s: self.gate_extended.get(s, 0) for s in steps}
        batch = 1 + min(have.values()) if have else 1
        cost = sum(len(batches[batch]) for s in steps if have[s] < batch) if batch < len(batches) else 0
        if batch >= len(batches) or cost == 0 or self.extra_evals + cost > cfg.eval_extra_budget:
            return {}, 0.0
        t = time.perf_counter()
        out: dict[int, list[PromptRecord]] = {}
        for s in steps:
            if have[s] >= batch:
                continue
            ev = self.score_batch(batch, self._policy_at(s))
            out[s] = list(ev.records)
            self.gate_records.setdefault(s, []).extend(ev.records)
            self.gate_extended[s] = batch
            if getattr(self, "_gate_csv", None) is not None:
                self._gate_csv.write(cfg.name, s, ev.records)
        self.extra_evals += cost
        return out, time.perf_counter() - t

    # ---- PPO update ----------------------------------------------------------------------------
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
            old_lp[i, :L], ref_lp[i, :L] = s.old_logprobs, s.ref_logprobs
            behav_lp[i, :L] = s.behav_logprobs if s.behav_logprobs is not None else s.old_logprobs
            if s.values is not None:
                values[i, :L] = s.values
            versions[i, :L] = torch.tensor(s.seq.versions)
        scores = torch.tensor([self._score(s) for s in samples], dtype=torch.float32)
        rewards, kl = P.kl_penalised_rewards(scores, old_lp, ref_lp, mask, cfg.kl_coef)
        if self.grouped:
            seq_reward = rewards.sum(1)
            adv = P.group_advantages(seq_reward, self.group_size, cfg.advantage)[:, None] * mask
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
        # off-policy correction (training/ppo.py): pi_prox is the actor before this update
        correction, is_cap = self.cfg.oppo.correction, self.cfg.oppo.is_cap
        prox_lp = old_lp if self._engine_is_actor() else self._proximal_logprobs(samples, T)
        raw_w = (prox_lp - behav_lp).exp() * train_mask  # before any cap: how off-policy the batch is
        lr_mult = self.cfg.fault.factor if self._fault_active("lr_spike") else 1.0
        for group in self.actor_opt.param_groups:
            group["lr"] = cfg.actor_lr * lr_mult
        if self.critic_opt:
            for group in self.critic_opt.param_groups:
                group["lr"] = cfg.critic_lr * lr_mult

        acc: dict[str, list[float]] = {k: [] for k in ("loss_policy", "loss_value", "clip_frac", "approx_kl",
                                                        "entropy", "grad_norm")}
        self.actor.train(True)
        mb_size = n // cfg.num_mini_batches
        for _ in range(cfg.num_ppo_epochs):
            perm = torch.randperm(n, generator=self.shuffle_gen).tolist()
            for start in range(0, n, mb_size):
                idx = perm[start : start + mb_size]
                n_tok = float(train_mask[idx].sum().clamp(min=1))
                self.actor_opt.zero_grad(set_to_none=True)
                if self.critic_opt:
                    self.critic_opt.zero_grad(set_to_none=True)
                sums = {"loss_policy": 0.0, "loss_value": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "entropy": 0.0}
                for micro in _micro_batches(idx, samples):
                    ids, attn, p_w, t_w = self._pack(micro, samples)
                    tmask = train_mask[micro, :t_w]
                    w = float(tmask.sum()) / n_tok
                    pos = (attn.cumsum(1) - 1).clamp(min=0)
                    logits = self.actor(input_ids=ids, attention_mask=attn, position_ids=pos).logits
                    logits = logits[:, p_w - 1 : p_w - 1 + t_w] / cfg.temperature
                    lp = torch.log_softmax(logits, -1).gather(-1, ids[:, p_w:, None]).squeeze(-1)
                    if correction == "none":
                        pg_loss, st = P.policy_loss(lp, old_lp[micro, :t_w], adv[micro, :t_w], tmask, cfg.cliprange)
                    else:
                        pg_loss, st = P.corrected_policy_loss(lp, prox_lp[micro, :t_w], behav_lp[micro, :t_w],
                                                              adv[micro, :t_w], tmask, cfg.cliprange, is_cap,
                                                              correction)
                    ent = P.masked_mean(P.entropy_from_logits(logits.detach()), tmask)
                    loss = pg_loss
                    if cfg.ent_coef:
                        loss = loss - cfg.ent_coef * P.masked_mean(P.entropy_from_logits(logits), tmask)
                    (loss * w).backward()
                    sums["loss_policy"] += float(pg_loss.detach()) * w
                    sums["clip_frac"] += float(st["clip_frac"]) * w
                    sums["approx_kl"] += float(st["approx_kl"]) * w
                    sums["entropy"] += float(ent) * w
                    if self.critic is not None:
                        hidden = self.critic.base_model(input_ids=ids, attention_mask=attn,
                                                        position_ids=pos).last_hidden_state
                        vpred = self.critic.score(hidden[:, p_w - 1 : p_w - 1 + t_w]).squeeze(-1)
                        vf = P.value_loss(vpred, values[micro, :t_w], returns[micro, :t_w], tmask,
                                          cfg.cliprange_value)
                        (cfg.vf_coef * vf * w).backward()
                        sums["loss_value"] += float(vf.detach()) * w
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
        return ids, attn, p_w, t_w

    # ---- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        path = self.out_dir / "checkpoints" / f"step-{self.step:06d}"
        tmp = path.with_name(path.name + ".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        state = {
            "step": self.step, "wall_s": self.wall_s, "next_uid": self.next_uid, "overlap": self.overlap,
            "actor": self.actor.state_dict(), "actor_opt": self.actor_opt.state_dict(),
            "critic": self.critic.state_dict() if self.critic is not None else None,
            "critic_opt": self.critic_opt.state_dict() if self.critic_opt else None,
            "buffer": [vars(s) for s in self.buffer],
            "delta_ctl": self.delta_ctl.state_dict(), "tuner": self.tuner.state_dict(),
            "deferral_counts": dict(self.deferral_counts),
            "frozen_actor": self.frozen_actor.state_dict() if self.frozen_actor is not None else None,
            "frozen_version": getattr(self, "frozen_version", None),
            "rng": {"prompt": self.prompt_rng.bit_generator.state, "sample": self.sample_gen.get_state(),
                    "shuffle": self.shuffle_gen.get_state(), "torch": torch.get_rng_state(),
                    "python": random.getstate(), "numpy": np.random.get_state()},
        }
        torch.save(state, tmp / "state.pt")
        hf_logging.disable_progress_bar()  # no "Writing model shards" bar over the CLI's progress display
        self.actor.save_pretrained(tmp / "actor")
        self.tok.hf.save_pretrained(tmp / "actor")  # a complete model dir: usable as model_name_or_path
        (tmp / "config.yaml").write_text(yaml.safe_dump(self.cfg.model_dump(mode="json"), sort_keys=False))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
        self.checkpoints.append(path)
        keep = self.cfg.keep_checkpoints
        if keep:
            for old in sorted(path.parent.glob("step-*"))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        return path

    def load_checkpoint(self, path: Path) -> None:
        state = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)
        self.step, self.wall_s, self.next_uid = state["step"], state["wall_s"], state["next_uid"]
        self.actor.load_state_dict(state["actor"])
        self.actor_opt.load_state_dict(state["actor_opt"])
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
            self.critic_opt.load_state_dict(state["critic_opt"])
        self.buffer = [Sequence(**d) for d in state["buffer"]]
        self.delta_ctl.load_state_dict(state["delta_ctl"])
        self.tuner.load_state_dict(state["tuner"])
        self.deferral_counts = Counter({int(k): v for k, v in state["deferral_counts"].items()})
        if state["frozen_actor"] is not None:
            self.frozen_actor = frozen_copy(self.actor)
            self.frozen_actor.load_state_dict(state["frozen_actor"])
            self.frozen_version = state["frozen_version"]
        rng = state["rng"]
        self.prompt_rng.bit_generator.state = rng["prompt"]
        self.sample_gen.set_state(rng["sample"])
        self.shuffle_gen.set_state(rng["shuffle"])
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])

    def _write_summary(self) -> None:
        summary = {"overlap": self.overlap, "steps": self.step, "wall_s": self.wall_s,
                   "deferral_histogram": deferral_histogram(self.deferral_counts),
                   "delta": self.delta_ctl.delta, "chunk_size": self.tuner.current,
                   "checkpoints": [str(p) for p in sorted((self.out_dir / "checkpoints").glob("step-*"))]}
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))


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


class _MetricsCSV:
    """metrics.csv writer; on resume it keeps only rows up to the checkpoint's step."""

    def __init__(self, path: Path, resume_step: int):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = []
        if path.exists() and resume_step > 0:
            with path.open() as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
        self.fields = list(StepRecord(step=0, policy_version=0, reward_mean=0.0).flat())
        self.f = path.open("w", newline="")
        self.w = csv.DictWriter(self.f, fieldnames=self.fields)
        self.w.writeheader()
        for r in rows:
            self.w.writerow({k: r.get(k, "") for k in self.fields})
        self.f.flush()

    def write(self, record: StepRecord) -> None:
        self.w.writerow(record.flat())
        self.f.flush()

    def close(self) -> None:
        self.f.close()


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    ckpts = sorted(Path(out_dir).glob("checkpoints/step-[0-9]*[0-9]"))
    return ckpts[-1] if ckpts else None


def train(config: TrainConfig, overlap: str = "full", out_dir: str | Path | None = None, steps: int | None = None,
          resume: bool = True, progress=None) -> Iterator[StepRecord]:
    """Run PPO with the chosen overlap; yields one StepRecord per step (see module docstring)."""
    yield from Trainer(config, overlap, out_dir, resume=resume, progress=progress).run(steps)


@torch.no_grad()
def generate(policy: torch.nn.Module, tok: Tokenizer, prompts: list[str], max_new_tokens: int,
             temperature: float = 1.0, seed: int = 0) -> list[list[int]]:
    """Sample one response per prompt with the KV-cached engine (no overlap); returns token ids."""
    engine = TransformersEngine(tok.eos_id, tok.pad_id, temperature)
    engine.sync(policy, 0)
    ids, attn = left_pad([tok.encode(format_prompt(p)) for p in prompts], tok.pad_id)
    n = len(prompts)
    gen = torch.Generator().manual_seed(seed)
    engine.begin(ids, attn, torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.long), max_new_tokens, gen)
    chunk = engine.decode(max_new_tokens, n)
    engine.release()
    return [chunk.ids[i][chunk.mask[i].bool()].tolist() for i in range(n)]


def gold_eval(policy_or_checkpoint, prompts: list[str] | None = None, config: TrainConfig | None = None, *,
              tok: Tokenizer | None = None, seed: int | None = None, prompt_ids: list[int] | None = None,
              reward_model: torch.nn.Module | None = None, proxy_bonus=None) -> GoldEval:
    """Gold score (world feedback) of a policy on held-out prompts: mean, standard error, n, and one
    `PromptRecord` per prompt.

    `policy_or_checkpoint`: a causal LM, or a checkpoint directory written by the trainer (its
    `config.yaml` supplies the config). `prompts` default to the config's held-out prompts
    (`eval_prompts` of them), which training never sees; `prompt_ids` name them (default 0, 1, ...). `seed`: the
    sampling seed, default the run's fixed gate seed (`training.gate.batch_seed(config.seed, 0)`), so a checkpoint
    scored here reads what the trainer's gate read. `reward_model` (optional) gives each record its proxy score,
    plus `proxy_bonus(text)` where training's reward adds one (NaN without a reward model).
    """
    if isinstance(policy_or_checkpoint, (str, Path)):
        ckpt = Path(policy_or_checkpoint)
        if not (ckpt / "actor").is_dir():
            raise BadInput(f"checkpoint: '{ckpt}' has no actor/ directory (pass a checkpoints/step-NNNNNN path)")
        if config is None:
            config = TrainConfig.model_validate(yaml.safe_load((ckpt / "config.yaml").read_text()))
        tok = tok or make_tokenizer(config.policy.model_name_or_path)
        policy = build_causal_lm(config.policy.model_copy(update={"model_name_or_path": str(ckpt / "actor")}), tok,
                                 _max_positions(config)).eval()
    else:
        policy = policy_or_checkpoint
        if config is None:
            raise BadInput("gold_eval: pass config= when evaluating a live policy")
        tok = tok or make_tokenizer(config.policy.model_name_or_path)
    if prompts is None:
        prompts = make_prompts(config.task, config.seed).heldout[: config.eval_prompts]
    ids = list(prompt_ids) if prompt_ids is not None else list(range(len(prompts)))
    if len(ids) != len(prompts):
        raise ValueError(f"gold_eval: {len(prompts)} prompts but {len(ids)} prompt_ids")
    seed = batch_seed(config.seed, 0) if seed is None else int(seed)
    responses = generate(policy, tok, prompts, config.ppo.max_new_tokens, config.ppo.temperature, seed=seed)
    texts = [tok.decode(r) for r in responses]
    golds = [gold_score(p, t, config.task) for p, t in zip(prompts, texts, strict=True)]
    if reward_model is not None:
        proxies = proxy_scores(reward_model, [tok.encode(format_prompt(p)) for p in prompts], responses, tok.pad_id)
        if proxy_bonus is not None:
            proxies = [v + proxy_bonus(t) for v, t in zip(proxies, texts, strict=True)]
    else:
        proxies = [NAN] * len(prompts)
    records = [PromptRecord(prompt_id=int(i), seed=seed, gold_score=float(g), proxy_score=float(x),
                            response_len=len(r)) for i, g, x, r in zip(ids, golds, proxies, responses, strict=True)]
    mean, se = summary(records)
    return GoldEval(mean=mean, se=se, n=len(records),
                    response_len_mean=float(np.mean([len(r) for r in responses])),
                    unparseable_rate=float(np.mean([not parseable(t) for t in texts])), records=records)
