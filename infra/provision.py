"""Worker provisioning: task runners (threads or Ray), GPU worker slots, work pools, the Prefect API's outages.

- Task runners: flows fan out on Prefect's `ThreadPoolTaskRunner` (bounded: unbounded is the default and
  would start a thread per task); with `--runner ray` on `prefect_ray.RayTaskRunner` (the `ray` extra): the cluster
  at `RAY_ADDRESS`, else a local head started on loopback (small object store, no dashboard) and shut down with
  the runner. Ray workers get the Prefect API and MLflow store of this process. A task that trains asks Ray for
  its GPUs inside `gpu_request(n)`: `num_gpus` on a cluster with GPUs, else the `gpu_slot` custom resource.
- Compute pool: `infra/compute.py`.
- GPU worker slots: a Prefect global concurrency limit (`gpu-slots`) sized to the cluster; a job holds
  `occupy=n_gpus` slots while it trains (`strict=True`: a missing limit is an error, not a silent no-op).
  They fail closed: a server that cannot create, resize or grant the limit is retried with backoff for
  `RLHFOPS_SLOTS_WAIT_S` (default 60 s), then `SlotsUnavailable` is raised and nothing starts. A private
  in-process pool (a counting semaphore of the same size, shared with no other process) only when the user
  chooses it with `RLHFOPS_SLOTS=local`; `SlotPool.backend` says which holds the slots.
- Heartbeats: `no_heartbeats()` for subflows and temporary-server runs (see there).
- Work pools: `local-process` (type process) for local deployments; a Kubernetes work pool whose base
  job template (`infra/k8s/gpu-base-job-template.json`) requests `nvidia.com/gpu`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from common.errors import BadInput

RUNNERS = ("thread", "ray")
GPU_LIMIT = "gpu-slots"
LOCAL_POOL = "local-process"
K8S_POOL = "k8s-gpu"
K8S_TEMPLATE = Path(__file__).resolve().parent / "k8s" / "gpu-base-job-template.json"


#: the custom Ray resource that stands in for GPU slots on a cluster without GPUs (a local head declares
#: `RLHFOPS_RAY_GPU_SLOTS` of them, default 2: the nightly platform round's slot pool)
SLOT_RESOURCE = "gpu_slot"
#: object store of a local Ray head: the simulation units' results are small (Ray's minimum is 75 MiB)
RAY_OBJECT_STORE_MB = 128
#: what Ray workers need from this process's environment to reach the same Prefect API and MLflow store
RAY_WORKER_ENV = ("MLFLOW_TRACKING_URI", "PREFECT_LOGGING_LEVEL", "PREFECT_SERVER_ANALYTICS_ENABLED",
                  "OMP_WAIT_POLICY", "MPLBACKEND")
_RAY_ADDRESS = re.compile(r"^(auto|local|(ray://)?[A-Za-z0-9_.\-]+:\d{1,5})$")


def check_runner(runner: str) -> str:
    """Validate `--runner` before any work starts; `ray` needs the optional extra and a well-formed
    `RAY_ADDRESS` if one is set."""
    if runner not in RUNNERS:
        raise BadInput(f"runner: '{runner}' is not one of {', '.join(RUNNERS)}")
    if runner == "ray":
        try:
            import prefect_ray  # noqa: F401
        except ImportError:
            raise BadInput("runner: 'ray' needs prefect-ray, which is not installed; run `pip install '.[ray]'` "
                           "(or use runner 'thread')") from None
        address = os.environ.get("RAY_ADDRESS", "").strip()
        if address and not _RAY_ADDRESS.match(address):
            raise BadInput(f"RAY_ADDRESS: '{address}' is not host:port, ray://host:port or auto; unset it to start "
                           "a local Ray head")
        ray_slots()
    return runner


def ray_slots() -> int:
    raw = os.environ.get("RLHFOPS_RAY_GPU_SLOTS", "2").strip()
    if not raw.isdigit() or not 1 <= int(raw) <= 4096:
        raise BadInput(f"RLHFOPS_RAY_GPU_SLOTS: '{raw}' is not a whole number in 1..4096 (GPU slots of a local "
                       "Ray head)")
    return int(raw)


def ray_worker_env() -> dict[str, str]:
    """The environment Ray workers need: the Prefect API this process uses (on the temporary server too, else each
    worker would start a server of its own) and the MLflow store."""
    from prefect.settings import get_current_settings

    env = {k: os.environ[k] for k in RAY_WORKER_ENV if os.environ.get(k)}
    url = get_current_settings().api.url
    if not url:
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer._instances.get(None)
        url = server.api_url if server is not None and server.running else None
    if url:
        env["PREFECT_API_URL"] = url
    return env


def ray_init_kwargs(address: str | None) -> dict[str, Any]:
    """`ray.init` arguments: the workers' environment; for a local head also loopback only, no dashboard, a small
    object store, this machine's cores and the GPU-slot resource."""
    kwargs: dict[str, Any] = {"runtime_env": {"env_vars": ray_worker_env()}, "log_to_driver": False}
    if address:
        return kwargs
    return {**kwargs, "num_cpus": os.cpu_count() or 1, "include_dashboard": False, "_node_ip_address": "127.0.0.1",
            "object_store_memory": RAY_OBJECT_STORE_MB * 2**20, "resources": {SLOT_RESOURCE: ray_slots()}}


