"""The early-stop rules: the EvalStop paper's `evalstop` (k consecutive declines), `stopat` (fixed progress) and
`lossplateau`, and the noise-aware `patience`, `cusum`, `bocpd` and `divergence` that read the run's own eval noise
(eval/noise.py). Each is a `Detector` of eval/detector_base.py; `eval.detectors.make_detector` builds one by its
name in eval/registry.py, and callers import the classes from `eval.detectors`.

Monitors are deliberately tiny (O(1) state per run, O(1) per observation) because the simulator drives millions of
them.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from eval.detector_base import NAN, Checkpoint, Detector, Monitor
from eval.noise import RunNoise, _multiplicity, _normalised_change, _slope, _sxx, robust_diff_sigma


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
# Every threshold below is in units of the run's own eval noise, estimated online from the run itself
# (`RunNoise`): the gate's standard error while the run is short, then its own estimate. Nothing assumes a scale:
# an affine change of the metric's units (a * eval + b, a > 0; the gate's SE scales with it) leaves every
# verdict unchanged. A run that reports no SE is not judged until its own estimate exists. The estimate and the
# slope helpers are in eval/noise.py.


class _PatienceMonitor(Monitor):
    __slots__ = ("k", "z", "noise")

    def __init__(self, k: int, z: float):
        self.k, self.z = k, z
        self.noise = RunNoise()

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:
            return False
        self.noise.add(cp)
        ev = self.noise.evals
        if len(ev) <= self.k:
            return False
        sigma = self.noise.sigma()
        if sigma != sigma:
            return False
        return max(ev[-self.k:]) < max(ev[:-self.k]) - self.z * sigma * math.sqrt(2.0)


class MinDeltaPatience(Detector):
    """Stop when the best eval of the last `k` checkpoints is below the best before them by more than
    `z` * sigma * sqrt(2), sigma the run's own noise (patience with a noise-scaled minimum delta)."""

    name = "patience"
    threshold = "z"

    def __init__(self, k: int = 2, z: float = 1.0):
        if k < 1 or z < 0:
            raise ValueError("patience: need k >= 1, z >= 0")
        self.k, self.z = int(k), float(z)

    title = "Patience"

    def start(self) -> Monitor:
        return _PatienceMonitor(self.k, self.z)

    def params(self) -> dict[str, Any]:
        return {"k": self.k, "z": self.z}


class _CusumMonitor(Monitor):
    __slots__ = ("h", "drift", "noise", "stat")

    def __init__(self, h: float, drift: float):
        self.h, self.drift = h, drift
        self.noise = RunNoise()
        self.stat = 0.0

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:
            return False
        self.noise.add(cp)
        change = _normalised_change(self.noise.evals, self.noise.sigma())
        if change != change:
            return False
        self.stat = max(0.0, self.stat - change - self.drift)
        return self.stat > self.h


class Cusum(Detector):
    """One-sided CUSUM on checkpoint-to-checkpoint eval changes in units of the run's noise:
    S_t = max(0, S_{t-1} + (e_{t-1} - e_t) / (sqrt(2) sigma) - drift); stop when S_t > h."""

    name = "cusum"
    threshold = "h"

    def __init__(self, h: float = 2.0, drift: float = 0.0):
        if h <= 0 or drift < 0:
            raise ValueError("cusum: need h > 0, drift >= 0")
        self.h, self.drift = float(h), float(drift)

    title = "CUSUM"

    def start(self) -> Monitor:
        return _CusumMonitor(self.h, self.drift)

    def params(self) -> dict[str, Any]:
        return {"h": self.h, "drift": self.drift}


class _BocpdMonitor(Monitor):
    """Adams & MacKay (2007) on noise-normalised eval changes with a Normal-Gamma prior, so each run
    length's predictive is a Student-t. Per run length r it keeps the segment's sufficient statistics."""

    __slots__ = ("det", "noise", "logp", "n", "sx", "sxx")

    def __init__(self, det: Bocpd):
        self.det = det
        self.noise = RunNoise()
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
        from scipy import stats  # here, not at import: scipy.stats takes ~1 s to import, only bocpd needs it

        if cp.eval_score != cp.eval_score:
            return False
        self.noise.add(cp)
        x = _normalised_change(self.noise.evals, self.noise.sigma())
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
    """Bayesian online change-point detection on eval changes (in units of the run's noise); stop when the
    posterior probability that the current regime is a downward one (mean change below -`min_drop`)
    exceeds `level`."""

    name = "bocpd"
    threshold = "level"

    def __init__(self, hazard: float = 0.3, level: float = 0.6, min_drop: float = 0.25,
                 mu0: float = 0.0, kappa0: float = 0.5, alpha0: float = 2.0, beta0: float = 1.0):
        if not 0 < hazard < 1 or not 0 < level < 1 or kappa0 <= 0 or alpha0 <= 0 or beta0 <= 0:
            raise ValueError("bocpd: need 0 < hazard < 1, 0 < level < 1 and positive prior parameters")
        self.hazard, self.level, self.min_drop = float(hazard), float(level), float(min_drop)
        self.mu0, self.kappa0, self.alpha0, self.beta0 = float(mu0), float(kappa0), float(alpha0), float(beta0)

    title = "BOCPD"

    def start(self) -> Monitor:
        return _BocpdMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"hazard": self.hazard, "level": self.level, "min_drop": self.min_drop}


