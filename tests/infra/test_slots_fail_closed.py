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
    falls back to a semaphore (before: backend "local", and the job started)."""
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
def run_holders(api_url: str, name: str, answers: list[str], until: float, wait_s: float, hold_s: float) -> list:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=slot_faults.holder, args=(api_url, name, 2, a, until, wait_s, hold_s, results))
             for a in answers]
    for p in procs:
        p.start()
    out = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return out


@pytest.mark.slow
def test_two_processes_never_hold_one_slot_while_the_server_fails(prefect_server):
    """Two processes, each holding both slots of one limit for 1.5 s, start while the server's limit calls fail (one
    sees 500s, the other "database is locked") for 3 s: both wait, both end on the server's limit, and their held
    intervals do not overlap. Before, each fell back to its own semaphore and both held the slots at once. When the
    server never recovers, neither holds anything."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    held = run_holders(url, limit_name("two-procs"), ["500", "locked"], time.time() + 3.0, 60, 1.5)
    assert [r[1] for r in held] == ["prefect", "prefect"], held
    assert max_overlap([(r[2], r[3]) for r in held]) == 1, held

    refused = run_holders(url, limit_name("two-procs-down"), ["500", "locked"], math.inf, 1.5, 1.5)
    assert [r[1] for r in refused] == ["error", "error"], refused
    assert all(r[2].startswith("SlotsUnavailable: ") for r in refused), refused
