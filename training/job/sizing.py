"""Sizes a training config implies, without building anything: the positions a model is built for, the vocabulary,
which models a job builds (the critic: ppo only; the reference: only when a KL is paid), their parameter counts and
the job's planned memory by role (checked against the machine's before any model is allocated).

Plain functions over a `training.job.config.TrainConfig`. training/job/config.py re-exports these names and calls
`check_train_memory` from `check_train_resources`, so this module never imports it, not even for types: the aliases
below name what each argument is."""

from __future__ import annotations

from typing import Any

TrainConfig = Any  # training.job.config.TrainConfig
ModelConfig = Any  # training.job.config.ModelConfig
TaskConfig = Any  # training.job.config.TaskConfig
DatasetTaskConfig = Any  # training.job.config.DatasetTaskConfig

#: ByT5's byte-level tokenizer: 256 bytes + pad, eos, unk (tests/cli/test_bad_input.py checks it against the tokenizer)
BYTE_VOCAB = 259
#: the synthetic task's prompts are at most this many tokens (training/models.py: positions = prompt positions +
#: 2 * max_new_tokens); a dataset task's are at most its `max_prompt_tokens`
PROMPT_POSITIONS = 32


def prompt_positions(cfg: TrainConfig) -> int:
    """Positions a prompt may take: the synthetic task's 32, or a dataset task's `max_prompt_tokens`."""
    return cfg.task.max_prompt_tokens if cfg.task.kind == "dataset" else PROMPT_POSITIONS


def max_positions(cfg: TrainConfig) -> int:
    """Positions a model of the job is built for: a prompt, a carried response and a fresh one."""
    return prompt_positions(cfg) + 2 * cfg.ppo.max_new_tokens


def vocab_size(task: TaskConfig | DatasetTaskConfig) -> int:
    """Ids of the tokenizer the task names (a checkpoint's own tokenizer is not estimated here)."""
    return task.vocab_size if task.kind == "synthetic" and task.tokenizer == "bpe" else BYTE_VOCAB


def uses_critic(cfg: TrainConfig) -> bool:
    """PPO learns a value model; grpo and rloo take their baseline from the group and build none."""
    return cfg.algorithm == "ppo"


def uses_reference(cfg: TrainConfig) -> bool:
    """A frozen reference policy is built only when a KL to it is paid (kl_coef > 0, in the reward or the loss)."""
    return cfg.ppo.kl_coef > 0


def scorer_models(cfg: TrainConfig) -> list[tuple[str, ModelConfig]]:
    """The models whose shape the config gives (role, shape): the policy (critic and reference share it) and the
    synthetic task's proxy reward model; a function or a checkpoint reward has none."""
    out = [("policy", cfg.policy)]
    if cfg.reward.kind == "proxy":
        out.append(("reward", cfg.reward))
    return out


#: tokens per micro-batch of the PPO update (training/trainer.py `_micro_batches`): backward runs per micro-batch,
#: so activations are held for this many tokens at a time
MICRO_BATCH_TOKENS = 8192


def parameter_count(mc: ModelConfig, positions: int, vocab: int = BYTE_VOCAB) -> int:
    """Parameters of the causal LM built from `mc` (training/models.py `_hf_config`): tied embeddings, per layer
    q and o (hidden^2 each), k and v (hidden x kv_dim each: grouped-query attention shares a k/v head among
    num_heads / kv_heads query heads) and the MLP (llama/qwen2: gate, up, down; gpt2: up, down) plus norms and
    biases; gpt2 adds learned positions. A scorer has `hidden` more (its one-label head)."""
    h, i, layers, kv = mc.hidden_size, mc.intermediate_size, mc.num_layers, mc.kv_dim
    if mc.arch == "gpt2":
        return vocab * h + positions * h + layers * (4 * h * h + 2 * h * i + 9 * h + i) + 2 * h
    qkv_bias = h + 2 * kv if mc.arch == "qwen2" else 0  # qwen2's q/k/v projections carry biases
    return vocab * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i + 2 * h + qkv_bias) + h


