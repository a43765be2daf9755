"""Fit a detector's threshold to a target false-stop rate on healthy runs, and check it on held-back ones.

A detector with a `threshold` parameter stops fewer runs as that parameter grows. For each healthy run the
*critical* threshold is the smallest value at which the run is no longer stopped; the calibrated threshold
is the smallest value that leaves at most floor(target * n) healthy runs stopped. The false-stop rate on a
held-back set is reported with its exact (Clopper-Pearson) confidence interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from eval.detectors import DETECTOR_CONFIG, Detector, make_detector

#: search range per threshold parameter (a detector stops nothing at the top of it on any sane run)
#: (z_decline starts at 3: a fall of fewer than 3 noise SDs is no evidence of a decline, as in the corpus's label rule)
_RANGE = {"z": (0.0, 64.0), "z_own": (0.0, 64.0), "z_decline": (3.0, 256.0), "h": (1e-6, 256.0),
          "level": (1e-6, 1.0 - 1e-9)}


def threshold_key(det: Detector, runs) -> str | None:
    """The parameter a fleet calibrates: the own-noise bar when some run of it is long enough to be judged
    on its own noise or reports no gate SE (the gate bar then stays as configured), else the gate bar."""
    from eval.detectors import MIN_DIFFS

    own = any(len(cps) - 2 >= MIN_DIFFS or not any(cp.eval_se == cp.eval_se and cp.eval_se > 0 for cp in cps)
              for cps in runs)
    return det.threshold_own if own and det.threshold_own is not None else det.threshold


def _stops(det: Detector, checkpoints) -> bool:
    monitor = det.start()
    return any(monitor.observe(cp) for cp in checkpoints)


def own_noise_runs(runs) -> list:
    """The runs (lists of checkpoints) that report no gate SE: judged on their own noise estimate."""
    return [cps for cps in runs if not any(cp.eval_se == cp.eval_se and cp.eval_se > 0 for cp in cps)]


def critical_threshold(name: str, params: dict[str, Any], checkpoints, iters: int = 40,
                       key: str | None = None) -> float:
    """Smallest value of threshold `key` at which this run is not stopped (bisection: stops are monotone in it)."""
    key = key or make_detector(name, **params).threshold
    if key is None:
        raise ValueError(f"detector '{name}' has no threshold to calibrate")
    lo, hi = _RANGE[key]
    if not _stops(make_detector(name, **{**params, key: lo}), checkpoints):
        return lo
    if _stops(make_detector(name, **{**params, key: hi}), checkpoints):
        return math.inf
    for _ in range(iters):
        mid = (lo + hi) / 2.0
        if _stops(make_detector(name, **{**params, key: mid}), checkpoints):
            lo = mid
        else:
            hi = mid
    return hi


def fit_threshold(critical: np.ndarray, target: float) -> float:
    """The smallest threshold that stops at most floor(target * n) of the runs whose critical values these are."""
    c = np.sort(np.asarray(critical, dtype=float))[::-1]
    allowed = int(math.floor(target * len(c) + 1e-9))
    value = float(c[allowed]) if allowed < len(c) else 0.0
    if math.isinf(value):
        # more runs than allowed are stopped whatever this threshold is (by another bar of the detector): the
        # most this threshold can do is stop none of the others
        finite = c[np.isfinite(c)]
        value = float(finite.max()) if finite.size else 0.0
    return value


@dataclass
class FalseStopCheck:
    stopped: int
    runs: int
    rate: float
    low: float
    high: float


def false_stop_check(stopped: int, runs: int, confidence: float = 0.95) -> FalseStopCheck:
    """False-stop rate with its exact two-sided confidence interval (scipy's Clopper-Pearson)."""
    ci = stats.binomtest(stopped, runs).proportion_ci(confidence_level=confidence, method="exact")
    return FalseStopCheck(stopped, runs, stopped / runs, float(ci.low), float(ci.high))


def calibrate(name: str, healthy_runs, target: float, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Calibrated parameters of `name` on these healthy runs (lists of checkpoints); other parameters
    are `base` (default: the detector's current configured ones)."""
    det = make_detector(name, **(base or {}))
    params = det.params() if base is None else dict(base)
    groups = calibration_groups(det, healthy_runs)
    if not groups:
        raise ValueError(f"detector '{name}' has no threshold to calibrate")
    for key, runs in groups:
        crit = np.array([critical_threshold(name, params, cps, key=key) for cps in runs])
        value = fit_threshold(crit, target)
        if not math.isfinite(value):
            raise ValueError(f"detector '{name}': more than {target:.1%} of the healthy runs are stopped at any "
                             f"{key}; it cannot reach that false-stop rate on this fleet")
        # a hair above the critical value of the last run allowed to stay (stops are `statistic > threshold`);
        # at the bottom of the range exactly its floor (a run's critical value there means "not stopped at it")
        floor = _RANGE[key][0]
        params[key] = round(value + 1e-6, 6) if value > floor else floor
    return params


def has_proxy(checkpoints) -> bool:
    """Whether a run records the proxy reward (the reward-hacking signature needs it)."""
    return any(cp.reward == cp.reward for cp in checkpoints)


def calibration_groups(det: Detector, runs) -> list[tuple[str, list]]:
    """The (threshold, healthy runs) pairs a fleet calibrates, each to the target rate on its own runs. A
    detector with a separate bar for runs without a proxy (`threshold_decline`, switched on) fits it on those
    runs and its usual bar on the runs that record the proxy; any other detector fits one bar on all runs."""
    decline = getattr(det, "threshold_decline", None)
    if decline is not None and getattr(det, "hold", 0) >= 1:
        proxy = [cps for cps in runs if has_proxy(cps)]
        plain = [cps for cps in runs if not has_proxy(cps)]
        groups = [(threshold_key(det, proxy), proxy)] if proxy else []
        return groups + ([(decline, plain)] if plain else [])
    key = threshold_key(det, runs)
    return [(key, list(runs))] if key is not None else []


def write_config(name: str, params: dict[str, Any], target: float, fleet: str, runs: int, stopped: int,
                 path: Path | None = None, note: str = "") -> Path:
    """Record the calibrated thresholds in the versioned config (version bumped, a changelog line added). An existing
    config is read by the one strict reader (`common.config.read_config_mapping`, as `make_detector` reads it): an
    empty file, a key given twice, a top level that is not a mapping, a `version` that is not a whole number, a
    `detectors` that is not a mapping or a `changelog` that is not a list is BadInput naming the file and the field,
    and the file is left as it was. A missing file is started."""
    import yaml

    from common.config import read_config_mapping
    from common.errors import BadInput

    path = path or DETECTOR_CONFIG
    doc: dict[str, Any] = read_config_mapping(path, "detector config")[0] if path.is_file() else {}
    where = f"detector config: '{path}'"
    v = doc.get("version", 0)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise BadInput(f"{where}: field 'version': {v!r} is not a whole number >= 0 (write it unquoted, e.g. "
                       "version: 9)")
    for field, kind, example in (("detectors", dict, "a mapping of detector names"),
                                 ("changelog", list, "a list of lines")):
        if field in doc and not isinstance(doc[field], kind):
            raise BadInput(f"{where}: field '{field}' must be {example}, not a {type(doc[field]).__name__}")
    version = v + 1
    doc["version"] = version
    doc.setdefault("detectors", {})[name] = {
        "params": params,
        "target_false_stop_rate": target,
        "calibrated_on": {"fleet": fleet, "healthy_runs": runs, "stopped": stopped, "date": str(date.today())},
    }
    doc.setdefault("changelog", []).append(
        f"v{version}: {name} {params} calibrated to a {target:.1%} false-stop rate on {runs} healthy runs of "
        f"{fleet} ({stopped} stopped){'; ' + note if note else ''}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=110))
    return path
