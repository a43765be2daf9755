"""A bill computed by hand for a small multi-tenant workload: which tenant, which phase and which GPU kind each
charge lands on, and what it costs. The other ledger tests check sums that hold for any tenant or phase mapping;
these check the mapping itself. Every expected number below is this file's own arithmetic on the charges it makes
(GPU-seconds = wall seconds x GPUs; cost = GPU-seconds / 3600 x the kind's hourly price), never the ledger's."""

from __future__ import annotations

from fractions import Fraction as F

import pandas as pd
import pytest

from infra.ledger import MICRO, PHASES, Ledger, PriceTable, charge_simulated_jobs
from training.metrics import StepRecord

# distinct prices, so a charge booked to the wrong kind changes the bill
PRICES = PriceTable(gpu_hour={"h100": "4.00", "a100": "2.40", "l4": "0.80"}, tenants=["acme", "globex"])
PRICE = {"h100": F(4), "a100": F(12, 5), "l4": F(4, 5)}


def step(n: int, gen: int, trained: int, **phase_seconds: float) -> StepRecord:
    return StepRecord(step=n, policy_version=n, reward_mean=0.0, phase_seconds=phase_seconds,
                      tokens_generated=gen, tokens_trained=trained)


def sim_jobs() -> pd.DataFrame:
    """Two finished simulated jobs (a `jobs.csv` frame): tenant index 0 (acme) and 1 (globex)."""
    return pd.DataFrame([
        dict(experiment="E1", variant="v", scheduler="FIFO", seed=1, job_id=0, tenant=0, gpus=2, eval_minutes=3.0,
             checkpoints=4, gpu_minutes=60.0),
        dict(experiment="E1", variant="v", scheduler="FIFO", seed=1, job_id=1, tenant=1, gpus=1, eval_minutes=0.5,
             checkpoints=2, gpu_minutes=10.0),
    ])


def bill() -> Ledger:
    ledger = Ledger(PRICES)
    # acme-1: trainer steps on 2 x H100 (step 2 ran no eval gate)
    ledger.charge_step("acme-1", "acme", "h100",
                       step(1, 100, 80, rollout=3.0, score=1.5, sync=0.5, optim=2.0, eval=4.0), n_gpus=2)
    ledger.charge_step("acme-1", "acme", "h100", step(2, 90, 70, rollout=2.5, score=1.0, sync=0.25, optim=1.75),
                       n_gpus=2)
    # acme-2: direct charges on one A100
    ledger.charge("acme-2", "acme", "a100", "rollout", 600.0, tokens_generated=1000)
    ledger.charge("acme-2", "acme", "a100", "eval", 300.0)
    # globex-1: one trainer step on 4 x L4
    ledger.charge_step("globex-1", "globex", "l4", step(1, 400, 300, rollout=10.0, score=5.0, optim=2.5, eval=6.0),
                       n_gpus=4)
    # globex-2: one run on two kinds (its eval on an H100, its optimiser step on an A100)
    ledger.charge("globex-2", "globex", "h100", "eval", 900.0)
    ledger.charge("globex-2", "globex", "a100", "optim", 1800.0, tokens_trained=50, steps=1)
    # the simulator's finished jobs: eval = GPUs x eval minutes x checkpoints, the rest is optim, both on H100
    charge_simulated_jobs(ledger, sim_jobs(), gpu_kind="h100")
    return ledger


