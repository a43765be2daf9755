"""A job on two ranks (the local launcher) under `run_job` with a ledger: two GPUs charged per step; a rank killed
once is restarted from the last checkpoint (`max_rank_restarts`) and the job ends as the uninterrupted one did,
every step once in metrics.csv, in the records and in the ledger; a rank killed on every start ends FAILED after
exactly the bound, in one line naming it.

Oracles: the uninterrupted two-rank run at the same seed (keyed draws: the restarted run's rows equal its rows,
timings aside); the ledger's GPU-microseconds recomputed by hand from the records' phase seconds x 2 GPUs, as
`Ledger.charge` rounds them; the count of worker starts and of fault markers."""

from __future__ import annotations

import csv
import math

import pytest
from tiny_job import tiny_config

from infra.ledger import MICRO, PHASES, Ledger, load_prices
from training.job.lifecycle import JobHooks, JobSpec, make_supervisor, run_job

STEPS = 4
#: columns that are timings (they differ between any two runs) or say where the time went
TIMING = ("wall_s", "rank_idle_s", "reward_fn_cpu_s")


class CountingHooks(JobHooks):
    """The default in-process hooks, counting worker starts; checkpoints are not scored (nothing here reads them)."""

    def __init__(self):
        self.starts = 0
        self.started_at: list[int] = []  # the step each worker resumed from
        self.restarted: list[str] = []

    def start_worker(self, spec):
        self.starts += 1
        worker = super().start_worker(spec)
        self.started_at.append(worker.step)
        return worker

    def restarting(self, spec, error):
        self.restarted.append(str(error))

    def score(self, spec, checkpoints):
        return []


def _job(tmp_path, cache, name: str, restarts: int = 1, **fault) -> tuple:
    over = {"fault": {"kind": "rank_exit", "rank": 1, **fault}} if fault else {}
    cfg = tiny_config(cache, seed=0, n_heldout_prompts=8, steps=STEPS, **over)
    spec = JobSpec(tenant="acme", name=name, config=cfg, run_id=name, out_dir=tmp_path / name, gpus=2,
                   max_rank_restarts=restarts)
    ledger = Ledger(load_prices())
    hooks = CountingHooks()
    outcome = run_job(spec, hooks=hooks, supervisor=make_supervisor(spec, ledger=ledger))
    return outcome, hooks, ledger.run_totals().get(name), tmp_path / name


def _rows(out) -> list[dict[str, str]]:
    return list(csv.DictReader((out / "metrics.csv").open()))


def _charged_us(records: list[dict], gpus: int) -> int:
    """The ledger's GPU-microseconds for these step records, recomputed: each phase's seconds x GPUs, rounded per
    charge as `Ledger.charge` does."""
    return sum(round(float(r[f"phase_{p}_s"]) * gpus * MICRO) for r in records for p in PHASES
               if float(r[f"phase_{p}_s"]))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, cache):
    return _job(tmp_path_factory.mktemp("ref"), cache, "ref")


def test_two_ranks_are_charged_two_gpus_per_step(uninterrupted):
    outcome, hooks, totals, out = uninterrupted
    assert outcome.status.state.value == "SUCCEEDED", outcome.status.reason
    rows = _rows(out)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert {r["world_size"] for r in rows} == {"2"}
    assert hooks.starts == 1 and totals.steps == STEPS
    assert totals.gpu_us == _charged_us(rows, 2) > _charged_us(rows, 1)


def test_a_rank_killed_once_is_restarted_from_the_last_checkpoint(tmp_path, cache, uninterrupted):
    """Rank 1 dies at the start of step 4 on the first start only: the restart resumes from the step-2
    checkpoint, runs step 3 again (given once) and step 4; the rows equal the uninterrupted run's."""
    outcome, hooks, totals, out = _job(tmp_path, cache, "once", at_step=3, times=1)
    assert outcome.status.state.value == "SUCCEEDED", outcome.status.reason
    assert hooks.starts == 2 and len(hooks.restarted) == 1 and "rank 1 exited with code 3 in step 4" in \
        hooks.restarted[0]
    assert hooks.started_at == [0, 2]  # the restart resumed from the step-2 checkpoint
    assert len(list(out.glob(".fault-rank_exit-rank1-*"))) == 1
    rows = _rows(out)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert [int(r["step"]) for r in outcome.records] == list(range(1, STEPS + 1))
    reference = _rows(uninterrupted[3])
    for got, want in zip(rows, reference, strict=True):
        for key, value in want.items():
            if key in TIMING or key.startswith("phase_") or not value:
                continue
            a, b = float(got[key]), float(value)
            assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-4, abs=1e-5), (got["step"], key)
    # each step charged once, at 2 GPUs: what the supervisor was given, nothing of the re-run step 3
    assert totals.steps == STEPS
    assert totals.gpu_us == _charged_us(outcome.records, 2)


def test_a_rank_killed_on_every_start_fails_after_the_bound(tmp_path, cache):
    outcome, hooks, totals, out = _job(tmp_path, cache, "always", restarts=1, at_step=1)
    assert outcome.status.state.value == "FAILED"
    reason = outcome.status.reason
    assert "\n" not in reason and "rank 1 exited with code 3 in step 2" in reason, reason
    assert "restarted 1 time from the last checkpoint: max_rank_restarts 1" in reason, reason
    assert hooks.starts == 2
    assert [int(r["step"]) for r in outcome.records] == [1]
    assert totals.steps == 1 and totals.gpu_us == _charged_us(outcome.records, 2)
