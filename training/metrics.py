"""The per-step record the trainer yields. Flows, accounting, the health catalog and eval gates
consume it, so its field names are a contract inside the project: add fields, never rename.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

NAN = float("nan")

#: wall-clock phases of one PPO step (the runbook's `rlapi_step_phase_seconds{phase=...}`); `reward_fn`: the step's
#: wait on the tenant's reward function (training/inputs/scorers.py), 0 with a reward model
PHASES = ("rollout", "score", "sync", "optim", "eval", "reward_fn")


@dataclass(slots=True)
class StepRecord:
    step: int
    policy_version: int
    # proxy reward (what PPO optimises) and world feedback (held-out gold score, NaN between gates)
    reward_mean: float
    reward_std: float = NAN
    gold_eval: float = NAN
    gold_eval_se: float = NAN
    # algorithmic health
    kl: float = NAN
    entropy: float = NAN
    grad_norm: float = NAN
    clip_frac: float = NAN
    approx_kl: float = NAN
    adv_mean: float = NAN
    adv_std: float = NAN
    ret_mean: float = NAN
    loss_policy: float = NAN
    loss_value: float = NAN
    # rollout shape (drift detection)
    response_len_mean: float = NAN
    truncation_rate: float = NAN
    unparseable_rate: float = NAN
    # run mechanics and accounting
    phase_seconds: dict[str, float] = field(default_factory=dict)
    tokens_generated: int = 0
    tokens_trained: int = 0
    samples_trained: int = 0
    delta: int = 0
    chunk_size: int = 0
    deferred: int = 0
    wall_s: float = NAN
    # added by the OPPO trainer: mean policy-version lag of trained tokens (inter-step staleness) and
    # decode steps the rollout took (the straggler cost inter-step overlap removes)
    staleness_mean: float = NAN
    decode_steps: int = 0
    # off-policy view of the trained tokens (training/algorithms/core_algos.py, "off-policy correction"): the largest
    # version lag, the share of tokens sampled by an older policy, and the importance weights pi_prox/pi_behav before
    # any cap (normalised effective sample size (sum w)^2 / (n sum w^2) in (0, 1], mean, max); tokens masked by
    # `oppo.max_staleness` are left out
    staleness_max: float = NAN
    stale_frac: float = NAN
    is_ess: float = NAN
    is_weight_mean: float = NAN
    is_weight_max: float = NAN
    # response length (tokens) of the trained samples that were carried over from an earlier step and of
    # those begun and finished in this step (NaN when a group is empty): the carried-vs-fresh length drift
    len_carried_mean: float = NAN
    len_fresh_mean: float = NAN
    # CPU seconds the tenant's reward function used in its own processes this step (charged to the tenant)
    reward_fn_cpu_s: float = 0.0
    # grpo/rloo (NaN for ppo): the share of the step's groups whose scored rewards are all equal (no learning
    # signal) and the mean within-group std of the rewards; the k3 KL to the reference when it is paid in the loss
    group_flat_frac: float = NAN
    group_reward_std: float = NAN
    kl_loss: float = NAN
    # a job on several ranks (training/distributed/): its ranks, and the most any rank waited inside the step's
    # collectives (seconds; 0 on one rank). The step's figures are the global batch's; phase times the slowest rank's
    world_size: int = 1
    rank_idle_s: float = 0.0
    # a function reward's own figures (training/inputs/scorers.py RewardFunctions): `reward_fn/<function>/mean` per
    # function and `reward_fn/<name>` for what it logged with log_metric; flat() spreads them into the row
    reward_fn_metrics: dict[str, float] = field(default_factory=dict)

    def flat(self) -> dict[str, float]:
        """One flat dict of numbers (phase times as `phase_<name>_s`, a reward function's metrics under their own
        `reward_fn/...` names) for CSV rows and metric loggers."""
        row = asdict(self)
        phases = row.pop("phase_seconds")
        extra = row.pop("reward_fn_metrics")
        for name in PHASES:
            row[f"phase_{name}_s"] = float(phases.get(name, 0.0))
        row.update({k: float(v) for k, v in sorted(extra.items()) if k not in row})
        return row
