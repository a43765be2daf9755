"""Training configuration (pydantic; unknown keys and wrong types are rejected with the field named).

PPO defaults follow TRL's `PPOConfig` as of v0.19, the last TRL release that shipped a PPO trainer
(`num_ppo_epochs=4`, `num_mini_batches=1`, `gamma=1.0`, `lam=0.95`, `cliprange=0.2`,
`cliprange_value=0.2`, `vf_coef=0.1`, `kl_coef=0.05`, k1 KL estimator folded into the reward,
advantages whitened over the batch) and `TrainingArguments.max_grad_norm=1.0`. Where a value differs
(learning rates and batch sizes for tiny random-weight models on a CPU), the YAML files in configs/ say
why. OPPO defaults follow the OPPO paper (Algorithm 1, Eq. 4).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from common.errors import BadInput, register_union_kinds

# the sizes a config implies (re-exported: callers import them from here)
from training.job.sizing import (  # noqa: F401
    BYTE_VOCAB,
    MICRO_BATCH_TOKENS,
    PROMPT_POSITIONS,
    check_train_memory,
    max_positions,
    parameter_count,
    prompt_positions,
    scorer_models,
    train_memory_breakdown,
    train_memory_bytes,
    uses_critic,
    uses_reference,
    vocab_size,
)

#: the config's `device` values (training/job/device.py makes them a torch device)
DEVICE_PATTERN = r"^(auto|cpu|cuda|cuda:\d{1,3})$"
DEVICE_CHOICES = "auto, cpu, cuda, cuda:N"


def check_device_text(value: Any, field: str = "device") -> str:
    """`value` is one of auto, cpu, cuda, cuda:N; ValueError naming the choices otherwise (no torch)."""
    if not isinstance(value, str) or not re.fullmatch(DEVICE_PATTERN, value):
        raise ValueError(f"{value!r} is not a device: use one of {DEVICE_CHOICES}")
    return value


class Strict(BaseModel):
    # NaN and infinity are never a valid setting (YAML spells them .nan and .inf)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)



class ModelConfig(Strict):
    """A tiny transformer built from a config with random weights, or a local checkpoint."""

    arch: Literal["llama", "gpt2", "qwen2"] = "llama"
    # upper bounds: beyond them a model is not "tiny" on any machine; `check_train_memory` bounds the total
    hidden_size: int = Field(64, ge=8, le=65536)
    num_layers: int = Field(2, ge=1, le=512)
    num_heads: int = Field(4, ge=1, le=1024)
    intermediate_size: int = Field(128, ge=8, le=262144)
    #: key/value heads (grouped-query attention, llama/qwen2): None means num_heads (every head its own k/v)
    num_kv_heads: int | None = Field(None, ge=1, le=1024)
    #: local checkpoint directory (transformers format); replaces the tiny random-weight model
    model_name_or_path: str | None = None

    @model_validator(mode="after")
    def _shape(self) -> ModelConfig:
        if self.model_name_or_path:
            return self  # the checkpoint's own config decides its shape
        if self.hidden_size % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide hidden_size ({self.hidden_size}): each head "
                             f"gets hidden_size / num_heads dimensions (e.g. num_heads "
                             f"{_divisor_near(self.hidden_size, self.num_heads)})")
        if self.arch != "gpt2" and (self.hidden_size // self.num_heads) % 2:
            # rotary position embeddings rotate pairs of dimensions
            raise ValueError(f"hidden_size / num_heads ({self.hidden_size // self.num_heads}) must be even for "
                             f"arch {self.arch} (rotary embeddings rotate pairs of dimensions)")
        if self.num_kv_heads is not None:
            if self.arch == "gpt2" and self.num_kv_heads != self.num_heads:
                raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must equal num_heads ({self.num_heads}) for arch "
                                 "gpt2 (it has no grouped-query attention; use arch llama or qwen2, or drop it)")
            if self.num_heads % self.num_kv_heads:
                raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}): each "
                                 f"key/value head serves a whole group of query heads (e.g. num_kv_heads "
                                 f"{_divisor_near(self.num_heads, self.num_kv_heads)})")
        return self

    @property
    def kv_heads(self) -> int:
        """Key/value heads in effect (num_kv_heads, or num_heads when unset)."""
        return self.num_kv_heads or self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: kv_heads x head_dim."""
        return self.kv_heads * (self.hidden_size // self.num_heads)


def _divisor_near(n: int, k: int) -> int:
    """The divisor of n closest to k (a suggestion for num_heads)."""
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


class TaskConfig(Strict):
    """The synthetic "balanced text" task (see training/inputs/synthetic_task.py): gold scorer, prompts, corpus, proxy
    RM."""

    kind: Literal["synthetic"] = "synthetic"
    n_train_prompts: int = Field(512, ge=8, le=1_000_000)
    n_heldout_prompts: int = Field(128, ge=8, le=1_000_000)
    long_prompt_frac: float = Field(0.25, ge=0.0, le=1.0, description="share of '?' prompts (long answers)")
    #: random words in a prompt before its mark ("kol brane?" has 2); more words make longer prompts
    prompt_words: int = Field(2, ge=1, le=400)
    # characters; responses are cut at max_new_tokens anyway, and huge means never finish drawing the corpus
    short_mean_len: float = Field(8.0, gt=1.0, le=65536)
    long_mean_len: float = Field(60.0, gt=1.0, le=65536)
    #: a corpus answer's length in characters: "geometric" (memoryless, the mean above) or "lognormal" (the same
    #: mean, log-space spread `length_sigma`: median = mean / exp(sigma^2 / 2), a heavier tail)
    length_dist: Literal["geometric", "lognormal"] = "geometric"
    length_sigma: float = Field(0.9, gt=0.0, le=4.0)
    #: "byte": ByT5's bytes (259 ids, no files); "bpe": a byte-level BPE of `vocab_size` ids trained on the task's
    #: text (training/inputs/tokenizer.py, cached in cache_dir), so the output layer is a real share of a decode step
    tokenizer: Literal["byte", "bpe"] = "byte"
    vocab_size: int = Field(32000, ge=512, le=262144, description="ids of the BPE tokenizer (tokenizer: bpe)")
    #: Beta(a, b) of a corpus response's vowel share: both > 0
    vowel_beta: tuple[Annotated[float, Field(gt=0.0, le=1000.0)], Annotated[float, Field(gt=0.0, le=1000.0)]] = (
        2.0, 7.0)
    gold_peak: float = Field(0.45, gt=0.0, lt=1.0, description="vowel share the gold scorer likes best")
    gold_width: float = Field(0.3, gt=0.0, le=10.0)
    long_target_len: float = Field(40.0, gt=0.0, le=4096, description="characters a '?' answer needs for full gold")
    short_target_len: float = Field(4.0, gt=0.0, le=4096, description="characters a '.' answer needs for full gold")
    # proxy reward model: trained on gold-labelled pairs with Bradley-Terry label noise
    n_pairs: int = Field(2000, ge=16, le=1_000_000)
    cut_pair_frac: float = Field(0.3, ge=0.0, le=1.0, description="share of pairs: an answer vs its cut-off start")
    label_temperature: float = Field(0.25, ge=1e-3, le=100.0, description="BT noise: P(a>b)=sigmoid((g_a-g_b)/T)")
    rm_epochs: int = Field(2, ge=1, le=1000)
    rm_lr: float = Field(2e-3, gt=0.0, le=1.0)
    rm_batch_size: int = Field(64, ge=1, le=65536)
    #: "torch": a plain length-bucketed Bradley-Terry loop; "trl": TRL's RewardTrainer, the same loss, but
    #: measured ~6x slower here (440 s vs 68 s for 3000 pairs on 2 cores: Trainer + collator overhead)
    rm_trainer: Literal["trl", "torch"] = "torch"
    # base-policy warm start (SFT on the synthetic corpus) so the reference model writes text
    sft_steps: int = Field(300, ge=0, le=1_000_000)
    sft_lr: float = Field(3e-3, gt=0.0, le=1.0)
    sft_batch_size: int = Field(32, ge=1, le=65536)
    #: moved: a local reward-model checkpoint is `reward: {kind: model, path: ...}` (refused here with that fix)
    reward_model_path: str | None = None

    @field_validator("reward_model_path")
    @classmethod
    def _moved(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError(f"moved: write reward: {{kind: model, path: '{value}'}} (a local sequence-classification "
                             "checkpoint) instead of task.reward_model_path")
        return value


class DatasetTaskConfig(Strict):
    """A tenant's own data (training/inputs/job_inputs.py): train and held-out files whose `prompt_key` column is the
    prompt; every other column reaches the reward and gate functions as a keyword list. Paths are relative to the config
    file's folder (`TrainConfig.config_dir`)."""

    kind: Literal["dataset"]
    train: str = Field(description="train prompts: a .jsonl, .json, .parquet or .csv file")
    heldout: str = Field(description="held-out prompts for the eval gate (never trained on)")
    prompt_key: str = Field("prompt", min_length=1, description="the column holding the prompt")
    #: a column of reference completions: the base policy's warm start (supervised fine-tuning) when the policy has
    #: no checkpoint; without it (and without a checkpoint) the policy starts from random weights
    sft_key: str | None = Field(None, min_length=1)
    max_prompt_tokens: int = Field(256, ge=1, le=131072,
                                   description="longer prompts are dropped (refused above 1% of a file)")
    #: "auto": apply the tokenizer's chat template when it has one; "none": the prompt text as it is
    chat_template: Literal["auto", "none"] = "auto"
    sft_steps: int = Field(300, ge=0, le=1_000_000)
    sft_lr: float = Field(3e-3, gt=0.0, le=1.0)
    sft_batch_size: int = Field(32, ge=1, le=65536)
    #: the byte tokenizer when the policy has no checkpoint (a checkpoint brings its own)
    tokenizer: Literal["byte"] = "byte"


def _kind(default: str):
    """A discriminator that reads `kind`, with `default` when it is left out (configs written before the kinds)."""
    def read(value: Any) -> str:
        kind = value.get("kind", default) if isinstance(value, dict) else getattr(value, "kind", default)
        return kind if isinstance(kind, str) else default
    return Discriminator(read)


register_union_kinds("task", {"synthetic", "dataset"})
register_union_kinds("reward", {"proxy", "function", "model"})
register_union_kinds("gate", {"gold", "function", "model"})

TaskSpec = Annotated[Annotated[TaskConfig, Tag("synthetic")] | Annotated[DatasetTaskConfig, Tag("dataset")],
                     _kind("synthetic")]


class ProxyRewardConfig(ModelConfig):
    """The learned proxy reward model of the synthetic task: the shape of a sequence-classification model fitted to
    gold-labelled noisy preference pairs (training/models.py)."""

    kind: Literal["proxy"] = "proxy"


class FunctionSettings(Strict):
    """Tenant code (training/inputs/tenant_code.py): `ref` is FILE.py:NAME (relative to the config's folder),
    package.module:NAME, or a built-in (training/inputs/rewards: e.g. gsm8k:strict_match), called as
    fn(prompts, completions, **columns) -> list[float | None] in a child process."""

    kind: Literal["function"]
    ref: str = Field(min_length=3, description="FILE.py:NAME, package.module:NAME or a built-in name")
    timeout_s: float = Field(30.0, gt=0.0, le=86400.0, description="per call; a call past it is killed")
    memory_mb: int = Field(2048, ge=64, le=1_048_576, description="address-space limit of a function's process")


class FunctionRewardConfig(FunctionSettings):
    """`ref` may be a list of functions, as TRL's `reward_funcs`: the reward is the weighted sum of their scores
    (`weights`, same length, default all 1.0), NaN-aware as TRL's (a function's None counts 0 in the sum; a sample
    no function scored has no reward)."""

    ref: str | list[str] = Field(min_length=1, description="FILE.py:NAME, package.module:NAME or a built-in name, "
                                                            "or a list of them")
    weights: list[float] | None = Field(None, description="one weight per function of a `ref` list (default 1.0)")
    max_error_frac: float = Field(0.01, ge=0.0, le=1.0,
                                  description="share of a batch's samples that may raise before the job fails")
    workers: int = Field(2, ge=1, le=256, description="processes running the tenant's functions")

    @model_validator(mode="after")
    def _refs(self) -> FunctionRewardConfig:
        refs = self.refs
        if any(not isinstance(r, str) or len(r) < 3 for r in refs):
            raise ValueError("every function of reward.ref must be FILE.py:NAME, package.module:NAME or a built-in "
                             "name")
        if self.weights is not None and len(self.weights) != len(refs):
            raise ValueError(f"reward.weights has {len(self.weights)} weight{'s' * (len(self.weights) != 1)} for "
                             f"{len(refs)} function{'s' * (len(refs) != 1)} of reward.ref: give one per function")
        return self

    @property
    def refs(self) -> list[str]:
        """The reward's functions, one or more."""
        return [self.ref] if isinstance(self.ref, str) else list(self.ref)

    @property
    def weight_list(self) -> list[float]:
        return list(self.weights) if self.weights is not None else [1.0] * len(self.refs)


class ModelScorerConfig(Strict):
    kind: Literal["model"]
    path: str = Field(min_length=1, description="a local sequence-classification checkpoint (num_labels=1)")


RewardSpec = Annotated[Annotated[ProxyRewardConfig, Tag("proxy")] | Annotated[FunctionRewardConfig, Tag("function")]
                       | Annotated[ModelScorerConfig, Tag("model")], _kind("proxy")]


class GoldGateConfig(Strict):
    kind: Literal["gold"] = "gold"


class FunctionGateConfig(FunctionSettings):
    pass


GateSpec = Annotated[Annotated[GoldGateConfig, Tag("gold")] | Annotated[FunctionGateConfig, Tag("function")]
                     | Annotated[ModelScorerConfig, Tag("model")], _kind("gold")]


class PPOConfig(Strict):
    batch_size: int = Field(16, ge=2, le=65536, description="B: samples per PPO step")
    max_new_tokens: int = Field(160, ge=1, le=32768)
    #: sampling temperature: below 0.01 logits/T overflows float32; above 10 sampling is uniform noise
    temperature: float = Field(1.0, ge=0.01, le=10.0)
    num_ppo_epochs: int = Field(4, ge=1, le=100)
    num_mini_batches: int = Field(1, ge=1)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(0.95, ge=0.0, le=1.0)
    # Bounds: far outside anything published (TRL, OpenRLHF: clip 0.2, vf 0.1, kl 0.001-0.2), so they only
    # catch typos such as a missing minus sign in an exponent (1e308 instead of 1e-3).
    cliprange: float = Field(0.2, gt=0.0, le=10.0)
    cliprange_value: float = Field(0.2, gt=0.0, le=100.0)
    vf_coef: float = Field(0.1, ge=0.0, le=100.0)
    ent_coef: float = Field(0.0, ge=0.0, le=10.0)
    kl_coef: float = Field(0.05, ge=0.0, le=100.0)
    whiten_advantages: bool = True
    max_grad_norm: float = Field(1.0, gt=0.0, le=1e6)
    #: learning rates: 0 < lr <= 1 (Adam steps above 1 diverge for any model)
    actor_lr: float = Field(1e-3, gt=0.0, le=1.0)
    critic_lr: float = Field(1e-3, gt=0.0, le=1.0)
    #: completions sampled per prompt (G). The top-level `algorithm` sets its default: ppo 1, grpo 8, rloo 2 (TRL's
    #: GRPOConfig / RLOOConfig `num_generations`); grpo and rloo need G >= 2 (their baseline is the group)
    group_size: int = Field(1, ge=1, le=65536)
    #: grpo: divide each group's centred rewards by the group's standard deviation ("group", GRPO and TRL's
    #: default) or not ("none", Dr. GRPO, Liu et al. 2025)
    scale_rewards: Literal["group", "none"] = "group"
    #: where the KL to the reference policy goes: "reward" (k1 per token, subtracted from the reward: PPO's and
    #: RLOO's) or "loss" (the k3 estimator added to the loss with weight kl_coef: GRPO's `beta`). kl_coef 0 builds
    #: no reference model at all
    kl_in: Literal["reward", "loss"] = "reward"

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "advantage" in data:
            data = dict(data)
            was = data.pop("advantage")
            if was not in ("gae", None):  # a saved config of an earlier version holds the default "gae": dropped
                raise ValueError(f"advantage: {was!r} moved: write the top-level `algorithm: {was}` "
                                 "(and ppo.group_size for its completions per prompt)")
        return data

    @model_validator(mode="after")
    def _check(self) -> PPOConfig:
        if self.batch_size % self.num_mini_batches:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be divisible by num_mini_batches ({self.num_mini_batches})"
            )
        return self  # batch_size against group_size: TrainConfig, once the algorithm's group_size is known


#: the algorithms (top-level `algorithm`) and the ppo fields each sets when the config leaves them out: TRL 1.16's
#: GRPOConfig (num_generations 8, beta 0.0: no reference model, one iteration per generation batch, no batch
#: whitening) and RLOOConfig (num_generations 2, beta 0.05 in the reward, normalize_advantages False); ppo is
#: TRL 0.19's PPOConfig (the module docstring). docs/algorithms.md lists where these differ from TRL and why.
ALGORITHM_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {"group_size": 1, "kl_coef": 0.05, "kl_in": "reward", "whiten_advantages": True, "num_ppo_epochs": 4},
    "grpo": {"group_size": 8, "kl_coef": 0.0, "kl_in": "loss", "whiten_advantages": False, "num_ppo_epochs": 1},
    "rloo": {"group_size": 2, "kl_coef": 0.05, "kl_in": "reward", "whiten_advantages": False, "num_ppo_epochs": 1},
}
ALGORITHMS = tuple(ALGORITHM_DEFAULTS)
#: the algorithm an earlier version's `ppo.advantage` named (before the top-level `algorithm`): read from saved bench
#: configs (training/benches/baseline.py) and old runs' MLflow params (infra/reporting.py)
ALGORITHM_OF_ADVANTAGE = {"gae": "ppo", "grpo": "grpo", "rloo": "rloo"}


