"""Early-stop detectors: one interface for every time-series detector.

A detector reads one run's checkpoint series, one checkpoint at a time, and answers
"stop now" or "continue". The same objects serve the discrete-event simulator (through the
scheduler's early-stop wrapper), the live platform, and `rlhfops detect` replaying trace files.

    detector = make_detector("evalstop", k=2)
    monitor = detector.start()            # per-run state
    for cp in checkpoints:                # in step order
        if monitor.observe(cp):           # True: stop this run now (keep its best checkpoint)
            break

Monitors are deliberately tiny (O(1) state per run, O(1) per observation) because the
simulator drives millions of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np
from scipy import stats

NAN = float("nan")


@dataclass(slots=True)
class Checkpoint:
    """What a detector may see of one checkpoint of a run: world feedback and training proxies.

    `progress` is the trainer's own step fraction (steps done / steps planned), NaN when unknown.
    Optional signals are NaN when the run does not report them. `eval_se` is the standard error the
    eval gate reports with its score; noise-aware detectors scale their thresholds with it.
    """

    step: float
    eval_score: float
    progress: float = NAN
    loss: float = NAN
    reward: float = NAN
    kl: float = NAN
    entropy: float = NAN
    grad_norm: float = NAN
    response_len: float = NAN
    eval_se: float = NAN  # the gate's standard error of eval_score (NaN: unknown)


class Monitor:
    """Per-run detector state. `observe` returns True when the run should stop at this checkpoint."""

    __slots__ = ()

    def observe(self, cp: Checkpoint) -> bool:  # pragma: no cover - interface
        raise NotImplementedError


class Detector:
    """A detector family with fixed parameters; `start()` makes the state for one run."""

    name: ClassVar[str]
    #: which input field the detector needs besides `eval_score` (checked before replaying traces)
    needs: ClassVar[tuple[str, ...]] = ()

    def start(self) -> Monitor:  # pragma: no cover - interface
        raise NotImplementedError

    #: display name in result tables
    title: ClassVar[str] = ""

    @property
    def label(self) -> str:
        """Name used in result tables: the title, plus any parameter that differs from its default
        (`EvalStop`, `EvalStop(k=3)`, `CUSUM(h=2)`), so differently tuned detectors never share a row."""
        import inspect

        defaults = {k: v.default for k, v in inspect.signature(type(self).__init__).parameters.items()
                    if v.default is not inspect.Parameter.empty}
        changed = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in self.params().items() if k in defaults and defaults[k] != v]
        title = self.title or self.name
        return f"{title}({','.join(changed)})" if changed else title

    def params(self) -> dict[str, Any]:
        return {}

    def scan(self, series: dict[str, np.ndarray]) -> np.ndarray:
        """Batch form over many runs: `series` maps Checkpoint field names to (runs, checkpoints)
        arrays (NaN where absent). Returns, per run, the index of the first checkpoint where the
        detector fires, or -1. This default replays monitors; detectors that must be fast over
        fleets (the health catalog) override it with a vectorised version that gives the same answer.
        """
        names = [f.name for f in fields(Checkpoint) if f.name in series]
        n_runs, n_steps = next(iter(series.values())).shape
        # Python floats once per array: indexing numpy element by element costs more than the monitors
        rows = {name: np.asarray(series[name], dtype=float).tolist() for name in names}
        out = np.full(n_runs, -1, dtype=np.int64)
        for r in range(n_runs):
            monitor = self.start()
            for t in range(n_steps):
                values = {name: rows[name][r][t] for name in names}
                values.setdefault("step", float(t))
                values.setdefault("eval_score", NAN)
                if monitor.observe(Checkpoint(**values)):
                    out[r] = t
                    break
        return out


# --------------------------------------------------------------------------- EvalStop
class _EvalStopMonitor(Monitor):
    __slots__ = ("k", "prev", "declines")

    def __init__(self, k: int):
        self.k = k
        self.prev = -math.inf
        self.declines = 0

    def observe(self, cp: Checkpoint) -> bool:
        score = cp.eval_score
        if score != score:  # NaN: a missed eval is no evidence either way
            return False
        self.declines = self.declines + 1 if score < self.prev else 0
        self.prev = score
        return self.declines >= self.k


class EvalStop(Detector):
    """Stop after `k` consecutive checkpoint-to-checkpoint eval declines (the EvalStop paper, §3)."""

    name = "evalstop"

    def __init__(self, k: int = 2):
        if k < 1:
            raise ValueError("evalstop: k must be >= 1")
        self.k = int(k)

    title = "EvalStop"

    def start(self) -> Monitor:
        return _EvalStopMonitor(self.k)

    def scan(self, series: dict[str, np.ndarray]) -> np.ndarray:
        """Vectorised over runs (the simulator plans a million runs at once); same answer as the monitor."""
        evals = np.asarray(series["eval_score"], dtype=float)
        runs, steps = evals.shape
        out = np.full(runs, -1, dtype=np.int64)
        prev = np.full(runs, -np.inf)
        declines = np.zeros(runs, dtype=np.int64)
        for t in range(steps):
            score = evals[:, t]
            seen = score == score  # a NaN (missed eval) leaves the state as it was
            declines = np.where(seen, np.where(score < prev, declines + 1, 0), declines)
            prev = np.where(seen, score, prev)
            out[seen & (declines >= self.k) & (out < 0)] = t
        return out

    def params(self) -> dict[str, Any]:
        return {"k": self.k}


# --------------------------------------------------------------------------- StopAt
class _StopAtMonitor(Monitor):
    __slots__ = ("p",)

    def __init__(self, p: float):
        self.p = p

    def observe(self, cp: Checkpoint) -> bool:
        return cp.progress >= self.p - 1e-9


class StopAt(Detector):
    """Stop every run at its first checkpoint at or past progress `p` (the paper's trivial baseline)."""

    name = "stopat"
    needs = ("progress",)

    def __init__(self, p: float = 0.65):
        if not 0.0 < p <= 1.0:
            raise ValueError("stopat: p must be in (0, 1]")
        self.p = float(p)

    @property
    def label(self) -> str:
        return f"StopAt{self.p:g}"

    def start(self) -> Monitor:
        return _StopAtMonitor(self.p)

    def scan(self, series: dict[str, np.ndarray]) -> np.ndarray:
        """Vectorised over runs; same answer as the monitor."""
        if "progress" not in series:
            return np.full(len(next(iter(series.values()))), -1, dtype=np.int64)
        fires = np.asarray(series["progress"], dtype=float) >= self.p - 1e-9
        return np.where(fires.any(axis=1), fires.argmax(axis=1), -1).astype(np.int64)

    def params(self) -> dict[str, Any]:
        return {"p": self.p}


# --------------------------------------------------------------------------- LossPlateau
class _LossPlateauMonitor(Monitor):
    __slots__ = ("window", "min_rel", "losses")

    def __init__(self, window: int, min_rel: float):
        self.window = window
        self.min_rel = min_rel
        self.losses: list[float] = []

    def observe(self, cp: Checkpoint) -> bool:
        loss = cp.loss
        if loss != loss:
            return False
        losses = self.losses
        losses.append(loss)
        if len(losses) < self.window:
            return False
        if len(losses) > self.window:
            del losses[0]
        old = losses[0]
        return (old - loss) / max(abs(old), 1e-12) < self.min_rel


class LossPlateau(Detector):
    """SLAQ-style loss-only stop: the loss improved by less than `min_rel` (relative) across the last
    `window` checkpoints (first to last of the window)."""

    name = "lossplateau"
    needs = ("loss",)

    def __init__(self, window: int = 3, min_rel: float = 0.02):
        if window < 2:
            raise ValueError("lossplateau: window must be >= 2 checkpoints")
        self.window = int(window)
        self.min_rel = float(min_rel)

    title = "LossPlateau"

    def start(self) -> Monitor:
        return _LossPlateauMonitor(self.window, self.min_rel)

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "min_rel": self.min_rel}