class _DivergenceMonitor(Monitor):
    __slots__ = ("det", "noise", "rewards")

    def __init__(self, det: Divergence):
        self.det = det
        self.noise = RunNoise()
        self.rewards: list[float] = []

    def has_proxy(self) -> bool:
        """Whether this run records the proxy reward (any finite value so far)."""
        return any(r == r for r in self.rewards)

    def sigma(self) -> float:
        """The run's eval noise. While the gate's SE is the noise figure (a short run), the few second
        differences the run already has are pooled with it, the SE counting as `gate_weight` of them: a real
        run whose evals move more than its gate can explain (policy noise on top of the gate's sampling
        noise) is not judged on the gate's SE alone. Never below the SE."""
        sigma = self.noise.sigma()  # sets noise.from_gate
        g = self.det.gate_weight
        evals = self.noise.evals
        if self.noise.from_gate and math.isfinite(g) and len(evals) >= 4:
            nu = len(evals) - 2
            own = robust_diff_sigma(evals)
            pooled = math.sqrt((g * sigma * sigma + nu * own * own) / (g + nu))
            sigma = max(sigma, pooled)
        return sigma

    def proxy_rises(self, w: int) -> bool:
        """The proxy's slope over the last `w` checkpoints is positive by more than `z_proxy` SEs of a slope
        (the proxy's own noise: MAD of its second differences / sqrt 6); a run without a proxy passes."""
        rw = self.rewards[-w:]
        if not self.has_proxy():
            return True
        if any(r != r for r in rw):
            return True  # a missed proxy value is no evidence against the signature
        slope = _slope(rw)
        if not slope > 0.0:
            return False
        if self.det.z_proxy <= 0.0:
            return True
        finite = [r for r in self.rewards if r == r]
        sd = robust_diff_sigma(finite) if len(finite) >= 4 else NAN
        if not sd > 0.0:
            return True
        return slope * math.sqrt(_sxx(w)) / sd > self.det.z_proxy

    def decline_statistic(self, sigma: float) -> float:
        """Runs without a proxy, judged on their own noise, can only show a decline: the last `hold` evals all
        sit below the run's best by more than `hold_drawdown` of the range covered so far, and their best is
        below the run's best by this many noise SDs (0 when the drawdown has not held that long)."""
        d = self.det
        evals = self.noise.evals
        if d.hold < 1 or len(evals) <= d.hold or not sigma > 0.0:
            return 0.0
        top, bottom = max(evals), min(evals)
        recent = max(evals[-d.hold:])
        if top - recent <= d.hold_drawdown * (top - bottom):
            return 0.0
        return (top - recent) / sigma

    def statistic(self) -> float:
        """The largest threshold `z` at which this checkpoint stops the run (0 when none): each test's
        significance of the eval's fall (-slope / its SE), divided by the test's share of `z`."""
        d = self.det
        evals = self.noise.evals
        sigma = self.sigma()
        if not sigma > 0.0:
            return 0.0
        if d.min_drawdown > 0.0 and not self.noise.from_gate:
            # judged on its own noise estimate, a run's fall must already have given back a share of what it
            # gained, over the last `persist` evals: a very smooth curve (noise near zero) otherwise makes any
            # dip of its last digits "significant", and a one-checkpoint collapse that recovers looks like a fall
            top, bottom = max(evals), min(evals)
            if len(evals) < d.persist or top - max(evals[-d.persist:]) < d.min_drawdown * (top - bottom):
                return 0.0
        best = 0.0
        for w, ratio in d.tests:
            if len(evals) < w:
                continue
            if not self.proxy_rises(w):
                continue  # the proxy does not rise: a collapse, not reward hacking
            # SE of a least-squares slope over w equally spaced points: sigma / sqrt(sum((i - mean)^2))
            significance = -_slope(evals[-w:]) * math.sqrt(_sxx(w)) / sigma
            # the j-th test of a run is one of many: its bar grows like the maximum of j noise draws
            # (sqrt(2 ln j) for large j), so a 200-checkpoint run is not stopped by its longest noise streak
            best = max(best, significance / (ratio * _multiplicity(len(evals) - w + 1)))
        return best

    def observe(self, cp: Checkpoint) -> bool:
        if cp.eval_score != cp.eval_score:
            return False
        self.noise.add(cp)
        self.rewards.append(cp.reward)
        d = self.det
        if d.hold >= 1 and not self.has_proxy():
            sigma = self.sigma()  # sets noise.from_gate
            if not self.noise.from_gate:
                return self.decline_statistic(sigma) > d.z_decline
        stat = self.statistic()  # sets noise.from_gate
        return stat > (d.z if self.noise.from_gate else d.z_own)