# The bill by hand: GPU-seconds per (run, kind, phase).
SIM0 = "E1/v/FIFO/seed1/job0"
SIM1 = "E1/v/FIFO/seed1/job1"
SIM0_EVAL = 2 * 3.0 * 4 * 60  # 1440 GPU-s of the job's 3600
SIM1_EVAL = 1 * 0.5 * 2 * 60  # 60 GPU-s of the job's 600
EXPECTED: dict[tuple[str, str, str], float] = {
    ("acme-1", "h100", "rollout"): (3.0 + 2.5) * 2,
    ("acme-1", "h100", "score"): (1.5 + 1.0) * 2,
    ("acme-1", "h100", "sync"): (0.5 + 0.25) * 2,
    ("acme-1", "h100", "optim"): (2.0 + 1.75) * 2,
    ("acme-1", "h100", "eval"): 4.0 * 2,
    ("acme-2", "a100", "rollout"): 600.0,
    ("acme-2", "a100", "eval"): 300.0,
    ("globex-1", "l4", "rollout"): 10.0 * 4,
    ("globex-1", "l4", "score"): 5.0 * 4,
    ("globex-1", "l4", "optim"): 2.5 * 4,
    ("globex-1", "l4", "eval"): 6.0 * 4,
    ("globex-2", "h100", "eval"): 900.0,
    ("globex-2", "a100", "optim"): 1800.0,
    (SIM0, "h100", "eval"): SIM0_EVAL,
    (SIM0, "h100", "optim"): 60.0 * 60 - SIM0_EVAL,
    (SIM1, "h100", "eval"): SIM1_EVAL,
    (SIM1, "h100", "optim"): 10.0 * 60 - SIM1_EVAL,
}
TENANT = {"acme-1": "acme", "acme-2": "acme", "globex-1": "globex", "globex-2": "globex", SIM0: "acme",
          SIM1: "globex"}
#: (tokens generated, tokens trained, committed steps) per run
COUNTS = {"acme-1": (190, 150, 2), "acme-2": (1000, 0, 0), "globex-1": (400, 300, 1), "globex-2": (0, 50, 1),
          SIM0: (0, 0, 4), SIM1: (0, 0, 2)}


def expected_cost(select) -> F:
    return sum((F(str(s)) / 3600 * PRICE[kind] for (run, kind, phase), s in EXPECTED.items()
                if select(run, kind, phase)), F(0))


def test_each_run_is_billed_per_phase_to_its_tenant():
    runs = bill().run_totals()
    assert set(runs) == set(TENANT)
    for run, t in runs.items():
        for phase in PHASES:
            want = sum(s for (r, _, p), s in EXPECTED.items() if r == run and p == phase)
            assert t.gpu_us_by_phase[phase] == round(want * MICRO), (run, phase)
        assert t.gpu_us == round(sum(s for (r, _, _), s in EXPECTED.items() if r == run) * MICRO), run
        assert (t.tokens_generated, t.tokens_trained, t.steps) == COUNTS[run], run
        assert t.cost == expected_cost(lambda r, k, p, run=run: r == run), run


def test_the_bill_per_tenant_phase_and_gpu_kind():
    tenants = bill().tenant_totals()
    assert set(tenants) == {"acme", "globex"}
    for name, t in tenants.items():
        for phase in PHASES:
            want = sum(s for (r, _, p), s in EXPECTED.items() if TENANT[r] == name and p == phase)
            assert t.gpu_us_by_phase[phase] == round(want * MICRO), (name, phase)
        assert t.cost == expected_cost(lambda r, k, p, name=name: TENANT[r] == name), name
        assert t.steps == sum(c[2] for r, c in COUNTS.items() if TENANT[r] == name)
    # the same bill written out as a tenant would read it (GPU-hours x price per kind, eval included)
    acme = (F(2 * (3 + F("2.5") + F("1.5") + 1 + F("0.5") + F("0.25") + 2 + F("1.75") + 4)) * 4  # acme-1, H100
            + F(600 + 300) * F("2.4")  # acme-2, A100
            + F(3600) * 4) / 3600  # the simulated job, H100
    globex = (F(4 * (10 + 5 + F("2.5") + 6)) * F("0.8")  # globex-1, L4
              + F(900) * 4 + F(1800) * F("2.4")  # globex-2: eval on H100, optim on A100
              + F(600) * 4) / 3600  # the simulated job, H100
    assert tenants["acme"].cost == acme and tenants["globex"].cost == globex
    # eval is billed: acme's eval GPU-seconds are its trainer gate, its A100 eval and the simulated job's evals
    assert tenants["acme"].gpu_us_by_phase["eval"] == round((8.0 + 300.0 + SIM0_EVAL) * MICRO)


