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

NAN = float("nan")


@dataclass(slots=True)
class Checkpoint:
    """What a detector may see of one checkpoint of a run: world feedback and training proxies.

    `progress` is the trainer's own step fraction (steps done / steps planned), NaN when unknown.
    Optional signals are NaN when the run does not report them.
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

    @property
    def label(self) -> str:
        """Name used in result tables (e.g. `EvalStop`, `StopAt0.65`)."""
        return self.name

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
        out = np.full(n_runs, -1, dtype=np.int64)
        for r in range(n_runs):
            monitor = self.start()
            for t in range(n_steps):
                values = {name: float(series[name][r, t]) for name in names}
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

    @property
    def label(self) -> str:
        return "EvalStop" if self.k == 2 else f"EvalStop(k={self.k})"

    def start(self) -> Monitor:
        return _EvalStopMonitor(self.k)

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

    @property
    def label(self) -> str:
        return "LossPlateau"

    def start(self) -> Monitor:
        return _LossPlateauMonitor(self.window, self.min_rel)

    def params(self) -> dict[str, Any]:
        return {"window": self.window, "min_rel": self.min_rel}


DETECTORS: dict[str, type[Detector]] = {cls.name: cls for cls in (EvalStop, StopAt, LossPlateau)}

#: the detector `rlhfops detect` and the live platform use when none is named
DEFAULT_DETECTOR = "evalstop"


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