class Divergence(Detector):
    """The runbook's reward-hacking signature as an early-stop rule: over the last `window` checkpoints the
    proxy reward's slope is positive (by more than `z_proxy` SEs of its own noise) while the eval slope is
    significantly negative (below -`z` standard errors of a least-squares slope, from the run's own noise); a
    second test over the last 3 checkpoints with the stricter bar `short_ratio` * z reacts sooner to a steep
    fall. `z` is the bar while the gate's SE is the noise figure (pooled with the run's first second
    differences, the SE weighing `gate_weight` of them); `z_own` the bar when the noise is the run's own
    estimate (from 8 checkpoints on, or without an SE: a noisier figure, blind to autocorrelated noise). On its
    own noise a run is also held to `min_drawdown` > 0: its last `persist` evals must sit below its best by
    that share of the range it has covered so far (scale-free; `persist` 2 lets a one-checkpoint collapse
    that recovers pass).

    A run that records no proxy cannot show the signature, only a decline; with `hold` >= 1 such a run, once
    judged on its own noise, is stopped when its last `hold` evals all sit below its best by more than
    `hold_drawdown` of its range so far and by more than `z_decline` noise SDs (a collapse that recovers
    within `hold` checkpoints passes). Each bar is calibrated on healthy runs of its own kind."""

    name = "divergence"
    threshold = "z"
    threshold_own = "z_own"
    #: the bar for runs without a proxy, judged on their own noise (calibrated on healthy runs of that kind)
    threshold_decline = "z_decline"

    def __init__(self, window: int = 4, z: float = 1.0, short_ratio: float = 2.0, z_own: float | None = None,
                 min_drawdown: float = 0.0, persist: int = 1, gate_weight: float = math.inf,
                 z_proxy: float = 0.0, hold: int = 0, hold_drawdown: float = 0.5, z_decline: float = 3.0):
        z_own = z if z_own is None else z_own
        if window < 2 or z < 0 or short_ratio < 0 or z_own < 0 or not 0 <= min_drawdown < 1:
            raise ValueError("divergence: need window >= 2, z >= 0, z_own >= 0, short_ratio >= 0, "
                             "0 <= min_drawdown < 1")
        if not gate_weight > 0 or z_proxy < 0 or hold < 0 or not 0 <= hold_drawdown < 1 or z_decline < 0:
            raise ValueError("divergence: need gate_weight > 0, z_proxy >= 0, hold >= 0, 0 <= hold_drawdown < 1, "
                             "z_decline >= 0")
        self.window, self.z, self.short_ratio, self.z_own = int(window), float(z), float(short_ratio), float(z_own)
        self.min_drawdown, self.persist = float(min_drawdown), int(persist)
        self.gate_weight, self.z_proxy = float(gate_weight), float(z_proxy)
        self.hold, self.hold_drawdown, self.z_decline = int(hold), float(hold_drawdown), float(z_decline)
        if self.persist < 1:
            raise ValueError("divergence: need persist >= 1")
        # (window, share of z) per test; short_ratio 0 switches the short test off
        self.tests = [(self.window, 1.0)] + ([(3, self.short_ratio)] if self.short_ratio > 0 and self.window > 3
                                              else [])

    title = "Divergence"

    def label_defaults(self) -> dict[str, Any]:
        # z_own's default, None, means "the same as z": a z_own equal to z is not a change of the defaults
        return {**super().label_defaults(), "z_own": self.z}

    def start(self) -> Monitor:
        return _DivergenceMonitor(self)

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "z": self.z, "short_ratio": self.short_ratio, "z_own": self.z_own,
                "min_drawdown": self.min_drawdown, "persist": self.persist, "gate_weight": self.gate_weight,
                "z_proxy": self.z_proxy, "hold": self.hold, "hold_drawdown": self.hold_drawdown,
                "z_decline": self.z_decline}
