"""The detector interface: what a detector sees of one checkpoint (`Checkpoint`), its state on one run
(`Monitor`), and a detector family with fixed parameters (`Detector`). eval/detectors.py holds the early-stop
detectors, eval/health/ the run-health alerts; both implement this interface, and eval/registry.py lists them.

Plain Python + numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

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
    #: the parameter that sets how much evidence a stop needs (larger: fewer stops); what
    #: `rlhfops detect --calibrate` fits to a target false-stop rate. None: not calibratable.
    threshold: ClassVar[str | None] = None
    #: the threshold that applies to runs without a gate SE, where it differs (else `threshold`)
    threshold_own: ClassVar[str | None] = None

    def start(self) -> Monitor:  # pragma: no cover - interface
        raise NotImplementedError

    #: display name in result tables
    title: ClassVar[str] = ""

    @property
    def label(self) -> str:
        """Name used in result tables: the title, plus any parameter that differs from its default
        (`EvalStop`, `EvalStop(k=3)`, `CUSUM(h=2)`), so differently tuned detectors never share a row."""
        defaults = self.label_defaults()
        changed = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                   for k, v in self.params().items() if k in defaults and defaults[k] != v]
        title = self.title or self.name
        return f"{title}({','.join(changed)})" if changed else title

    def label_defaults(self) -> dict[str, Any]:
        """The parameter values `label` leaves out: the constructor's defaults. A detector whose default is
        derived from another parameter (a None that means "the same as z") overrides this with the value."""
        import inspect

        return {k: v.default for k, v in inspect.signature(type(self).__init__).parameters.items()
                if v.default is not inspect.Parameter.empty}

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
