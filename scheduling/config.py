"""Experiment configuration (pydantic): unknown keys and wrong types are rejected with the field named.

Defaults follow the EvalStop paper's Table 6 (Appendix A). Where the converted text lost a number,
the value chosen here is the one that reproduces the paper's tables; each such value is marked
"(lost in the text)" with the reasoning, and the YAML files in configs/ repeat it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Range = tuple[float, float]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _check_range(v: Range) -> Range:
    if v[0] > v[1]:
        raise ValueError(f"range [{v[0]}, {v[1]}] has low > high")
    return v


class NoiseConfig(Strict):
    kind: Literal["gaussian", "student_t", "ar1"] = "gaussian"
    # (lost in the text) 0.02: Table 1's FPR (1.5%) sits between Table 4's sigma=0.01 (0.0%) and
    # sigma=0.03 (2.9%) rows, and typical benchmark standard errors are 2-5%.
    sigma: float = Field(0.02, ge=0.0)
    df: float = Field(3.0, gt=2.0, description="Student-t degrees of freedom (heavy tails)")
    rho: float = Field(0.6, ge=0.0, lt=1.0, description="AR(1) lag-1 autocorrelation")


class JobTypeConfig(Strict):
    duration_min: Range
    gpus: tuple[int, int]
    eval_interval: float = Field(gt=0.0, le=1.0, description="progress between evaluations")
    eval_minutes: float = Field(ge=0.0, description="GPU-occupying minutes per evaluation")

    _r = field_validator("duration_min")(_check_range)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: tuple[int, int]) -> tuple[int, int]:
        if v[0] < 1 or v[0] > v[1]:
            raise ValueError("gpus must be [low, high] with 1 <= low <= high")
        return v


class RLHFCurveConfig(Strict):
    peak_progress: Range = (0.55, 0.75)
    # (lost in the text) absolute eval drop from the peak to the end of training. 0.20-0.35 makes
    # a 15%-progress step after the peak fall by ~0.1-0.15, which reproduces Table 4's recall
    # under noise (77% at sigma=0.08, 70% at sigma=0.12).
    drop: Range = (0.20, 0.35)
    healthy_tau: Range = (0.35, 0.7)

    _r = field_validator("peak_progress", "drop", "healthy_tau")(_check_range)


class RLHFConfig(JobTypeConfig):
    curve: RLHFCurveConfig = RLHFCurveConfig()


class CurveConfig(Strict):
    eval_start: Range = (0.05, 0.15)
    eval_gain: Range = (0.35, 0.55)
    lora_tau: Range = (0.12, 0.3)
    dpo_saturation: Range = (0.5, 0.8)
    loss_start: Range = (2.0, 3.0)
    loss_floor: Range = (0.6, 1.0)
    # RLHF training loss flattens at 50-70% of progress in both regimes (Appendix A)
    loss_plateau: Range = (0.5, 0.7)
    sft_loss_tau: float = Field(0.6, gt=0.0, description="LoRA/DPO loss decay scale (keeps improving)")
    # (calibration) relative loss decline per unit progress that remains after the plateau, and
    # multiplicative loss noise. Together they make a "2% over 3 checkpoints" plateau rule fire on
    # about 40% of RLHF runs, as LossPlateau does in Table 1 (recall 38%).
    loss_tail: float = Field(0.06, ge=0.0)
    loss_noise: float = Field(0.01, ge=0.0)

    _r = field_validator(
        "eval_start", "eval_gain", "lora_tau", "dpo_saturation", "loss_start", "loss_floor", "loss_plateau"
    )(_check_range)


class MixConfig(Strict):
    lora: float = Field(ge=0.0)
    dpo: float = Field(ge=0.0)
    rlhf: float = Field(ge=0.0)

    @model_validator(mode="after")
    def _nonzero(self) -> MixConfig:
        if self.lora + self.dpo + self.rlhf <= 0:
            raise ValueError("mix must have at least one positive share")
        return self


class WorkloadConfig(Strict):
    jobs: int = Field(200, ge=1)
    tenants: int = Field(5, ge=1)
    gpus: int = Field(64, ge=1)
    mix: MixConfig = MixConfig(lora=0.1, dpo=0.1, rlhf=0.8)
    # (lost in the text) jobs per minute. 0.5/min puts 200 jobs on the cluster within ~400 minutes,
    # a backlog that gives the paper's JCT scale (SRTF-Est ~1100 min on E2, ~360 min on E1).
    arrival_rate: float = Field(0.5, gt=0.0)
    hack_fraction: float = Field(0.6, ge=0.0, le=1.0)
    preemption_overhead_min: float = Field(2.0, ge=0.0)
    eval_noise: NoiseConfig = NoiseConfig()
    # The paper injects eval noise on RLHF runs (section 4.6); LoRA/DPO evals are deterministic unless set.
    sft_eval_noise: NoiseConfig = NoiseConfig(sigma=0.0)
    lora: JobTypeConfig = JobTypeConfig(duration_min=(10, 60), gpus=(1, 2), eval_interval=0.10, eval_minutes=1)
    dpo: JobTypeConfig = JobTypeConfig(duration_min=(30, 120), gpus=(2, 4), eval_interval=0.20, eval_minutes=3)
    rlhf: RLHFConfig = RLHFConfig(duration_min=(60, 360), gpus=(4, 8), eval_interval=0.15, eval_minutes=5)
    curves: CurveConfig = CurveConfig()

    @model_validator(mode="after")
    def _fits(self) -> WorkloadConfig:
        for name in ("lora", "dpo", "rlhf"):
            if getattr(self, name).gpus[1] > self.gpus:
                raise ValueError(f"{name}.gpus upper bound exceeds the cluster's {self.gpus} GPUs")
        return self


class MetricsConfig(Strict):
    quality_threshold: float = 0.3
    min_improvement: float = Field(0.01, ge=0.0, description="relative improvement that makes a checkpoint useful")


class VariantConfig(Strict):
    name: str
    set: dict[str, object] = {}
    schedulers: list[str] | None = None


class ExperimentConfig(Strict):
    name: str
    description: str = ""
    seeds: list[int] = [42, 123, 456, 789, 1024]
    schedulers: list[str]
    workload: WorkloadConfig = WorkloadConfig()
    metrics: MetricsConfig = MetricsConfig()
    variants: list[VariantConfig] = [VariantConfig(name="default")]
    backfill_depth: int = Field(32, ge=0, description="queued jobs scanned past a blocked head")

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if not v:
            raise ValueError("at least one seed is needed")
        return v
