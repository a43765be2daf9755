"""The run-health alert catalog: the runbook's seven per-run detectors over windows of training steps,
plus one run-mechanics alert (weight-sync stall) that the frozen-sync canary needs.

Each alert is a `Detector` (eval/detectors.py): a streaming monitor for live runs
(`start()` / `Monitor.observe`) and a vectorised numpy `scan()` over a fleet of recorded runs that
returns the same first-fire index. Streaming and batch forms share the same window kernels (called on
one window in the monitor, on every window of every run in `scan`), so they agree bit for bit.

    catalog = Catalog.from_file("configs/alerts.yaml", algorithm="ppo")
    live = catalog.start(tenant="acme")            # one run
    for record in trainer:                          # training.metrics.StepRecord
        for event in live.observe(HealthCheckpoint.from_step_record(record)):
            ...                                     # AlertEvent: name, severity, step, reason
    first = catalog.scan(series)                    # {alert: (runs,) first-fire index or -1}

Windows are counted in training steps. The trainer yields one record per step; a trace recorded every
d steps is evaluated with `alert.at_spacing(d)`, which converts windows to rows and per-step rates to
per-row rates. Per-step signals that `Checkpoint` does not carry (truncation and unparseable-output
rates, GPU-seconds spent) travel in `HealthCheckpoint`, a subclass, and in `scan` under the same keys.

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.errors import BadInput, describe_validation_error
from eval.detectors import DETECTORS, NAN, Checkpoint, Detector, Monitor

Severity = Literal["paging", "advisory"]
DEFAULT_ALERTS_FILE = Path(__file__).resolve().parent.parent / "configs" / "alerts.yaml"


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


# --------------------------------------------------------------------------- window kernels
# Each kernel maps windows shaped (..., w) to one statistic per window. Monitors call them on a
# (1, 1, w) array holding their current window; `scan` calls them on (runs, windows, w). Numpy
# reduces each last-axis row with the same inner loop either way, so both give identical floats.


def _blocks(x: np.ndarray, w: int) -> np.ndarray:
    """(runs, steps) -> (runs, complete windows, w)."""
    nb = x.shape[1] // w
    return x[:, : nb * w].reshape(x.shape[0], nb, w)


def _quartiles(win: np.ndarray, min_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear-interpolated quartiles of each window, ignoring NaN; NaN where fewer than min_n values.
    (numpy's default quantile method, written out so NaN-free windows need one sort and no gathers.)"""
    s = np.sort(win, axis=-1)  # NaN sorts last
    w = win.shape[-1]
    out = []
    if not np.isnan(s[..., -1]).any():  # no window holds NaN: every window has w values
        for q in (0.25, 0.5, 0.75):
            pos = q * (w - 1)
            lo = int(math.floor(pos))
            hi = min(lo + 1, w - 1)
            frac = pos - lo
            v = s[..., lo] + frac * (s[..., hi] - s[..., lo])
            out.append(v if w >= min_n else np.full(v.shape, np.nan))
        return out[0], out[1], out[2]
    n = (~np.isnan(win)).sum(axis=-1)
    for q in (0.25, 0.5, 0.75):
        pos = q * (np.maximum(n, 1) - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
        frac = pos - lo
        v_lo = np.take_along_axis(s, lo[..., None], axis=-1)[..., 0]
        v_hi = np.take_along_axis(s, hi[..., None], axis=-1)[..., 0]
        v = v_lo + frac * (v_hi - v_lo)
        out.append(np.where(n >= min_n, v, np.nan))
    return out[0], out[1], out[2]


@dataclass(slots=True)
class _Sums:
    """Least-squares sums of one window with local x = 0..w-1 (NaN values left out)."""

    n: np.ndarray
    sx: np.ndarray
    sxx: np.ndarray
    sy: np.ndarray
    sxy: np.ndarray
    syy: np.ndarray


def _rsum(a: np.ndarray) -> np.ndarray:
    """Sum over the last axis. einsum's sum-of-products loop reduces each window on its own, in the
    same order whatever the leading shape, and is several times faster than `.sum(-1)` on short rows."""
    return np.einsum("...w->...", a)


def _rdot(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("...w,w->...", a, v)


def _rsq(a: np.ndarray) -> np.ndarray:
    return np.einsum("...w,...w->...", a, a)


def _window_sums(win: np.ndarray, with_syy: bool = False) -> _Sums:
    """Sums of each window. When no window holds NaN a shorter path yields the same floats (the masked
    terms are exact copies and the x-sums are exact integers)."""
    w = win.shape[-1]
    x = np.arange(w, dtype=np.float64)
    sy = _rsum(win)
    if not np.isnan(sy).any():
        shape = win.shape[:-1]
        return _Sums(
            n=np.full(shape, float(w)),
            sx=np.full(shape, x.sum()),
            sxx=np.full(shape, (x * x).sum()),
            sy=sy,
            sxy=_rdot(win, x),
            syy=_rsq(win) if with_syy else None,  # type: ignore[arg-type]
        )
    valid = ~np.isnan(win)
    y0 = np.where(valid, win, 0.0)
    m = valid.astype(np.float64)
    return _Sums(
        n=_rsum(m),
        sx=_rdot(m, x),
        sxx=_rdot(m, x * x),
        sy=_rsum(y0),
        sxy=_rdot(y0, x),
        syy=_rsq(y0) if with_syy else None,  # type: ignore[arg-type]
    )


def _slope(s: _Sums, min_n: int) -> np.ndarray:
    """Least-squares slope per row (NaN where fewer than min_n points)."""
    den = s.n * s.sxx - s.sx * s.sx
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (s.n * s.sxy - s.sx * s.sy) / den
    return np.where((s.n >= min_n) & (den > 0), slope, np.nan)


def _slope_se(s: _Sums) -> np.ndarray:
    """Standard error of the least-squares slope (needs `syy`); NaN with fewer than 3 points."""
    with np.errstate(invalid="ignore", divide="ignore"):
        cxx = s.sxx - s.sx * s.sx / s.n
        cxy = s.sxy - s.sx * s.sy / s.n
        cyy = s.syy - s.sy * s.sy / s.n
        rss = np.maximum(cyy - (cxy / cxx) * cxy, 0.0)
        return np.sqrt(rss / (s.n - 2.0) / cxx)


def _mean_var(win: np.ndarray, min_n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, unbiased variance and count of each window, ignoring NaN (NaN-free windows: same floats)."""
    total = _rsum(win)
    if not np.isnan(total).any():
        n = np.full(win.shape[:-1], float(win.shape[-1]))
        mean = total / n
        var = _rsq(win - mean[..., None]) / (n - 1)
        if win.shape[-1] >= min_n:
            return mean, var, n
        return np.full(n.shape, np.nan), np.full(n.shape, np.nan), n
    valid = ~np.isnan(win)
    n = _rsum(valid.astype(np.float64))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = _rsum(np.where(valid, win, 0.0)) / n
        var = _rsq(np.where(valid, win - mean[..., None], 0.0)) / (n - 1)
    ok = n >= min_n
    return np.where(ok, mean, np.nan), np.where(ok, var, np.nan), n


def _first_true(mask: np.ndarray) -> np.ndarray:
    """Per row, the first True column or -1."""
    if mask.shape[1] == 0:
        return np.full(mask.shape[0], -1, dtype=np.int64)
    idx = np.argmax(mask, axis=1)
    return np.where(mask.any(axis=1), idx, -1).astype(np.int64)


def _runs_of(mask: np.ndarray, k: int) -> np.ndarray:
    """mask[:, t] and the k-1 columns before it all True (k consecutive), same shape as mask."""
    out = mask.copy()
    for j in range(1, k):
        out[:, j:] &= mask[:, :-j]
        out[:, :j] = False
    return out


def _lengths(series: dict[str, np.ndarray], n_runs: int, n_steps: int) -> np.ndarray:
    """Observations per run: NaN-padding at the end of a row is not part of the run."""
    if "step" in series:
        present = ~np.isnan(series["step"])
    else:
        present = np.zeros((n_runs, n_steps), dtype=bool)
        for arr in series.values():
            present |= ~np.isnan(arr)
    last = n_steps - np.argmax(present[:, ::-1], axis=1)
    return np.where(present.any(axis=1), last, 0)


def _outside_prev(x: np.ndarray, w: int, lo: np.ndarray | None, hi: np.ndarray) -> np.ndarray:
    """(runs, steps) bool: step t lies outside (lo, hi) of window t // w - 1 (the trailing complete window).
    `lo`/`hi` are per complete window, (runs, windows); `lo=None` checks the upper side only."""
    n_runs, n_steps = x.shape
    nb = hi.shape[1]
    out = np.zeros((n_runs, n_steps), dtype=bool)
    if nb >= 2:
        xb = x[:, w : nb * w].reshape(n_runs, nb - 1, w)
        o = xb > hi[:, :-1, None]
        if lo is not None:
            o |= xb < lo[:, :-1, None]
        out[:, w : nb * w] = o.reshape(n_runs, -1)
    if nb >= 1 and n_steps > nb * w:
        xt = x[:, nb * w :]
        o = xt > hi[:, -1:]
        if lo is not None:
            o |= xt < lo[:, -1:]
        out[:, nb * w :] = o
    return out


#: runs per chunk in `scan`: keeps each temporary (runs x steps) array within the L3 cache
CHUNK_RUNS = 256


def _as_arrays(series: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], int, int]:
    if not series:
        raise ValueError("scan: no series given")
    arrays = {k: np.ascontiguousarray(v, dtype=np.float64) for k, v in series.items()}
    shapes = {v.shape for v in arrays.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"scan: series must be (runs, steps) arrays of one shape, got {shapes}")
    n_runs, n_steps = next(iter(shapes))
    return arrays, n_runs, n_steps


def _fmt(v: float) -> str:
    return f"{v:.4g}"


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


# --------------------------------------------------------------------------- 1. reward band
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
class SyncStall(HealthAlert):
    """Run mechanics, not algorithmic health (runbook layer 2): the policy-version lag of the tokens being
    trained stays above `max_lag` for `persist` consecutive steps, i.e. the rollout workers are not
    receiving new weights. A platform fault, never reported to the customer as an algorithmic alert."""

    name = "sync_stall"
    needs = ("staleness",)
    title = "Weight-sync stall"
    reason = "the platform stopped delivering updated weights to the rollout workers (a platform problem)"
    first_response = "check the weight-sync path (broadcast / checkpoint reload) and rollout-worker health"
    layer = "mechanics"
    window_params = ()

    def __init__(self, max_lag: float = 4.0, persist: int = 5):
        if max_lag <= 0 or persist < 1:
            raise ValueError("sync_stall: need max_lag > 0, persist >= 1")
        self.max_lag, self.persist = float(max_lag), int(persist)

    @property
    def w(self) -> int:
        return 1

    def start(self) -> Monitor:
        return _SyncMonitor(self)

    def _scan(self, s, n_runs, n_steps):
        return _first_true(_runs_of(s["staleness"] > self.max_lag, self.persist))


class _SyncMonitor(_AlertMonitor):
    __slots__ = ("count",)

    def __init__(self, alert):
        super().__init__(alert)
        self.count = 0

    def _observe(self, cp):
        a: SyncStall = self.alert  # type: ignore[assignment]
        lag = getattr(cp, "staleness", NAN)
        self.count = self.count + 1 if lag > a.max_lag else 0
        if self.count >= a.persist:
            self.detail = (
                f"trained tokens lag the trainer by {_fmt(lag)} versions (> {a.max_lag:g}) "
                f"for {a.persist} steps"
            )
            return True
        return False


# --------------------------------------------------------------------------- registry and config
ALERTS: dict[str, type[HealthAlert]] = {
    cls.name: cls
    for cls in (
        RewardBand, KLBlowup, EntropyCollapse, RewardHacking, DeadRun, GradNormSpike, RolloutDrift, SyncStall
    )
}
# The alerts are detectors too (`rlhfops detect --detector kl_blowup`); health imports detectors, never
# the reverse, so registering here creates no import cycle.
for _name, _cls in ALERTS.items():
    DETECTORS.setdefault(_name, _cls)

ParamValue = float | int | bool | None


class Demote(BaseModel):
    """Route an alert as advisory instead of paging for these algorithms or tenants (while retuning)."""

    model_config = ConfigDict(extra="forbid")
    algorithms: list[str] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)


class FalsePositiveRecord(BaseModel):
    """The alert's measured false-positive rate: fraction of healthy runs on which it fired."""

    model_config = ConfigDict(extra="forbid")
    rate: float = Field(ge=0, le=1)
    healthy_runs: int = Field(ge=1)
    measured_by: str


class AlertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    severity: Severity = "paging"
    #: what a firing paging alert does to the customer-facing run state
    action: Literal["degrade", "pause"] = "degrade"
    params: dict[str, ParamValue] = Field(default_factory=dict)
    #: per-algorithm parameter overrides (e.g. a KL ceiling per algorithm)
    params_by_algorithm: dict[str, dict[str, ParamValue]] = Field(default_factory=dict)
    demote: Demote = Field(default_factory=Demote)
    false_positive_rate: FalsePositiveRecord | None = None


class AlertsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)
    changelog: list[str] = Field(default_factory=list)
    alerts: dict[str, AlertConfig]
    #: named parameter overlays, e.g. `canary`: shorter windows for the short fault-injection runs
    profiles: dict[str, dict[str, dict[str, ParamValue]]] = Field(default_factory=dict)


def _build_alert(
    name: str, cfg: AlertConfig, algorithm: str | None, source: str, overlay: dict | None = None,
    overlay_where: str = "",
) -> HealthAlert:
    cls = ALERTS[name]
    params = dict(cfg.params)
    where = f"alerts.{name}.params"
    if algorithm is not None and algorithm in cfg.params_by_algorithm:
        params.update(cfg.params_by_algorithm[algorithm])
        where = f"alerts.{name}.params_by_algorithm.{algorithm}"
    if overlay:
        params.update(overlay)
        where = overlay_where
    import inspect

    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    for key in params:
        if key not in allowed:
            raise BadInput(
                f"{source}: field '{where}.{key}': unknown parameter (expected one of: {', '.join(allowed)})"
            )
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise BadInput(f"{source}: field '{where}': {err}") from None


def load_alerts_config(path: str | Path | None = None) -> AlertsConfig:
    """Read and validate the thresholds file; any problem is a one-line BadInput naming the field."""
    path = Path(path) if path is not None else DEFAULT_ALERTS_FILE
    source = str(path)
    if not path.is_file():
        raise BadInput(f"--alerts: file '{path}' not found (pass a thresholds YAML like configs/alerts.yaml)")
    from common.validate import check_finite_tree, read_yaml_mapping

    raw = read_yaml_mapping(path, "alerts")  # UTF-8, valid YAML, a mapping
    # .nan/.inf or astronomic thresholds would silence an alert (or fire it always)
    check_finite_tree(raw, source, max_abs=1e12)
    try:
        cfg = AlertsConfig.model_validate(raw)
    except ValidationError as err:
        raise BadInput(describe_validation_error(err, source=source)) from None
    for name in cfg.alerts:
        if name not in ALERTS:
            choices = ", ".join(ALERTS)
            raise BadInput(f"{source}: field 'alerts.{name}': unknown alert (choose from: {choices})")
    for name, acfg in cfg.alerts.items():
        _build_alert(name, acfg, None, source)
        for algo in acfg.params_by_algorithm:
            _build_alert(name, acfg, algo, source)
    for profile, overlays in cfg.profiles.items():
        for name, overlay in overlays.items():
            where = f"profiles.{profile}.{name}"
            if name not in cfg.alerts:
                raise BadInput(f"{source}: field '{where}': unknown or unconfigured alert")
            _build_alert(name, cfg.alerts[name], None, source, overlay, where)
    return cfg


@dataclass(slots=True)
class AlertEvent:
    """One alert firing on one run."""

    alert: str
    severity: Severity
    action: str
    step: float
    index: int
    detail: str
    reason: str
    first_response: str
    #: "algorithmic" or "mechanics" (see HealthAlert.layer)
    layer: str = "algorithmic"


class Catalog:
    """The configured set of alerts for one algorithm, with routing (paging or advisory per tenant)."""

    def __init__(
        self, alerts: dict[str, HealthAlert], config: AlertsConfig | None = None, algorithm: str | None = None
    ):
        self.alerts = alerts
        self.config = config
        self.algorithm = algorithm

    @classmethod
    def from_config(
        cls, config: AlertsConfig, algorithm: str | None = None, source: str = "alerts",
        profile: str | None = None,
    ) -> Catalog:
        if profile is not None and profile not in config.profiles:
            raise BadInput(f"{source}: no profile '{profile}' (have: {', '.join(config.profiles) or 'none'})")
        overlays = config.profiles.get(profile, {}) if profile else {}
        alerts = {
            name: _build_alert(
                name, acfg, algorithm, source, overlays.get(name), f"profiles.{profile}.{name}"
            )
            for name, acfg in config.alerts.items()
        }
        return cls(alerts, config, algorithm)

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, algorithm: str | None = None, profile: str | None = None
    ) -> Catalog:
        source = str(path or DEFAULT_ALERTS_FILE)
        return cls.from_config(load_alerts_config(path), algorithm, source=source, profile=profile)

    @classmethod
    def defaults(cls) -> Catalog:
        return cls({name: klass() for name, klass in ALERTS.items()})

    @property
    def version(self) -> int | None:
        return self.config.version if self.config else None

    def at_spacing(self, spacing: float) -> Catalog:
        scaled = {k: a.at_spacing(spacing) for k, a in self.alerts.items()}
        return Catalog(scaled, self.config, self.algorithm)

    def severity(self, name: str, tenant: str | None = None) -> Severity:
        if self.config is None or name not in self.config.alerts:
            return "paging"
        acfg = self.config.alerts[name]
        if acfg.severity == "advisory":
            return "advisory"
        if self.algorithm is not None and self.algorithm in acfg.demote.algorithms:
            return "advisory"
        if tenant is not None and tenant in acfg.demote.tenants:
            return "advisory"
        return "paging"

    def action(self, name: str) -> str:
        if self.config is None or name not in self.config.alerts:
            return "pause" if name in ("reward_hacking", "kl_blowup") else "degrade"
        return self.config.alerts[name].action

    def scan(
        self, series: dict[str, np.ndarray], only: list[str] | None = None, workers: int = 2
    ) -> dict[str, np.ndarray]:
        """First-fire index per run for every alert (or those in `only`), vectorised over runs. Work is
        split into cache-sized chunks of runs and shared by `workers` threads (numpy releases the GIL)."""
        names = only if only is not None else list(self.alerts)
        arrays, n_runs, n_steps = _as_arrays(series)
        out = {name: np.empty(n_runs, dtype=np.int64) for name in names}
        jobs: list[tuple[list[str], int, int]] = []
        chunked = [n for n in names if not self.alerts[n].whole_fleet]
        for n in names:
            if self.alerts[n].whole_fleet:
                jobs.append(([n], 0, n_runs))
        for lo in range(0, n_runs, CHUNK_RUNS):
            jobs.append((chunked, lo, min(lo + CHUNK_RUNS, n_runs)))

        def run(job: tuple[list[str], int, int]) -> None:
            job_names, lo, hi = job
            part = {k: v[lo:hi] for k, v in arrays.items()}
            lengths = _lengths(part, hi - lo, n_steps)
            for n in job_names:
                out[n][lo:hi] = self.alerts[n].scan_chunk(part, lengths)

        if workers <= 1:
            for job in jobs:
                run(job)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(run, jobs))
        return out

    def start(self, tenant: str | None = None, only: list[str] | None = None) -> CatalogMonitor:
        names = only if only is not None else list(self.alerts)
        return CatalogMonitor(self, {n: self.alerts[n] for n in names}, tenant)