# --------------------------------------------------------------------------- noise-aware detectors
# They read the gate's standard error from each checkpoint (`eval_se`); runs that do not report one
# fall back to the detector's `se` parameter. Thresholds are therefore in units of eval noise, which is
# what lets one default configuration hold from near-deterministic evals to very noisy ones.
# Their defaults were chosen once, by a sweep over Gaussian eval noise sigma 0.02-0.12 and a 20% hacking
# rate on a tuning workload (1,500 jobs, seed 1) that the reported experiments (seeds 42..1024) never use.


def _se(cp: Checkpoint, fallback: float) -> float:
    se = cp.eval_se
    return se if se == se and se > 0.0 else fallback


def _normalised_change(monitor, cp: Checkpoint, fallback_se: float) -> float:
    """Eval change since the monitor's previous checkpoint in units of the noise of a difference of two
    evals (sqrt(2) SE); NaN for a missed eval or the first checkpoint. Updates `monitor.prev`."""
    e = cp.eval_score
    if e != e:
        return NAN
    prev, monitor.prev = monitor.prev, e
    if prev != prev:
        return NAN
    return (e - prev) / (_se(cp, fallback_se) * math.sqrt(2.0))


class _PatienceMonitor(Monitor):
    __slots__ = ("k", "z", "delta", "se", "evals")

    def __init__(self, k: int, z: float, delta: float, se: float):
        self.k, self.z, self.delta, self.se = k, z, delta, se
        self.evals: list[float] = []

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:
            return False
        ev = self.evals
        ev.append(cp.eval_score)
        if len(ev) <= self.k:
            return False
        margin = max(self.delta, self.z * _se(cp, self.se) * math.sqrt(2.0))
        return max(ev[-self.k:]) < max(ev[:-self.k]) - margin