def with_algorithm_defaults(ppo: PPOConfig, algorithm: str) -> PPOConfig:
    """`ppo` with `algorithm`'s defaults in every field the config left out (pydantic's `model_fields_set`). The
    filled fields stay unset, so a config re-validated with another algorithm (an override, a sweep trial's
    `algorithm`) takes that algorithm's defaults, not these."""
    unset = {k: v for k, v in ALGORITHM_DEFAULTS[algorithm].items() if k not in ppo.model_fields_set}
    if not unset:
        return ppo
    out = ppo.model_copy(update=unset)
    object.__setattr__(out, "__pydantic_fields_set__", set(ppo.model_fields_set))
    return out


#: the ppo fields a dataset task (a tenant's own data) gets when its config leaves them out. actor_lr: the global
#: 1e-3 (the synthetic task's, which its committed figures rest on) blew up the KL of a first tenant config on the
#: worked example's data within 2 steps (KL 28 per sequence, `kl_blowup`, FAILED); 1e-4 kept it under 2 over 60 steps
#: (docs/tenant-jobs.md, "A first config's defaults", for the command and the numbers)
DATASET_PPO_DEFAULTS: dict[str, Any] = {"actor_lr": 1e-4}


def with_task_defaults(ppo: PPOConfig, task_kind: str) -> PPOConfig:
    """`ppo` with a dataset task's defaults (`DATASET_PPO_DEFAULTS`) in the fields the config left out; they stay
    unset, as `with_algorithm_defaults` leaves its own. A synthetic task's config is returned as it is."""
    unset = {k: v for k, v in DATASET_PPO_DEFAULTS.items() if k not in ppo.model_fields_set}
    if task_kind != "dataset" or not unset:
        return ppo
    out = ppo.model_copy(update=unset)
    object.__setattr__(out, "__pydantic_fields_set__", set(ppo.model_fields_set))
    return out


