"""The alert base: what every run-health alert reads (`HealthCheckpoint`, the `SIGNALS` a fleet's `scan`
takes) and what every alert is (`HealthAlert`: a `Detector` plus the catalog's metadata and the windows-in-steps
conversion; `_AlertMonitor`: its streaming state on one run).

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from eval.detector_base import NAN, Checkpoint, Detector, Monitor
from eval.health.kernels import CHUNK_RUNS, _as_arrays, _first_true, _lengths, _runs_of


@dataclass(slots=True)
class HealthCheckpoint(Checkpoint):
    """A `Checkpoint` plus the per-step signals only the health catalog reads (NaN when unknown)."""

    truncation_rate: float = NAN
    unparseable_rate: float = NAN
    #: GPU-seconds spent on this step (any positive value means spend accrues; NaN: unknown, assumed)
    gpu_seconds: float = NAN
    #: mean policy-version lag of the trained tokens (weight-sync health; StepRecord.staleness_mean)
    staleness: float = NAN
    #: spread of the reward across the step's samples (StepRecord.reward_std): ~0 means no learning signal
    reward_std: float = NAN
    #: normalised effective sample size of the importance weights pi_prox/pi_behav (StepRecord.is_ess)
    is_ess: float = NAN
    #: mean response length of the trained samples carried over from an earlier step, and of those begun and
    #: finished in this step (StepRecord.len_carried_mean / len_fresh_mean; NaN when a group is empty)
    len_carried: float = NAN
    len_fresh: float = NAN
    #: grpo/rloo (NaN for ppo): the share of the step's groups of completions whose rewards are all equal (no
    #: learning signal), and the mean within-group reward std (StepRecord.group_flat_frac / group_reward_std)
    group_flat_frac: float = NAN
    group_reward_std: float = NAN

    @classmethod
    def from_step_record(cls, rec: Any, progress: float = NAN) -> HealthCheckpoint:
        """From a `training.metrics.StepRecord` (duck-typed, so eval/ does not import training/)."""
        phases = getattr(rec, "phase_seconds", None) or {}
        spent = float(sum(phases.values())) if phases else NAN
        return cls(
            step=float(rec.step),
            eval_score=float(rec.gold_eval),
            progress=progress,
            loss=float(getattr(rec, "loss_policy", NAN)),
            reward=float(rec.reward_mean),
            kl=float(rec.kl),
            entropy=float(rec.entropy),
            grad_norm=float(rec.grad_norm),
            response_len=float(rec.response_len_mean),
            truncation_rate=float(rec.truncation_rate),
            unparseable_rate=float(rec.unparseable_rate),
            gpu_seconds=spent,
            staleness=float(getattr(rec, "staleness_mean", NAN)),
            reward_std=float(getattr(rec, "reward_std", NAN)),
            is_ess=float(getattr(rec, "is_ess", NAN)),
            len_carried=float(getattr(rec, "len_carried_mean", NAN)),
            len_fresh=float(getattr(rec, "len_fresh_mean", NAN)),
            group_flat_frac=float(getattr(rec, "group_flat_frac", NAN)),
            group_reward_std=float(getattr(rec, "group_reward_std", NAN)),
        )


SIGNALS: tuple[str, ...] = tuple(f.name for f in fields(HealthCheckpoint))


def series_from_checkpoints(runs: list[list[Checkpoint]]) -> dict[str, np.ndarray]:
    """Stack runs of checkpoints into the (runs, steps) arrays `scan` reads, NaN-padded at the end."""
    n_steps = max((len(r) for r in runs), default=0)
    out = {name: np.full((len(runs), n_steps), np.nan) for name in SIGNALS}
    for i, run in enumerate(runs):
        for t, cp in enumerate(run):
            for name in SIGNALS:
                out[name][i, t] = getattr(cp, name, NAN)
    return out


# --------------------------------------------------------------------------- alert base
class HealthAlert(Detector):
    """One row of the runbook's alert catalog. Subclasses define the statistic; this class holds the
    catalog metadata (plain-language reason, first response) and the windows-in-steps conversion."""

    #: title used in tables
    title: ClassVar[str]
    #: the customer-readable reason a run carries when this alert moves its state
    reason: ClassVar[str]
    #: the runbook's first-response pointer (for the on-call)
    first_response: ClassVar[str]
    #: runbook layer: "algorithmic" (the run's learning) or "mechanics" (the platform running it); a
    #: mechanics page is attributed to the platform, an algorithmic one to non-convergence
    layer: ClassVar[str] = "algorithmic"
    #: what the run must have for the alert to apply: "critic" (a learned value function: ppo) or "groups" (several
    #: completions per prompt: grpo, rloo); None: every run. A catalog built for an algorithm that lacks it leaves
    #: the alert out and says why (`Catalog.not_evaluated`; eval/health/config.py ALGORITHM_HAS)
    requires: ClassVar[str | None] = None
    #: parameters measured in steps (converted to rows by `at_spacing`) and per-step rates
    window_params: ClassVar[tuple[str, ...]] = ("window",)
    rate_params: ClassVar[tuple[str, ...]] = ()

    spacing: float = 1.0

    def at_spacing(self, spacing: float) -> HealthAlert:
        """The same alert for a trace recorded every `spacing` steps (windows stay in steps)."""
        if spacing <= 0 or not math.isfinite(spacing):
            raise ValueError(f"{self.name}: step spacing must be positive, got {spacing}")
        other = copy.copy(self)
        other.spacing = float(spacing)
        return other

    def rows(self, steps: int) -> int:
        """Window length in recorded rows for a window of `steps` training steps (at least 4 rows)."""
        return max(4, int(round(steps / self.spacing)))

    @property
    def w(self) -> int:
        return self.rows(self.window)  # type: ignore[attr-defined]

    def params(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k != "spacing"}

    #: whether `_scan` is cheaper on the whole fleet than on cache-sized chunks of runs
    whole_fleet: ClassVar[bool] = False

    def scan(self, series: dict[str, np.ndarray]) -> np.ndarray:
        arrays, n_runs, _ = _as_arrays(series)
        if self.whole_fleet:
            return self.scan_chunk(arrays)
        out = np.empty(n_runs, dtype=np.int64)
        for lo in range(0, n_runs, CHUNK_RUNS):
            part = {k: v[lo : lo + CHUNK_RUNS] for k, v in arrays.items()}
            out[lo : lo + CHUNK_RUNS] = self.scan_chunk(part)
        return out

    def scan_chunk(self, arrays: dict[str, np.ndarray], lengths: np.ndarray | None = None) -> np.ndarray:
        """`scan` on float64 arrays of a slice of runs (`lengths`: observations per run, if known)."""
        n_runs, n_steps = next(iter(arrays.values())).shape
        if lengths is None:
            lengths = _lengths(arrays, n_runs, n_steps)
        missing = [name for name in self.needs if name not in arrays]
        if missing:
            arrays = dict(arrays)
            for name in missing:
                arrays[name] = np.full((n_runs, n_steps), np.nan)
        first = self._scan(arrays, n_runs, n_steps)
        return np.where(first < lengths, first, -1)

    def _scan(self, s: dict[str, np.ndarray], n_runs: int, n_steps: int) -> np.ndarray:
        raise NotImplementedError


class _AlertMonitor(Monitor):
    """Streaming state of one alert on one run; `detail` says what fired (set when observe returns True)."""

    __slots__ = ("alert", "t", "detail")

    def __init__(self, alert: HealthAlert):
        self.alert = alert
        self.t = 0
        self.detail = ""

    def observe(self, cp: Checkpoint) -> bool:
        fired = self._observe(cp)
        self.t += 1
        return fired

    def _observe(self, cp: Checkpoint) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


# --------------------------------------------------------------------------- a bar held for `persist` steps
class PersistentBreach(HealthAlert):
    """An alert on one signal (`needs[0]`) that fires once the signal breaches the alert's bar (`breached`) for
    `persist` consecutive steps (sync_stall, low_ess, flat_groups). A step without the figure (NaN) never breaches,
    so it breaks the run of breaching steps. Subclasses set `persist` and say what breaching is and how to put it."""

    window_params: ClassVar[tuple[str, ...]] = ()
    persist: int

    @property
    def w(self) -> int:
        return 1

    def breached(self, value: Any) -> Any:
        """Whether `value` (a float, or a numpy array of them) is past the bar; False for NaN."""
        raise NotImplementedError

    def describe(self, value: float) -> str:
        """The monitor's `detail` when the alert fires at `value`."""
        raise NotImplementedError

    def start(self) -> Monitor:
        return _BreachMonitor(self)

    def _scan(self, s: dict[str, np.ndarray], n_runs: int, n_steps: int) -> np.ndarray:
        return _first_true(_runs_of(self.breached(s[self.needs[0]]), self.persist))


