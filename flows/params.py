"""Parameter types of the deployed flows: what the Prefect UI's run form offers.

Prefect builds a deployment's form from the flow's signature (`prefect.utilities.callables.parameter_schema`):
a `Literal` becomes a drop-down of its values, and the `Args:` section of the flow's docstring becomes each
field's description. The choices here mirror the registries in the domain code; tests/flows/test_flow_forms.py
fails when they drift apart.
"""

from __future__ import annotations

from typing import Literal

#: training.trainer.OVERLAPS
Overlap = Literal["none", "intra", "inter", "full"]
#: eval.registry.EARLY_STOP_DETECTORS
#: (the first is the platform default, eval.registry.DEFAULT_DETECTOR)
DetectorName = Literal["noisepatience", "divergence", "evalstop", "stopat", "lossplateau", "patience", "cusum", "bocpd"]
#: scheduling.experiments.EXPERIMENTS
ExperimentName = Literal["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8"]
#: the alert catalog's profiles in configs/alerts.yaml (None: production thresholds)
AlertProfile = Literal["canary"]
#: infra.provision.RUNNERS
RunnerKind = Literal["thread", "ray"]
#: training.canaries.CANARIES
CanaryName = Literal["control", "frozen_sync", "constant_reward", "oversized_lr", "gameable_reward"]