class MinDeltaPatience(Detector):
    """Stop when the best eval of the last `k` checkpoints is below the best before them by more than
    delta = max(`delta`, `z` * SE * sqrt(2)) (patience with a noise-scaled minimum delta)."""

    name = "patience"

    def __init__(self, k: int = 2, z: float = 1.0, delta: float = 0.0, se: float = 0.02):
        if k < 1 or z < 0 or delta < 0 or se <= 0:
            raise ValueError("patience: need k >= 1, z >= 0, delta >= 0, se > 0")
        self.k, self.z, self.delta, self.se = int(k), float(z), float(delta), float(se)

    title = "Patience"

    def start(self) -> Monitor:
        return _PatienceMonitor(self.k, self.z, self.delta, self.se)

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "z": self.z, "delta": self.delta, "se": self.se}


class _CusumMonitor(Monitor):
    __slots__ = ("h", "drift", "se", "prev", "stat")

    def __init__(self, h: float, drift: float, se: float):
        self.h, self.drift, self.se = h, drift, se
        self.prev = NAN
        self.stat = 0.0

    def observe(self, cp: Checkpoint) -> bool:
        change = _normalised_change(self, cp, self.se)
        if change != change:
            return False
        self.stat = max(0.0, self.stat - change - self.drift)
        return self.stat > self.h


class Cusum(Detector):
    """One-sided CUSUM on checkpoint-to-checkpoint eval changes, normalised by the gate's SE:
    S_t = max(0, S_{t-1} + (e_{t-1} - e_t) / (sqrt(2) SE) - drift); stop when S_t > h."""

    name = "cusum"

    def __init__(self, h: float = 2.0, drift: float = 0.0, se: float = 0.02):
        if h <= 0 or drift < 0 or se <= 0:
            raise ValueError("cusum: need h > 0, drift >= 0, se > 0")
        self.h, self.drift, self.se = float(h), float(drift), float(se)

    title = "CUSUM"

    def start(self) -> Monitor:
        return _CusumMonitor(self.h, self.drift, self.se)

    def params(self) -> dict[str, Any]:
        return {"h": self.h, "drift": self.drift, "se": self.se}


class _BocpdMonitor(Monitor):
    """Adams & MacKay (2007) on SE-normalised eval changes with a Normal-Gamma prior, so each run
    length's predictive is a Student-t. Per run length r it keeps the segment's sufficient statistics."""

    __slots__ = ("det", "prev", "logp", "n", "sx", "sxx")

    def __init__(self, det: Bocpd):
        self.det = det
        self.prev = NAN
        self.logp = np.zeros(1)  # log P(run length = r), r = 0..t
        self.n = np.zeros(1)
        self.sx = np.zeros(1)
        self.sxx = np.zeros(1)

    def _posterior(self, n, sx, sxx):
        d = self.det
        kappa = d.kappa0 + n
        mean = np.divide(d.kappa0 * d.mu0 + sx, kappa)
        xbar = np.divide(sx, np.maximum(n, 1.0))
        ss = np.maximum(sxx - n * xbar * xbar, 0.0)
        alpha = d.alpha0 + n / 2.0
        beta = d.beta0 + 0.5 * ss + d.kappa0 * n * (xbar - d.mu0) ** 2 / (2.0 * kappa)
        return mean, kappa, alpha, beta

    def observe(self, cp: Checkpoint) -> bool:
        x = _normalised_change(self, cp, self.det.se)
        if x != x:
            return False
        mean, kappa, alpha, beta = self._posterior(self.n, self.sx, self.sxx)
        scale = np.sqrt(beta * (kappa + 1.0) / (alpha * kappa))
        log_pred = stats.t.logpdf(x, df=2.0 * alpha, loc=mean, scale=scale)
        h = self.det.hazard
        grow = self.logp + log_pred + math.log(1.0 - h)
        cp_mass = np.logaddexp.reduce(self.logp + log_pred) + math.log(h)
        logp = np.concatenate(([cp_mass], grow))
        logp -= np.logaddexp.reduce(logp)
        self.logp = logp
        self.n = np.concatenate(([0.0], self.n)) + 1.0
        self.sx = np.concatenate(([0.0], self.sx)) + x
        self.sxx = np.concatenate(([0.0], self.sxx)) + x * x
        # P(the current regime's mean change is downward), mixed over run lengths
        mean, kappa, alpha, beta = self._posterior(self.n, self.sx, self.sxx)
        p_down = stats.t.cdf(-self.det.min_drop, df=2.0 * alpha, loc=mean, scale=np.sqrt(beta / (alpha * kappa)))
        return float(np.exp(logp) @ p_down) > self.det.level