def train_memory_bytes(cfg: TrainConfig) -> float:
    """Planned memory of one training process: the sum of `train_memory_breakdown`."""
    return sum(train_memory_breakdown(cfg).values())


def train_memory_breakdown(cfg: TrainConfig) -> dict[str, float]:
    """Planned memory of one training process (float32) by role, a deliberate over-estimate:
    weights: actor 16 B/param (weights, gradients, two Adam moments), frozen reference 4 B (only when a KL is paid:
    `uses_reference`), critic 16 B (ppo only: `uses_critic`), proxy reward model 20 B (it trains first);
    decode: each policy-shaped role's and the proxy's key/value caches (kv_dim wide per layer) for B + delta_max
    sequences of prompt + 2 * max_new_tokens positions;
    training: per-layer activations of one micro-batch (at most MICRO_BATCH_TOKENS tokens, or one whole sequence;
    about 14 hidden + 2 intermediate floats per token, plus the heads x positions x positions attention scores),
    for actor and critic, plus the actor's logits (logits, log-softmax and their gradient: 3 x vocabulary floats
    per token). Key/value caches and activations take 2 bytes a float under `dtype: bfloat16`, 4 under float32; the
    weights term stays at float32 whatever the dtype: the trainable models keep float32 weights, gradients and AdamW
    moments (docs/training.md), and the frozen ones in bfloat16 plus autocast's copies fit in what it allows.
    A checkpoint's size is its own and not estimated (a role loaded from one counts 0)."""
    positions = max_positions(cfg)
    in_flight = cfg.ppo.batch_size + cfg.oppo.delta_max
    minibatch = cfg.ppo.batch_size // cfg.ppo.num_mini_batches
    micro_tokens = min(minibatch * positions, max(MICRO_BATCH_TOKENS, positions))
    vocab = vocab_size(cfg.task)
    act_bytes = 2.0 if cfg.dtype == "bfloat16" else 4.0

    def kv(mc: ModelConfig) -> float:
        return 2 * mc.num_layers * mc.kv_dim * positions * in_flight * act_bytes

    def activations(mc: ModelConfig) -> float:
        per_token = 14 * mc.hidden_size + 2 * mc.intermediate_size + mc.num_heads * positions
        return act_bytes * micro_tokens * mc.num_layers * per_token

    out: dict[str, float] = {}
    pol = cfg.policy
    if not pol.model_name_or_path:
        n = parameter_count(pol, positions, vocab)
        out["actor"] = 16.0 * n + kv(pol) + activations(pol) + 3 * 4.0 * micro_tokens * vocab
        if uses_reference(cfg):
            out["reference"] = 4.0 * n + kv(pol)
        if uses_critic(cfg):
            out["critic"] = 16.0 * (n + pol.hidden_size) + kv(pol) + activations(pol)
    if cfg.reward.kind == "proxy" and not cfg.reward.model_name_or_path:
        out["reward"] = 20.0 * parameter_count(cfg.reward, positions, vocab) + kv(cfg.reward)
    return out


def check_train_memory(cfg: TrainConfig) -> None:
    """BadInput before any model is allocated when the estimate exceeds the memory limit."""
    from common.validate import check_memory

    positions = max_positions(cfg)
    sizes = ", ".join(f"{role} {parameter_count(mc, positions, vocab_size(cfg.task)) / 1e6:,.1f}M parameters"
                      for role, mc in scorer_models(cfg) if not mc.model_name_or_path)
    check_memory(train_memory_bytes(cfg), "policy/reward", f"training ({sizes}; batch {cfg.ppo.batch_size}, "
                 f"max_new_tokens {cfg.ppo.max_new_tokens})",
                 "lower hidden_size, num_layers or intermediate_size (or batch_size, max_new_tokens)")
