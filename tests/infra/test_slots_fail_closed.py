"""GPU slots fail closed: a Prefect server that cannot create, resize or grant the slot limit (an HTTP 500, SQLite's
"database is locked", which the server answers 503) is retried for `RLHFOPS_SLOTS_WAIT_S`; a server that recovers in
time gives the job its slots on the server's limit; one that does not fails the job before it starts (nothing trained,
nothing charged), and a round before any job. Never a private semaphore unless `RLHFOPS_SLOTS=local` chose it.

The faults are the server's own answers injected below Prefect's clients (`slot_faults`); the oracles are the
server's limit read back through a clean client (its size, its active slots while a holder is inside), the holders'
own wall-clock intervals, and the files and MLflow records a job would have written had it trained."""

from __future__ import annotations

import math
import multiprocessing as mp
import time
import uuid

import pytest
import slot_faults
from test_platform_slots import max_overlap

from common.errors import BadInput


def limit_name(tag: str) -> str:
    return f"gpu-slots-{tag}-{uuid.uuid4().hex[:8]}"


def read_limit(name: str):
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as c:
        return c.read_global_concurrency_limit_by_name(name)


@pytest.fixture()
def no_client_retries():
    """Prefect's client retries a 503 itself (2, 4, 8, ... s): off here, so the wait measured is the pool's."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}):
        yield


# ------------------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("env, value", [("RLHFOPS_SLOTS", "semaphore"), ("RLHFOPS_SLOTS", "Local"),
                                        ("RLHFOPS_SLOTS_WAIT_S", "-1"), ("RLHFOPS_SLOTS_WAIT_S", "soon"),
                                        ("RLHFOPS_SLOTS_WAIT_S", "nan")])
def test_a_bad_slot_setting_is_one_line_naming_it(env, value, monkeypatch):
    from infra import provision

    monkeypatch.setenv(env, value)
    with pytest.raises(BadInput) as err:
        provision.gpu_slots(2, limit_name("bad-setting"))
    line = str(err.value)
    assert line.startswith(f"{env}: '{value}'") and "\n" not in line, line


def test_a_bad_slot_setting_stops_the_platform_command_before_any_work(tmp_path, capsys, monkeypatch):
    """`rlhfops platform` with a bad `RLHFOPS_SLOTS`: exit 2, one line naming it, no server started."""
    from cli_helpers import run_cli, tripwire

    import rlhfops.commands.flowrun as flowrun

    monkeypatch.setattr(flowrun, "start_prefect_api", tripwire)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RLHFOPS_SLOTS", "shared")
    code, lines = run_cli(["platform", "--steps", "4"], capsys, monkeypatch)
    assert code == 2 and lines == ["error: RLHFOPS_SLOTS: 'shared' is not one of prefect, local (unset it to hold "
                                   "GPU slots on the Prefect server's concurrency limit)"], lines
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_bad_slot_setting_fails_the_job_before_its_run_is_opened(prefect_server, mlflow_store, tmp_path,
                                                                   monkeypatch):
    from flows.rlhf_job import rlhf_job
    from infra import tracking as T

    monkeypatch.setenv("RLHFOPS_SLOTS_WAIT_S", "a minute")
    state = rlhf_job(request={"out_root": str(tmp_path / "jobs"), "run_dir": "."}, return_state=True)
    assert state.is_failed() and "RLHFOPS_SLOTS_WAIT_S: 'a minute'" in state.message, state.message
    assert not (tmp_path / "jobs").exists()
    assert T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}") is None


def test_the_local_pool_only_when_the_user_chose_it(monkeypatch):
    """`RLHFOPS_SLOTS=local`: a semaphore of this process, said so, with no request to any server (the API here is
    a closed port: provisioning on it would fail)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra import provision

    monkeypatch.setenv("RLHFOPS_SLOTS", "local")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        pool = provision.gpu_slots(2, limit_name("local"))
    assert pool.backend == "local" and "RLHFOPS_SLOTS=local" in pool.describe()
    with pool.take(2), pytest.raises(TimeoutError):
        with pool.take(1, timeout_s=0.2):
            pass


