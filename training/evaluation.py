"""Gold evaluation on held-out prompts: `generate`, `gold_eval` (a checkpoint or a live policy) and the trainer's
eval gate (`EvalGate`, a mixin of `training.trainer.Trainer`: the gate at a step, its fixed-seed extension batches).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from common.errors import BadInput
from training.gate import HeldoutScorer, PromptRecord, batch_seed, heldout_batches, proxy_scores, summary
from training.inputs.job_inputs import JobInputs, job_inputs
from training.inputs.synthetic_task import parseable
from training.inputs.tokenizer import Tokenizer, tokenizer_for
from training.job.config import TrainConfig
from training.job.device import autocast, model_device, resolve_device
from training.metrics import NAN
from training.models import _max_positions, build_causal_lm, checkpoint_scorer, frozen_copy
from training.rollout.engine import TransformersEngine, left_pad


@dataclass
class GoldEval:
    mean: float
    se: float
    n: int
    response_len_mean: float
    unparseable_rate: float
    #: one per prompt, in prompt order (training/gate.py)
    records: list[PromptRecord] = field(default_factory=list)


class EvalGate:
    def _proxy_bonus(self, text: str) -> float:
        """What the gameable-reward fault adds to a response's proxy score (0 when the fault is off)."""
        if self._fault_active("gameable_reward"):
            return self.cfg.fault.bonus * text.count(self.cfg.fault.trigger)
        return 0.0

    def score_batch(self, batch: int, policy: torch.nn.Module | None = None) -> GoldEval:
        """Score held-out batch `batch` (0: the gate's prompts; 1, 2, ...: the extension batches) with its fixed
        sampling seed (common random numbers, training/gate.py): gold and proxy score per prompt."""
        cfg = self.cfg
        rng = heldout_batches(self.inputs.n_heldout, cfg.eval_prompts, cfg.eval_extra_batch)[batch]
        return gold_eval(policy if policy is not None else self.actor, self.inputs.heldout_prompts(rng), cfg,
                         tok=self.tok, seed=batch_seed(cfg.seed, batch), prompt_ids=list(rng),
                         reward_model=self.reward_model, proxy_bonus=self._proxy_bonus, inputs=self.inputs,
                         scorer=self.heldout_scorer())

    def heldout_scorer(self) -> HeldoutScorer:
        """The gate's scorer (training/inputs/scorers.py), built once: the gold scorer, the gate function (in the job's
        tenant-code processes) or the gate's model."""
        if getattr(self, "_heldout_scorer", None) is None:
            model = (checkpoint_scorer(self.cfg.gate.path, self.tok, self.cfg, self.device)
                     if self.cfg.gate.kind == "model" else None)
            self._heldout_scorer = HeldoutScorer(self.cfg, self.inputs, self.tok, self.tenant_pool, model)
        self._heldout_scorer.step = self.step  # a gate function's trainer_state.global_step
        return self._heldout_scorer

    def gate(self) -> GoldEval:
        """The eval gate at the current step: held-out batch 0, its per-prompt records kept (`gate_records`) and
        written to the run directory's gate_records.csv; the policy's weights are kept while an extension budget
        is set, so `extend_gate` can score this checkpoint again later."""
        ev = self.score_batch(0)
        self.gate_records[self.step] = list(ev.records)
        if self.cfg.eval_extra_budget > 0:
            # kept on the CPU: a GPU holds one policy, not one per gate
            self._gate_weights[self.step] = {k: v.detach().to("cpu", copy=True)
                                             for k, v in self.actor.state_dict().items()}
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
        batches = heldout_batches(self.inputs.n_heldout, cfg.eval_prompts, cfg.eval_extra_batch)
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


def _scoring_device(trained_on: str) -> torch.device:
    return resolve_device("cpu" if trained_on == "cpu" else "auto")


@torch.no_grad()
def generate(policy: torch.nn.Module, tok: Tokenizer, prompts: list[str], max_new_tokens: int,
             temperature: float = 1.0, seed: int = 0, render=None) -> list[list[int]]:
    """Sample one response per prompt with the KV-cached engine (no overlap), on the policy's device; returns token
    ids. `render(prompt) -> text` is how the job's inputs present a prompt (default the synthetic task's)."""
    from training.models import format_prompt

    render = render or format_prompt
    engine = TransformersEngine(tok.eos_id, tok.pad_id, temperature)
    engine.sync(policy, 0)
    device = model_device(policy)
    ids, attn = left_pad([tok.encode(render(p)) for p in prompts], tok.pad_id)
    n = len(prompts)
    gen = torch.Generator(device=device).manual_seed(seed)
    engine.begin(ids.to(device), attn.to(device), torch.zeros(n, dtype=torch.bool, device=device),
                 torch.zeros(n, dtype=torch.long, device=device), max_new_tokens, gen)
    chunk = engine.decode(max_new_tokens, n)
    engine.release()
    ids, mask = chunk.ids.cpu(), chunk.mask.cpu()
    return [ids[i][mask[i].bool()].tolist() for i in range(n)]