def ray_gpu_options(gpus: int, cluster: dict[str, float]) -> dict[str, Any]:
    """The Ray remote options of a task that trains on `gpus` GPUs, on a cluster with these total resources."""
    if gpus < 1:
        return {}
    if cluster.get("GPU", 0) > 0:
        kind, have, opts = "GPU", cluster["GPU"], {"num_gpus": gpus}
    else:
        kind, have, opts = SLOT_RESOURCE, cluster.get(SLOT_RESOURCE, 0), {"resources": {SLOT_RESOURCE: gpus}}
    if gpus > have:
        raise BadInput(f"gpus: a task asks for {gpus} GPUs but the Ray cluster has {have:g} {kind}; lower it or "
                       "add nodes" + (" (or raise RLHFOPS_RAY_GPU_SLOTS)" if kind == SLOT_RESOURCE else ""))
    return opts


@contextmanager
def gpu_request(gpus: int) -> Iterator[None]:
    """Tasks submitted to a Ray task runner inside the block ask Ray for `gpus` GPUs (`ray_gpu_options`), so Ray
    places them on a node that has them and runs no more at once than there are. Without a running Ray (the thread
    runner) it does nothing: there `SlotPool` holds the GPU slots."""
    try:
        import ray
    except ImportError:
        yield
        return
    if not ray.is_initialized() or gpus < 1:
        yield
        return
    from prefect_ray.context import remote_options

    with remote_options(**ray_gpu_options(gpus, ray.cluster_resources())):
        yield


def task_runner(runner: str = "thread", max_workers: int | None = None):
    """The Prefect task runner for a flow's fan-out. Built when the flow module is imported; a Ray runner reads its
    settings (`RAY_ADDRESS`, the Prefect API to hand to workers) when it is entered."""
    check_runner(runner)
    if runner == "ray":
        return ray_task_runner()
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=max_workers or max(4, 2 * (os.cpu_count() or 1)))