def test_an_unreachable_server_fails_closed_naming_it(monkeypatch):
    """No server at all (a closed port): after the wait, `SlotsUnavailable` names the server and the limit; no pool
    falls back to a semaphore (a fallback would say backend "local" and start the job)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra import provision

    monkeypatch.setattr(provision, "API_OUTAGE_BUDGET_S", 0.5)  # the outage wait inside each attempt
    monkeypatch.setenv("RLHFOPS_SLOTS_WAIT_S", "1")
    name = limit_name("unreachable")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), \
            pytest.raises(provision.SlotsUnavailable) as err:
        provision.gpu_slots(2, name)
    line = str(err.value)
    assert "\n" not in line and name in line and "http://127.0.0.1:9/api" in line and "did not start" in line
    assert not [k for k in provision._slot_pools if k[0] == name]  # nothing kept: the next job asks again


# ------------------------------------------------------------------------------- one process, a faulty server
@pytest.mark.slow
@pytest.mark.parametrize("answer", ["500", "locked"])
def test_a_pool_waits_out_a_failing_server_then_holds_its_limit(answer, prefect_server, monkeypatch,
                                                                no_client_retries):
    """The limit calls fail for 2 s: creating the pool waits, then the server holds a limit of the pool's size; then
    the acquisitions fail for 2 s: `take` waits, then holds the slots on the server (its limit shows them active)."""
    from infra.provision import SlotPool

    name, fault_s = limit_name(f"recover-{answer}"), 2.0
    fault = slot_faults.patch_transports(monkeypatch, answer, time.time() + fault_s)
    t0 = time.perf_counter()
    pool = SlotPool(3, name, wait_s=30)
    made_s = time.perf_counter() - t0
    assert fault["faulted"] >= 1 and pool.backend == "prefect"  # it met the fault and got past it
    assert made_s >= fault_s - 0.1  # it waited for the server, not for nothing
    assert read_limit(name).limit == 3

    fault = slot_faults.patch_transports(monkeypatch, answer, time.time() + fault_s, slot_faults.ACQUIRE_PATH)
    with pool.take(2) as waited:
        assert read_limit(name).active_slots == 2  # held on the server, not in this process
        assert fault["faulted"] >= 1 and waited >= fault_s - 0.1
    assert read_limit(name).active_slots == 0


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["500", "locked"])
def test_a_pool_fails_closed_when_the_server_does_not_recover(answer, prefect_server, monkeypatch,
                                                              no_client_retries):
    """The limit calls fail for good: the pool raises `SlotsUnavailable` after its wait (one line: the limit, the
    server, the last error); a pool whose acquisitions fail for good never runs the block."""
    from prefect.settings import PREFECT_API_URL

    from infra.provision import SlotPool, SlotsUnavailable

    code = str(slot_faults.ANSWERS[answer][0])
    name = limit_name(f"closed-{answer}")
    fault = slot_faults.patch_transports(monkeypatch, answer, math.inf)
    t0 = time.perf_counter()
    with pytest.raises(SlotsUnavailable) as err:
        SlotPool(2, name, wait_s=3)
    # retried up to the bound and no further (a 503 attempt takes 2 s: Prefect's client sleeps once even at 0 retries)
    assert 3 <= time.perf_counter() - t0 < 15 and fault["faulted"] >= 2
    line = str(err.value)
    assert "\n" not in line and name in line and PREFECT_API_URL.value() in line and code in line, line

    monkeypatch.setitem(fault, "answer", None)  # a healthy server makes the pool...
    pool = SlotPool(2, name, wait_s=3)
    fault = slot_faults.patch_transports(monkeypatch, answer, math.inf, slot_faults.ACQUIRE_PATH)  # ...then fails
    ran = []
    with pytest.raises(SlotsUnavailable, match="acquire slots") as err, pool.take(1):
        ran.append(True)
    assert not ran and code in str(err.value) and fault["faulted"] >= 2
    assert read_limit(name).active_slots == 0


# ------------------------------------------------------------------------------ two processes, a faulty server
def run_holders(api_url: str, name: str, answers: list[str], for_s: float, wait_s: float, hold_s: float) -> list:
    ctx = mp.get_context("spawn")
    results, together = ctx.Queue(), ctx.Barrier(len(answers))
    procs = [ctx.Process(target=slot_faults.holder,
                         args=(api_url, name, 2, a, for_s, wait_s, hold_s, together, results)) for a in answers]
    for p in procs:
        p.start()
    out = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return out


@pytest.mark.slow
def test_two_processes_never_hold_one_slot_while_the_server_fails(prefect_server):
    """Two processes, started together, each holding both slots of one limit for 2 s, while the server's limit calls
    fail (one sees 500s, the other "database is locked") for their first 3 s: both wait, both end on the server's
    limit, and their held intervals do not overlap (a per-process fallback would let both hold the slots at
    once). When the server never recovers, neither holds anything."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    held = run_holders(url, limit_name("two-procs"), ["500", "locked"], 3.0, 60, 2.0)
    assert [r[1] for r in held] == ["prefect", "prefect"] and all(r[4] >= 1 for r in held), held
    assert max_overlap([(r[2], r[3]) for r in held]) == 1, held

    refused = run_holders(url, limit_name("two-procs-down"), ["500", "locked"], math.inf, 3, 2.0)
    assert [r[1] for r in refused] == ["error", "error"] and all(r[3] >= 2 for r in refused), refused
    assert all(r[2].startswith("SlotsUnavailable: ") for r in refused), refused