def gold_eval(policy_or_checkpoint, prompts: list[str] | None = None, config: TrainConfig | None = None, *,
              tok: Tokenizer | None = None, seed: int | None = None, prompt_ids: list[int] | None = None,
              reward_model: torch.nn.Module | None = None, proxy_bonus=None,
              device: torch.device | str | None = None, inputs: JobInputs | None = None,
              scorer: HeldoutScorer | None = None) -> GoldEval:
    """Gold score (world feedback) of a policy on held-out prompts: mean, standard error, n, and one
    `PromptRecord` per prompt.

    `policy_or_checkpoint`: a causal LM, or a checkpoint directory written by the trainer (its
    `config.yaml` supplies the config). `prompts` default to the config's held-out prompts
    (`eval_prompts` of them), which training never sees; `prompt_ids` name them (default 0, 1, ...). `seed`: the
    sampling seed, default the run's fixed gate seed (`training.gate.batch_seed(config.seed, 0)`), so a checkpoint
    scored here reads what the trainer's gate read. `reward_model` (optional) gives each record its proxy score,
    plus `proxy_bonus(text)` where training's reward adds one (NaN without a reward model). A checkpoint is loaded
    onto `device` (default: the CPU when its config says cpu, else CUDA when present: the machine scoring it need not
    have the GPU that trained it); a live policy is scored where it is. Sampling runs at
    the config's dtype (bfloat16 autocast), as the trainer's gate does. `inputs` and `scorer` (default: built from the
    config) are the job's prompts (training/inputs/job_inputs.py) and the gate's scorer (training/inputs/scorers.py:
    the gold scorer, a gate function or a gate model); `gold_score` of a record is that scorer's score.
    """
    if isinstance(policy_or_checkpoint, (str, Path)):
        ckpt = Path(policy_or_checkpoint)
        if not (ckpt / "actor").is_dir():
            raise BadInput(f"checkpoint: '{ckpt}' has no actor/ directory (pass a checkpoints/step-NNNNNN path)")
        if config is None:
            config = TrainConfig.model_validate(yaml.safe_load((ckpt / "config.yaml").read_text()))
        tok = tok or tokenizer_for(config)
        policy = build_causal_lm(config.policy.model_copy(update={"model_name_or_path": str(ckpt / "actor")}), tok,
                                 _max_positions(config)).to(device or _scoring_device(config.device)).eval()
    else:
        policy = policy_or_checkpoint
        if config is None:
            raise BadInput("gold_eval: pass config= when evaluating a live policy")
        tok = tok or tokenizer_for(config)
    inputs = inputs or job_inputs(config, tok)
    own_scorer = scorer is None
    if own_scorer:
        scorer = heldout_scorer_for(config, inputs, tok, model_device(policy))
    if prompts is None:
        prompts = inputs.heldout_prompts(range(min(config.eval_prompts, inputs.n_heldout)))
    ids = list(prompt_ids) if prompt_ids is not None else list(range(len(prompts)))
    if len(ids) != len(prompts):
        raise ValueError(f"gold_eval: {len(prompts)} prompts but {len(ids)} prompt_ids")
    seed = batch_seed(config.seed, 0) if seed is None else int(seed)
    with autocast(model_device(policy), config.dtype):
        responses = generate(policy, tok, prompts, config.ppo.max_new_tokens, config.ppo.temperature, seed=seed,
                             render=inputs.render)
    texts = [tok.decode(r) for r in responses]
    try:
        golds = scorer.score(prompts, texts, responses, ids)
    finally:
        if own_scorer:
            scorer.close()
    if reward_model is not None:
        with autocast(model_device(reward_model), config.dtype):
            proxies = proxy_scores(reward_model, [tok.encode(inputs.render(p)) for p in prompts], responses,
                                   tok.pad_id)
        if proxy_bonus is not None:
            proxies = [v + proxy_bonus(t) for v, t in zip(proxies, texts, strict=True)]
    else:
        proxies = [NAN] * len(prompts)
    records = [PromptRecord(prompt_id=int(i), seed=seed, gold_score=float(g), proxy_score=float(x),
                            response_len=len(r)) for i, g, x, r in zip(ids, golds, proxies, responses, strict=True)]
    mean, se = summary(records)
    return GoldEval(mean=mean, se=se, n=len(records),
                    response_len_mean=float(np.mean([len(r) for r in responses])),
                    unparseable_rate=(float(np.mean([not parseable(t) for t in texts])) if inputs.kind == "synthetic"
                                      else 0.0), records=records)


def heldout_scorer_for(config: TrainConfig, inputs: JobInputs, tok: Tokenizer,
                       device: torch.device | str | None = None) -> HeldoutScorer:
    """A gate scorer of its own (a checkpoint scored outside its trainer): its tenant-code pool, if it needs one, is
    stopped by `HeldoutScorer.close`."""
    model = checkpoint_scorer(config.gate.path, tok, config, device) if config.gate.kind == "model" else None
    return HeldoutScorer(config, inputs, tok, model=model, own_pool=True)