class OPPOConfig(Strict):
    """Overlap knobs. `--overlap` on the CLI picks which halves are on; these tune them."""

    chunk_size: int = Field(16, ge=1, le=32768, description="C: tokens per streamed chunk (intra-step overlap)")
    tune_chunk: bool = True
    chunk_candidates: list[Annotated[int, Field(ge=1, le=32768)]] = Field(default_factory=lambda: [8, 16, 32])
    tune_every: int = Field(50, ge=1, description="steps between chunk-size tuning rounds")
    # Delta: extra prompts started per step (B + Delta in flight)
    delta_init: int = Field(4, ge=0, le=65536)
    delta_min: int = Field(0, ge=0, le=65536)
    delta_max: int = Field(16, ge=0, le=65536)
    delta_window: int = Field(5, ge=1, le=100_000, description="W: reward window for the Delta controller")
    #: "eq4": Delta grows while reward improves (paper Eq. 4); "alg1": Algorithm 1 line 24 as printed
    delta_rule: Literal["eq4", "alg1"] = "eq4"
    adaptive_delta: bool = True
    #: drop tokens generated by a policy more than this many versions old from the loss (None: keep all)
    max_staleness: int | None = Field(None, ge=0)
    #: off-policy correction for carried (stale) tokens, training/algorithms/core_algos.py: "none" (the ratio against
    #: the log-probs recorded at the start of the step, no importance weight), "tis" (token-level truncated
    #: importance sampling, weight min(pi_old/pi_behav, is_cap)), "decoupled" (AReaL's decoupled PPO: clip
    #: pi_theta/pi_prox, weight pi_prox/pi_behav, tokens whose weight exceeds is_cap dropped)
    correction: Literal["none", "tis", "decoupled"] = "none"
    is_cap: float = Field(2.0, gt=1.0, le=1e4, description="C: importance-weight cap of tis / decoupled")
    #: engine "continuous": refill free rows only once this many are free (each refill round is one prefill forward,
    #: about a decode step on a GPU; 1 refills at every step)
    refill_min: int = Field(1, ge=1, le=65536)
    #: threads for torch intra-op work; with overlap the decode and scorer threads get one core each
    torch_threads: int = Field(2, ge=1, le=1024)

    @model_validator(mode="after")
    def _check(self) -> OPPOConfig:
        if not self.delta_min <= self.delta_init <= self.delta_max:
            raise ValueError("need delta_min <= delta_init <= delta_max")
        if not self.chunk_candidates:
            raise ValueError("chunk_candidates must list at least one size")
        return self


