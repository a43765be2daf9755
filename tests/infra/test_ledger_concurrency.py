"""The ledger against an independent running total, alone and under 8 charging threads plus a reader.

The oracle is the test's own bookkeeping: every charge the test issues is also added, per tenant, to plain
integers and `Fraction`s here (cost = micro-GPU-seconds x price / 3.6e9, the price parsed by `Decimal`), so
a dropped, doubled or mis-attributed charge in the ledger shows up as a difference. Charges are whole
micro-GPU-seconds so the oracle needs no rounding rule of its own.
"""

from __future__ import annotations

import re
import sys
import threading
from collections import defaultdict
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from infra.ledger import PHASES, Ledger, PriceTable

PRICE = {"h100": "4.00", "a100": "2.40", "l4": "0.83"}
PRICES = PriceTable(gpu_hour=PRICE)
TENANTS = [f"tenant-{i}" for i in range(5)]


class RunningTotal:
    """Per-tenant sums kept by the test as it issues charges (not by the ledger)."""

    def __init__(self):
        self.us: dict[str, int] = defaultdict(int)
        self.us_by_phase: dict[tuple[str, str], int] = defaultdict(int)
        self.tokens_generated: dict[str, int] = defaultdict(int)
        self.tokens_trained: dict[str, int] = defaultdict(int)
        self.steps: dict[str, int] = defaultdict(int)
        self.cost: dict[str, Fraction] = defaultdict(Fraction)

    def add(self, tenant, kind, phase, us, gen, trained, steps):
        self.us[tenant] += us
        self.us_by_phase[(tenant, phase)] += us
        self.tokens_generated[tenant] += gen
        self.tokens_trained[tenant] += trained
        self.steps[tenant] += steps
        self.cost[tenant] += Fraction(us, 3_600_000_000) * Fraction(Decimal(PRICE[kind]))

    def merge(self, other: RunningTotal) -> None:
        for name in ("us", "us_by_phase", "tokens_generated", "tokens_trained", "steps", "cost"):
            mine = getattr(self, name)
            for k, v in getattr(other, name).items():
                mine[k] += v


def issue(ledger: Ledger, oracle: RunningTotal, rng, run_id: str, tenant: str) -> None:
    kind, phase = str(rng.choice(list(PRICE))), str(rng.choice(PHASES))
    us = int(rng.integers(0, 50_000_000))  # up to 50 GPU-seconds, in whole micro-GPU-seconds
    gen, trained, steps = int(rng.integers(0, 5000)), int(rng.integers(0, 5000)), int(rng.integers(0, 2))
    ledger.charge(run_id, tenant, kind, phase, gpu_seconds=us / 1_000_000, tokens_generated=gen,
                  tokens_trained=trained, steps=steps)
    oracle.add(tenant, kind, phase, us, gen, trained, steps)


def assert_matches(ledger: Ledger, oracle: RunningTotal) -> None:
    tenants = ledger.tenant_totals()
    assert set(tenants) == set(oracle.us)
    for name, t in tenants.items():
        assert t.gpu_us == oracle.us[name], name
        assert t.cost == oracle.cost[name], name  # exact: Fraction against Fraction
        assert t.tokens_generated == oracle.tokens_generated[name]
        assert t.tokens_trained == oracle.tokens_trained[name]
        assert t.steps == oracle.steps[name]
        for p in PHASES:
            assert t.gpu_us_by_phase[p] == oracle.us_by_phase[(name, p)], (name, p)
    cluster = ledger.cluster_total()  # per-tenant totals add up exactly to the cluster's
    assert cluster.gpu_us == sum(oracle.us.values()) == sum(t.gpu_us for t in tenants.values())
    assert cluster.cost == sum(oracle.cost.values(), Fraction(0)) == sum((t.cost for t in tenants.values()),
                                                                            Fraction(0))
    assert cluster.steps == sum(oracle.steps.values())
    assert cluster.tokens_generated == sum(oracle.tokens_generated.values())


def test_ledger_equals_a_running_total_kept_by_the_test():
    rng = np.random.default_rng(11)
    ledger, oracle = Ledger(PRICES), RunningTotal()
    owner = {f"run-{i}": TENANTS[i % len(TENANTS)] for i in range(40)}
    runs = list(owner)
    for _ in range(3000):
        run = runs[int(rng.integers(len(runs)))]
        issue(ledger, oracle, rng, run, owner[run])
    assert_matches(ledger, oracle)
    frame = ledger.frame()  # the display frame carries the same per-run numbers, tenant by tenant
    by_tenant = frame.groupby("tenant")["steps"].sum().to_dict()
    assert by_tenant == dict(oracle.steps)


def test_charge_step_books_every_phase_times_gpus():
    """A StepRecord's phases x n_gpus, against the hand-made sum (one step, its tokens)."""
    from training.metrics import StepRecord

    rec = StepRecord(step=1, policy_version=1, reward_mean=0.0, tokens_generated=7, tokens_trained=5,
                     phase_seconds={"rollout": 1.25, "score": 0.5, "sync": 0.0, "optim": 2.0, "eval": 0.75})
    ledger = Ledger(PRICES)
    ledger.charge_step("r", "acme", "h100", rec, n_gpus=4)
    t = ledger.run_totals()["r"]
    assert t.gpu_us == 4 * (1.25 + 0.5 + 2.0 + 0.75) * 1_000_000
    assert (t.steps, t.tokens_generated, t.tokens_trained) == (1, 7, 5)
    assert t.cost == Fraction(18, 3600) * 4  # 18 GPU-seconds at $4.00/h


