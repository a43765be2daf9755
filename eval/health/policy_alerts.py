"""Alerts 1-4 of the runbook, on what the policy learns: reward band (explosion or collapse), KL blowup,
entropy collapse, the reward-hacking signature. Each is a streaming monitor and a vectorised `scan` built on
the same window kernels (eval/health/kernels.py), so both give the same first-fire index.

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import math

import numpy as np

from eval.detector_base import Monitor
from eval.health.base import HealthAlert, _AlertMonitor, _BandMonitor
from eval.health.kernels import (
    _blocks,
    _first_true,
    _fmt,
    _outside_prev,
    _quartiles,
    _runs_of,
    _slope,
    _slope_se,
    _window_sums,
)


# --------------------------------------------------------------------------- 1. reward band
class RewardBand(HealthAlert):
    """Reward explosion or collapse: the reward mean leaves median ± k·IQR of the previous window (the
    trailing robust band, refreshed every `window` steps) for `persist` consecutive steps."""

    name = "reward_band"
    needs = ("reward",)
    title = "Reward explosion or collapse"
    reason = "the training reward jumped outside its recent range"
    first_response = "freeze promotion; inspect reward-scorer logs; reward design"

    def __init__(self, window: int = 20, k: float = 3.0, persist: int = 3, min_iqr: float = 0.01):
        if window < 4 or persist < 1 or k <= 0 or min_iqr < 0:
            raise ValueError("reward_band: need window >= 4, persist >= 1, k > 0, min_iqr >= 0")
        self.window, self.k, self.persist, self.min_iqr = int(window), float(k), int(persist), float(min_iqr)

    def band(self, win: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        q1, med, q3 = _quartiles(win, min_n=max(3, win.shape[-1] // 2))
        spread = self.k * np.maximum(q3 - q1, self.min_iqr)
        return med - spread, med + spread, med

    def start(self) -> Monitor:
        return _RewardBandMonitor(self, "reward")

    def _scan(self, s, n_runs, n_steps):
        w, x = self.w, s["reward"]
        lo, hi, _ = self.band(_blocks(x, w))
        return _first_true(_runs_of(_outside_prev(x, w, lo, hi), self.persist))


class _RewardBandMonitor(_BandMonitor):
    __slots__ = ()

    def _observe(self, cp):
        a: RewardBand = self.alert  # type: ignore[assignment]
        if self.t and self.t % a.w == 0:
            self._roll()
        x = cp.reward
        self.cur.append(x)
        out = x < self.lo or x > self.hi
        self.count = self.count + 1 if out else 0
        if self.count >= a.persist:
            side = "above" if x > self.hi else "below"
            self.detail = (
                f"reward {_fmt(x)} {side} band [{_fmt(self.lo)}, {_fmt(self.hi)}] (median ± {a.k:g}·IQR of "
                f"the previous {a.window} steps) for {a.persist} steps"
            )
            return True
        return False


# --------------------------------------------------------------------------- 2. KL blowup
class KLBlowup(HealthAlert):
    """KL to the reference above a per-algorithm `ceiling` for `persist` steps, or its least-squares slope
    over a window of `window` steps above `slope_cap` per step."""

    name = "kl_blowup"
    needs = ("kl",)
    title = "KL blowup"
    reason = "the model moved too far from its starting point, so its outputs may no longer be reliable"
    first_response = "check LR and KL coefficient; the policy ran away from the reference (PPO)"
    rate_params = ("slope_cap",)

    def __init__(self, ceiling: float = 1.0, slope_cap: float = 0.01, window: int = 20, persist: int = 2):
        if window < 4 or persist < 1 or ceiling <= 0 or slope_cap <= 0:
            raise ValueError("kl_blowup: need ceiling > 0, slope_cap > 0, window >= 4, persist >= 1")
        self.ceiling, self.slope_cap = float(ceiling), float(slope_cap)
        self.window, self.persist = int(window), int(persist)

    def slopes(self, win: np.ndarray) -> np.ndarray:
        return _slope(_window_sums(win), min_n=max(3, win.shape[-1] // 2)) / self.spacing

    def start(self) -> Monitor:
        return _KLMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        w, x = self.w, s["kl"]
        over = _first_true(_runs_of(x > self.ceiling, self.persist))
        steep = _first_true(self.slopes(_blocks(x, w)) > self.slope_cap)
        steep = np.where(steep >= 0, steep * w + w - 1, -1)
        both = np.where(over < 0, steep, np.where(steep < 0, over, np.minimum(over, steep)))
        return both


class _KLMonitor(_AlertMonitor):
    __slots__ = ("cur", "count")

    def __init__(self, alert):
        super().__init__(alert)
        self.cur: list[float] = []
        self.count = 0

    def _observe(self, cp):
        a: KLBlowup = self.alert  # type: ignore[assignment]
        x = cp.kl
        self.cur.append(x)
        self.count = self.count + 1 if x > a.ceiling else 0
        if self.count >= a.persist:
            self.detail = f"KL {_fmt(x)} above ceiling {a.ceiling:g} for {a.persist} steps"
            return True
        if len(self.cur) == a.w:
            slope = float(a.slopes(np.array(self.cur)[None, None, :])[0, 0])
            self.cur = []
            if slope > a.slope_cap:
                self.detail = f"KL slope {_fmt(slope)}/step over {a.window} steps above cap {a.slope_cap:g}"
                return True
        return False


# --------------------------------------------------------------------------- 3. entropy collapse
class EntropyCollapse(HealthAlert):
    """The runbook's executed detector: the EWMA of policy entropy falls faster than `drop` per step
    in `k` consecutive windows of `window` steps (windows start at step `window`)."""

    name = "entropy_collapse"
    needs = ("entropy",)
    whole_fleet = True  # the EWMA recursion loops over steps: one pass over all runs beats chunks
    title = "Entropy collapse"
    reason = "the model's outputs are collapsing onto a few answers (mode collapse)"
    first_response = "clip-higher or KL term per GRPO variants; mode collapse in progress"
    rate_params = ("drop",)

    def __init__(self, alpha: float = 0.2, drop: float = 0.004, k: int = 3, window: int = 25):
        if not 0 < alpha <= 1 or drop <= 0 or k < 1 or window < 4:
            raise ValueError("entropy_collapse: need 0 < alpha <= 1, drop > 0, k >= 1, window >= 4")
        self.alpha, self.drop, self.k, self.window = float(alpha), float(drop), int(k), int(window)

    def rate(self, e_start: np.ndarray | float, e_end: np.ndarray | float):
        return (e_end - e_start) / (self.w * self.spacing)

    def start(self) -> Monitor:
        return _EntropyMonitor(self)

    def ewma_at(self, x: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """EWMA of every run at the given step columns (sorted). The recursion runs over steps,
        vectorised over runs; NaN entries carry the previous average, which starts at the first
        finite value. Same operations, in the same order, as the streaming monitor."""
        a, c = self.alpha, 1.0 - self.alpha
        out = np.empty((x.shape[0], len(cols)))
        if len(cols) == 0:
            return out
        xt = np.ascontiguousarray(x[:, : int(cols[-1]) + 1].T)
        want = np.zeros(xt.shape[0], dtype=bool)
        want[cols] = True
        slot = np.cumsum(want) - 1
        e = xt[0].copy()
        if want[0]:
            out[:, 0] = e
        tmp = np.empty_like(e)
        if not np.isnan(xt).any():
            for i in range(1, xt.shape[0]):
                np.multiply(xt[i], a, out=tmp)
                np.multiply(e, c, out=e)
                np.add(tmp, e, out=e)
                if want[i]:
                    out[:, slot[i]] = e
        else:
            for i in range(1, xt.shape[0]):
                xi = xt[i]
                new = xi * a + e * c
                e = np.where(np.isnan(xi), e, np.where(np.isnan(e), xi, new))
                if want[i]:
                    out[:, slot[i]] = e
        return out

    def _scan(self, s, n_runs, n_steps):
        w = self.w
        nb = n_steps // w - 1  # windows start at w, 2w, ... while the whole window fits
        if nb < 1:
            return np.full(n_runs, -1, dtype=np.int64)
        starts = np.arange(1, nb + 1) * w
        cols = np.sort(np.concatenate([starts, starts + w - 1]))
        e = self.ewma_at(s["entropy"], cols)
        falling = self.rate(e[:, 0::2], e[:, 1::2]) < -self.drop
        j = _first_true(_runs_of(falling, self.k))
        return np.where(j >= 0, (j + 1) * w + w - 1, -1)


class _EntropyMonitor(_AlertMonitor):
    __slots__ = ("e", "e_start", "consecutive")

    def __init__(self, alert):
        super().__init__(alert)
        self.e = math.nan
        self.e_start = math.nan
        self.consecutive = 0

    def _observe(self, cp):
        a: EntropyCollapse = self.alert  # type: ignore[assignment]
        x, w, t = cp.entropy, a.w, self.t
        if x == x:
            self.e = x if self.e != self.e else x * a.alpha + self.e * (1.0 - a.alpha)
        if t >= w and t % w == 0:
            self.e_start = self.e
        if t >= 2 * w - 1 and t % w == w - 1:
            rate = a.rate(self.e_start, self.e)
            self.consecutive = self.consecutive + 1 if rate < -a.drop else 0
            if self.consecutive >= a.k:
                self.detail = (
                    f"entropy EWMA fell {_fmt(-rate)}/step (> {a.drop:g}) in {a.k} consecutive "
                    f"{a.window}-step windows; now {_fmt(self.e)}"
                )
                return True
        return False


# --------------------------------------------------------------------------- 4. reward hacking
class RewardHacking(HealthAlert):
    """The runbook's executed detector: in a window of `window` steps (windows tile the run from step 0)
    the reward's least-squares slope is above +tau while the eval gate's is below -tau. The eval may be
    sparse (NaN between gates): its slope uses the gates inside the window (at least `min_evals`).
    With `z` > 0 each slope must also clear z standard errors of itself, so a noisy eval set (few
    held-out items per gate) does not fake a decline; z = 0 is the runbook's detector exactly."""

    name = "reward_hacking"
    needs = ("reward",)
    title = "Reward-hacking signature"
    reason = (
        "the training reward kept rising while the held-out evaluation fell: the model is gaming the reward"
    )
    first_response = "stop the run; audit the reward function; evaluation integrity"
    rate_params = ("tau",)

    def __init__(self, window: int = 50, tau: float = 0.002, min_evals: int = 3, z: float = 0.0):
        if window < 4 or tau < 0 or min_evals < 3 or z < 0:
            raise ValueError("reward_hacking: need window >= 4, tau >= 0, min_evals >= 3, z >= 0")
        self.window, self.tau, self.min_evals, self.z = int(window), float(tau), int(min_evals), float(z)

    def window_flags(self, reward: np.ndarray, evals: np.ndarray) -> np.ndarray:
        """(runs, windows) True where the window shows the signature (all windows, not just the first)."""
        w = self.w
        rs = _window_sums(_blocks(reward, w), with_syy=self.z > 0)
        es = _window_sums(_blocks(evals, w), with_syy=self.z > 0)
        r = _slope(rs, min_n=3) / self.spacing
        e = _slope(es, min_n=self.min_evals) / self.spacing
        if self.z == 0:
            return (r > self.tau) & (e < -self.tau)
        r_bar = np.maximum(self.tau, self.z * _slope_se(rs) / self.spacing)
        e_bar = np.maximum(self.tau, self.z * _slope_se(es) / self.spacing)
        with np.errstate(invalid="ignore"):
            return (r > r_bar) & (e < -e_bar)

    def start(self) -> Monitor:
        return _HackingMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        j = _first_true(self.window_flags(s["reward"], s["eval_score"]))
        return np.where(j >= 0, j * self.w + self.w - 1, -1)


class _HackingMonitor(_AlertMonitor):
    __slots__ = ("rew", "ev", "first_step")

    def __init__(self, alert):
        super().__init__(alert)
        self.rew: list[float] = []
        self.ev: list[float] = []
        self.first_step = math.nan

    def _observe(self, cp):
        a: RewardHacking = self.alert  # type: ignore[assignment]
        if not self.rew:
            self.first_step = cp.step
        self.rew.append(cp.reward)
        self.ev.append(cp.eval_score)
        if len(self.rew) < a.w:
            return False
        r = np.array(self.rew)[None, :]
        e = np.array(self.ev)[None, :]
        self.rew, self.ev = [], []
        if bool(a.window_flags(r, e)[0, 0]):
            rs = float(_slope(_window_sums(r[:, None, :]), 3)[0, 0]) / a.spacing
            es = float(_slope(_window_sums(e[:, None, :]), a.min_evals)[0, 0]) / a.spacing
            self.detail = (
                f"over steps {self.first_step:g}..{cp.step:g}: reward slope {_fmt(rs)}/step while eval "
                f"slope {_fmt(es)}/step (tau {a.tau:g})"
            )
            return True
        return False
