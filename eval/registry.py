"""Every early-stop detector and every run-health alert, by name: the one registry.

Each family is listed here explicitly, class by class, so what a name means never depends on which module
was imported first: nothing registers itself, and the mappings are read-only. To add a detector or an alert, write its
class in its own module and list it below.

    detector_class("divergence")        # -> Divergence (ValueError naming the choices if unknown)
    alert_class("kl_blowup")            # -> KLBlowup
    EARLY_STOP_DETECTORS                # name -> class: the rules an eval gate runs to stop a run
    ALERTS                              # name -> class: the run-health catalog (configs/alerts.yaml)
    DETECTORS                           # both: every name `make_detector` and `rlhfops detect` accept

Build one with `eval.detectors.make_detector(name, **params)` (class defaults, then the calibrated thresholds
in configs/detectors.yaml, then `params`), or an alert catalog with `eval.health.Catalog`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from eval.detector_base import Detector
from eval.health.base import HealthAlert
from eval.health.group_alerts import FlatGroups, GroupSpreadCollapse
from eval.health.offpolicy_alerts import CarriedLengthDrift, LowESS
from eval.health.policy_alerts import EntropyCollapse, KLBlowup, RewardBand, RewardHacking
from eval.health.run_alerts import DeadRun, GradNormSpike, RolloutDrift, SyncStall
from eval.paired import PairedStop
from eval.patience import NoisePatience
from eval.stop_rules import Bocpd, Cusum, Divergence, EvalStop, LossPlateau, MinDeltaPatience, StopAt


def _by_name(*classes: type[Detector], taken: Mapping[str, type[Detector]] | None = None) -> Mapping:
    """name -> class, in the order given; a name used twice (here or in `taken`) is a programming error."""
    out: dict[str, type[Detector]] = {}
    for cls in classes:
        if cls.name in out or (taken is not None and cls.name in taken):
            raise RuntimeError(f"eval/registry.py: the name '{cls.name}' is registered twice")
        out[cls.name] = cls
    return MappingProxyType(out)


#: the early-stop detectors: what an eval gate runs to stop a declining run (the scheduler's early-stop
#: wrapper, the live platform, `rlhfops detect`), the choices of the `rlhf-job` form's `detector`
EARLY_STOP_DETECTORS: Mapping[str, type[Detector]] = _by_name(
    EvalStop, StopAt, LossPlateau, MinDeltaPatience, Cusum, Bocpd, Divergence, NoisePatience, PairedStop,
)

#: the run-health alerts, in the runbook's order (1-7 algorithmic, 8 run mechanics), then the off-policy pair of
#: inter-step overlap (9 low importance-weight ESS, 10 carried-vs-fresh length drift), then the pair of the critic-free
#: group methods (11 flat reward groups, 12 group reward-spread collapse); configs/alerts.yaml configures them by these
#: names
ALERTS: Mapping[str, type[HealthAlert]] = _by_name(
    RewardBand, KLBlowup, EntropyCollapse, RewardHacking, DeadRun, GradNormSpike, RolloutDrift, SyncStall,
    LowESS, CarriedLengthDrift, FlatGroups, GroupSpreadCollapse,
    taken=EARLY_STOP_DETECTORS,
)

#: every name `make_detector` builds: the early-stop detectors, then the alerts (an alert replays a run as a
#: detector too: `rlhfops detect --detector kl_blowup`)
DETECTORS: Mapping[str, type[Detector]] = MappingProxyType({**EARLY_STOP_DETECTORS, **ALERTS})


def detector_class(name: str) -> type[Detector]:
    """The class registered under `name` (any case), early-stop detector or alert; ValueError names the choices."""
    cls = DETECTORS.get(name.lower())
    if cls is None:
        raise ValueError(f"unknown detector '{name}' (choose from: {', '.join(sorted(DETECTORS))})")
    return cls


def alert_class(name: str) -> type[HealthAlert]:
    """The run-health alert registered under `name`; ValueError names the choices."""
    cls = ALERTS.get(name)
    if cls is None:
        raise ValueError(f"unknown alert '{name}' (choose from: {', '.join(ALERTS)})")
    return cls
