"""Alerts 5-8 of the runbook, on whether the run trains at all and runs properly: dead run, gradient-norm
spikes, rollout drift, and the run-mechanics alert weight-sync stall. Streaming monitor and vectorised `scan`
per alert, on the shared window kernels (eval/health/kernels.py).

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import fields

import numpy as np

from eval.detector_base import NAN, Monitor
from eval.health.base import HealthAlert, PersistentBreach, _AlertMonitor, _BandMonitor
from eval.health.kernels import (
    _blocks,
    _first_true,
    _fmt,
    _mean_var,
    _outside_prev,
    _quartiles,
    _rsum,
    _Sums,
    _window_sums,
)


# --------------------------------------------------------------------------- 5. dead run
class DeadRun(HealthAlert):
    """Budget burning with no learning signal: over the trailing `m` windows of `window` steps, reward
    and KL are both flat within noise (least-squares slope within `z` standard errors of zero, or the
    fitted change over the span below `tol`) while GPU spend accrues. With `max_reward_std` set, the
    spread of rewards across each step's samples must also stay at or below it over those windows (no
    advantage signal left: a dead or constant reward), which tells a dead run from a converged one
    that still gets graded rewards; steps that do not report the spread do not block the alert."""

    name = "dead_run"
    needs = ("reward", "kl")
    title = "Dead run"
    reason = "the run is spending GPU time but the reward is not changing: it is not learning"
    first_response = (
        "check reward-function output distribution and LR; budget burning with no learning signal"
    )

    def __init__(
        self, window: int = 20, m: int = 5, z: float = 2.0, tol: float = 1e-3,
        max_reward_std: float | None = None,
    ):
        if window < 4 or m < 1 or z < 0 or tol < 0 or (max_reward_std is not None and max_reward_std < 0):
            raise ValueError("dead_run: need window >= 4, m >= 1, z >= 0, tol >= 0, max_reward_std >= 0")
        self.window, self.m, self.z, self.tol = int(window), int(m), float(z), float(tol)
        self.max_reward_std = None if max_reward_std is None else float(max_reward_std)

    def no_spread(self, std: np.ndarray) -> np.ndarray:
        """Per window (runs, windows, w) -> (runs, windows): every reported reward spread <= the cap."""
        return ~(std > self.max_reward_std).any(axis=-1)

    def trailing_all(self, flags: np.ndarray) -> np.ndarray:
        """(runs, windows) -> True where the flag holds in all of the trailing m windows."""
        m, nb = self.m, flags.shape[1]
        if nb < m:
            return np.zeros(flags.shape, dtype=bool)
        all_m = np.lib.stride_tricks.sliding_window_view(flags, m, axis=1).all(axis=-1)
        return np.concatenate([np.zeros((flags.shape[0], m - 1), dtype=bool), all_m], axis=1)

    def flat(self, sums: _Sums) -> np.ndarray:
        """Per window-end, whether the trailing m windows are flat (False until m windows exist).
        `sums` fields are (runs, windows); each group of m consecutive windows is merged into one
        least-squares fit (window j of the group is offset by j·w steps)."""
        m, w = self.m, self.w
        nb = sums.n.shape[1]
        if nb < m:
            return np.zeros(sums.n.shape, dtype=bool)
        o = np.arange(m, dtype=np.float64) * w

        def grouped(a: np.ndarray) -> np.ndarray:  # (runs, groups, m) views of m consecutive windows
            return np.lib.stride_tricks.sliding_window_view(a, m, axis=1)

        n_j, sx_j, sy_j = grouped(sums.n), grouped(sums.sx), grouped(sums.sy)
        n = _rsum(n_j)
        sx = _rsum(sx_j + n_j * o)
        sxx = _rsum(grouped(sums.sxx) + 2.0 * o * sx_j + n_j * (o * o))
        sy = _rsum(sy_j)
        sxy = _rsum(grouped(sums.sxy) + o * sy_j)
        syy = _rsum(grouped(sums.syy))
        with np.errstate(invalid="ignore", divide="ignore"):
            cxx = sxx - sx * sx / n
            cxy = sxy - sx * sy / n
            cyy = syy - sy * sy / n
            slope = cxy / cxx
            rss = np.maximum(cyy - slope * cxy, 0.0)
            se = np.sqrt(rss / (n - 2.0) / cxx)
            span = float(m * w)
            ok = (n >= m * w / 2) & (cxx > 0)
            is_flat = ok & (np.abs(slope) * span <= np.maximum(self.tol, self.z * se * span))
        pad = np.zeros((sums.n.shape[0], m - 1), dtype=bool)
        return np.concatenate([pad, is_flat], axis=1)

    def spends(self, gpu: np.ndarray) -> np.ndarray:
        """Per window: spend accrues (some positive GPU-seconds, or no spend reported at all: a committed
        step is assumed to cost GPU time)."""
        return (gpu > 0).any(axis=-1) | ~(gpu <= 0).any(axis=-1)

    def start(self) -> Monitor:
        return _DeadMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w = self.w
        fr = self.flat(_window_sums(_blocks(s["reward"], w), with_syy=True))
        fk = self.flat(_window_sums(_blocks(s["kl"], w), with_syy=True))
        dead = fr & fk
        std = s.get("reward_std")
        if self.max_reward_std is not None and std is not None and dead.any():
            dead &= self.trailing_all(self.no_spread(_blocks(std, w)))
        gpu = s.get("gpu_seconds")
        if gpu is not None and dead.any():
            gpu = _blocks(gpu, w)
            # the per-window test only where it can matter: identical answers, a fraction of the work
            rows = np.nonzero(dead.any(axis=1))[0]
            dead[rows] &= self.spends(gpu[rows])
        j = _first_true(dead)
        return np.where(j >= 0, j * w + w - 1, -1)


class _DeadMonitor(_AlertMonitor):
    __slots__ = ("rew", "kl", "gpu", "std", "hist_r", "hist_k", "hist_s")

    def __init__(self, alert):
        super().__init__(alert)
        self.rew: list[float] = []
        self.kl: list[float] = []
        self.gpu: list[float] = []
        self.std: list[float] = []
        self.hist_r: deque[_Sums] = deque(maxlen=alert.m)
        self.hist_k: deque[_Sums] = deque(maxlen=alert.m)
        self.hist_s: deque[bool] = deque(maxlen=alert.m)

    @staticmethod
    def _stack(hist: deque[_Sums]) -> _Sums:
        return _Sums(*(np.concatenate([getattr(h, f.name) for h in hist], axis=1) for f in fields(_Sums)))

    def _observe(self, cp):
        a: DeadRun = self.alert  # type: ignore[assignment]
        self.rew.append(cp.reward)
        self.kl.append(cp.kl)
        self.gpu.append(getattr(cp, "gpu_seconds", NAN))
        self.std.append(getattr(cp, "reward_std", NAN))
        if len(self.rew) < a.w:
            return False
        self.hist_r.append(_window_sums(np.array(self.rew)[None, None, :], with_syy=True))
        self.hist_k.append(_window_sums(np.array(self.kl)[None, None, :], with_syy=True))
        if a.max_reward_std is not None:
            self.hist_s.append(bool(a.no_spread(np.array(self.std)[None, None, :])[0, 0]))
        spend = bool(a.spends(np.array(self.gpu)[None, None, :])[0, 0])
        self.rew, self.kl, self.gpu, self.std = [], [], [], []
        if len(self.hist_r) < a.m or not spend:
            return False
        if a.max_reward_std is not None and not all(self.hist_s):
            return False
        fr = bool(a.flat(self._stack(self.hist_r))[0, -1])
        fk = bool(a.flat(self._stack(self.hist_k))[0, -1])
        if fr and fk:
            spread = f", reward spread <= {a.max_reward_std:g}" if a.max_reward_std is not None else ""
            self.detail = (
                f"reward and KL flat within noise for {a.m} windows of {a.window} steps{spread} "
                "while spend accrues"
            )
            return True
        return False


# --------------------------------------------------------------------------- 6. gradient-norm spike
class GradNormSpike(HealthAlert):
    """Gradient norm above median + k·IQR of the previous window, `repeats` times within the trailing
    `window` steps; with `clip_norm` set, only spikes where clipping engaged (norm > clip_norm) count."""

    name = "grad_norm_spike"
    needs = ("grad_norm",)
    title = "Gradient-norm spike"
    reason = "training updates became unstable (repeated gradient spikes)"
    first_response = "check batch composition and LR schedule; correlate with loss scale if mixed precision"

    def __init__(
        self, window: int = 20, k: float = 3.0, repeats: int = 3, min_iqr: float = 0.01,
        clip_norm: float | None = None,
    ):
        if window < 4 or k <= 0 or repeats < 1 or min_iqr < 0 or (clip_norm is not None and clip_norm <= 0):
            raise ValueError(
                "grad_norm_spike: need window >= 4, k > 0, repeats >= 1, min_iqr >= 0, clip_norm > 0"
            )
        self.window, self.k, self.repeats, self.min_iqr = int(window), float(k), int(repeats), float(min_iqr)
        self.clip_norm = None if clip_norm is None else float(clip_norm)

    def band(self, win: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q1, med, q3 = _quartiles(win, min_n=max(3, win.shape[-1] // 2))
        return med, med + self.k * np.maximum(q3 - q1, self.min_iqr), med

    def is_spike(self, g, hi):
        spike = g > hi
        if self.clip_norm is not None:
            spike = spike & (g > self.clip_norm)
        return spike

    def start(self) -> Monitor:
        return _GradMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w, g = self.w, s["grad_norm"]
        _, hi, _ = self.band(_blocks(g, w))
        spike = _outside_prev(g, w, None, hi)
        if self.clip_norm is not None:
            spike &= g > self.clip_norm
        c = np.cumsum(spike, axis=1, dtype=np.int32)
        recent = c.copy()
        recent[:, w:] -= c[:, :-w]
        return _first_true(recent >= self.repeats)


class _GradMonitor(_BandMonitor):
    __slots__ = ()

    def __init__(self, alert):
        super().__init__(alert, "grad_norm")

    def _observe(self, cp):
        a: GradNormSpike = self.alert  # type: ignore[assignment]
        if self.t and self.t % a.w == 0:
            self._roll()
        g = cp.grad_norm
        self.cur.append(g)
        while self.spikes and self.spikes[0] <= self.t - a.w:
            self.spikes.popleft()
        if a.is_spike(g, self.hi):
            self.spikes.append(self.t)
            if len(self.spikes) >= a.repeats:
                clip = f", clipping engaged (> {a.clip_norm:g})" if a.clip_norm is not None else ""
                self.detail = (
                    f"{len(self.spikes)} gradient-norm spikes in {a.window} steps above {_fmt(self.hi)} "
                    f"(median {_fmt(self.med)} + {a.k:g}·IQR){clip}; last {_fmt(g)}"
                )
                return True
        return False


# --------------------------------------------------------------------------- 7. rollout drift
DRIFT_SIGNALS = ("response_len", "truncation_rate", "unparseable_rate")


class RolloutDrift(HealthAlert):
    """Rollout quality shifting between consecutive windows of `window` steps: the window mean of
    generation length moves by more than `len_rel` (relative), or the truncation / unparseable-output
    rate by more than `rate_abs` (absolute), and the move exceeds `z` standard errors of the difference."""

    name = "rollout_drift"
    needs = ("response_len",)
    title = "Rollout-quality drift"
    reason = "the model's generations changed shape (length, truncation or unparseable outputs)"
    first_response = "check sampling params and stop tokens; drift here often precedes reward artifacts"

    def __init__(self, window: int = 20, len_rel: float = 0.5, rate_abs: float = 0.15, z: float = 3.0):
        if window < 4 or len_rel <= 0 or rate_abs <= 0 or z < 0:
            raise ValueError("rollout_drift: need window >= 4, len_rel > 0, rate_abs > 0, z >= 0")
        self.window, self.len_rel = int(window), float(len_rel)
        self.rate_abs, self.z = float(rate_abs), float(z)

    def drifted(self, win: np.ndarray, signal: str) -> tuple[np.ndarray, np.ndarray]:
        """For (runs, windows, w) of one signal: per window b >= 1 whether it drifted from window b-1
        (column 0 is False), and the window means."""
        mean, var, n = _mean_var(win, min_n=max(2, win.shape[-1] // 2))
        prev_m, prev_v, prev_n = mean[:, :-1], var[:, :-1], n[:, :-1]
        cur_m, cur_v, cur_n = mean[:, 1:], var[:, 1:], n[:, 1:]
        tol = self.len_rel * np.abs(prev_m) if signal == "response_len" else self.rate_abs
        with np.errstate(invalid="ignore"):
            se = np.sqrt(cur_v / cur_n + prev_v / prev_n)
            moved = np.abs(cur_m - prev_m) > np.maximum(tol, self.z * se)
        pad = np.zeros((win.shape[0], 1), dtype=bool)
        return np.concatenate([pad, moved], axis=1), mean

    def start(self) -> Monitor:
        return _DriftMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w = self.w
        any_drift = None
        for name in DRIFT_SIGNALS:
            if name not in s:
                continue
            moved, _ = self.drifted(_blocks(s[name], w), name)
            any_drift = moved if any_drift is None else (any_drift | moved)
        if any_drift is None:
            return np.full(n_runs, -1, dtype=np.int64)
        j = _first_true(any_drift)
        return np.where(j >= 0, j * w + w - 1, -1)


class _DriftMonitor(_AlertMonitor):
    __slots__ = ("cur", "prev")

    def __init__(self, alert):
        super().__init__(alert)
        self.cur: dict[str, list[float]] = {k: [] for k in DRIFT_SIGNALS}
        self.prev: dict[str, list[float]] = {}

    def _observe(self, cp):
        a: RolloutDrift = self.alert  # type: ignore[assignment]
        for k in DRIFT_SIGNALS:
            self.cur[k].append(getattr(cp, k, NAN))
        if len(self.cur["response_len"]) < a.w:
            return False
        prev, self.prev = self.prev, self.cur
        self.cur = {k: [] for k in DRIFT_SIGNALS}
        if not prev:
            return False
        for k in DRIFT_SIGNALS:
            win = np.array([prev[k], self.prev[k]])[None, :, :]
            moved, mean = a.drifted(win, k)
            if bool(moved[0, 1]):
                self.detail = (
                    f"{k} window mean moved {_fmt(float(mean[0, 0]))} -> {_fmt(float(mean[0, 1]))} "
                    f"between consecutive {a.window}-step windows"
                )
                return True
        return False


# --------------------------------------------------------------------------- 8. weight-sync stall
class SyncStall(PersistentBreach):
    """Run mechanics, not algorithmic health (runbook layer 2): the policy-version lag of the tokens being
    trained stays above `max_lag` for `persist` consecutive steps, i.e. the rollout workers are not
    receiving new weights. A platform fault, never reported to the customer as an algorithmic alert."""

    name = "sync_stall"
    needs = ("staleness",)
    title = "Weight-sync stall"
    reason = "the platform stopped delivering updated weights to the rollout workers (a platform problem)"
    first_response = "check the weight-sync path (broadcast / checkpoint reload) and rollout-worker health"
    layer = "mechanics"

    def __init__(self, max_lag: float = 4.0, persist: int = 5):
        if max_lag <= 0 or persist < 1:
            raise ValueError("sync_stall: need max_lag > 0, persist >= 1")
        self.max_lag, self.persist = float(max_lag), int(persist)

    def breached(self, lag):
        return lag > self.max_lag

    def describe(self, lag: float) -> str:
        return f"trained tokens lag the trainer by {_fmt(lag)} versions (> {self.max_lag:g}) for {self.persist} steps"