class FaultConfig(Strict):
    """Fault injection for health canaries (training/trainer.py module docstring lists the kinds)."""

    kind: Literal["none", "frozen_sync", "constant_reward", "lr_spike", "gameable_reward", "nan_reward",
                  "behaviour_mismatch", "duplicated_carry", "rank_exit", "rank_hang", "scorer_exit"] = "none"
    at_step: int = Field(0, ge=0, description="first step the fault is active")
    factor: float = Field(100.0, gt=0.0, le=1e4,
                          description="lr_spike: learning-rate multiplier; behaviour_mismatch: sampling-temperature "
                                      "multiplier")
    bonus: float = Field(0.5, ge=-100.0, le=100.0, description="gameable_reward: reward per trigger character")
    trigger: str = Field("z", min_length=1, max_length=1, description="gameable_reward: the trigger character")
    #: rank_exit / rank_hang (a job on several ranks): this rank dies (os._exit(3)) or hangs at the start of step
    #: `at_step` + 1 (the rest of the group must end within the collective timeout, naming it)
    rank: int = Field(1, ge=0, le=4095, description="rank_exit, rank_hang: the rank that dies or hangs")
    #: scorer_exit (placement reward_apart): the scorer process exits with code 3 when step `at_step` + 1 begins
    #: rank_exit / rank_hang: on how many of the job's starts the fault fires (0: all); a marker in the run directory
    #: per firing lets a job restarted from its checkpoint succeed (without a run directory: every start)
    times: int = Field(0, ge=0, le=1000, description="rank_exit, rank_hang: fire on the job's first `times` "
                       "starts only (markers in the run directory); 0: every start")