@contextmanager
def no_heartbeats() -> Iterator[None]:
    """Flow runs started inside this block (in this thread, or in tasks submitted from it) get no heartbeat
    thread. Prefect 3.8's heartbeat thread for a sync flow run sleeps in 1-second steps and the flow run's exit
    joins it, so each flow run blocked its caller for up to a second on the way out (measured here: a trivial
    subflow 1.15 s with it, 0.18 s without). Used for subflows, which run in their parent's process and end with
    it (the parent keeps its heartbeat; a zombie-flow automation marks the parent crashed, not the subflows), and
    for flows on the temporary server, which stops with the process (nothing could read a missed heartbeat)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield


@functools.cache
def _ray_runner_class():
    from prefect_ray import RayTaskRunner

    class LoopbackRayTaskRunner(RayTaskRunner):
        """prefect-ray's runner whose `ray.init` arguments are made when it starts (`ray_init_kwargs`): the Prefect
        API the workers must use is known only once this process has one."""

        def __enter__(self):
            address = os.environ.get("RAY_ADDRESS", "").strip() or None
            self.address = address
            self.init_kwargs = {"namespace": "prefect", **ray_init_kwargs(address)}
            return super().__enter__()

    return LoopbackRayTaskRunner


def ray_task_runner():
    return _ray_runner_class()()


# ------------------------------------------------------------------------------------------------ GPU worker slots


#: `RLHFOPS_SLOTS`: what holds the GPU slots. `prefect` (default): the Prefect global concurrency limit on the API in
#: use (the temporary server's when `PREFECT_API_URL` is unset), shared by every process that talks to it. `local`: a
#: counting semaphore in this process, shared with no other process (one process on one machine, or a test).
SLOTS_ENV = "RLHFOPS_SLOTS"
SLOT_BACKENDS = ("prefect", "local")
#: `RLHFOPS_SLOTS_WAIT_S`: how long a job retries a server that cannot create, resize or grant the slot limit
#: before it gives up (`SlotsUnavailable`); a server restart or a burst of SQLite "database is locked" fits in it
SLOTS_WAIT_ENV = "RLHFOPS_SLOTS_WAIT_S"
SLOTS_WAIT_S = 60.0
#: backoff between those retries: 0.5, 1, 2, 4, ... s, at most this
SLOTS_RETRY_MAX_DELAY_S = 8.0


class SlotsUnavailable(RuntimeError):
    """The Prefect limit that holds the GPU slots could not be created, resized or acquired within the slot wait
    (`RLHFOPS_SLOTS_WAIT_S`): the job did not start (nothing trained, nothing charged)."""


def slots_backend() -> str:
    """`RLHFOPS_SLOTS`, checked: `prefect` unless the user chose `local`."""
    raw = os.environ.get(SLOTS_ENV, "").strip() or "prefect"
    if raw not in SLOT_BACKENDS:
        raise BadInput(f"{SLOTS_ENV}: '{raw}' is not one of {', '.join(SLOT_BACKENDS)} (unset it to hold GPU slots "
                       "on the Prefect server's concurrency limit)")
    return raw


def slots_wait_s() -> float:
    """`RLHFOPS_SLOTS_WAIT_S`, checked (default `SLOTS_WAIT_S`)."""
    raw = os.environ.get(SLOTS_WAIT_ENV, "").strip()
    if not raw:
        return SLOTS_WAIT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 86400:
        raise BadInput(f"{SLOTS_WAIT_ENV}: '{raw}' is not a number of seconds in 0..86400 (how long a job retries "
                       "the Prefect server for its GPU slots)")
    return value


def check_slot_settings() -> tuple[str, float]:
    """`RLHFOPS_SLOTS` and `RLHFOPS_SLOTS_WAIT_S`, checked (a bad one is `BadInput` naming it): for an entry point to
    call before it starts any work."""
    return slots_backend(), slots_wait_s()


def _slot_timeout_error() -> type[BaseException]:
    """What `concurrency(..., timeout_seconds=...)` raises when the slots stayed taken: an answer, not a fault."""
    try:
        from prefect.concurrency._asyncio import AcquireConcurrencySlotTimeoutError
    except ImportError:  # a Prefect that moved it: its documented base class
        return TimeoutError
    return AcquireConcurrencySlotTimeoutError


class SlotPool:
    """GPU worker slots. `backend` is "prefect" (a global concurrency limit on the Prefect server, shared by
    every process that talks to it) or "local" (a counting semaphore in this process: only when the user chose it,
    `RLHFOPS_SLOTS=local`, or a caller passed it). A Prefect limit that cannot be created, resized or acquired is
    retried for `wait_s` seconds (default `RLHFOPS_SLOTS_WAIT_S`), then `SlotsUnavailable`: never a silent fallback
    to a semaphore other processes do not share (two jobs on one GPU)."""

    def __init__(self, size: int, name: str = GPU_LIMIT, backend: str | None = None, wait_s: float | None = None):
        if size < 1:
            raise BadInput(f"slots: the pool needs at least one slot (got {size})")
        self.size, self.name = size, name
        self.wait_s = slots_wait_s() if wait_s is None else wait_s
        self.backend = backend or slots_backend()
        if self.backend not in SLOT_BACKENDS:
            raise BadInput(f"slots: backend '{self.backend}' is not one of {', '.join(SLOT_BACKENDS)}")
        if self.backend == "prefect":
            self._provision()
        self._cond = threading.Condition()
        self._free = size
        self.waits: list[float] = []

    def _provision(self) -> None:
        """Create the limit on the server, or resize it to this pool's size."""
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectAlreadyExists

        def upsert(_timeout_s: float | None = None) -> None:
            with get_client(sync_client=True) as c:
                try:
                    c.upsert_global_concurrency_limit_by_name(self.name, self.size)
                except ObjectAlreadyExists:
                    # Prefect's upsert is a read, then a create: a pool provisioned at the same moment in another
                    # thread or process created the limit in between. Upserting again finds it (and resizes it).
                    c.upsert_global_concurrency_limit_by_name(self.name, self.size)

        self._until_held("create or resize the limit", upsert)

    def _until_held(self, what: str, request: Callable[[float | None], Any], timeout_s: float | None = None) -> Any:
        """`request(timeout left)` until it succeeds, retried with backoff for `wait_s` seconds on any error but a
        slot timeout (the slots stayed taken for `timeout_s`: propagated), the last attempt at `wait_s`; then
        `SlotsUnavailable`, one line naming the server, the limit and the last error. One attempt can take longer
        than the backoff: an unreachable API is waited out for its own outage budget (`retry_unreachable`), and
        Prefect's client retries a 503 (a locked database) itself before it answers."""
        timeout_error = _slot_timeout_error()
        t0, delay, attempts = time.monotonic(), 0.5, 0
        while True:
            attempts += 1
            left = None if timeout_s is None else max(0.0, timeout_s - (time.monotonic() - t0))
            try:
                return retry_unreachable(functools.partial(request, left))
            except (BadInput, timeout_error):
                raise
            except Exception as err:  # noqa: BLE001 - every other error leaves the limit unheld: retried, then fatal
                waited = time.monotonic() - t0
                cause = f"{type(err).__name__}: {err}".replace("\n", " ")
                if waited >= self.wait_s:
                    raise SlotsUnavailable(
                        f"GPU slots unavailable: could not {what} '{self.name}' ({self.size} slots) on the Prefect "
                        f"server at {api_label()} in {waited:.1f} s ({attempts} attempts; {SLOTS_WAIT_ENV}="
                        f"{self.wait_s:g}); last error {cause[:300]}; the job did not start") from err
                delay = min(delay, self.wait_s - waited)  # the last attempt at the bound
                _log().warning("GPU slots: could not %s '%s' (%s); retrying in %.1f s", what, self.name, cause[:300],
                               delay)
                time.sleep(delay)
                delay = min(delay * 2, SLOTS_RETRY_MAX_DELAY_S)

    @contextmanager
    def take(self, n: int = 1, timeout_s: float | None = None) -> Iterator[float]:
        """Hold `n` slots for the duration of the block; yields the seconds spent waiting for them."""
        if n > self.size:
            raise BadInput(f"slots: a job asks for {n} GPU slots but the pool has {self.size}")
        t0 = time.perf_counter()
        if self.backend == "prefect":
            from contextlib import ExitStack

            from prefect.concurrency.sync import concurrency

            with ExitStack() as held:
                # a fresh client's request each time: a server restart made it ConcurrencySlotAcquisitionError, a
                # 5xx or a locked database the same; retried for `wait_s`, then the job fails without starting
                self._until_held("acquire slots of the limit", lambda left: held.enter_context(
                    concurrency(self.name, occupy=n, timeout_seconds=left, strict=True)), timeout_s)
                wait = time.perf_counter() - t0
                self.waits.append(wait)
                yield wait
                # the release is the first request of a fresh client, which Prefect does not retry on a refused
                # connection: a job that trained through an API outage failed here, work done. (Not after an error
                # in the block: a cancelled or failing job should not wait minutes to say so.)
                wait_for_api()
            return
        with self._cond:
            if not self._cond.wait_for(lambda: self._free >= n, timeout=timeout_s):
                raise TimeoutError(f"no {n} free GPU slots within {timeout_s}s")
            self._free -= n
        wait = time.perf_counter() - t0
        self.waits.append(wait)
        try:
            yield wait
        finally:
            with self._cond:
                self._free += n
                self._cond.notify_all()

    def describe(self) -> str:
        if self.backend == "prefect":
            return f"{self.size} GPU slots (Prefect global concurrency limit '{self.name}')"
        return f"{self.size} GPU slots (local slot pool, {SLOTS_ENV}=local: this process only)"


