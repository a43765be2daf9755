"""Fixtures shared by the test files: a temporary Prefect server of one's own, a fresh MLflow store."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

#: the per-test timeout (pytest-timeout) of a test marked `slow` that names none of its own: the end-to-end tests
#: train real jobs or start servers; their default (pyproject's `timeout`, 300 s) is meant for everything else
SLOW_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    """Slow end-to-end tests get `SLOW_TIMEOUT_S` unless they carry an explicit `@pytest.mark.timeout(...)`."""
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


def _address_space_bytes() -> int:
    """This process's virtual address space now (VmSize), in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@pytest.fixture(autouse=True)
def _memory_cap(request):
    """`@pytest.mark.memory_cap(gib)`: the test may grow this process's address space by at most `gib` GiB
    (RLIMIT_AS, soft limit only, restored after the test). A runaway allocation then fails that test with a
    MemoryError at once instead of swapping the shared CI machine to a halt and ending as a whole-run timeout.
    The cap is relative to what the (xdist) worker already maps, so the modules earlier tests imported (torch maps
    about 0.6 GB) do not eat the budget."""
    marker = request.node.get_closest_marker("memory_cap")
    if marker is None or not sys.platform.startswith("linux"):
        yield
        return
    import resource

    gib = float(marker.kwargs.get("gib", marker.args[0] if marker.args else 4))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _address_space_bytes() + int(gib * 2**30)
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextmanager
def temporary_prefect_server(tmp_path_factory, home_name: str = "prefect-home",
                             startup_timeout_s: int = 180) -> Iterator[None]:
    """Prefect's test harness (a temporary server on SQLite) with its own PREFECT_HOME, analytics off and quiet
    logs."""
    from prefect.settings import (
        PREFECT_HOME,
        PREFECT_LOGGING_LEVEL,
        PREFECT_SERVER_ANALYTICS_ENABLED,
        temporary_settings,
    )
    from prefect.testing.utilities import prefect_test_harness

    home = tmp_path_factory.mktemp(home_name)
    with temporary_settings({PREFECT_HOME: str(home), PREFECT_SERVER_ANALYTICS_ENABLED: False,
                             PREFECT_LOGGING_LEVEL: "WARNING"}):
        with prefect_test_harness(server_startup_timeout=startup_timeout_s):
            yield


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """One temporary Prefect server for the session. Prefect's sync event-loop thread keeps talking to the first
    server a process used, so a second harness in the same process is not isolated: share this one, and give
    slot limits names of their own."""
    with temporary_prefect_server(tmp_path_factory):
        yield


@pytest.fixture(scope="module")
def warm_start_cache(request, tmp_path_factory):
    """Where tiny-model warm starts (base policy, proxy reward model) are kept. They are keyed by a hash of the
    config that made them, so pytest's cache directory can keep them between sessions (mutation testing starts a
    fresh session per mutant)."""
    if getattr(request.config, "cache", None) is not None:
        return request.config.cache.mkdir("rlhfops-warm-starts")
    return tmp_path_factory.mktemp("warm-starts")


@pytest.fixture()
def tiny_platform_job():
    """Overrides that make the platform round's PPO job tiny (small models, few pairs and SFT steps; jobs with
    these settings share one warm start)."""
    return {"policy.hidden_size": 32, "policy.num_layers": 1, "policy.intermediate_size": 64,
            "reward.hidden_size": 32, "reward.num_layers": 1, "reward.intermediate_size": 64,
            "task.n_pairs": 64, "task.sft_steps": 20, "task.n_train_prompts": 32, "task.n_heldout_prompts": 8,
            "ppo.batch_size": 8, "ppo.max_new_tokens": 16, "eval_prompts": 8}


@pytest.fixture()
def mlflow_store(tmp_path, monkeypatch):
    """A SQLite MLflow store of the test's own (absolute path: threads and worker processes share it)."""
    from infra import tracking as T

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return T.init_store()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite MLflow store for a test module (creating one runs MLflow's migrations: seconds each on 2 loaded
    cores); its tests keep apart by their own registered model (`model`) or run keys."""
    from infra import tracking as T

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")
        yield T.init_store()


@pytest.fixture()
def model(request) -> str:
    """A registered-model name of the test's own."""
    return f"policy-{request.node.name}"[:200].replace("[", "-").replace("]", "")


class StopThirdEarly:
    """A gate detector: a monitor says stop at its third checkpoint if that checkpoint is at step <= 6. Each
    `start()` is a fresh monitor, so a resumed run's gate only stops on checkpoints seen after the resume."""

    def start(self):
        seen = []

        class Monitor:
            def observe(self, cp):
                seen.append(cp.step)
                return len(seen) == 3 and cp.step <= 6

        return Monitor()


@pytest.fixture
def stop_third_early():
    """The gate detector of the pause-then-resume tests (the lifecycle's and the flow's)."""
    return StopThirdEarly
