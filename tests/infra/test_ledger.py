"""Per-tenant accounting: exact sums, phase split, cost per committed step, StepRecord and bad input."""

from fractions import Fraction

import numpy as np
import pytest

from common.errors import BadInput
from infra.ledger import MICRO, PHASES, Ledger, PriceTable, load_prices
from training.metrics import PHASES as TRAINER_PHASES
from training.metrics import StepRecord

PRICES = PriceTable(gpu_hour={"h100": "4.00", "a100": "2.40", "l4": "0.83"}, tenants=["acme"])


def test_phases_match_the_trainer():
    assert PHASES == TRAINER_PHASES


def random_ledger(seed=0, n_charges=5000):
    rng = np.random.default_rng(seed)
    ledger = Ledger(PRICES)
    tenants = [f"tenant-{i}" for i in range(7)]
    runs = {f"run-{i}": tenants[i % 7] for i in range(60)}
    run_ids = list(runs)
    for _ in range(n_charges):
        run = run_ids[int(rng.integers(len(run_ids)))]
        ledger.charge(
            run, runs[run], str(rng.choice(["h100", "a100", "l4"])), str(rng.choice(PHASES)),
            gpu_seconds=float(rng.exponential(3.7)),  # arbitrary floats: 1/3-ish seconds, many digits
            tokens_generated=int(rng.integers(0, 5000)), tokens_trained=int(rng.integers(0, 5000)),
            steps=int(rng.integers(0, 2)),
        )
    return ledger


def test_per_tenant_sums_equal_cluster_total_exactly():
    ledger = random_ledger()
    cluster = ledger.cluster_total()
    tenants = ledger.tenant_totals()
    assert len(tenants) == 7
    assert sum(t.gpu_us for t in tenants.values()) == cluster.gpu_us
    assert sum((t.cost for t in tenants.values()), Fraction(0)) == cluster.cost  # exact, no tolerance
    assert isinstance(cluster.cost, Fraction) and cluster.cost.denominator > 1
    for field in ("tokens_generated", "tokens_trained", "steps"):
        assert sum(getattr(t, field) for t in tenants.values()) == getattr(cluster, field)
    for p in PHASES:
        assert sum(t.gpu_us_by_phase[p] for t in tenants.values()) == cluster.gpu_us_by_phase[p]
    # and each run's phases add up to the run
    for t in ledger.run_totals().values():
        assert sum(t.gpu_us_by_phase.values()) == t.gpu_us


def test_cost_and_cost_per_step():
    ledger = Ledger(PRICES)
    ledger.charge("r", "acme", "h100", "rollout", 1800.0)  # half an H100-hour: $2.00
    ledger.charge("r", "acme", "a100", "optim", 3600.0, steps=4)  # one A100-hour: $2.40
    t = ledger.run_totals()["r"]
    assert t.cost == Fraction(440, 100) and t.cost_per_step == Fraction(110, 100)
    assert t.gpu_us == 5400 * MICRO and t.gpu_us_by_phase["rollout"] == 1800 * MICRO
    frame = ledger.frame()
    assert frame.loc[0, "cost_per_step"] == pytest.approx(1.1) and frame.loc[0, "gpu_seconds_optim"] == 3600


def test_charge_step_from_a_trainer_record():
    rec = StepRecord(step=1, policy_version=1, reward_mean=0.3,
                     phase_seconds={"rollout": 2.0, "score": 0.5, "sync": 0.25, "optim": 1.0},
                     tokens_generated=2048, tokens_trained=1024)
    ledger = Ledger(PRICES)
    for _ in range(3):
        ledger.charge_step("r", "acme", "l4", rec, n_gpus=2)
    t = ledger.run_totals()["r"]
    assert t.steps == 3 and t.tokens_generated == 6144 and t.tokens_trained == 3072
    assert t.gpu_us_by_phase == {"rollout": 12 * MICRO, "score": 3 * MICRO, "sync": int(1.5 * MICRO),
                                 "optim": 6 * MICRO, "eval": 0, "reward_fn": 0}