def api_label() -> str:
    """The Prefect API this process uses, for a message: its URL, or the temporary server's."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if url:
        return str(url)
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer._instances.get(None)
    return f"{server.api_url} (temporary)" if server is not None and server.running else "the temporary server"


_slot_pools: dict[tuple[str, str | None, str], SlotPool] = {}
#: not the compute pool's lock: provisioning may wait `RLHFOPS_SLOTS_WAIT_S` for the server, the compute pool must not
_slot_pools_lock = threading.Lock()


def gpu_slots(size: int, name: str = GPU_LIMIT) -> SlotPool:
    """The process's slot pool of that name on the Prefect API in use (one per name, API and backend, so concurrent
    jobs in this process share it); the Prefect limit is (re)sized to `size` on first use. Keyed by the API too: a
    pool provisioned on one server holds no limit on another (a process that switched servers waited forever).
    Raises `SlotsUnavailable` when the server cannot hold the limit (nothing is kept: the next call tries again)."""
    from prefect.settings import PREFECT_API_URL

    backend = slots_backend()
    key = (name, PREFECT_API_URL.value(), backend)
    with _slot_pools_lock:
        pool = _slot_pools.get(key)
        if pool is None or pool.size != size:
            pool = _slot_pools[key] = SlotPool(size, name, backend)
        return pool


# ---------------------------------------------------------------------------------------------------------
# work pools


def k8s_base_job_template(path: Path = K8S_TEMPLATE) -> dict:
    return json.loads(path.read_text())


def ensure_work_pools(k8s: bool = False) -> list[str]:
    """Create the local process pool (and, with `k8s`, the Kubernetes GPU pool from the template) on the
    Prefect server in use. Idempotent. Returns the pool names that exist afterwards."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    wanted = [WorkPoolCreate(name=LOCAL_POOL, type="process")]
    if k8s:
        wanted.append(WorkPoolCreate(name=K8S_POOL, type="kubernetes", base_job_template=k8s_base_job_template()))
    made = []
    with get_client(sync_client=True) as c:
        for pool in wanted:
            try:
                c.create_work_pool(pool)
            except ObjectAlreadyExists:
                pass
            made.append(pool.name)
    return made