class CatalogMonitor:
    """All alerts on one live run. `observe` returns the alerts that fired at this checkpoint (each
    alert fires at most once per run; afterwards it is latched and no longer fed)."""

    def __init__(self, catalog: Catalog, alerts: dict[str, HealthAlert], tenant: str | None):
        self.catalog = catalog
        self.tenant = tenant
        self.monitors: dict[str, _AlertMonitor] = {n: a.start() for n, a in alerts.items()}  # type: ignore[misc]
        self.fired: dict[str, AlertEvent] = {}
        self.index = 0

    def observe(self, cp: Checkpoint) -> list[AlertEvent]:
        events = []
        for name, mon in self.monitors.items():
            if name in self.fired:
                continue
            if mon.observe(cp):
                alert = self.catalog.alerts[name]
                ev = AlertEvent(
                    alert=name, severity=self.catalog.severity(name, self.tenant),
                    action=self.catalog.action(name), step=cp.step, index=self.index, detail=mon.detail,
                    reason=alert.reason, first_response=alert.first_response, layer=alert.layer,
                )
                self.fired[name] = ev
                events.append(ev)
        self.index += 1
        return events


def replay_alert(alert: HealthAlert, run: dict[str, np.ndarray]) -> tuple[int, str]:
    """Stream one run (1-D arrays by signal name) through a fresh monitor: (fire index or -1, detail)."""
    n = len(next(iter(run.values())))
    names = [k for k in SIGNALS if k in run]
    mon = alert.start()
    for t in range(n):
        vals = {k: float(run[k][t]) for k in names}
        if "step" in vals and vals["step"] != vals["step"]:
            break  # NaN padding: the run ended
        vals.setdefault("step", float(t))
        vals.setdefault("eval_score", NAN)
        if mon.observe(HealthCheckpoint(**vals)):
            return t, mon.detail  # type: ignore[attr-defined]
    return -1, ""