def test_the_cluster_bill_per_gpu_kind():
    ledger = bill()
    cluster = ledger.cluster_total()
    by_kind = {k: expected_cost(lambda r, kk, p, k=k: kk == k) for k in PRICE}
    # per kind by hand: H100 GPU-seconds 2 x 16.5 = 33 (acme-1) + 900 (globex-2 eval) + 4200 (simulated jobs)
    assert by_kind["h100"] == F(33 + 900 + 4200, 3600) * 4
    assert cluster.cost == sum(by_kind.values())
    assert cluster.gpu_us == round(sum(EXPECTED.values()) * MICRO)
    assert cluster.steps == sum(c[2] for c in COUNTS.values())


def test_the_frame_shows_the_same_bill():
    frame = bill().frame().set_index("run_id")
    for run in TENANT:
        row = frame.loc[run]
        assert row["tenant"] == TENANT[run]
        for phase in PHASES:
            want = sum(s for (r, _, p), s in EXPECTED.items() if r == run and p == phase)
            assert row[f"gpu_seconds_{phase}"] == pytest.approx(want, abs=1e-6), (run, phase)
        cost = expected_cost(lambda r, k, p, run=run: r == run)
        assert row["cost"] == pytest.approx(float(cost), rel=1e-12)
        steps = COUNTS[run][2]
        if steps:
            assert row["cost_per_step"] == pytest.approx(float(cost / steps), rel=1e-12)


def test_simulated_jobs_edge_cases_by_hand():
    """Tenant names given explicitly, a tenant index past the names (booked to `tenant<i>`), and a job whose evals
    would exceed its GPU time (eval is capped at the job's GPU time, nothing is left for optim)."""
    jobs = pd.DataFrame([
        # 1 GPU x 1 min x 4 checkpoints = 240 GPU-s of evals, but the job held its GPU only 2 min: eval 120, optim 0
        dict(experiment="E", variant="v", scheduler="S", seed=0, job_id=0, tenant=1, gpus=1, eval_minutes=1.0,
             checkpoints=4, gpu_minutes=2.0),
        # tenant index 2 == len(names): no name, booked to "tenant2"; evals 2 x 0.5 x 1 x 60 = 60 of its 600
        dict(experiment="E", variant="v", scheduler="S", seed=0, job_id=1, tenant=2, gpus=2, eval_minutes=0.5,
             checkpoints=1, gpu_minutes=10.0),
        # evals exactly the job's GPU time: 1 x 2 x 1 x 60 = 120 = 2 min: optim 0
        dict(experiment="E", variant="v", scheduler="S", seed=0, job_id=2, tenant=0, gpus=1, eval_minutes=2.0,
             checkpoints=1, gpu_minutes=2.0),
    ])
    ledger = Ledger(PRICES)
    charge_simulated_jobs(ledger, jobs, gpu_kind="l4", tenants=["north", "south"])
    tenants = ledger.tenant_totals()
    assert set(tenants) == {"north", "south", "tenant2"}
    assert tenants["south"].gpu_us_by_phase == {**dict.fromkeys(PHASES, 0), "eval": 120 * MICRO}
    assert tenants["tenant2"].gpu_us_by_phase == {**dict.fromkeys(PHASES, 0), "eval": 60 * MICRO,
                                                  "optim": 540 * MICRO}
    assert tenants["north"].gpu_us_by_phase == {**dict.fromkeys(PHASES, 0), "eval": 120 * MICRO}
    assert [tenants[t].steps for t in ("north", "south", "tenant2")] == [1, 4, 1]
    assert tenants["tenant2"].cost == F(600, 3600) * PRICE["l4"]