class _BreachMonitor(_AlertMonitor):
    __slots__ = ("count",)

    def __init__(self, alert: PersistentBreach):
        super().__init__(alert)
        self.count = 0

    def _observe(self, cp: Checkpoint) -> bool:
        a: PersistentBreach = self.alert  # type: ignore[assignment]
        value = getattr(cp, a.needs[0], NAN)
        self.count = self.count + 1 if a.breached(value) else 0
        if self.count >= a.persist:
            self.detail = a.describe(value)
            return True
        return False


# --------------------------------------------------------------------------- band monitor (alerts 1 and 6)
class _BandMonitor(_AlertMonitor):
    __slots__ = ("cur", "lo", "hi", "med", "count", "window_start", "signal", "spikes")

    def __init__(self, alert: HealthAlert, signal: str):
        super().__init__(alert)
        self.signal = signal
        self.cur: list[float] = []
        self.lo = self.hi = self.med = math.nan
        self.count = 0
        self.window_start = -1
        self.spikes: deque[int] = deque()

    def _roll(self) -> None:
        """At a window boundary the window just completed becomes the reference band."""
        a: Any = self.alert
        win = np.array(self.cur, dtype=np.float64)[None, None, :]
        lo, hi, med = a.band(win)
        self.lo, self.hi, self.med = float(lo[0, 0]), float(hi[0, 0]), float(med[0, 0])
        self.window_start = self.t - a.w
        self.cur = []