# --------------------------------------------------------------------------- synthetic fleet
FAULTS = ("healthy", *ALERTS)


def synthetic_fleet(
    n_runs: int, n_steps: int, seed: int = 0, fault_frac: float = 0.3, gate_every: int = 10
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A fleet of per-step health series: mostly healthy PPO-like runs, plus runs with one injected
    fault per alert (onset between 30% and 70% of the run). Returns (series, fault name per run, onset
    index per run; -1 for healthy). Used to benchmark the catalog and to measure false-positive rates."""
    rng = np.random.default_rng(seed)
    t = np.arange(n_steps, dtype=np.float64)[None, :]
    shape = (n_runs, n_steps)
    kinds = np.zeros(n_runs, dtype=np.int64)
    n_fault = int(round(n_runs * fault_frac))
    kinds[:n_fault] = 1 + np.arange(n_fault) % (len(FAULTS) - 1)
    rng.shuffle(kinds)
    onset = np.where(kinds > 0, rng.integers(int(0.3 * n_steps), int(0.7 * n_steps) + 1, n_runs), -1)
    col = lambda v: np.asarray(v, dtype=np.float64)[:, None]  # noqa: E731
    after = t >= col(np.maximum(onset, 0)) if n_runs else np.zeros(shape, bool)
    since = np.maximum(t - col(np.maximum(onset, 0)), 0.0)
    is_ = {name: col(kinds == i).astype(bool) for i, name in enumerate(FAULTS)}

    tau = col(rng.uniform(0.4, 1.5, n_runs)) * n_steps
    r0, r1 = col(rng.uniform(0.1, 0.3, n_runs)), col(rng.uniform(0.6, 0.9, n_runs))
    learn = 1.0 - np.exp(-t / tau)
    reward = r0 + (r1 - r0) * learn + rng.normal(0, 1, shape) * col(rng.uniform(0.005, 0.03, n_runs))
    e0, e1 = col(rng.uniform(0.2, 0.35, n_runs)), col(rng.uniform(0.5, 0.7, n_runs))
    evals = e0 + (e1 - e0) * learn + rng.normal(0, 0.01, shape)
    kl = col(rng.uniform(0.05, 0.3, n_runs)) * (t / n_steps) + np.abs(rng.normal(0, 0.003, shape))
    entropy = col(rng.uniform(1.5, 2.5, n_runs)) * np.exp(-t / (4 * tau)) + rng.normal(0, 0.03, shape)
    grad = np.exp(rng.normal(0.0, 0.15, shape)) * col(rng.uniform(0.5, 2.0, n_runs))
    length = col(rng.uniform(30, 120, n_runs)) * (1 + 0.2 * learn) + rng.normal(0, 2, shape)
    trunc = np.clip(0.03 + rng.normal(0, 0.01, shape), 0, 1)
    unparse = np.clip(0.02 + rng.normal(0, 0.01, shape), 0, 1)

    at = lambda name: is_[name] & after  # noqa: E731
    reward = np.where(at("reward_band"), reward + 0.5 + 0.01 * since, reward)
    kl = np.where(at("kl_blowup"), kl + 0.02 * since, kl)
    entropy = np.where(at("entropy_collapse"), entropy * np.exp(-since / 40.0), entropy)
    hack_r = reward + 0.002 * since
    hack_e = evals - 0.003 * since
    reward = np.where(at("reward_hacking"), hack_r, reward)
    evals = np.where(at("reward_hacking"), hack_e, evals)
    # dead: learning stops at onset; reward and KL stay where they were, up to noise
    o = col(np.maximum(onset, 0))
    frozen_r = r0 + (r1 - r0) * (1.0 - np.exp(-o / tau))
    frozen_kl = kl[np.arange(n_runs), np.maximum(onset, 0)][:, None] if n_runs else kl[:, :1]
    reward = np.where(at("dead_run"), frozen_r + rng.normal(0, 0.01, shape), reward)
    kl = np.where(at("dead_run"), frozen_kl + rng.normal(0, 0.001, shape), kl)
    spikes = at("grad_norm_spike") & (rng.random(shape) < 0.25)
    grad = np.where(spikes, grad * 8.0, grad)
    drift = at("rollout_drift")
    length = np.where(drift, length * 2.0, length)
    trunc = np.where(drift, np.clip(trunc + 0.3, 0, 1), trunc)
    staleness = rng.integers(0, 3, shape).astype(np.float64) * 0.5  # healthy overlap: 0-1 versions
    staleness = np.where(at("sync_stall"), since, staleness)  # frozen sync: the lag grows every step

    gated = (np.arange(n_steps) % gate_every == gate_every - 1)[None, :]
    series = {
        "step": np.broadcast_to(t, shape).copy(),
        "eval_score": np.where(gated, evals, np.nan),
        "reward": reward, "kl": kl, "entropy": entropy, "grad_norm": grad, "response_len": length,
        "truncation_rate": trunc, "unparseable_rate": unparse,
        "gpu_seconds": np.ones(shape), "staleness": staleness,
    }
    return series, np.array(FAULTS)[kinds], onset


def measure_false_positive_rates(
    catalog: Catalog, n_runs: int = 2000, n_steps: int = 1000, seed: int = 0
) -> dict[str, float]:
    """Fraction of the synthetic fleet's healthy runs on which each alert fires."""
    series, kind, _ = synthetic_fleet(n_runs, n_steps, seed=seed, fault_frac=0.0)
    first = catalog.scan(series)
    return {name: float((f >= 0).mean()) for name, f in first.items()}
