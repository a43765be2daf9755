"""A run's eval noise, estimated online from the run itself, and the least-squares slope helpers the noise-aware
detectors (eval/detectors.py: patience, CUSUM, BOCPD, divergence) measure their thresholds with.

Plain Python + numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import math

import numpy as np

from eval.detector_base import NAN, Checkpoint

#: second differences a run needs before it is judged on its own noise estimate (8 checkpoints): the
#: simulator's 7-checkpoint jobs, like any short gated run, are judged on their gate's SE throughout
MIN_DIFFS = 6
_MAD_TO_SD = 1.482602218505602  # 1 / Phi^-1(3/4): MAD of a normal sample -> its standard deviation
_MEANABS_TO_SD = math.sqrt(math.pi / 2.0)


def robust_diff_sigma(evals: list[float]) -> float:
    """The noise of one eval, from a run's series: the MAD of second differences / sqrt(6) (a second
    difference e[t+1] - 2 e[t] + e[t-1] cancels a locally linear trend and carries 6 times an eval's variance;
    the median ignores the few large values at a peak or a change of slope). First differences would count a
    rise-then-fall curve's trend as noise. Quantised scores (pass@1 over few problems, 1-5 judges) can make
    more than half the values equal, so a zero MAD falls back to the mean absolute deviation.
    NaN with fewer than 3 evals."""
    if len(evals) < 3:
        return NAN
    d2 = np.diff(np.asarray(evals, dtype=float), n=2)
    dev = np.abs(d2 - np.median(d2))
    mad = float(np.median(dev))
    sd = _MAD_TO_SD * mad if mad > 0.0 else _MEANABS_TO_SD * float(dev.mean())
    return sd / math.sqrt(6.0)


class RunNoise:
    """Online noise estimate of one run. A short run leans on its gate: while it has fewer than MIN_DIFFS
    second differences its noise is the gate's SE (NaN without one: not judged yet). A longer run is judged on
    what it shows: its own robust estimate, floored by the gate's SE where there is one (a run's checkpoints
    can look smoother than the gate can measure, e.g. while early training barely moves the model, and a
    stop on such "precision" would be a stop on the gate's sampling noise). `from_gate` says which of the
    two is in use, so a detector can hold the own estimate (noisier, blind to autocorrelation) to its own,
    separately calibrated bar."""

    __slots__ = ("evals", "se", "from_gate")

    def __init__(self) -> None:
        self.evals: list[float] = []
        self.se = NAN
        self.from_gate = False

    def add(self, cp: Checkpoint) -> None:
        """Record a checkpoint whose eval is not NaN."""
        self.evals.append(cp.eval_score)
        se = cp.eval_se
        if se == se and se > 0.0:
            self.se = se

    def sigma(self) -> float:
        se = self.se
        if len(self.evals) - 2 < MIN_DIFFS:
            self.from_gate = se == se
            return se
        self.from_gate = False
        own = robust_diff_sigma(self.evals)
        return max(own, se) if se == se else own


def _normalised_change(evals: list[float], sigma: float) -> float:
    """Last eval change in units of the noise of a difference of two evals (sqrt(2) sigma)."""
    if len(evals) < 2 or not sigma > 0.0:
        return NAN
    return (evals[-1] - evals[-2]) / (sigma * math.sqrt(2.0))


def _slope(y: list[float]) -> float:
    n = len(y)
    xm = (n - 1) / 2.0
    ym = sum(y) / n
    num = sum((i - xm) * (v - ym) for i, v in enumerate(y))
    den = sum((i - xm) ** 2 for i in range(n))
    return num / den


def _multiplicity(j: int) -> float:
    """How much the bar of a run's j-th test of one window is raised: 1 for the first, then
    sqrt(1 + 2 * MULTIPLICITY * ln j)."""
    return math.sqrt(1.0 + 2.0 * MULTIPLICITY * math.log(j)) if j > 1 else 1.0


#: strength of the multiplicity correction (0: none, 1: grows like the maximum of j independent normals)
MULTIPLICITY = 1.0


def _sxx(w: int) -> float:
    return sum((i - (w - 1) / 2.0) ** 2 for i in range(w))
