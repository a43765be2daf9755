"""The catalog: the configured alerts of one algorithm with their routing (paging or advisory per tenant),
scanned over a fleet of recorded runs (`Catalog.scan`) or fed one live run's steps (`CatalogMonitor`), and
`replay_alert`, which streams one recorded run through one alert to say what fired.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import BadInput
from eval.detector_base import NAN, Checkpoint
from eval.health.base import SIGNALS, HealthAlert, HealthCheckpoint, _AlertMonitor
from eval.health.config import (
    DEFAULT_ALERTS_FILE,
    AlertsConfig,
    Severity,
    _build_alert,
    load_alerts_config,
    not_evaluated_reason,
)
from eval.health.kernels import CHUNK_RUNS, _as_arrays, _lengths
from eval.registry import ALERTS


@dataclass(slots=True)
class AlertEvent:
    """One alert firing on one run."""

    alert: str
    severity: Severity
    action: str
    step: float
    index: int
    detail: str
    reason: str
    first_response: str
    #: "algorithmic" or "mechanics" (see HealthAlert.layer)
    layer: str = "algorithmic"


class Catalog:
    """The configured set of alerts for one algorithm, with routing (paging or advisory per tenant). An alert that
    does not apply to the algorithm (a critic alert on grpo/rloo, a group alert on ppo: eval/health/config.py
    ALGORITHM_HAS) is left out of `alerts` and listed in `not_evaluated` with the reason ("not evaluated: no
    critic")."""

    def __init__(
        self, alerts: dict[str, HealthAlert], config: AlertsConfig | None = None, algorithm: str | None = None,
        not_evaluated: dict[str, str] | None = None, profile: str | None = None,
    ):
        self.alerts = alerts
        self.config = config
        self.algorithm = algorithm
        #: configured alerts left out for this algorithm -> why ("not evaluated: no critic")
        self.not_evaluated = dict(not_evaluated or {})
        self.profile = profile

    @classmethod
    def from_config(
        cls, config: AlertsConfig, algorithm: str | None = None, source: str = "alerts",
        profile: str | None = None,
    ) -> Catalog:
        if profile is not None and profile not in config.profiles:
            raise BadInput(f"{source}: no profile '{profile}' (have: {', '.join(config.profiles) or 'none'})")
        overlays = config.profiles.get(profile, {}) if profile else {}
        alerts, skipped = {}, {}
        for name, acfg in config.alerts.items():
            why = not_evaluated_reason(ALERTS[name], algorithm)
            if why is not None:
                skipped[name] = why
                continue
            alerts[name] = _build_alert(name, acfg, algorithm, source, overlays.get(name), f"profiles.{profile}.{name}")
        return cls(alerts, config, algorithm, skipped, profile)

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, algorithm: str | None = None, profile: str | None = None
    ) -> Catalog:
        source = str(path or DEFAULT_ALERTS_FILE)
        return cls.from_config(load_alerts_config(path), algorithm, source=source, profile=profile)

    def for_algorithm(self, algorithm: str | None) -> Catalog:
        """The same thresholds file and profile built for `algorithm` (itself when it already is, or when it was not
        built from a file)."""
        if algorithm == self.algorithm or self.config is None:
            return self
        return Catalog.from_config(self.config, algorithm, profile=self.profile)

    @classmethod
    def defaults(cls) -> Catalog:
        return cls({name: klass() for name, klass in ALERTS.items()})

    @property
    def version(self) -> int | None:
        return self.config.version if self.config else None

    def at_spacing(self, spacing: float) -> Catalog:
        scaled = {k: a.at_spacing(spacing) for k, a in self.alerts.items()}
        return Catalog(scaled, self.config, self.algorithm, self.not_evaluated, self.profile)

    def severity(self, name: str, tenant: str | None = None) -> Severity:
        if self.config is None or name not in self.config.alerts:
            return "paging"
        acfg = self.config.alerts[name]
        if acfg.severity == "advisory":
            return "advisory"
        if self.algorithm is not None and self.algorithm in acfg.demote.algorithms:
            return "advisory"
        if tenant is not None and tenant in acfg.demote.tenants:
            return "advisory"
        return "paging"

    def action(self, name: str) -> str:
        if self.config is None or name not in self.config.alerts:
            return "pause" if name in ("reward_hacking", "kl_blowup") else "degrade"
        return self.config.alerts[name].action

    def scan(
        self, series: dict[str, np.ndarray], only: list[str] | None = None, workers: int = 2
    ) -> dict[str, np.ndarray]:
        """First-fire index per run for every alert (or those in `only`), vectorised over runs. Work is
        split into cache-sized chunks of runs and shared by `workers` threads (numpy releases the GIL)."""
        names = only if only is not None else list(self.alerts)
        arrays, n_runs, n_steps = _as_arrays(series)
        out = {name: np.empty(n_runs, dtype=np.int64) for name in names}
        jobs: list[tuple[list[str], int, int]] = []
        chunked = [n for n in names if not self.alerts[n].whole_fleet]
        for n in names:
            if self.alerts[n].whole_fleet:
                jobs.append(([n], 0, n_runs))
        for lo in range(0, n_runs, CHUNK_RUNS):
            jobs.append((chunked, lo, min(lo + CHUNK_RUNS, n_runs)))

        def run(job: tuple[list[str], int, int]) -> None:
            job_names, lo, hi = job
            part = {k: v[lo:hi] for k, v in arrays.items()}
            lengths = _lengths(part, hi - lo, n_steps)
            for n in job_names:
                out[n][lo:hi] = self.alerts[n].scan_chunk(part, lengths)

        if workers <= 1:
            for job in jobs:
                run(job)
        else:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=workers) as pool:
                list(pool.map(run, jobs))
        return out

    def start(self, tenant: str | None = None, only: list[str] | None = None) -> CatalogMonitor:
        names = only if only is not None else list(self.alerts)
        return CatalogMonitor(self, {n: self.alerts[n] for n in names}, tenant)


