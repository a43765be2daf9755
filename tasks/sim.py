"""Prefect tasks around the simulator: one task per workload unit (variant x seed, every scheduler)."""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE

from infra.compute import compute
from scheduling.experiments import Unit, run_unit
from tasks.retry import RETRIES, backoff, maybe_fail, retry_transient
from tasks.timing import clock


def unit_key(unit: Unit) -> str:
    return f"{unit.experiment}/{unit.variant}/seed{unit.seed}"


@task(name="simulate-unit", task_run_name="sim {unit.experiment}/{unit.variant}/seed{unit.seed}",
      retries=RETRIES, retry_delay_seconds=backoff(1.0), retry_jitter_factor=0.5,
      retry_condition_fn=retry_transient, cache_policy=NO_CACHE, log_prints=False)
def simulate_unit(unit: Unit, fail_rate: float = 0.0, fault_seed: int = 0):
    """`scheduling.experiments.run_unit` on the compute pool: returns (per-seed summary rows, job tables).
    The injected fault sits where a real worker fails to start: before any work."""
    maybe_fail("worker-start", unit_key(unit), fail_rate, fault_seed)
    with clock.span("work"):
        return compute(run_unit, unit)
