"""Early-stop detectors: build one by name (`make_detector`), on one interface for every time-series detector
(eval/detector_base.py).

A detector reads one run's checkpoint series, one checkpoint at a time, and answers "stop now" or "continue". The
same objects serve the discrete-event simulator (through the scheduler's early-stop wrapper), the live platform, and
`rlhfops detect` replaying trace files.

    detector = make_detector("evalstop", k=2)
    monitor = detector.start()            # per-run state
    for cp in checkpoints:                # in step order
        if monitor.observe(cp):           # True: stop this run now (keep its best checkpoint)
            break

The rules themselves live in eval/stop_rules.py (the paper's and the noise-aware ones), eval/patience.py
(`noisepatience`, the default) and eval/paired.py; every name is listed once in eval/registry.py. This module
imports the interface, the noise estimate and the rule classes under the names callers use
(`from eval.detectors import Checkpoint, EvalStop, MIN_DIFFS`), and reads the registry only inside `make_detector`,
so nothing the registry imports depends on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eval.detector_base import NAN as NAN
from eval.detector_base import Checkpoint as Checkpoint
from eval.detector_base import Detector, Monitor
from eval.noise import MIN_DIFFS as MIN_DIFFS
from eval.noise import RunNoise as RunNoise
from eval.noise import _slope as _slope
from eval.noise import robust_diff_sigma as robust_diff_sigma
from eval.stop_rules import Bocpd, Cusum, Divergence, EvalStop, LossPlateau, MinDeltaPatience, StopAt

__all__ = [
    "NAN", "Checkpoint", "Detector", "Monitor", "MIN_DIFFS", "RunNoise", "robust_diff_sigma",
    "EvalStop", "StopAt", "LossPlateau", "MinDeltaPatience", "Cusum", "Bocpd", "Divergence",
    "DEFAULT_DETECTOR", "DETECTOR_CONFIG", "calibrated_params", "make_detector",
]


#: The detector `rlhfops detect` and the live platform use when none is named. Its thresholds are not the
#: class defaults: they come from configs/detectors.yaml, calibrated to a stated false-stop rate on healthy
#: runs (`rlhfops detect --calibrate HEALTHY.csv`); see docs/detectors.md for how it was chosen.
DEFAULT_DETECTOR = "noisepatience"

#: the versioned thresholds `make_detector` reads (a platform recalibrates on its own fleet and commits it)
DETECTOR_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "detectors.yaml"


def calibrated_params(name: str, config: Path | None = None) -> dict[str, Any]:
    """The calibrated parameters of detector `name` in the versioned config ({} when it has none)."""
    path = config or DETECTOR_CONFIG
    if not path.is_file():
        return {}
    from common.config import read_config_mapping  # the one strict reader: empty, duplicate keys, non-mapping

    doc, _ = read_config_mapping(path, "detector config")
    entry = (doc.get("detectors") or {}).get(name.lower()) or {}
    return dict(entry.get("params") or {})


def make_detector(name: str, config: Path | None = None, **params: Any) -> Detector:
    """Build a detector by its name in eval/registry.py (an early-stop detector or a run-health alert): its class
    defaults, overridden by its calibrated thresholds in configs/detectors.yaml (or `config`), overridden by
    `params`. Unknown names and parameters raise ValueError naming them."""
    from eval.registry import detector_class  # here: the registry loads every detector and alert module

    key = name.lower()
    cls = detector_class(name)
    merged = {**calibrated_params(key, config), **params}
    try:
        return cls(**merged)
    except TypeError as err:
        raise ValueError(f"detector '{name}': bad parameter ({err})") from None
