"""Per-tenant accounting: GPU-seconds per run split by phase, tokens, and cost per committed optimizer step.

    ledger = Ledger(load_prices())                       # prices per GPU kind: configs/prices.yaml
    ledger.charge("run-7", "acme", "h100", "rollout", gpu_seconds=12.5, tokens_generated=4096)
    ledger.charge_step("run-7", "acme", "h100", step_record, n_gpus=2)   # a trainer StepRecord
    ledger.describe("run-7", algorithm="grpo")           # the job's attributes: columns of its row in frame()
    ledger.run_totals(), ledger.tenant_totals(), ledger.cluster_total(), ledger.frame()

Arithmetic is exact: GPU time is kept in integer micro-GPU-seconds and cost as a `Fraction` of the
currency unit (decimal prices), so per-tenant sums equal the cluster total exactly, not within a tolerance.
The trainer (per step) and the scheduling simulator (per finished job) feed the same ledger.

The phases are the trainer's wall-clock phases, whatever models a step runs: a critic-free job (`algorithm: grpo` or
`rloo`) has no value model to score or update, so its `score` and `optim` seconds hold none of that work and it is
charged for what it ran; nothing here counts models. A job run's row says which algorithm it trained (`describe`,
called where the job's supervisor is made: `training.job.lifecycle.make_supervisor`), so a bill splits by algorithm.

Thread safety: the platform round charges from up to 8 job threads while others read totals. Every
charge and every read of the rows holds one lock; reads copy the rows under it and roll up outside it,
so a read never iterates a dict that another thread is growing, and no read-modify-write of a row is lost.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.config import config_dir, config_path, load_config
from common.errors import BadInput
from training.job.request import check_gpu_kind

#: wall-clock phases of one step (same names as training.metrics.PHASES; a test keeps them equal)
PHASES = ("rollout", "score", "sync", "optim", "eval", "reward_fn")
#: what a run's row says about its job besides the tenant (`Ledger.describe`): columns of `frame()`, empty for a run
#: never described (a simulated job)
JOB_ATTRS = ("algorithm",)
#: the kind whose price the tenant's function CPU seconds are charged at (configs/prices.yaml)
CPU_KIND = "cpu"
MICRO = 1_000_000
DEFAULT_PRICES_FILE = config_dir() / "prices.yaml"


class PriceTable(BaseModel):
    model_config = ConfigDict(extra="forbid")
    currency: str = "USD"
    #: price of one GPU-hour per GPU kind, as a decimal string ("4.00")
    gpu_hour: dict[str, str]
    #: known tenants (bounded label set for per-tenant metrics)
    tenants: list[str] = Field(default_factory=list)

    @field_validator("gpu_hour")
    @classmethod
    def _decimal_prices(cls, v: dict[str, str]) -> dict[str, str]:
        for kind, price in v.items():
            try:
                d = Decimal(str(price))
            except InvalidOperation:
                raise ValueError(f"price of '{kind}' must be a decimal number, got {price!r}") from None
            if not d.is_finite() or d < 0:
                raise ValueError(f"price of '{kind}' must be >= 0, got {price!r}")
        return {k: str(p) for k, p in v.items()}

    def hourly(self, gpu_kind: str) -> Fraction:
        return Fraction(Decimal(self.gpu_hour[gpu_kind]))


def load_prices(path: str | Path | None = None) -> PriceTable:
    path = config_path(path) if path is not None else DEFAULT_PRICES_FILE
    if not path.is_file():
        raise BadInput(f"prices: file '{path}' not found (see configs/prices.yaml)")
    return load_config(PriceTable, path, field="prices")


@dataclass
class Totals:
    gpu_us: int = 0
    gpu_us_by_phase: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PHASES, 0))
    tokens_generated: int = 0
    tokens_trained: int = 0
    steps: int = 0
    cost: Fraction = Fraction(0)

    @property
    def gpu_seconds(self) -> float:
        return self.gpu_us / MICRO

    @property
    def cost_per_step(self) -> Fraction | None:
        """Cost per committed optimizer step (None before the first step)."""
        return self.cost / self.steps if self.steps else None

    def add(self, other: Totals) -> None:
        self.gpu_us += other.gpu_us
        for p, v in other.gpu_us_by_phase.items():
            self.gpu_us_by_phase[p] += v
        self.tokens_generated += other.tokens_generated
        self.tokens_trained += other.tokens_trained
        self.steps += other.steps
        self.cost += other.cost


class Ledger:
    def __init__(self, prices: PriceTable | None = None):
        self.prices = prices if prices is not None else load_prices()
        # (run_id, gpu_kind, phase) -> [gpu_us, tokens_generated, tokens_trained, steps]
        self._rows: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self.tenant_of: dict[str, str] = {}
        self.attrs_of: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def describe(self, run_id: str, **attrs: str) -> None:
        """Record the job attributes of `run_id` (`JOB_ATTRS`: its training `algorithm`); `frame()` shows them beside
        the tenant. Charges are unchanged: the attributes are labels, not money."""
        unknown = sorted(set(attrs) - set(JOB_ATTRS))
        if unknown:
            raise ValueError(f"ledger: unknown job attribute(s) {', '.join(unknown)} (known: {', '.join(JOB_ATTRS)})")
        with self._lock:
            self.attrs_of.setdefault(run_id, {}).update({k: str(v) for k, v in attrs.items() if v is not None})

    def charge(
        self, run_id: str, tenant: str, gpu_kind: str, phase: str, gpu_seconds: float,
        tokens_generated: int = 0, tokens_trained: int = 0, steps: int = 0,
    ) -> None:
        """Add GPU time (GPU-seconds: wall seconds x GPUs) and counts to one run's phase."""
        if phase not in PHASES:
            raise ValueError(f"ledger: unknown phase '{phase}' (choose from: {', '.join(PHASES)})")
        check_gpu_kind(gpu_kind, self.prices.gpu_hour, field="ledger.gpu_kind")  # the one price check
        if not math.isfinite(gpu_seconds) or gpu_seconds < 0:
            raise ValueError(f"ledger: gpu_seconds must be finite and >= 0, got {gpu_seconds}")
        if min(tokens_generated, tokens_trained, steps) < 0:
            raise ValueError("ledger: token and step counts must be >= 0")
        with self._lock:
            owner = self.tenant_of.setdefault(run_id, tenant)
            if owner != tenant:
                raise ValueError(f"ledger: run '{run_id}' belongs to tenant '{owner}', not '{tenant}'")
            row = self._rows[(run_id, gpu_kind, phase)]
            row[0] += round(gpu_seconds * MICRO)
            row[1] += int(tokens_generated)
            row[2] += int(tokens_trained)
            row[3] += int(steps)

    def _snapshot(self) -> tuple[list[tuple[tuple[str, str, str], tuple[int, ...]]], dict[str, str]]:
        """A consistent copy of the rows and run owners, taken under the lock (readers roll up the copy)."""
        with self._lock:
            return [(key, tuple(row)) for key, row in self._rows.items()], dict(self.tenant_of)

    def charge_step(self, run_id: str, tenant: str, gpu_kind: str, record: Any, n_gpus: int = 1) -> None:
        """Charge one trainer step (a `training.metrics.StepRecord`): each phase's wall time x GPUs, its
        tokens, and one committed optimizer step."""
        phases = dict(getattr(record, "phase_seconds", {}) or {})
        for phase in PHASES:
            if phases.get(phase, 0.0):
                self.charge(run_id, tenant, gpu_kind, phase, float(phases[phase]) * n_gpus)
        self.charge(
            run_id, tenant, gpu_kind, "optim", 0.0,
            tokens_generated=int(record.tokens_generated), tokens_trained=int(record.tokens_trained), steps=1,
        )
        cpu_s = float(getattr(record, "reward_fn_cpu_s", 0.0) or 0.0)
        if cpu_s > 0 and CPU_KIND in self.prices.gpu_hour:
            # the reward function's own processes: their CPU seconds, at the CPU price (the GPU's wait on them is
            # the `reward_fn` phase above)
            self.charge(run_id, tenant, CPU_KIND, "reward_fn", cpu_s)

    def _cost(self, gpu_us: int, gpu_kind: str) -> Fraction:
        return Fraction(gpu_us, MICRO * 3600) * self.prices.hourly(gpu_kind)

    def run_totals(self) -> dict[str, Totals]:
        return self._run_totals(self._snapshot()[0])

    def _run_totals(self, rows) -> dict[str, Totals]:
        out: dict[str, Totals] = defaultdict(Totals)
        for (run_id, kind, phase), (us, gen, trained, steps) in rows:
            t = out[run_id]
            t.gpu_us += us
            t.gpu_us_by_phase[phase] += us
            t.tokens_generated += gen
            t.tokens_trained += trained
            t.steps += steps
            t.cost += self._cost(us, kind)
        return dict(out)

    def tenant_totals(self) -> dict[str, Totals]:
        rows, tenant_of = self._snapshot()
        out: dict[str, Totals] = defaultdict(Totals)
        for run_id, t in self._run_totals(rows).items():
            out[tenant_of[run_id]].add(t)
        return dict(out)

    def cluster_total(self) -> Totals:
        """Computed from the raw rows, independently of the per-run and per-tenant roll-ups."""
        t = Totals()
        for (_, kind, phase), (us, gen, trained, steps) in self._snapshot()[0]:
            t.gpu_us += us
            t.gpu_us_by_phase[phase] += us
            t.tokens_generated += gen
            t.tokens_trained += trained
            t.steps += steps
            t.cost += self._cost(us, kind)
        return t

    def frame(self):
        """One row per run (floats for display; the exact values stay in `run_totals`): its tenant, its job attributes
        (`JOB_ATTRS`, empty where never described), GPU-seconds in all and per phase, tokens, steps, cost."""
        import pandas as pd

        snapshot, tenant_of = self._snapshot()
        with self._lock:
            attrs_of = {run: dict(a) for run, a in self.attrs_of.items()}
        rows = []
        for run_id, t in sorted(self._run_totals(snapshot).items()):
            attrs = attrs_of.get(run_id, {})
            row = {"run_id": run_id, "tenant": tenant_of[run_id], **{a: attrs.get(a, "") for a in JOB_ATTRS},
                   "gpu_seconds": t.gpu_seconds}
            row.update({f"gpu_seconds_{p}": t.gpu_us_by_phase[p] / MICRO for p in PHASES})
            row.update(
                tokens_generated=t.tokens_generated, tokens_trained=t.tokens_trained, steps=t.steps,
                cost=float(t.cost), cost_per_step=float(t.cost_per_step) if t.steps else math.nan,
            )
            rows.append(row)
        return pd.DataFrame(rows)


