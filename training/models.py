"""The four PPO roles as transformers models and the two warm starts.

- actor / reference: a causal LM (`*ForCausalLM`), tiny and random-weight unless `model_name_or_path`;
  the reference is a frozen copy of the base policy.
- reward model / critic: `*ForSequenceClassification` with one label. The reward is the head's
  output at the last real token (what TRL's RewardTrainer trains); the critic applies the same
  head to every position (OpenRLHF's critic; it is initialised from the reward model, as OpenRLHF does).
- the tokenizer they are built for: training/inputs/tokenizer.py (`ByT5Tokenizer`'s bytes, a checkpoint's own, or the
  task's BPE).

Warm starts, cached under `cache_dir` by a hash of the config that made them so a run, its resume and the
benchmark's four modes share them: the base policy is fitted to the task corpus (a few hundred SFT steps,
seconds) so the reference writes text with long-tailed lengths; the proxy reward model is fitted to
gold-labelled noisy preference pairs with TRL's RewardTrainer (or the same Bradley-Terry loss in plain
torch, `task.rm_trainer: torch`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    Qwen2Config,
)

from training.inputs.synthetic_task import corpus_response, make_prompts, preference_pairs
from training.inputs.tokenizer import Tokenizer
from training.job.config import ModelConfig, TrainConfig

log = logging.getLogger(__name__)


def format_prompt(prompt: str) -> str:
    """The synthetic task's prompt as the model reads it (training/inputs/job_inputs.py `SyntheticInputs.render`)."""
    return prompt + " "


def _hf_config(mc: ModelConfig, tok: Tokenizer, max_positions: int, **extra):
    common = dict(vocab_size=tok.vocab_size, pad_token_id=tok.pad_id, eos_token_id=tok.eos_id, **extra)
    if mc.arch == "gpt2":
        return GPT2Config(
            n_embd=mc.hidden_size, n_layer=mc.num_layers, n_head=mc.num_heads, n_inner=mc.intermediate_size,
            n_positions=max_positions, bos_token_id=tok.eos_id, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, **common,
        )
    cls = LlamaConfig if mc.arch == "llama" else Qwen2Config
    return cls(
        hidden_size=mc.hidden_size, intermediate_size=mc.intermediate_size, num_hidden_layers=mc.num_layers,
        num_attention_heads=mc.num_heads, num_key_value_heads=mc.kv_heads,
        max_position_embeddings=max_positions, bos_token_id=None, tie_word_embeddings=True, **common,
    )


#: models are built one at a time in a process: transformers' `from_pretrained` initialises under a meta-device
#: context, and a model built in another thread meanwhile (a platform round's jobs score and start in threads) can get
#: meta tensors ("Cannot copy out of meta tensor" at its first `.to(device)`) or corrupted weights
_BUILD_LOCK = threading.RLock()


def build_causal_lm(mc: ModelConfig, tok: Tokenizer, max_positions: int) -> PreTrainedModel:
    with _BUILD_LOCK:
        if mc.model_name_or_path:
            return AutoModelForCausalLM.from_pretrained(mc.model_name_or_path, dtype=torch.float32)
        return AutoModelForCausalLM.from_config(_hf_config(mc, tok, max_positions), dtype=torch.float32)


def build_scorer(mc: ModelConfig, tok: Tokenizer, max_positions: int, path: str | None = None) -> PreTrainedModel:
    """A one-label sequence-classification model (reward model or critic)."""
    path = path or mc.model_name_or_path
    with _BUILD_LOCK:
        if path:
            model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        else:
            model = AutoModelForSequenceClassification.from_config(
                _hf_config(mc, tok, max_positions, num_labels=1), dtype=torch.float32
            )
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_id
    return model