@pytest.fixture()
def fast_thread_switches():
    """Switch threads every microsecond instead of every 5 ms, so a reader iterating the rows is preempted
    by a charging thread on nearly every read (the race shows up within a fraction of a second)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


def test_eight_charging_threads_and_a_reader(fast_thread_switches):
    """Regression: `run_totals()` read while job threads charged raised `RuntimeError: dictionary changed size
    during iteration`, and two threads adding to one row could lose an update."""
    ledger = Ledger(PRICES)
    n_threads, per_thread = 8, 1500
    oracles = [RunningTotal() for _ in range(n_threads)]
    shared = {f"shared-{j}": TENANTS[j % len(TENANTS)] for j in range(10)}  # rows every thread adds to
    done = threading.Event()
    start = threading.Barrier(n_threads + 1)  # everyone starts together, the reader already warm
    reader_busy = threading.Event()  # set after the reader's third read: chargers wait for it halfway, so
    # reads overlap charging however the machine schedules the threads
    errors: list[BaseException] = []
    reads = []

    def charger(k: int) -> None:
        rng = np.random.default_rng([5, k])
        start.wait()
        try:
            for i in range(per_thread):
                if i == per_thread // 2:
                    assert reader_busy.wait(timeout=120), "the reader never got going"
                if i % 2:
                    run = f"shared-{int(rng.integers(10))}"
                    issue(ledger, oracles[k], rng, run, shared[run])
                else:  # a new run: the row dict grows while the reader iterates it
                    issue(ledger, oracles[k], rng, f"t{k}-run-{i}", TENANTS[k % len(TENANTS)])
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    def reader() -> None:
        last = -1
        ledger.frame()  # first call imports pandas: do it before the chargers start
        start.wait()
        try:
            while not done.is_set():
                ledger.run_totals()
                ledger.tenant_totals()
                ledger.frame()
                gpu_us = ledger.cluster_total().gpu_us
                assert gpu_us >= last, "cluster total went backwards"  # charges are >= 0
                last = gpu_us
                reads.append(gpu_us)
                if len(reads) == 3:
                    reader_busy.set()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=charger, args=(k,)) for k in range(n_threads)]
    read_thread = threading.Thread(target=reader)
    read_thread.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    read_thread.join()
    assert not errors, repr(errors[0])
    assert len(reads) >= 3  # the reader really ran alongside the chargers
    oracle = RunningTotal()
    for o in oracles:
        oracle.merge(o)
    assert_matches(ledger, oracle)


# ------------------------------------------------------------------------------------------------------
# mutants that survived `make mutate` on infra/ledger.py, killed here


def test_frame_rows_equal_the_running_total():
    """The display frame (one row per run) carries each run's numbers: summed per tenant they equal the
    test's own running total (floats for display, so within float rounding)."""
    rng = np.random.default_rng(12)
    ledger, oracle = Ledger(PRICES), RunningTotal()
    owner = {f"run-{i}": TENANTS[i % len(TENANTS)] for i in range(12)}
    for _ in range(400):
        run = list(owner)[int(rng.integers(len(owner)))]
        issue(ledger, oracle, rng, run, owner[run])
    frame = ledger.frame()
    assert sorted(frame.run_id) == sorted(owner)
    per_tenant = frame.groupby("tenant").sum(numeric_only=True)
    for tenant in oracle.us:
        row = per_tenant.loc[tenant]
        assert row.gpu_seconds == pytest.approx(oracle.us[tenant] / 1_000_000)
        assert row.cost == pytest.approx(float(oracle.cost[tenant]))
        assert row.tokens_generated == oracle.tokens_generated[tenant]
        assert row.tokens_trained == oracle.tokens_trained[tenant]
        for p in PHASES:
            assert row[f"gpu_seconds_{p}"] == pytest.approx(oracle.us_by_phase[(tenant, p)] / 1_000_000)


def test_charge_step_defaults_to_one_gpu():
    from training.metrics import StepRecord

    rec = StepRecord(step=1, policy_version=1, reward_mean=0.0, phase_seconds={"rollout": 3.0})
    ledger = Ledger(PRICES)
    ledger.charge_step("r", "acme", "h100", rec)
    assert ledger.run_totals()["r"].gpu_us == 3_000_000


@pytest.mark.parametrize("field", ["tokens_generated", "tokens_trained", "steps"])
def test_negative_counts_are_refused(field):
    ledger = Ledger(PRICES)
    with pytest.raises(ValueError, match="token and step counts must be >= 0"):
        ledger.charge("r", "acme", "h100", "rollout", 1.0, **{field: -1})
    assert ledger.run_totals() == {}  # nothing was booked


def test_price_file_errors_name_the_file(tmp_path):
    from common.errors import BadInput
    from infra.ledger import load_prices

    missing = tmp_path / "nope.yaml"
    with pytest.raises(BadInput, match=f"prices: file '{missing}' not found"):
        load_prices(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu_hour: [unclosed\n")
    with pytest.raises(BadInput, match=re.escape(f"prices: '{bad}' is not valid YAML")):
        load_prices(bad)
    bad.write_text("gpu_hour: {h100: 'four'}\n")
    with pytest.raises(BadInput, match=str(bad)):
        load_prices(bad)
