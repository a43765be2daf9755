"""The simulator's finished jobs feed the same accounting ledger as the trainer."""

from __future__ import annotations

import pandas as pd

from infra.ledger import MICRO, Ledger, charge_simulated_jobs
from scheduling.config import WorkloadConfig
from scheduling.engine import simulate
from scheduling.metrics import job_table
from scheduling.policies import parse_scheduler
from scheduling.workload import generate


def test_simulated_jobs_charge_the_ledger_exactly():
    wc = WorkloadConfig(jobs=120)
    wl = generate(wc, 5)
    res = simulate(wl, parse_scheduler("EvalStop+SRTF"), wc.gpus)
    jobs = pd.DataFrame(job_table(wl, res))
    jobs.insert(0, "seed", 5)
    jobs.insert(0, "scheduler", "EvalStop+SRTF")
    jobs.insert(0, "variant", "default")
    jobs.insert(0, "experiment", "E2")
    ledger = Ledger()
    charge_simulated_jobs(ledger, jobs)
    cluster = ledger.cluster_total()
    tenants = ledger.tenant_totals()
    assert len(tenants) == wc.tenants
    assert sum(t.gpu_us for t in tenants.values()) == cluster.gpu_us
    assert sum((t.cost for t in tenants.values()), start=0) == cluster.cost
    # the ledger holds the simulator's GPU time (to the micro-second rounding of each charge)
    assert abs(cluster.gpu_us / MICRO - jobs.gpu_minutes.sum() * 60) < 2 * len(jobs) / MICRO + 1e-6
    assert cluster.gpu_us_by_phase["eval"] > 0 and cluster.steps == int(jobs.checkpoints.sum())