class CatalogMonitor:
    """All alerts on one live run. `observe` returns the alerts that fired at this checkpoint (each
    alert fires at most once per run; afterwards it is latched and no longer fed)."""

    def __init__(self, catalog: Catalog, alerts: dict[str, HealthAlert], tenant: str | None):
        self.catalog = catalog
        self.tenant = tenant
        self.monitors: dict[str, _AlertMonitor] = {n: a.start() for n, a in alerts.items()}  # type: ignore[misc]
        self.fired: dict[str, AlertEvent] = {}
        self.index = 0

    def observe(self, cp: Checkpoint) -> list[AlertEvent]:
        events = []
        for name, mon in self.monitors.items():
            if name in self.fired:
                continue
            if mon.observe(cp):
                alert = self.catalog.alerts[name]
                ev = AlertEvent(
                    alert=name, severity=self.catalog.severity(name, self.tenant),
                    action=self.catalog.action(name), step=cp.step, index=self.index, detail=mon.detail,
                    reason=alert.reason, first_response=alert.first_response, layer=alert.layer,
                )
                self.fired[name] = ev
                events.append(ev)
        self.index += 1
        return events


def replay_alert(alert: HealthAlert, run: dict[str, np.ndarray]) -> tuple[int, str]:
    """Stream one run (1-D arrays by signal name) through a fresh monitor: (fire index or -1, detail)."""
    n = len(next(iter(run.values())))
    names = [k for k in SIGNALS if k in run]
    mon = alert.start()
    for t in range(n):
        vals = {k: float(run[k][t]) for k in names}
        if "step" in vals and vals["step"] != vals["step"]:
            break  # NaN padding: the run ended
        vals.setdefault("step", float(t))
        vals.setdefault("eval_score", NAN)
        if mon.observe(HealthCheckpoint(**vals)):
            return t, mon.detail  # type: ignore[attr-defined]
    return -1, ""