def default_cache_dir() -> str:
    """Where warm starts are cached when a config names no `cache_dir`: `RLHFOPS_CACHE_DIR`, else
    `$XDG_CACHE_HOME/rlhfops/warm-starts` (default `~/.cache/rlhfops/warm-starts`); an absolute path, so jobs started
    from any folder share it."""
    import os

    env = os.environ.get("RLHFOPS_CACHE_DIR", "").strip()
    if env:
        return str(Path(env).expanduser().resolve())
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or str(Path.home() / ".cache")
    return str((Path(base).expanduser() / "rlhfops" / "warm-starts").resolve())


class TrainConfig(Strict):
    name: str = "ppo"
    #: ppo (a learned critic, GAE), grpo (group-relative advantages) or rloo (leave-one-out baseline): the last two
    #: build no critic; each sets its own defaults for the ppo fields a config leaves out (ALGORITHM_DEFAULTS)
    algorithm: Literal["ppo", "grpo", "rloo"] = "ppo"
    #: numpy and torch generators take non-negative seeds
    seed: int = Field(0, ge=0, le=2**32 - 1)
    steps: int = Field(100, ge=1, le=10_000_000)
    policy: ModelConfig = Field(default_factory=ModelConfig)
    #: what scores training samples: the synthetic task's learned proxy (the default; its model shape), a tenant's
    #: function, or a local reward-model checkpoint
    reward: RewardSpec = Field(default_factory=ProxyRewardConfig)
    #: the job's prompts: the synthetic task (the default) or a tenant's data set
    task: TaskSpec = Field(default_factory=TaskConfig)
    #: what scores held-out responses for the eval gate: the synthetic task's gold scorer, a function, or a model
    gate: GateSpec = Field(default_factory=GoldGateConfig)
    #: the folder relative paths of the config (data files, FILE.py refs) are read from, and the tenant functions'
    #: working directory: set to the config file's folder when a file is loaded; None: the working directory
    config_dir: str | None = None
    ppo: PPOConfig = Field(default_factory=PPOConfig)
    oppo: OPPOConfig = Field(default_factory=OPPOConfig)
    fault: FaultConfig = Field(default_factory=FaultConfig)
    #: rollout engine: "transformers" (the chunked KV-cached loop of training/rollout/engine.py), "continuous"
    #: (inter-step overlap on a loop that refills finished rows at every decode step, training/rollout/continuous.py;
    #: the other modes
    #: keep the chunked loop), "vllm" (untested, GPU only)
    engine: Literal["transformers", "continuous", "vllm"] = "transformers"
    #: where every model, tensor, generator, cache and optimiser state lives (training/job/device.py; auto: CUDA when
    #: present, the job's GPU slot picking the card) and the forward passes' precision (bfloat16: float32 master
    #: weights and AdamW state, bfloat16 autocast, frozen reference and reward model in bfloat16)
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N")
    dtype: Literal["float32", "bfloat16"] = "float32"
    #: how rollout tokens are drawn (training/rollout/engine.py KeyedDraws): "stream" (one generator's stream, the
    #: draws of before), "keyed" (each draw keyed by seed, sample and position: the same tokens on any number of
    #: ranks), "auto" (stream on one rank, keyed on several)
    sampling: Literal["auto", "stream", "keyed"] = "auto"
    #: where the reward and reference models run (docs/ranks.md): "colocated" (in every policy rank) or
    #: "reward_apart" (a process of their own that the policy ranks stream chunks to: training/distributed/apart.py;
    #: the critic stays with the policy)
    placement: Literal["colocated", "reward_apart"] = "colocated"
    checkpoint_every: int = Field(25, ge=1)
    keep_checkpoints: int = Field(0, ge=0, description="0 keeps every checkpoint")
    eval_every: int = Field(10, ge=1, description="steps between gold evaluations on held-out prompts")
    eval_prompts: int = Field(64, ge=1, le=1_000_000, description="held-out prompts per gold evaluation")
    #: the gate's extension (training/gate.py): when a stop decision is close, the next batch of `eval_extra_batch`
    #: held-out prompts (after the gate's own, in held-out order) is scored for the two checkpoints in question, up to
    #: `eval_extra_budget` extra prompt evaluations per run (0: never extend)
    eval_extra_batch: int = Field(32, ge=1, le=1_000_000, description="held-out prompts per gate extension")
    eval_extra_budget: int = Field(0, ge=0, le=100_000_000,
                                   description="extra prompt evaluations a run's gate may spend on close decisions")
    #: where base-policy and proxy-RM warm starts are cached (keyed by a hash of the config that made them and, for a
    #: data set, of its rows); default `default_cache_dir()`, the same folder whatever the working directory
    cache_dir: str = Field(default_factory=lambda: default_cache_dir())


    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        return check_device_text(value)

    @model_validator(mode="after")
    def _check(self) -> TrainConfig:
        # the algorithm's defaults fill the ppo fields left out (an after-validator: a before-validator's returned
        # mapping would be re-read in Python mode, where strict validation refuses a list for a tuple)
        self.ppo = with_task_defaults(with_algorithm_defaults(self.ppo, self.algorithm), self.task.kind)
        if self.ppo.batch_size % self.ppo.group_size:
            raise ValueError(f"ppo.batch_size ({self.ppo.batch_size}) must be a multiple of ppo.group_size "
                             f"({self.ppo.group_size}): a step trains whole groups of completions of one prompt")
        if self.algorithm != "ppo" and self.ppo.group_size < 2:
            raise ValueError(f"ppo.group_size: {self.algorithm} needs at least 2 completions per prompt (its baseline "
                             f"is the group's other members); got {self.ppo.group_size}")
        if self.sampling == "keyed" and self.engine != "transformers":
            raise ValueError(f"sampling: 'keyed' draws on the chunked engine only (engine: transformers); this "
                             f"config's engine is {self.engine!r}")
        if self.algorithm != "grpo" and self.ppo.scale_rewards != "group":
            raise ValueError(f"ppo.scale_rewards: {self.ppo.scale_rewards!r} applies to algorithm grpo only (this "
                             f"config's is {self.algorithm}): drop it")
        if self.task.kind == "dataset":
            if self.reward.kind == "proxy":
                raise ValueError("reward: a dataset task needs reward.kind function (ref: FILE.py:NAME) or model "
                                 "(path: a reward-model checkpoint); the proxy is the synthetic task's own")
            if self.gate.kind == "gold":
                raise ValueError("gate: a dataset task needs gate.kind function (ref: FILE.py:NAME) or model; the "
                                 "gold scorer is the synthetic task's own")
            return self  # the held-out count is known once the file is read (training/inputs/job_inputs.py)
        if self.eval_prompts > self.task.n_heldout_prompts:
            raise ValueError(f"eval_prompts ({self.eval_prompts}) exceeds task.n_heldout_prompts "
                             f"({self.task.n_heldout_prompts}): the gate would silently score fewer prompts "
                             "(lower eval_prompts or raise task.n_heldout_prompts)")
        return self