def scorer_parts(model: PreTrainedModel) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(transformer body, linear head) of a sequence-classification model, for per-position outputs."""
    head = getattr(model, "score", None) or getattr(model, "classifier", None)
    if head is None:
        raise TypeError(f"{type(model).__name__} has no `score` head; use a *ForSequenceClassification model")
    return model.base_model, head


@functools.cache
def _build_code() -> str:
    """The code and libraries that build a warm start (this module, the task's corpus, torch, transformers): part of
    every cache key, so weights built by other code are rebuilt rather than silently reused."""
    import transformers

    from training.inputs import synthetic_task as task
    from training.inputs import tokenizer

    digest = hashlib.sha256()
    for source in (Path(__file__), Path(task.__file__), Path(tokenizer.__file__)):
        digest.update(source.read_bytes())
    digest.update(f"{torch.__version__} {transformers.__version__}".encode())
    return digest.hexdigest()[:12]


def _dump(part) -> Any:
    """A config part as the cache key reads it: a `kind` left at its default (the synthetic task, the proxy) is left
    out, so warm starts cached before the kinds existed keep their keys."""
    if not hasattr(part, "model_dump"):
        return part
    out = part.model_dump()
    if out.get("kind") in ("synthetic", "proxy"):
        out.pop("kind")
    return out


def _hash(*parts) -> str:
    blob = json.dumps([_dump(p) for p in parts] + [_build_code()], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _max_positions(cfg: TrainConfig) -> int:
    from training.job.config import max_positions

    return max_positions(cfg)


def _pad_right(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def fit_completions(cfg: TrainConfig, tok: Tokenizer, model: PreTrainedModel, draw) -> None:
    """Supervised fine-tuning of the base policy, in place: `task.sft_steps` AdamW steps (`sft_lr`, warm-up then
    linear decay) on length-bucketed batches of `sft_batch_size` (prompt, completion) pairs, the loss on the
    completion's tokens and EOS only. `draw(rng) -> (the prompt's text as the model reads it, the completion)` gives
    the pairs (the run's seed decides them)."""
    task = cfg.task
    rng = np.random.default_rng([cfg.seed, 303])
    opt = torch.optim.AdamW(model.parameters(), lr=task.sft_lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / task.sft_steps))
    model.train()
    device = _device_of(model)
    cap = cfg.ppo.max_new_tokens
    batches: list[list[tuple[list[int], int]]] = []
    for _ in range(task.sft_steps):
        if not batches:  # length-bucketed batches: long-tailed lengths would otherwise be mostly padding
            pool = []
            for _ in range(8 * task.sft_batch_size):
                prompt_text, completion = draw(rng)
                p_ids = tok.encode(prompt_text)
                r_ids = tok.encode(completion)[:cap]
                pool.append((p_ids + r_ids + ([tok.eos_id] if len(r_ids) < cap else []), len(p_ids)))
            pool.sort(key=lambda x: len(x[0]))
            batches = [pool[k : k + task.sft_batch_size] for k in range(0, len(pool), task.sft_batch_size)]
            rng.shuffle(batches)
        batch = batches.pop()
        seqs, starts = [b[0] for b in batch], [b[1] for b in batch]
        ids, mask = (t.to(device) for t in _pad_right(seqs, tok.pad_id))
        labels = ids.clone()
        labels[mask == 0] = -100
        for i, s in enumerate(starts):
            labels[i, :s] = -100
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
    model.eval()


def sft_base_policy(cfg: TrainConfig, tok: Tokenizer, model: PreTrainedModel) -> None:
    """Fit the tiny base policy to the synthetic task's corpus, in place (`fit_completions`)."""
    prompts = make_prompts(cfg.task, cfg.seed).train

    def draw(rng: np.random.Generator) -> tuple[str, str]:
        p = prompts[int(rng.integers(len(prompts)))]
        return format_prompt(p), corpus_response(p, cfg.task, rng)

    fit_completions(cfg, tok, model, draw)


def _pair_tensors(cfg: TrainConfig, tok: Tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    pairs = preference_pairs(make_prompts(cfg.task, cfg.seed).train, cfg.task, cfg.seed)
    cap = cfg.ppo.max_new_tokens
    chosen, rejected = [], []
    for p, c, r in pairs:
        p_ids = tok.encode(format_prompt(p))
        chosen.append(p_ids + tok.encode(c)[:cap] + [tok.eos_id])
        rejected.append(p_ids + tok.encode(r)[:cap] + [tok.eos_id])
    return chosen, rejected


def train_proxy_rm_torch(cfg: TrainConfig, tok: Tokenizer, model: PreTrainedModel) -> None:
    """Bradley-Terry loss -log sigmoid(r_chosen - r_rejected), the loss RewardTrainer minimises."""
    task = cfg.task
    chosen, rejected = _pair_tensors(cfg, tok)
    gen = torch.Generator().manual_seed(cfg.seed)  # the bucket order: on the CPU, the same on every device
    opt = torch.optim.AdamW(model.parameters(), lr=task.rm_lr)
    model.train()
    device = _device_of(model)
    n = len(chosen)
    # length-bucketed batches (sorted by the longer of the pair), visited in random order
    by_len = sorted(range(n), key=lambda i: max(len(chosen[i]), len(rejected[i])))
    buckets = [by_len[k : k + task.rm_batch_size] for k in range(0, n, task.rm_batch_size)]
    for _ in range(task.rm_epochs):
        for b in torch.randperm(len(buckets), generator=gen, device="cpu").tolist():
            idx = buckets[b]
            ids, mask = (t.to(device) for t in _pad_right([chosen[i] for i in idx] + [rejected[i] for i in idx],
                                                          tok.pad_id))
            r = model(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
            loss = -F.logsigmoid(r[: len(idx)] - r[len(idx) :]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    model.eval()


def train_proxy_rm_trl(cfg: TrainConfig, tok: Tokenizer, model: PreTrainedModel) -> None:
    """TRL's RewardTrainer on pre-tokenised pairs (`chosen_ids` / `rejected_ids`)."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    task = cfg.task
    chosen, rejected = _pair_tensors(cfg, tok)
    data = Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})
    with tempfile.TemporaryDirectory() as out:
        args = RewardConfig(
            output_dir=out, per_device_train_batch_size=task.rm_batch_size, num_train_epochs=task.rm_epochs,
            learning_rate=task.rm_lr, lr_scheduler_type="constant", warmup_steps=0, logging_steps=10_000,
            save_strategy="no", report_to=[], seed=cfg.seed, use_cpu=True, disable_tqdm=True,
            max_length=None, dataloader_num_workers=0, center_rewards_coefficient=None,
        )
        trainer = RewardTrainer(model=model, args=args, train_dataset=data, processing_class=tok.hf)
        trainer.train()
    model.eval()


def _device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _device_key(device: torch.device | str | None) -> list:
    """The warm start's cache-key part for its device: none on the CPU (the keys CPU runs always had), the device
    type elsewhere (a GPU's float32 arithmetic gives other weights than the CPU's)."""
    device = torch.device(device or "cpu")
    return [] if device.type == "cpu" else [device.type]


def _cached(path: Path, model: torch.nn.Module, build) -> None:
    if path.is_file():
        model.load_state_dict(torch.load(path, map_location=_device_of(model), weights_only=True))
        return
    build()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, path)


def sft_references(cfg: TrainConfig, tok: Tokenizer, model: PreTrainedModel, inputs: Any) -> None:
    """Fit the base policy to a data set's reference completions (`task.sft_key`), in place: train rows drawn with
    the run's seed (`fit_completions`)."""

    def draw(rng: np.random.Generator) -> tuple[str, str]:
        row = int(rng.integers(inputs.n_train))
        return inputs.render(inputs.prompt("train", row)), str(inputs.reference(row) or "")

    fit_completions(cfg, tok, model, draw)


def base_policy(cfg: TrainConfig, tok: Tokenizer, device: torch.device | str | None = None,
                inputs: Any = None) -> PreTrainedModel:
    """The base policy (= reference): a checkpoint, or the tiny model fitted to the corpus (cached), on `device`
    (default the CPU). Initialised on the CPU (the same weights on every device), fitted where it lives, in float32
    whatever the job's dtype (a float32 and a bfloat16 job start from the same base policy). A dataset task's tiny
    model is fitted to its reference completions (`task.sft_key`; `inputs`: its training/inputs/job_inputs.py
    `JobInputs`),
    keyed by the train rows' content (`DataFile.content_digest`); without references it starts from random weights."""
    torch.manual_seed(cfg.seed)
    model = build_causal_lm(cfg.policy, tok, _max_positions(cfg)).to(device or "cpu")
    if cfg.policy.model_name_or_path or cfg.task.sft_steps == 0:
        return model.eval()
    if cfg.task.kind == "dataset":
        if inputs is None or not inputs.has_references:
            return model.eval()
        # the rows' content, not the file: the same rows as JSON lines or Parquet, in any folder, share a warm start
        key = _hash(cfg.policy, cfg.task.model_dump(exclude={"train", "heldout"}), inputs.train.content_digest(),
                    cfg.seed, cfg.ppo.max_new_tokens, *_device_key(device))
        _cached(Path(cfg.cache_dir) / f"base-{key}.pt", model, lambda: sft_references(cfg, tok, model, inputs))
        return model.eval()
    key = _hash(cfg.policy, cfg.task.model_dump(include={"n_train_prompts", "n_heldout_prompts", "long_prompt_frac",
                "short_mean_len", "long_mean_len", "vowel_beta", "sft_steps", "sft_lr", "sft_batch_size",
                "prompt_words", "length_dist", "length_sigma", "tokenizer", "vocab_size"}),
                cfg.seed, cfg.ppo.max_new_tokens, *_device_key(device))
    _cached(Path(cfg.cache_dir) / f"base-{key}.pt", model, lambda: sft_base_policy(cfg, tok, model))
    return model.eval()


def proxy_reward_model(cfg: TrainConfig, tok: Tokenizer, device: torch.device | str | None = None) -> PreTrainedModel:
    """The reward model: a local checkpoint (`reward: {kind: model, path}`), or the synthetic task's proxy fitted to
    noisy gold pairs; on `device` (default the CPU), as `base_policy`."""
    torch.manual_seed(cfg.seed + 1)
    device = device or "cpu"
    if cfg.reward.kind == "model":
        return checkpoint_scorer(cfg.reward.path, tok, cfg, device)
    if cfg.reward.kind != "proxy":
        raise ValueError(f"reward.kind {cfg.reward.kind!r} has no reward model")
    model = build_scorer(cfg.reward, tok, _max_positions(cfg)).to(device)
    key = _hash(cfg.reward, cfg.task, cfg.seed, cfg.ppo.max_new_tokens, *_device_key(device))
    train = train_proxy_rm_trl if cfg.task.rm_trainer == "trl" else train_proxy_rm_torch
    _cached(Path(cfg.cache_dir) / f"rm-{key}.pt", model, lambda: train(cfg, tok, model))
    return model.to(device).eval()  # TRL's trainer (use_cpu) may have moved it


def checkpoint_scorer(path: str, tok: Tokenizer, cfg: TrainConfig, device: torch.device | str | None = None
                      ) -> PreTrainedModel:
    """A local sequence-classification checkpoint (a reward model, or a gate's scorer), frozen, on `device`."""
    return build_scorer(cfg.policy, tok, _max_positions(cfg), path=path).to(device or "cpu").eval()


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    clone = copy.deepcopy(model).eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone
