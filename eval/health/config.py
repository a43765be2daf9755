"""The alert thresholds file (configs/alerts.yaml): its pydantic schema and its loader, which checks every
field and builds every configured alert (each algorithm's and each profile's parameters too) before anything
runs, so a bad file is one line naming the field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from common.config import config_dir, config_path, load_config
from common.errors import BadInput
from eval.health.base import HealthAlert
from eval.registry import ALERTS

Severity = Literal["paging", "advisory"]
DEFAULT_ALERTS_FILE = config_dir() / "alerts.yaml"

ParamValue = float | int | bool | None

#: what a run of each trainer algorithm (training/job/config.py `TrainConfig.algorithm`) has beyond the common per-step
#: figures: a learned critic (ppo; `training.job.config.uses_critic`) or groups of completions per prompt (grpo, rloo:
#: StepRecord.group_flat_frac / group_reward_std, NaN for ppo). An alert that `requires` what the run lacks is not
#: evaluated on it; an algorithm not listed here (or none given) gets every alert. eval/ does not import training/:
#: tests/eval/test_health_groups.py checks this table against `uses_critic` for every algorithm the trainer knows.
ALGORITHM_HAS: dict[str, frozenset[str]] = {
    "ppo": frozenset({"critic"}),
    "grpo": frozenset({"groups"}),
    "rloo": frozenset({"groups"}),
}
#: how the catalog reports an alert left out for the run's algorithm, by what the alert requires
NOT_EVALUATED: dict[str, str] = {
    "critic": "not evaluated: no critic",
    "groups": "not evaluated: no groups (one completion per prompt)",
}


def not_evaluated_reason(alert: type[HealthAlert] | HealthAlert, algorithm: str | None) -> str | None:
    """Why `alert` does not apply to a run of `algorithm` ("not evaluated: no critic"), or None when it does."""
    need = alert.requires
    has = ALGORITHM_HAS.get(algorithm) if algorithm is not None else None
    if need is None or has is None or need in has:
        return None
    return NOT_EVALUATED[need]


class Demote(BaseModel):
    """Route an alert as advisory instead of paging for these algorithms or tenants (while retuning)."""

    model_config = ConfigDict(extra="forbid")
    algorithms: list[str] = Field(default_factory=list)
    tenants: list[str] = Field(default_factory=list)


class FalsePositiveRecord(BaseModel):
    """The alert's measured false-positive rate: fraction of healthy runs on which it fired."""

    model_config = ConfigDict(extra="forbid")
    rate: float = Field(ge=0, le=1)
    healthy_runs: int = Field(ge=1)
    measured_by: str


class AlertConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    severity: Severity = "paging"
    #: what a firing paging alert does to the customer-facing run state
    action: Literal["degrade", "pause"] = "degrade"
    params: dict[str, ParamValue] = Field(default_factory=dict)
    #: per-algorithm parameter overrides (e.g. a KL ceiling per algorithm)
    params_by_algorithm: dict[str, dict[str, ParamValue]] = Field(default_factory=dict)
    demote: Demote = Field(default_factory=Demote)
    false_positive_rate: FalsePositiveRecord | None = None


class AlertsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1)
    changelog: list[str] = Field(default_factory=list)
    alerts: dict[str, AlertConfig]
    #: named parameter overlays, e.g. `canary`: shorter windows for the short fault-injection runs
    profiles: dict[str, dict[str, dict[str, ParamValue]]] = Field(default_factory=dict)


def _build_alert(
    name: str, cfg: AlertConfig, algorithm: str | None, source: str, overlay: dict | None = None,
    overlay_where: str = "",
) -> HealthAlert:
    cls = ALERTS[name]
    params = dict(cfg.params)
    where = f"alerts.{name}.params"
    if algorithm is not None and algorithm in cfg.params_by_algorithm:
        params.update(cfg.params_by_algorithm[algorithm])
        where = f"alerts.{name}.params_by_algorithm.{algorithm}"
    if overlay:
        params.update(overlay)
        where = overlay_where
    import inspect

    allowed = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    for key in params:
        if key not in allowed:
            raise BadInput(
                f"{source}: field '{where}.{key}': unknown parameter (expected one of: {', '.join(allowed)})"
            )
    try:
        return cls(**params)
    except (ValueError, TypeError) as err:
        raise BadInput(f"{source}: field '{where}': {err}") from None


def load_alerts_config(path: str | Path | None = None) -> AlertsConfig:
    """Read and validate the thresholds file; any problem is a one-line BadInput naming the field."""
    from common.validate import check_finite_tree

    path = config_path(path) if path is not None else DEFAULT_ALERTS_FILE
    source = str(path)
    if not path.is_file():
        raise BadInput(f"alerts: file '{path}' not found (pass a thresholds YAML like configs/alerts.yaml)")
    # .nan/.inf or astronomic thresholds would silence an alert (or fire it always)
    cfg = load_config(AlertsConfig, path, field="alerts",
                      check=lambda raw, label: check_finite_tree(raw, label, max_abs=1e12))
    for name in cfg.alerts:
        if name not in ALERTS:
            choices = ", ".join(ALERTS)
            raise BadInput(f"{source}: field 'alerts.{name}': unknown alert (choose from: {choices})")
    for name, acfg in cfg.alerts.items():
        _build_alert(name, acfg, None, source)
        for algo in acfg.params_by_algorithm:
            _build_alert(name, acfg, algo, source)
    for profile, overlays in cfg.profiles.items():
        for name, overlay in overlays.items():
            where = f"profiles.{profile}.{name}"
            if name not in cfg.alerts:
                raise BadInput(f"{source}: field '{where}': unknown or unconfigured alert")
            _build_alert(name, cfg.alerts[name], None, source, overlay, where)
    return cfg
