"""The information boundary: what a non-clairvoyant scheduler may see of a job.

A `JobView` is a whitelist. It holds only observable state (type, tenant, GPU demand, arrival,
attained service, progress, the loss/eval history at reached checkpoints, and the per-type duration
estimate) and has no reference back to the simulator's job record, so the hidden truth (true
duration, hacking label, peak progress, future checkpoints) is unreachable through it. Asking for a
hidden field raises `InformationBoundaryError`, so a policy that tries fails loudly instead of
silently cheating.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HIDDEN_FIELDS = frozenset(
    {"duration", "true_duration", "hacking", "label", "is_hacking", "peak_progress", "peak", "remaining",
     "true_remaining", "future_evals", "curve"}
)


class InformationBoundaryError(AttributeError):
    """A scheduler or detector asked for something a real scheduler cannot know."""


class JobView:
    __slots__ = (
        "job_id", "job_type", "tenant", "gpus", "arrival", "est_duration",
        "attained", "progress", "eval_history", "loss_history", "reward_history", "progress_history", "preemptions",
        "eval_se",
    )

    def __init__(self, job_id: int, job_type: str, tenant: int, gpus: int, arrival: float, est_duration: float):
        self.job_id = job_id
        self.job_type = job_type
        self.tenant = tenant
        self.gpus = gpus
        self.arrival = arrival
        self.est_duration = est_duration
        self.attained = 0.0  # training minutes received so far
        self.progress = 0.0  # trainer-reported fraction of planned steps, at the last checkpoint
        self.eval_history: list[float] = []
        self.loss_history: list[float] = []
        self.reward_history: list[float] = []
        self.eval_se = float("nan")  # the eval gate's reported standard error
        self.progress_history: list[float] = []
        self.preemptions = 0

    def __getattr__(self, name: str):
        # Only reached for names that are not slots.
        if name in HIDDEN_FIELDS:
            raise InformationBoundaryError(
                f"JobView.{name} is hidden from schedulers (non-clairvoyant boundary); "
                "use est_duration, attained, progress and the checkpoint histories"
            )
        raise AttributeError(f"JobView has no field '{name}'")

    @property
    def est_remaining(self) -> float:
        """Per-type duration estimate minus attained service (never below zero)."""
        rem = self.est_duration - self.attained
        return rem if rem > 0.0 else 0.0

    @property
    def best_eval(self) -> float:
        return max(self.eval_history) if self.eval_history else float("-inf")

    def __repr__(self) -> str:
        return (f"JobView(id={self.job_id}, type={self.job_type}, tenant={self.tenant}, gpus={self.gpus}, "
                f"attained={self.attained:.1f}, progress={self.progress:.2f}, checkpoints={len(self.eval_history)})")


@dataclass(frozen=True)
class CheckpointSeries:
    """The observable checkpoint data of many jobs at once (what their `JobView`s will have shown by
    each checkpoint), for policies that plan their checkpoint verdicts in one batch. Flat layout: job i
    owns checkpoints `cp_start[i]:cp_start[i+1]`. No hidden field (duration, label, noise-free eval)."""

    job_type: np.ndarray  # int index into scheduling.workload.JOB_TYPES
    cp_start: np.ndarray  # int64, length n+1
    progress: np.ndarray
    eval_score: np.ndarray
    loss: np.ndarray
    reward: np.ndarray
    eval_se: np.ndarray  # per job