# ---------------------------------------------------------------------------------------------------------
# surviving Prefect API outages

#: how long a job waits out an unreachable Prefect API before it gives up (a server restart, a short outage)
API_OUTAGE_BUDGET_S = 300.0
#: Prefect client retries per request while the job runs: its backoff is 2, 4, 8, ... s, so 7 retries span ~4 min
#: (Prefect's default, 5, spans ~1 min: a 76-s outage failed the job)
API_CLIENT_RETRIES = 7


class APIUnreachable(ConnectionError):
    """The Prefect API stayed unreachable for longer than the outage budget."""


def wait_for_api(budget_s: float | None = None, first_delay_s: float = 1.0, max_delay_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep) -> float:
    """Block until the Prefect API answers its health check, backing off exponentially (1, 2, 4, ... up to 30 s)
    for up to `budget_s` (default `API_OUTAGE_BUDGET_S`). Returns the seconds waited (0 when it answered at once).

    Prefect's client retries a refused connection only on a client that has connected before; a fresh client (a
    concurrency-slot release, a new task run's first request) fails at once. Calling this before such a request
    turns an outage of a few minutes into a pause. On the temporary server it returns at once (that server lives
    in this process's care; if it is gone, waiting cannot bring it back)."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:
        return 0.0
    budget = API_OUTAGE_BUDGET_S if budget_s is None else budget_s
    t0, delay, logged = time.monotonic(), first_delay_s, False
    while True:
        try:
            with get_client(sync_client=True) as c:
                err = c.api_healthcheck()
        except Exception as exc:  # noqa: BLE001 - any failure to reach the API counts as an outage
            err = exc
        waited = time.monotonic() - t0
        if err is None:
            if logged:
                _log().warning("Prefect API reachable again after %.0f s", waited)
            return waited
        if waited + delay > budget:
            raise APIUnreachable(f"Prefect API at {get_current_settings().api.url} unreachable for {waited:.0f} s "
                                 f"({type(err).__name__}: {err}); retry the run, it resumes from its checkpoints")
        _log().warning("Prefect API unreachable (%s: %s); retrying in %.0f s", type(err).__name__, err, delay)
        logged = True
        sleep(delay)
        delay = min(delay * 2, max_delay_s)


def unreachable_api(err: BaseException) -> bool:
    """The error (or one it was raised from) is a failure to reach the Prefect API: a transport error of httpx (a
    refused connection, a reset, a timeout), as a fresh client raises it at once while the server restarts."""
    import httpx

    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, httpx.TransportError):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def retry_unreachable(fn: Callable[[], Any], attempts: int = 3) -> Any:
    """`fn()`; when it fails to reach the Prefect API (`unreachable_api`), wait for the API (`wait_for_api`) and call
    it again, up to `attempts` calls in all. For the requests Prefect makes through a fresh client (the runtime's
    deployment lookup, a concurrency-slot acquisition), which it does not retry on a refused connection: a server
    restart then became a failed job. Any other error, and the last attempt's, propagates."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as err:
            if attempt == attempts or not unreachable_api(err):
                raise
            _log().warning("Prefect API unreachable (%s: %s); waiting for it, then trying again",
                           type(err).__name__, err)
            wait_for_api()
    raise AssertionError("unreachable")  # the loop returns or raises