def charge_simulated_jobs(ledger: Ledger, jobs: Any, gpu_kind: str = "h100", tenants: list[str] | None = None) -> None:
    """Feed the simulator's finished jobs (a `jobs.csv` frame: one row per job, seed and scheduler) into the
    ledger. The simulator models a training step as one block, so a job's GPU time outside evaluations
    (training and restart overhead) is booked to `optim`, its evaluations to `eval`; every checkpoint
    counts as one committed step. Tenant indices map to the price table's tenant names when given."""
    names = tenants if tenants is not None else ledger.prices.tenants
    for row in jobs.itertuples(index=False):
        run_id = f"{row.experiment}/{row.variant}/{row.scheduler}/seed{row.seed}/job{row.job_id}"
        tenant = names[row.tenant] if row.tenant < len(names) else f"tenant{row.tenant}"
        eval_gpu_s = row.gpus * row.eval_minutes * row.checkpoints * 60.0
        total_gpu_s = row.gpu_minutes * 60.0
        ledger.charge(run_id, tenant, gpu_kind, "eval", min(eval_gpu_s, total_gpu_s))
        ledger.charge(run_id, tenant, gpu_kind, "optim", max(total_gpu_s - eval_gpu_s, 0.0),
                      steps=int(row.checkpoints))


def tenant_costs(job_rows: Any, prices: PriceTable | None = None):
    """tenants.csv of a simulator experiment: per experiment, variant, scheduler and tenant, the GPU-hours and cost
    the ledger charges for its finished jobs (`charge_simulated_jobs`), mean over seeds."""
    import pandas as pd

    prices = prices if prices is not None else load_prices()  # once: not a file read per group
    rows = []
    for (exp, variant, sched, seed), g in job_rows.groupby(["experiment", "variant", "scheduler", "seed"], sort=False):
        ledger = Ledger(prices)
        charge_simulated_jobs(ledger, g)
        for tenant, t in sorted(ledger.tenant_totals().items()):
            rows.append({"experiment": exp, "variant": variant, "scheduler": sched, "seed": seed, "tenant": tenant,
                         "gpu_hours": t.gpu_seconds / 3600, "cost": float(t.cost)})
    keys = ["experiment", "variant", "scheduler", "tenant"]
    if not rows:
        return pd.DataFrame(columns=[*keys, "gpu_hours", "cost"])
    return pd.DataFrame(rows).groupby(keys, sort=False)[["gpu_hours", "cost"]].mean().reset_index()
