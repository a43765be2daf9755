"""Training configuration (pydantic; unknown keys and wrong types are rejected with the field named).

PPO defaults follow TRL's `PPOConfig` as of v0.19, the last TRL release that shipped a PPO trainer
(`num_ppo_epochs=4`, `num_mini_batches=1`, `gamma=1.0`, `lam=0.95`, `cliprange=0.2`,
`cliprange_value=0.2`, `vf_coef=0.1`, `kl_coef=0.05`, k1 KL estimator folded into the reward,
advantages whitened over the batch) and `TrainingArguments.max_grad_norm=1.0`. Where a value differs
(learning rates and batch sizes for tiny random-weight models on a CPU), the YAML files in configs/ say
why. OPPO defaults follow the OPPO paper (Algorithm 1, Eq. 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlhfops.errors import BadInput


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(Strict):
    """A tiny transformer built from a config with random weights, or a local checkpoint."""

    arch: Literal["llama", "gpt2", "qwen2"] = "llama"
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(128, ge=8)
    #: local checkpoint directory (transformers format); replaces the tiny random-weight model
    model_name_or_path: str | None = None


class TaskConfig(Strict):
    """The synthetic "balanced text" task (see training/task.py): gold scorer, prompts, corpus, proxy RM."""

    n_train_prompts: int = Field(512, ge=8)
    n_heldout_prompts: int = Field(128, ge=8)
    long_prompt_frac: float = Field(0.25, ge=0.0, le=1.0, description="share of '?' prompts (long answers)")
    short_mean_len: float = Field(8.0, gt=1.0)
    long_mean_len: float = Field(60.0, gt=1.0)
    vowel_beta: tuple[float, float] = (2.0, 7.0)
    gold_peak: float = Field(0.45, gt=0.0, lt=1.0, description="vowel share the gold scorer likes best")
    gold_width: float = Field(0.3, gt=0.0)
    long_target_len: float = Field(40.0, gt=0.0, description="characters a '?' answer needs for full gold")
    short_target_len: float = Field(4.0, gt=0.0, description="characters a '.' answer needs for full gold")
    # proxy reward model: trained on gold-labelled pairs with Bradley-Terry label noise
    n_pairs: int = Field(2000, ge=16)
    cut_pair_frac: float = Field(0.3, ge=0.0, le=1.0, description="share of pairs: an answer vs its cut-off start")
    label_temperature: float = Field(0.25, gt=0.0, description="BT noise: P(a>b)=sigmoid((g_a-g_b)/T)")
    rm_epochs: int = Field(2, ge=1)
    rm_lr: float = Field(2e-3, gt=0.0)
    rm_batch_size: int = Field(64, ge=1)
    #: "torch": a plain length-bucketed Bradley-Terry loop; "trl": TRL's RewardTrainer, the same loss, but
    #: measured ~6x slower here (440 s vs 68 s for 3000 pairs on 2 cores: Trainer + collator overhead)
    rm_trainer: Literal["trl", "torch"] = "torch"
    # base-policy warm start (SFT on the synthetic corpus) so the reference model writes text
    sft_steps: int = Field(300, ge=0)
    sft_lr: float = Field(3e-3, gt=0.0)
    sft_batch_size: int = Field(32, ge=1)
    #: local reward-model checkpoint (AutoModelForSequenceClassification, num_labels=1) instead of the proxy
    reward_model_path: str | None = None


class PPOConfig(Strict):
    batch_size: int = Field(16, ge=2, description="B: samples per PPO step")
    max_new_tokens: int = Field(160, ge=1)
    temperature: float = Field(1.0, gt=0.0)
    num_ppo_epochs: int = Field(4, ge=1)
    num_mini_batches: int = Field(1, ge=1)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(0.95, ge=0.0, le=1.0)
    cliprange: float = Field(0.2, gt=0.0)
    cliprange_value: float = Field(0.2, gt=0.0)
    vf_coef: float = Field(0.1, ge=0.0)
    ent_coef: float = Field(0.0, ge=0.0)
    kl_coef: float = Field(0.05, ge=0.0)
    whiten_advantages: bool = True
    max_grad_norm: float = Field(1.0, gt=0.0)
    actor_lr: float = Field(1e-3, gt=0.0)
    critic_lr: float = Field(1e-3, gt=0.0)
    #: "gae": PPO with a critic; "grpo"/"rloo": critic-free group advantages (group_size samples per prompt)
    advantage: Literal["gae", "grpo", "rloo"] = "gae"
    group_size: int = Field(4, ge=2)

    @model_validator(mode="after")
    def _check(self) -> PPOConfig:
        if self.batch_size % self.num_mini_batches:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by num_mini_batches ({self.num_mini_batches})"
            )
        if self.advantage != "gae" and self.batch_size % self.group_size:
            raise ValueError(f"batch_size must be a multiple of group_size ({self.group_size}) for grpo/rloo")
        return self


class OPPOConfig(Strict):
    """Overlap knobs. `--overlap` on the CLI picks which halves are on; these tune them."""

    chunk_size: int = Field(16, ge=1, description="C: tokens per streamed chunk (intra-step overlap)")
    tune_chunk: bool = True
    chunk_candidates: list[int] = Field(default_factory=lambda: [8, 16, 32])
    tune_every: int = Field(50, ge=1, description="steps between chunk-size tuning rounds")
    delta_init: int = Field(4, ge=0)
    delta_min: int = Field(0, ge=0)
    delta_max: int = Field(16, ge=0)
    delta_window: int = Field(5, ge=1, description="W: reward window for the Delta controller")
    #: "eq4": Delta grows while reward improves (paper Eq. 4); "alg1": Algorithm 1 line 24 as printed
    delta_rule: Literal["eq4", "alg1"] = "eq4"
    adaptive_delta: bool = True
    #: drop tokens generated by a policy more than this many versions old from the loss (None: keep all)
    max_staleness: int | None = None
    #: threads for torch intra-op work; with overlap the decode and scorer threads get one core each
    torch_threads: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _check(self) -> OPPOConfig:
        if not self.delta_min <= self.delta_init <= self.delta_max:
            raise ValueError("need delta_min <= delta_init <= delta_max")
        if not self.chunk_candidates:
            raise ValueError("chunk_candidates must list at least one size")
        return self


class FaultConfig(Strict):
    """Fault injection for health canaries (training/trainer.py module docstring lists the kinds)."""

    kind: Literal["none", "frozen_sync", "constant_reward", "lr_spike", "gameable_reward", "nan_reward"] = "none"
    at_step: int = Field(0, ge=0, description="first step the fault is active")
    factor: float = Field(100.0, gt=0.0, description="lr_spike: learning-rate multiplier")
    bonus: float = Field(0.5, description="gameable_reward: reward per trigger character")
    trigger: str = Field("z", min_length=1, max_length=1, description="gameable_reward: the trigger character")


class TrainConfig(Strict):
    name: str = "ppo"
    seed: int = 0
    steps: int = Field(100, ge=1)
    policy: ModelConfig = Field(default_factory=ModelConfig)
    reward: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    oppo: OPPOConfig = Field(default_factory=OPPOConfig)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    engine: Literal["transformers", "vllm"] = "transformers"
    checkpoint_every: int = Field(25, ge=1)
    keep_checkpoints: int = Field(0, ge=0, description="0 keeps every checkpoint")
    eval_every: int = Field(10, ge=1, description="steps between gold evaluations on held-out prompts")
    eval_prompts: int = Field(64, ge=1, description="held-out prompts per gold evaluation")
    #: where base-policy and proxy-RM warm starts are cached (keyed by a hash of the config that made them)
    cache_dir: str = "runs/.cache"


def load_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """Read a YAML config; errors name the file and field."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"config: file '{path}' not found (pass a YAML path such as configs/ppo-tiny.yaml)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise BadInput(f"config: '{path}' is not valid YAML ({str(err).splitlines()[0]})") from err
    if not isinstance(raw, dict):
        raise BadInput(f"config: '{path}' must hold a mapping of fields at the top level")
    raw.setdefault("name", path.stem)
    for key, value in (overrides or {}).items():
        raw[key] = value
    return TrainConfig.model_validate(raw)
