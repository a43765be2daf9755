"""The run-health alert catalog: the runbook's seven per-run detectors over windows of training steps,
plus one run-mechanics alert (weight-sync stall) that the frozen-sync canary needs, two on the off-policy
side of inter-step overlap (low importance-weight ESS, carried-vs-fresh length drift), and two on the critic-free
group methods (flat reward groups, group reward-spread collapse; grpo and rloo runs only).

Each alert is a `Detector` (eval/detector_base.py): a streaming monitor for live runs
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

The package, one module per concern:
- `kernels`: the window kernels and array helpers both forms share;
- `base`: `HealthCheckpoint`, `SIGNALS` and the alert base (`HealthAlert`, the streaming monitor base);
- `policy_alerts`: alerts 1-4 (reward band, KL blowup, entropy collapse, reward hacking);
- `run_alerts`: alerts 5-8 (dead run, gradient-norm spike, rollout drift, weight-sync stall);
- `offpolicy_alerts`: alerts 9-10 of inter-step overlap (low importance-weight ESS, carried-vs-fresh length drift);
- `group_alerts`: alerts 11-12 of the group methods (flat reward groups, group reward-spread collapse);
- `config`: the thresholds file's schema and loader (`load_alerts_config`), and which alerts apply to which
  algorithm (`ALGORITHM_HAS`: no critic alert on a critic-free run, no group alert on ppo);
- `catalog`: `Catalog` (its `not_evaluated`: the alerts left out for the run's algorithm, with why),
  `CatalogMonitor`, `AlertEvent`, `replay_alert`;
- `fleet`: the synthetic fleet and the false-positive measurement.
The alerts are listed by name in `eval/registry.py` (`ALERTS`), with the early-stop detectors.

The names below are importable from `eval.health` itself; each is loaded from its module when first asked
for, so `import eval.health` imports nothing else and no import order matters (the registry imports the alert
modules, the catalog imports the registry).

Plain numpy: no Prefect or MLflow here.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    "eval.health.kernels": ("CHUNK_RUNS",),
    "eval.health.base": ("HealthCheckpoint", "SIGNALS", "series_from_checkpoints", "HealthAlert"),
    "eval.health.policy_alerts": ("RewardBand", "KLBlowup", "EntropyCollapse", "RewardHacking"),
    "eval.health.run_alerts": ("DeadRun", "GradNormSpike", "DRIFT_SIGNALS", "RolloutDrift", "SyncStall"),
    "eval.health.offpolicy_alerts": ("LowESS", "CarriedLengthDrift"),
    "eval.health.group_alerts": ("FlatGroups", "GroupSpreadCollapse"),
    "eval.health.config": (
        "Severity", "DEFAULT_ALERTS_FILE", "ParamValue", "Demote", "FalsePositiveRecord", "AlertConfig",
        "AlertsConfig", "load_alerts_config", "ALGORITHM_HAS", "NOT_EVALUATED", "not_evaluated_reason",
    ),
    "eval.health.catalog": ("AlertEvent", "Catalog", "CatalogMonitor", "replay_alert"),
    "eval.health.fleet": ("FAULTS", "synthetic_fleet", "measure_false_positive_rates"),
    "eval.registry": ("ALERTS",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'eval.health' has no attribute '{name}'")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