#: the weights file (or a sharded checkpoint's index) a transformers model directory holds
CHECKPOINT_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                      "pytorch_model.bin.index.json")


def check_train_resources(cfg: TrainConfig) -> None:
    """What the config names on disk, checked before anything is built: local checkpoints exist (a missing
    directory would otherwise be looked up on the Hugging Face Hub) and the warm-start cache is a directory."""
    from common.validate import check_out_dir

    checkpoints = [("policy.model_name_or_path", cfg.policy.model_name_or_path)]
    if cfg.reward.kind == "proxy":
        checkpoints.append(("reward.model_name_or_path", cfg.reward.model_name_or_path))
    for role in ("reward", "gate"):
        scorer = getattr(cfg, role)
        if scorer.kind == "model":
            checkpoints.append((f"{role}.path", scorer.path))
    for field, path in checkpoints:
        if path and not (Path(path) / "config.json").is_file():
            raise BadInput(f"{field}: '{path}' is not a local checkpoint directory with a config.json "
                           "(nothing is downloaded: pass a saved transformers model directory)")
        if path and not any((Path(path) / name).is_file() for name in CHECKPOINT_WEIGHTS):
            raise BadInput(f"{field}: '{path}' has a config.json but no weights ({' or '.join(CHECKPOINT_WEIGHTS[::2])}"
                           "): pass a directory written by save_pretrained")
    check_out_dir(cfg.cache_dir, "cache_dir")
    check_train_memory(cfg)


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """`cfg` with the paths it names (data files, checkpoints) made absolute against `config_dir` (default the
    working directory), so a checkpoint's saved config re-scores from anywhere. A FILE.py ref stays as written (the
    tenant's own words in messages) and is read against `config_dir` (training/inputs/tenant_code.py)."""
    base = Path(cfg.config_dir) if cfg.config_dir else Path.cwd()

    def absolute(path: str) -> str:
        return str(path if Path(path).is_absolute() else (base / path).resolve())

    update: dict[str, Any] = {}
    if cfg.task.kind == "dataset":
        update["task"] = cfg.task.model_copy(update={"train": absolute(cfg.task.train),
                                                      "heldout": absolute(cfg.task.heldout)})
    for role in ("reward", "gate"):
        scorer = getattr(cfg, role)
        if scorer.kind == "model":
            update[role] = scorer.model_copy(update={"path": absolute(scorer.path)})
    return cfg.model_copy(update=update) if update else cfg


def resolve_config(config: str | Path | dict, overrides: dict | None = None) -> TrainConfig:
    """A validated TrainConfig from a YAML path (or a mapping) plus dotted `overrides` ({"ppo.kl_coef": 0.01}).
    Errors are one line naming the file (or the override) and the field; nothing is built or written."""
    from common.config import load_config as load_model

    defaults = None if isinstance(config, dict) else {"name": Path(config).stem}
    cfg = load_model(TrainConfig, config, overrides, field="config", defaults=defaults)
    if cfg.config_dir is None and not isinstance(config, dict):
        from common.config import config_path

        cfg = cfg.model_copy(update={"config_dir": str(config_path(config).resolve().parent)})
    cfg = with_absolute_paths(cfg)
    check_train_resources(cfg)
    return cfg


def load_config(path: str | Path, overrides: dict | None = None) -> TrainConfig:
    """Read a YAML config; errors name the file and field (see `resolve_config`)."""
    return resolve_config(path, overrides)
