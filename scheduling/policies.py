"""Scheduling policies. Written once; driven by the simulator and by the live platform.

A policy ranks jobs (`priority`, lower runs first) from their `JobView` only, and may ask to stop a
job at a checkpoint (`on_checkpoint`). Priorities are re-read whenever a job's view changes (arrival,
checkpoint, preemption), so a policy must be a pure function of the view.

`EarlyStop` is the composable wrapper of the EvalStop paper (Algorithm 1): at every checkpoint it
asks its detector first and stops the job if told (the engine frees its GPUs), and only then
delegates ranking to the base policy, which therefore sees the updated cluster.
"""

from __future__ import annotations

import re

import numpy as np

from eval.detectors import Checkpoint, Detector, Monitor, make_detector
from scheduling.jobview import CheckpointSeries, JobView

INF = float("inf")


class Policy:
    name: str = "policy"
    preemptive: bool = False
    #: A running job's priority never gets worse at its own checkpoints (it reads only fixed fields and
    #: attained service, and is non-increasing in service). The engine then need not re-rank running
    #: jobs at every checkpoint. False is always safe.
    rank_never_worsens: bool = False

    def priority(self, view: JobView) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def on_checkpoint(self, view: JobView) -> bool:
        """Called after each evaluation lands in `view`. True: stop the job now, keep its best checkpoint."""
        return False

    def forget(self, job_id: int) -> None:
        """The job left the system; drop any per-job state."""

    def plan_stops(self, jobs: CheckpointSeries, job_types: tuple[str, ...]) -> np.ndarray | None:
        """Batch form of `on_checkpoint` for a history-only policy: per job, the flat index of the first
        checkpoint it would stop the job at, or -1. None: no batch form (the engine replays
        `on_checkpoint` job by job). `job_types` names the type indices of `jobs.job_type`."""
        if type(self).on_checkpoint is Policy.on_checkpoint:
            return np.full(len(jobs.cp_start) - 1, -1, dtype=np.int64)  # never stops a job
        return None

    @property
    def stop_reads_history_only(self) -> bool:
        """`on_checkpoint` decides from the job's fixed fields and checkpoint histories alone (never from
        attained service, preemptions or the clock), so the engine may replay its verdicts for a job
        ahead of time, one checkpoint at a time. True for policies that never stop a job."""
        return type(self).on_checkpoint is Policy.on_checkpoint

    @property
    def base(self) -> Policy:
        return self


class FIFO(Policy):
    name = "FIFO"
    rank_never_worsens = True

    def priority(self, view: JobView) -> float:
        return view.arrival


class SJFEst(Policy):
    """Non-preemptive shortest-job-first on the per-type duration estimate."""

    name = "SJF-Est"
    rank_never_worsens = True

    def priority(self, view: JobView) -> float:
        return view.est_duration


class SRTFEst(Policy):
    """Preemptive shortest-remaining-time-first on (per-type estimate - attained service)."""

    name = "SRTF-Est"
    preemptive = True
    rank_never_worsens = True  # the estimate minus attained service only falls as the job trains

    def priority(self, view: JobView) -> float:
        return view.est_remaining


class LossAware(Policy):
    """SLAQ-style: GPUs go to the jobs whose training loss is improving fastest.

    A job with fewer than two checkpoints has no measured improvement yet and is ranked first
    (SLAQ's optimistic start). Ranking is by the relative loss drop per checkpoint interval.
    """

    name = "LossAware"
    preemptive = True

    def priority(self, view: JobView) -> float:
        hist = view.loss_history
        if len(hist) < 2:
            return -INF
        prev, last = hist[-2], hist[-1]
        return -(prev - last) / max(abs(prev), 1e-12)


class EvalSched(Policy):
    """Eval-aware priority without termination: SRTF-Est, but jobs whose latest eval is below their
    best (post-peak) go behind every other job. They still occupy the system (the paper's point)."""

    name = "EvalSched"
    preemptive = True
    POST_PEAK_PENALTY = 1e9

    def priority(self, view: JobView) -> float:
        hist = view.eval_history
        penalty = self.POST_PEAK_PENALTY if len(hist) >= 2 and hist[-1] < max(hist) else 0.0
        return view.est_remaining + penalty