def test_a_step_record_without_phase_times_charges_its_tokens_and_step_only():
    """`charge_step` is duck-typed: a record with no `phase_seconds` (a scripted or replayed step) books no GPU time,
    its tokens and one committed step to optim."""
    from types import SimpleNamespace

    ledger = Ledger(PRICES)
    ledger.charge_step("r", "acme", "h100", SimpleNamespace(tokens_generated=7, tokens_trained=5), n_gpus=4)
    ledger.charge_step("r", "acme", "h100", SimpleNamespace(tokens_generated=1, tokens_trained=1, phase_seconds=None))
    t = ledger.run_totals()["r"]
    assert (t.gpu_us, t.tokens_generated, t.tokens_trained, t.steps, t.cost) == (0, 8, 6, 2, 0)


def test_bad_charges_are_refused_with_the_whole_message():
    ledger = Ledger(PRICES)
    with pytest.raises(ValueError, match=r"^ledger: unknown phase 'reward' \(choose from: rollout, score, sync, optim, "
                                         r"eval, reward_fn\)$"):
        ledger.charge("r", "acme", "h100", "reward", 1.0)
    for counts in ({"tokens_generated": -1}, {"tokens_trained": -1}, {"steps": -1}):
        with pytest.raises(ValueError, match=r"^ledger: token and step counts must be >= 0$"):
            ledger.charge("r", "acme", "h100", "rollout", 1.0, **counts)
    assert ledger.run_totals() == {}  # nothing was booked by a refused charge


def test_tenant_costs_by_hand():
    """tenants.csv: per experiment, variant, scheduler and tenant, the GPU-hours and cost of its simulated jobs on
    H100, mean over seeds; rows in the order the schedulers come (the experiment's), not sorted. Prices other than the
    shipped ones (H100 at 3.00, tenants north/south), so a ledger that ignored them would show."""
    from infra.ledger import tenant_costs

    prices = PriceTable(gpu_hour={"h100": "3.00"}, tenants=["north", "south"])

    def job(scheduler, seed, job_id, tenant, gpu_minutes):
        return dict(experiment="E1", variant="v", scheduler=scheduler, seed=seed, job_id=job_id, tenant=tenant,
                    gpus=1, eval_minutes=0.0, checkpoints=1, gpu_minutes=gpu_minutes)

    rows = pd.DataFrame([job("B", 1, 0, 0, 6.0),  # scheduler B first: north 0.1 h
                         job("A", 1, 0, 0, 60.0), job("A", 1, 1, 1, 30.0),  # north 1 h, south 0.5 h
                         job("A", 2, 0, 0, 120.0), job("A", 2, 1, 1, 90.0)])  # north 2 h, south 1.5 h
    out = tenant_costs(rows, prices)
    assert list(zip(out.scheduler, out.tenant, strict=True)) == [("B", "north"), ("A", "north"), ("A", "south")]
    got = {(r.scheduler, r.tenant): (r.gpu_hours, r.cost) for r in out.itertuples()}
    assert got[("A", "north")] == pytest.approx(((1 + 2) / 2, (3.0 + 6.0) / 2))
    assert got[("A", "south")] == pytest.approx(((0.5 + 1.5) / 2, (1.5 + 4.5) / 2))
    assert got[("B", "north")] == pytest.approx((0.1, 0.3))
    empty = tenant_costs(rows.iloc[:0], prices)
    assert empty.empty and list(empty.columns) == ["experiment", "variant", "scheduler", "tenant", "gpu_hours", "cost"]


def test_tenant_costs_default_to_the_shipped_prices():
    """Without a price table, tenants.csv is priced from configs/prices.yaml (read here with plain YAML)."""
    import yaml

    from common.config import config_dir
    from infra.ledger import tenant_costs

    shipped = yaml.safe_load((config_dir() / "prices.yaml").read_text())
    rows = pd.DataFrame([dict(experiment="E", variant="v", scheduler="S", seed=0, job_id=0, tenant=0, gpus=2,
                              eval_minutes=0.0, checkpoints=1, gpu_minutes=90.0)])
    (row,) = tenant_costs(rows).itertuples()
    assert row.tenant == shipped["tenants"][0] and row.gpu_hours == pytest.approx(1.5)
    assert row.cost == pytest.approx(1.5 * float(shipped["gpu_hour"]["h100"]))