def test_bad_input():
    ledger = Ledger(PRICES)
    with pytest.raises(BadInput, match=r"^ledger\.gpu_kind: 'tpu' has no price \(priced: a100, h100, l4; add it under "
                                       r"gpu_hour in configs/prices\.yaml\)$"):
        ledger.charge("r", "acme", "tpu", "rollout", 1.0)
    with pytest.raises(ValueError, match="unknown phase"):
        ledger.charge("r", "acme", "h100", "warmup", 1.0)
    with pytest.raises(ValueError, match="finite"):
        ledger.charge("r", "acme", "h100", "rollout", float("nan"))
    ledger.charge("r", "acme", "h100", "rollout", 1.0)
    with pytest.raises(ValueError, match="belongs to tenant 'acme'"):
        ledger.charge("r", "globex", "h100", "rollout", 1.0)


def test_prices_file(tmp_path):
    assert "h100" in load_prices().gpu_hour  # the shipped configs/prices.yaml
    bad = tmp_path / "p.yaml"
    bad.write_text("gpu_hour: {h100: 'four'}\n")
    with pytest.raises(BadInput, match="gpu_hour"):
        load_prices(bad)
    bad.write_text("gpu_hour: {h100: '4'}\nregion: eu\n")
    with pytest.raises(BadInput, match="'region'"):
        load_prices(bad)


def test_reward_function_cpu_seconds_are_charged_at_the_cpu_price():
    """A step's `reward_fn_cpu_s` (the tenant's function processes) is charged in the `reward_fn` phase at the `cpu`
    price, whatever GPU kind the job holds; the GPU's own wait is the phase's wall seconds at the GPU's price. By
    hand: 36 s of an h100 at 4.00/h is 0.04, one CPU-hour at 0.05/h is 0.05."""
    from fractions import Fraction

    from training.metrics import StepRecord

    ledger = Ledger(load_prices())
    rec = StepRecord(step=1, policy_version=1, reward_mean=0.0, phase_seconds={"reward_fn": 36.0},
                     reward_fn_cpu_s=3600.0)
    ledger.charge_step("r", "acme", "h100", rec)
    t = ledger.run_totals()["r"]
    assert Fraction(t.cost) == Fraction("0.04") + Fraction("0.05")
    assert t.gpu_us_by_phase["reward_fn"] == (36 + 3600) * MICRO


def test_a_runs_row_names_its_jobs_algorithm():
    """`describe` labels a run's row (the algorithm a job trained); a run never described (a simulated job) has it
    empty, the money is the same either way, and an attribute the ledger does not keep is refused."""
    ledger = Ledger(PRICES)
    ledger.charge("grpo-run", "acme", "h100", "rollout", 1800.0)
    ledger.charge("sim", "acme", "h100", "optim", 1800.0, steps=1)
    before = ledger.run_totals()
    ledger.describe("grpo-run", algorithm="grpo")
    assert ledger.run_totals() == before
    frame = ledger.frame().set_index("run_id")
    assert list(frame.columns[:2]) == ["tenant", "algorithm"]
    assert (frame.loc["grpo-run", "algorithm"], frame.loc["sim", "algorithm"]) == ("grpo", "")
    with pytest.raises(ValueError, match=r"unknown job attribute\(s\) colour \(known: algorithm\)"):
        ledger.describe("grpo-run", colour="red")


def test_the_job_supervisor_describes_its_run_in_the_ledger(tmp_path):
    """The one place a job's supervisor is made (`training.job.lifecycle.make_supervisor`, through the request's
    `build`) tells the ledger the job's algorithm, so every entry point's ledger rows carry it."""
    from training.job.request import build, parse_request

    ledger = Ledger(PRICES)
    for run_id, fields in (("ppo-run", {}), ("grpo-run", {"algorithm": "grpo", "group_size": 4})):
        build(parse_request({"out_root": str(tmp_path), "gpu_kind": "h100", **fields}), run_id=run_id, ledger=ledger)
    assert ledger.attrs_of == {"ppo-run": {"algorithm": "ppo"}, "grpo-run": {"algorithm": "grpo"}}