# ---------------------------------------------------------------------------------- a job and a round that cannot
@pytest.fixture()
def never_trains(monkeypatch):
    """Record any worker start (and refuse it, so a test of a job that must not start stays fast if one does)."""
    from tasks.training import PrefectJobHooks

    started: list[str] = []

    def start_worker(self, spec):
        started.append(spec.job)
        raise AssertionError(f"{spec.job} started a worker")

    monkeypatch.setattr(PrefectJobHooks, "start_worker", start_worker)
    return started


@pytest.mark.slow
@pytest.mark.parametrize("path", [slot_faults.LIMIT_PATHS, slot_faults.ACQUIRE_PATH], ids=["provision", "acquire"])
def test_a_job_without_slots_ends_failed_with_the_reason_nothing_trained_nothing_charged(
        path, prefect_server, mlflow_store, tmp_path, monkeypatch, never_trains):
    """`rlhf-job` on a server whose limit calls (all of them, or only the acquisition) answer 500 for good: the flow
    run fails with `SlotsUnavailable` (the limit and the server named), its MLflow run is FAILED as a platform fault
    with that reason, no worker started, no step ran, nothing was charged (a fallback would train it to the end on a
    private semaphore, tag `slots_backend: local`)."""
    from flows.rlhf_job import rlhf_job
    from infra import provision
    from infra import tracking as T
    from training.job.lifecycle import JOB_DONE

    monkeypatch.setattr(provision, "_slot_pools", {})  # a pool made earlier in the session would not ask the server
    monkeypatch.setenv("RLHFOPS_SLOTS_WAIT_S", "1")
    fault = slot_faults.patch_transports(monkeypatch, "500", math.inf, path)
    out = tmp_path / "job"
    state = rlhf_job(request={"out_root": str(out), "run_dir": ".", "steps": 4, "cluster_gpus": 2},
                     return_state=True)
    assert state.is_failed() and fault["faulted"] >= 1
    assert "SlotsUnavailable" in state.message and f"'{provision.GPU_LIMIT}'" in state.message, state.message
    assert never_trains == []
    assert not [p.name for p in out.iterdir() if p.name in ("checkpoints", "metrics.csv", "ledger.csv", JOB_DONE)]
    run = T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}")
    assert run.info.status == "FAILED"
    tags = run.data.tags
    assert tags["run_state"].startswith("FAILED") and tags["failure_class"] == "platform_fault"
    assert "GPU slots unavailable" in tags["reason"]
    assert not {"cost_usd", "gpu_hours", "steps"} & set(run.data.metrics)  # nothing charged, no step logged


