"""Alerts 9-10, on the off-policy side of inter-step overlap (carried responses, training/algorithms/core_algos.py's
correction): low effective sample size of the importance weights, and response-length drift between carried and fresh
samples. Streaming monitor and vectorised `scan` per alert, on the shared window kernels.

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import numpy as np

from eval.detector_base import NAN, Monitor
from eval.health.base import HealthAlert, PersistentBreach, _AlertMonitor
from eval.health.kernels import _blocks, _first_true, _fmt, _mean_var


# --------------------------------------------------------------------------- 9. low effective sample size
class LowESS(PersistentBreach):
    """The normalised effective sample size of the per-token importance weights pi_prox/pi_behav,
    (sum w)^2 / (n sum w^2), stays below `min_ess` for `persist` consecutive steps: the trained tokens were
    sampled by a policy far from the one being trained (stale carried tokens, a broken weight sync, an
    inference engine that samples differently from the trainer), so a few tokens carry the update. verl alarms
    below 0.3. Steps without the figure (NaN) break the run of low steps."""

    name = "low_ess"
    needs = ("is_ess",)
    title = "Low importance-sampling ESS"
    reason = "the training data no longer matches the policy being trained (too off-policy to learn from reliably)"
    first_response = (
        "check the staleness distribution and oppo.max_staleness, the weight sync, and whether the rollout engine "
        "samples with the trainer's settings (temperature, precision)"
    )

    def __init__(self, min_ess: float = 0.3, persist: int = 3):
        if not 0.0 < min_ess <= 1.0 or persist < 1:
            raise ValueError("low_ess: need 0 < min_ess <= 1, persist >= 1")
        self.min_ess, self.persist = float(min_ess), int(persist)

    def breached(self, ess):
        return ess < self.min_ess

    def describe(self, ess: float) -> str:
        return f"importance-weight ESS {_fmt(ess)} < {self.min_ess:g} for {self.persist} steps"


# --------------------------------------------------------------------------- 10. carried-vs-fresh length drift
def carried_log_ratio(len_carried: np.ndarray, len_fresh: np.ndarray) -> np.ndarray:
    """log(carried mean length / fresh mean length) per step; NaN where either group is missing or empty."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((len_carried > 0) & (len_fresh > 0), np.log(len_carried / len_fresh), np.nan)


class CarriedLengthDrift(HealthAlert):
    """Carried responses (begun under an older policy version, finished in a later step) and fresh ones move
    apart in length: the window mean of log(carried length / fresh length) differs by more than `log_ratio` from
    either of the two windows of `window` steps before it, beyond `z` standard errors of the difference (two
    windows back as well, so a step change that falls mid-window, half in one window and half in the next, is
    still seen at full size). Under inter-step
    overlap carried responses are the long stragglers, so the level of the gap is the workload's; a jump is a
    broken carry path (tokens lost or repeated on resume) or a fast collapse of fresh answers toward short ones,
    the bias that training first on the first B to finish invites. Windows with fewer than half their steps
    reporting both groups are not judged."""

    name = "carried_length_drift"
    needs = ("len_carried", "len_fresh")
    title = "Carried-vs-fresh length drift"
    reason = "responses carried across steps and fresh responses changed length relative to each other"
    first_response = (
        "compare carried and fresh samples (resume path: are carried tokens kept once?); check the Delta "
        "controller and the response-length trend of fresh samples (short-answer bias)"
    )

    def __init__(self, window: int = 20, log_ratio: float = 0.5, z: float = 3.0):
        if window < 4 or log_ratio <= 0 or z < 0:
            raise ValueError("carried_length_drift: need window >= 4, log_ratio > 0, z >= 0")
        self.window, self.log_ratio, self.z = int(window), float(log_ratio), float(z)

    def drifted(self, win: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For (runs, windows, w) of the log ratio: per window b >= 1 whether it moved from window b-1 or
        b-2 (column 0 is False), and the window means."""
        mean, var, n = _mean_var(win, min_n=max(2, win.shape[-1] // 2))
        moved = np.zeros(mean.shape, dtype=bool)
        for lag in (1, 2):
            if mean.shape[1] <= lag:
                continue
            with np.errstate(invalid="ignore"):
                se = np.sqrt(var[:, lag:] / n[:, lag:] + var[:, :-lag] / n[:, :-lag])
                moved[:, lag:] |= np.abs(mean[:, lag:] - mean[:, :-lag]) > np.maximum(self.log_ratio, self.z * se)
        return moved, mean

    def start(self) -> Monitor:
        return _CarriedMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w = self.w
        moved, _ = self.drifted(_blocks(carried_log_ratio(s["len_carried"], s["len_fresh"]), w))
        j = _first_true(moved)
        return np.where(j >= 0, j * w + w - 1, -1)


class _CarriedMonitor(_AlertMonitor):
    __slots__ = ("cur", "done")

    def __init__(self, alert):
        super().__init__(alert)
        self.cur: list[float] = []
        self.done: list[list[float]] = []  # the last three complete windows, oldest first

    def _observe(self, cp):
        a: CarriedLengthDrift = self.alert  # type: ignore[assignment]
        r = carried_log_ratio(np.array([getattr(cp, "len_carried", NAN)]), np.array([getattr(cp, "len_fresh", NAN)]))
        self.cur.append(float(r[0]))
        if len(self.cur) < a.w:
            return False
        self.done = [*self.done[-2:], self.cur]
        self.cur = []
        if len(self.done) < 2:
            return False
        moved, mean = a.drifted(np.array(self.done)[None, :, :])
        if bool(moved[0, -1]):
            self.detail = (
                f"carried/fresh length ratio {_fmt(float(np.exp(mean[0, -1])))}x in the last {a.window} steps "
                f"against {_fmt(float(np.exp(mean[0, -2])))}x in the window before"
            )
            return True
        return False