def _log():
    import logging

    try:
        from prefect.logging import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow or task run
        return logging.getLogger("rlhfops.provision")


@contextmanager
def api_outage_tolerance(retries: int = API_CLIENT_RETRIES) -> Iterator[None]:
    """Inside the block, every Prefect client request (task-run creation, state changes) is retried up to `retries`
    times with Prefect's exponential backoff instead of its default 5, and a refused connection on a client that
    had connected is one of the retried errors: a flow body survives an API outage of a few minutes. A setting
    the user made higher is kept. Not on the temporary server: it lives and dies with this process, and once it is
    gone (the process is being stopped) retrying for minutes only delays the exit."""
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, get_current_settings, temporary_settings

    if not get_current_settings().api.url:
        yield
        return
    with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: max(retries, PREFECT_CLIENT_MAX_RETRIES.value())}):
        yield


# ---------------------------------------------------------------------------------------------------------
# the temporary Prefect server dies with the process that started it

SERVER_APP_FACTORY = "infra.server_child:create_app"


def own_temporary_server() -> bool:
    """Make the temporary Prefect server this process may start (no `PREFECT_API_URL`) die with this process.

    Prefect starts it as a plain subprocess and stops it from an `atexit` hook, which never runs when the process
    is killed (kill -9, OOM): the server was still serving minutes later. Here the server runs our app factory
    (`infra.server_child`), which watches its parent and stops the server when the parent is gone. A
    parent-death signal (`prctl(PR_SET_PDEATHSIG)`) cannot do it: Prefect starts the server from whichever thread
    first needs the API (`rlhfops nightly` does it from a short-lived background thread), and the signal fires when
    that *thread* exits. Uses the hook Prefect's own test harness uses (`SubprocessASGIServer._instances[None]`).
    Returns True when installed (False with an API URL set, or when a temporary server already runs)."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return False
    owned = owned_server_class()
    current = SubprocessASGIServer._instances.get(None)
    if isinstance(current, owned):
        return True
    if current is not None and current.running:
        return False
    SubprocessASGIServer._instances.pop(None, None)
    owned()  # registers itself under the default key, where Prefect's clients look for the temporary server
    return True


@functools.cache
def owned_server_class():
    from prefect.server.api.server import SubprocessASGIServer

    class OwnedTemporaryServer(SubprocessASGIServer):
        """Prefect's temporary server, started through `infra.server_child` (see `own_temporary_server`)."""

        def _run_uvicorn_command(self):

            import prefect
            from prefect.settings import get_current_settings

            env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
                   "PREFECT__SERVER_FINAL": "1", **get_current_settings().to_environment_variables(exclude_unset=True),
                   "RLHFOPS_SERVER_PARENT_PID": str(os.getpid())}
            return subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
                 SERVER_APP_FACTORY, "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error",
                 "--lifespan", "on"], env=env)

    return OwnedTemporaryServer