class Bocpd(Detector):
    """Bayesian online change-point detection on eval changes (in SE units); stop when the posterior
    probability that the current regime is a downward one (mean change below -`min_drop`) exceeds `level`."""

    name = "bocpd"

    def __init__(self, hazard: float = 0.3, level: float = 0.6, min_drop: float = 0.25, se: float = 0.02,
                 mu0: float = 0.0, kappa0: float = 0.5, alpha0: float = 2.0, beta0: float = 1.0):
        if not 0 < hazard < 1 or not 0 < level < 1 or se <= 0 or kappa0 <= 0 or alpha0 <= 0 or beta0 <= 0:
            raise ValueError("bocpd: need 0 < hazard < 1, 0 < level < 1, se > 0 and positive prior parameters")
        self.hazard, self.level, self.min_drop, self.se = float(hazard), float(level), float(min_drop), float(se)
        self.mu0, self.kappa0, self.alpha0, self.beta0 = float(mu0), float(kappa0), float(alpha0), float(beta0)

    title = "BOCPD"

    def start(self) -> Monitor:
        return _BocpdMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"hazard": self.hazard, "level": self.level, "min_drop": self.min_drop, "se": self.se}


def _slope(y: list[float]) -> float:
    n = len(y)
    xm = (n - 1) / 2.0
    ym = sum(y) / n
    num = sum((i - xm) * (v - ym) for i, v in enumerate(y))
    den = sum((i - xm) ** 2 for i in range(n))
    return num / den


class _DivergenceMonitor(Monitor):
    __slots__ = ("det", "evals", "rewards")

    def __init__(self, det: Divergence):
        self.det = det
        self.evals: list[float] = []
        self.rewards: list[float] = []

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:
            return False
        d = self.det
        self.evals.append(cp.eval_score)
        self.rewards.append(cp.reward)
        se = _se(cp, d.se)
        for w, z in d.tests:
            if len(self.evals) < w:
                continue
            ev, rw = self.evals[-w:], self.rewards[-w:]
            # SE of a least-squares slope over w equally spaced points: SE / sqrt(sum((i - mean)^2))
            slope_se = se / math.sqrt(sum((i - (w - 1) / 2.0) ** 2 for i in range(w)))
            if _slope(ev) < -z * slope_se and (any(r != r for r in rw) or _slope(rw) > 0.0):
                return True
        return False


class Divergence(Detector):
    """The runbook's reward-hacking signature as an early-stop rule: over the last `window` checkpoints
    the proxy reward's slope is positive while the eval slope is significantly negative (below -`z`
    standard errors of a least-squares slope, from the gate's SE). Without a reward column it degrades
    to the eval-slope test alone."""

    name = "divergence"

    def __init__(self, window: int = 4, z: float = 1.0, short_z: float = 2.0, se: float = 0.02):
        if window < 2 or z < 0 or short_z < 0 or se <= 0:
            raise ValueError("divergence: need window >= 2, z >= 0, short_z >= 0, se > 0")
        self.window, self.z, self.short_z, self.se = int(window), float(z), float(short_z), float(se)
        # the main test, plus (short_z > 0) a stricter one over the last 3 checkpoints that reacts sooner
        # to a steep fall
        self.tests = [(self.window, self.z)] + ([(3, self.short_z)] if self.short_z > 0 and self.window > 3 else [])

    title = "Divergence"

    def start(self) -> Monitor:
        return _DivergenceMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "z": self.z, "short_z": self.short_z, "se": self.se}


DETECTORS: dict[str, type[Detector]] = {
    cls.name: cls for cls in (EvalStop, StopAt, LossPlateau, MinDeltaPatience, Cusum, Bocpd, Divergence)
}

#: The detector `rlhfops detect` and the live platform use when none is named: the best row of
#: docs/detectors.md (`rlhfops compare-detectors`). Divergence holds precision and recall >= 0.90 at
#: eval-noise sigma 0.08 and >= 0.85 at 0.12, >= 0.95 precision at a 20% hacking rate, and beats
#: EvalStop(k=2) on every column at the paper's default noise.
DEFAULT_DETECTOR = "divergence"


def make_detector(name: str, **params: Any) -> Detector:
    """Build a detector by registry name; unknown names and parameters raise ValueError naming them."""
    key = name.lower()
    if key not in DETECTORS:
        raise ValueError(f"unknown detector '{name}' (choose from: {', '.join(sorted(DETECTORS))})")
    cls = DETECTORS[key]
    try:
        return cls(**params)
    except TypeError as err:
        raise ValueError(f"detector '{name}': bad parameter ({err})") from None