@pytest.mark.slow
def test_a_round_without_slots_fails_before_any_job_and_the_cli_exits_1(prefect_server, mlflow_store, tmp_path,
                                                                        monkeypatch, never_trains):
    """A platform round on a server whose limit calls answer 500 for good fails before it starts any job (no warm
    start built, no job directory, no worker), and `rlhfops platform`'s runner (`run_flow`) prints one line naming
    the cause and exits 1."""
    import io

    import typer
    from rich.console import Console

    import flows.platform_round
    from rlhfops.commands.flowrun import run_flow

    warmed: list = []
    monkeypatch.setattr(flows.platform_round, "warm_starts", lambda cfgs: warmed.append(cfgs))
    monkeypatch.setenv("RLHFOPS_SLOTS_WAIT_S", "1")
    fault = slot_faults.patch_transports(monkeypatch, "500", math.inf)
    name, out = limit_name("round"), tmp_path / "round"
    console = Console(file=io.StringIO(), width=400)
    with pytest.raises(typer.Exit) as done:
        run_flow(console, flows.platform_round.platform_round, "platform round",
                 jobs=[{"tenant": "acme", "name": "a"}, {"tenant": "globex", "name": "b"}], slots=1, steps=4,
                 out_dir=str(out), cache_dir=str(tmp_path / "cache"), slot_limit=name, retry_delay_s=0.1)
    assert done.value.exit_code == 1 and fault["faulted"] >= 1
    said = console.file.getvalue()
    assert "platform round failed" in said and "SlotsUnavailable" in said and name in said, said
    assert warmed == [] and never_trains == []
    assert not out.exists() or not [p for p in out.iterdir() if p.is_dir()]


@pytest.mark.slow
def test_a_job_waits_out_a_failing_server_then_trains_on_its_slots(prefect_server, mlflow_store, tmp_path,
                                                                   monkeypatch, warm_start_cache, tiny_platform_job):
    """`rlhf-job` whose first 3 s of limit calls are answered 500: it waits, then starts its worker after
    the server recovered, holding its slot on the server's limit, and trains to the end."""
    import pandas as pd

    from flows.nightly_check import nightly_job_config
    from flows.rlhf_job import rlhf_job
    from infra import provision
    from infra import tracking as T
    from tasks.training import PrefectJobHooks

    monkeypatch.setattr(provision, "_slot_pools", {})
    monkeypatch.setenv("RLHFOPS_SLOTS_WAIT_S", "120")
    started = []  # (when, the server's active slots) as the worker starts
    start_worker = PrefectJobHooks.start_worker

    def recording_start(self, spec):
        started.append((time.time(), read_limit(provision.GPU_LIMIT).active_slots))
        return start_worker(self, spec)

    monkeypatch.setattr(PrefectJobHooks, "start_worker", recording_start)
    fault = slot_faults.patch_transports(monkeypatch, "500", for_s=3.0)  # from the job's first limit request
    out = tmp_path / "job"
    state = rlhf_job(request={"config": nightly_job_config(4, str(warm_start_cache)), "overrides": tiny_platform_job,
                              "out_root": str(out), "run_dir": ".", "cluster_gpus": 1, "detector": None},
                     return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert fault["faulted"] >= 1 and summary["state"] == "SUCCEEDED"
    (when, active), = started
    assert when >= fault["until"] and active == 1  # after the fault, on the server's one slot
    assert list(pd.read_csv(out / "metrics.csv").step) == [1, 2, 3, 4]
    assert T.client().get_run(summary["run_id"]).data.tags["slots_backend"] == "prefect"
