"""Prometheus metrics under the runbook's conventions (prometheus-client).

Three kinds of series, kept apart to contain cardinality:
- fleet metrics, never labelled with run_id: `rlapi_step_phase_seconds{phase}` (histogram of per-step
  phase wall time), `rlapi_steps_total`, `rlapi_alerts_total{alert,severity}`, `rlapi_runs{state}`;
- per-tenant aggregates with a bounded tenant label (the configured tenants, then up to `max_tenants`
  more; the rest fold into "other"): `rlapi_tenant_gpu_seconds_total{tenant,phase}`,
  `rlapi_tenant_tokens_total{tenant,kind}`, `rlapi_tenant_cost_total{tenant}`;
- per-run series, the only ones with run_id, all named `rlapi_run_*` (short retention; removed when the
  run ends): step, reward, KL, entropy, eval-gate score, phase seconds of the last step, GPU-seconds
  spent, current state.

Exposed on an HTTP port when asked (`serve(port)`), written as a text exposition file otherwise (`write`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, write_to_textfile
from prometheus_client.exposition import start_http_server

PHASES = ("rollout", "score", "sync", "optim", "eval")
PER_RUN_PREFIX = "rlapi_run_"
OTHER_TENANT = "other"
STATES = ("QUEUED", "PROVISIONING", "RUNNING", "DEGRADED", "PAUSED_BY_GATE", "SUCCEEDED", "FAILED")


class PlatformMetrics:
    def __init__(self, tenants: Iterable[str] = (), max_tenants: int = 50):
        self.registry = CollectorRegistry()
        self.max_tenants = max_tenants
        self._tenants: set[str] = set(tenants)
        self._configured = len(self._tenants)
        self._run_tenant: dict[str, str] = {}
        self._run_state: dict[str, str] = {}
        self._run_phases: dict[str, set[str]] = {}
        r = self.registry
        # fleet (no run_id, ever)
        self.step_phase = Histogram(
            "rlapi_step_phase_seconds", "Wall-clock seconds of one training-step phase, all runs", ["phase"],
            registry=r, buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )
        self.steps = Counter("rlapi_steps", "Committed optimizer steps, all runs", registry=r)
        self.alerts = Counter("rlapi_alerts", "Run-health alerts fired", ["alert", "severity"], registry=r)
        self.runs = Gauge("rlapi_runs", "Runs currently in each state", ["state"], registry=r)
        for s in STATES:
            self.runs.labels(s).set(0)
        # per tenant (bounded label set)
        self.tenant_gpu = Counter(
            "rlapi_tenant_gpu_seconds", "GPU-seconds by tenant and phase", ["tenant", "phase"], registry=r
        )
        self.tenant_tokens = Counter(
            "rlapi_tenant_tokens", "Tokens by tenant (kind: generated|trained)", ["tenant", "kind"],
            registry=r,
        )
        self.tenant_cost = Counter(
            "rlapi_tenant_cost", "Cost by tenant (ledger currency)", ["tenant"], registry=r
        )
        # per run (run_id; removed at run end)
        lab = ["run_id", "tenant"]
        self.run_step = Gauge("rlapi_run_step", "Last committed step of the run", lab, registry=r)
        self.run_reward = Gauge("rlapi_run_reward_mean", "Mean training reward, last step", lab, registry=r)
        self.run_kl = Gauge("rlapi_run_kl", "KL to the reference, last step", lab, registry=r)
        self.run_entropy = Gauge("rlapi_run_entropy", "Policy entropy, last step", lab, registry=r)
        self.run_eval = Gauge("rlapi_run_eval_score", "Last eval-gate score", lab, registry=r)
        self.run_gpu = Gauge("rlapi_run_gpu_seconds", "GPU-seconds spent so far", lab, registry=r)
        self.run_phase = Gauge(
            "rlapi_run_step_phase_seconds", "Phase wall time of the last step", [*lab, "phase"], registry=r
        )
        self.run_state = Gauge(
            "rlapi_run_state", "1 for the run's current state", [*lab, "state"], registry=r
        )

    # ------------------------------------------------------------------ labels
    def tenant_label(self, tenant: str | None) -> str:
        """The bounded tenant label: known tenants, newcomers while room remains, then 'other'."""
        if not tenant:
            return OTHER_TENANT
        if tenant in self._tenants:
            return tenant
        if len(self._tenants) < self._configured + self.max_tenants:
            self._tenants.add(tenant)
            return tenant
        return OTHER_TENANT

    def _run(self, run_id: str, tenant: str | None) -> tuple[str, str]:
        t = self._run_tenant.setdefault(run_id, self.tenant_label(tenant))
        return run_id, t

    # ------------------------------------------------------------------ feeds
    def observe_step(self, run_id: str, tenant: str | None, record: Any, n_gpus: int = 1) -> None:
        """One trainer step (a `training.metrics.StepRecord`, duck-typed)."""
        key = self._run(run_id, tenant)
        tlabel = key[1]
        phases = dict(getattr(record, "phase_seconds", {}) or {})
        spent = 0.0
        for phase in PHASES:
            sec = float(phases.get(phase, 0.0))
            self.step_phase.labels(phase).observe(sec)
            self.run_phase.labels(*key, phase).set(sec)
            self._run_phases.setdefault(run_id, set()).add(phase)
            if sec:
                self.tenant_gpu.labels(tlabel, phase).inc(sec * n_gpus)
            spent += sec * n_gpus
        self.steps.inc()
        self.tenant_tokens.labels(tlabel, "generated").inc(int(record.tokens_generated))
        self.tenant_tokens.labels(tlabel, "trained").inc(int(record.tokens_trained))
        self.run_step.labels(*key).set(record.step)
        for gauge, value in ((self.run_reward, record.reward_mean), (self.run_kl, record.kl),
                             (self.run_entropy, record.entropy)):
            if value == value:
                gauge.labels(*key).set(value)
        if record.gold_eval == record.gold_eval:
            self.run_eval.labels(*key).set(record.gold_eval)
        self.run_gpu.labels(*key).inc(spent)

    def observe_cost(self, tenant: str | None, cost: float) -> None:
        if cost > 0 and math.isfinite(cost):
            self.tenant_cost.labels(self.tenant_label(tenant)).inc(cost)

    def observe_alert(self, event: Any) -> None:
        self.alerts.labels(event.alert, event.severity).inc()

    def set_state(self, run_id: str, tenant: str | None, state: str) -> None:
        key = self._run(run_id, tenant)
        state = str(getattr(state, "value", state))
        old = self._run_state.get(run_id)
        if old is not None:
            self.runs.labels(old).dec()
            self.run_state.remove(*key, old)
        self.runs.labels(state).inc()
        self.run_state.labels(*key, state).set(1)
        self._run_state[run_id] = state

    def end_run(self, run_id: str) -> None:
        """Drop the run's per-run series (the fleet and tenant aggregates keep its contribution)."""
        if run_id not in self._run_tenant:
            return
        key = (run_id, self._run_tenant.pop(run_id))
        for g in (self.run_step, self.run_reward, self.run_kl, self.run_entropy, self.run_eval, self.run_gpu):
            try:
                g.remove(*key)
            except KeyError:
                pass
        for phase in self._run_phases.pop(run_id, set()):
            self.run_phase.remove(*key, phase)
        state = self._run_state.pop(run_id, None)
        if state is not None:
            self.run_state.remove(*key, state)
            self.runs.labels(state).dec()

    # ------------------------------------------------------------------ exposition
    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def write(self, path: str | Path) -> Path:
        """Write the text exposition format (for node_exporter's textfile collector or an artifact)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_to_textfile(str(path), self.registry)
        return path

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve /metrics on `port` (0 picks a free one) in a daemon thread; returns the HTTP server."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server