class EarlyStop(Policy):
    """Wrap any base policy with a detector. `job_types` limits which job types it may stop
    (None: all)."""

    def __init__(self, base: Policy, detector: Detector, job_types: tuple[str, ...] | None = None):
        self._base = base
        self.detector = detector
        self.job_types = job_types
        self.preemptive = base.preemptive
        self.rank_never_worsens = base.rank_never_worsens
        self.name = f"{detector.label}+{SHORT_BASE.get(base.name, base.name)}"
        self._monitors: dict[int, Monitor] = {}
        self.priority = base.priority  # delegate without an extra call layer (hot path)
        # one reusable checkpoint record: monitors read it during `observe` and keep no reference
        self._cp = Checkpoint(step=0, eval_score=0.0)

    @property
    def base(self) -> Policy:
        return self._base

    @property
    def stop_reads_history_only(self) -> bool:
        return True  # the detector sees only the checkpoint series and the gate's standard error

    def on_checkpoint(self, view: JobView) -> bool:
        if self.job_types is not None and view.job_type not in self.job_types:
            return False
        monitors = self._monitors
        monitor = monitors.get(view.job_id)
        if monitor is None:
            monitor = monitors[view.job_id] = self.detector.start()
        cp = self._cp
        cp.step = len(view.eval_history)
        cp.eval_score = view.eval_history[-1]
        cp.progress = view.progress
        cp.loss = view.loss_history[-1]
        cp.reward = view.reward_history[-1]
        cp.eval_se = view.eval_se
        return monitor.observe(cp)

    def forget(self, job_id: int) -> None:
        self._monitors.pop(job_id, None)

    def plan_stops(self, jobs: CheckpointSeries, job_types: tuple[str, ...]) -> np.ndarray:
        """Every in-scope job's checkpoint series through the detector's `scan` (vectorised for EvalStop and
        StopAt; a monitor per job otherwise), with the fields `on_checkpoint` feeds it."""
        n = len(jobs.cp_start) - 1
        plan = np.full(n, -1, dtype=np.int64)
        in_scope = np.ones(n, dtype=bool)
        if self.job_types is not None:
            in_scope = np.isin(jobs.job_type, [job_types.index(t) for t in self.job_types if t in job_types])
        n_cp = np.diff(jobs.cp_start)
        for length in np.unique(n_cp[in_scope]):
            if length == 0:
                continue
            idx = np.flatnonzero(in_scope & (n_cp == length))
            for chunk in np.array_split(idx, max(1, len(idx) // 65_536)):
                flat = jobs.cp_start[chunk, None] + np.arange(length)[None, :]
                series = {"step": np.broadcast_to(np.arange(1.0, length + 1.0), flat.shape),
                          "eval_score": jobs.eval_score[flat], "progress": jobs.progress[flat],
                          "loss": jobs.loss[flat], "reward": jobs.reward[flat],
                          "eval_se": np.broadcast_to(jobs.eval_se[chunk, None], flat.shape)}
                first = self.detector.scan(series)
                hit = first >= 0
                plan[chunk[hit]] = flat[hit, first[hit]]
        return plan


BASES: dict[str, type[Policy]] = {
    "FIFO": FIFO, "SJF-Est": SJFEst, "SJF": SJFEst, "SRTF-Est": SRTFEst, "SRTF": SRTFEst,
    "LossAware": LossAware, "EvalSched": EvalSched,
}
SHORT_BASE = {"SRTF-Est": "SRTF", "SJF-Est": "SJF"}

# The paper's StopAt baseline "terminates every RLHF job at fixed progress": it applies to RLHF only.
_DETECTOR_SCOPE = {"stopat": ("rlhf",)}
_SPEC = re.compile(r"^(?P<det>[A-Za-z]+)(?P<num>\d*\.?\d+)?(?:\((?P<args>[^)]*)\))?$")


def scheduler_detector(spec: str) -> tuple[str, dict[str, float | int]] | None:
    """The early-stop part of a scheduler name as (detector name, parameters): `Paired(margin=0.1)+SRTF` ->
    ("paired", {"margin": 0.1}), `StopAt0.65+SJF` -> ("stopat", {"p": 0.65}); None for a bare base policy. Raises
    ValueError naming what cannot be read (the names themselves are checked by `parse_scheduler`)."""
    spec = spec.strip()
    if "+" not in spec:
        return None
    det_part = spec.split("+", 1)[0]
    m = _SPEC.match(det_part)
    if not m:
        raise ValueError(f"cannot parse detector '{det_part}' in '{spec}' (e.g. EvalStop, StopAt0.65, EvalStop(k=3))")
    name = m.group("det").lower()
    params: dict[str, float | int] = {}
    if m.group("num"):
        params["p" if name == "stopat" else "k"] = float(m.group("num"))
    if m.group("args"):
        for item in m.group("args").split(","):
            key, _, value = item.partition("=")
            if not _ or not key.strip():
                raise ValueError(f"detector argument '{item}' in '{spec}' must be key=value")
            try:
                params[key.strip()] = _number(value.strip())
            except ValueError:
                raise ValueError(f"detector argument '{item}' in '{spec}': '{value.strip()}' is not a number (write "
                                 "key=value, e.g. EvalStop(k=3))") from None
    return name, params


def parse_scheduler(spec: str) -> Policy:
    """Build a policy from the paper's table names: `SRTF-Est`, `EvalStop+SRTF`, `StopAt0.65+SRTF`,
    `LossPlateau+FIFO`, `EvalStop(k=3)+SJF`. Raises ValueError naming what is wrong."""
    spec = spec.strip()
    if "+" not in spec:
        if spec not in BASES:
            raise ValueError(f"unknown scheduler '{spec}' (bases: {', '.join(sorted(set(BASES)))})")
        return BASES[spec]()
    base_part = spec.split("+", 1)[1]
    if base_part not in BASES:
        raise ValueError(f"unknown base scheduler '{base_part}' in '{spec}' (bases: {', '.join(sorted(BASES))})")
    name, params = scheduler_detector(spec)
    detector = make_detector(name, **params)
    return EarlyStop(BASES[base_part](), detector, _DETECTOR_SCOPE.get(detector.name))


def parse_base(spec: str) -> Policy:
    """The base policy of a scheduler name (`Paired+SRTF` -> SRTF), without building its early-stop detector: for a
    caller that builds the stop rule elsewhere (the live platform round: each job's request carries it). Raises
    ValueError naming what is wrong."""
    spec = spec.strip()
    base_part = spec.split("+", 1)[1] if "+" in spec else spec
    if base_part not in BASES:
        raise ValueError(f"unknown base scheduler '{base_part}' in '{spec}' (bases: {', '.join(sorted(set(BASES)))})")
    return BASES[base_part]()


def _number(text: str) -> float | int:
    try:
        return int(text)
    except ValueError:
        return float(text)
