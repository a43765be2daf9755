"""`--runner ray`: the choice of Ray resources for a training task, the RAY_ADDRESS check, and a real local Ray head
(loopback, started and shut down by the task runner) whose workers report what Ray assigned them. That the
nightly's results on Ray equal the thread runner's is tests/infra/test_stack.py's slow test."""

from __future__ import annotations

import os
import sys

import pytest

from common.errors import BadInput
from infra.provision import SLOT_RESOURCE, check_runner, gpu_request, ray_gpu_options, task_runner

ray = pytest.importorskip("ray", reason="the ray extra: pip install '.[ray]'")


def test_a_training_task_asks_for_gpus_on_a_gpu_cluster_and_for_slots_elsewhere():
    assert ray_gpu_options(2, {"CPU": 64.0, "GPU": 8.0}) == {"num_gpus": 2}
    assert ray_gpu_options(2, {"CPU": 2.0, SLOT_RESOURCE: 2.0}) == {"resources": {SLOT_RESOURCE: 2}}
    assert ray_gpu_options(0, {"GPU": 8.0}) == {}
    with pytest.raises(BadInput, match="asks for 9 GPUs but the Ray cluster has 8 GPU"):
        ray_gpu_options(9, {"GPU": 8.0})
    with pytest.raises(BadInput, match="RLHFOPS_RAY_GPU_SLOTS"):
        ray_gpu_options(3, {"CPU": 2.0, SLOT_RESOURCE: 2.0})


@pytest.mark.parametrize("address, ok", [("ray://head:10001", True), ("10.0.0.5:6379", True), ("auto", True),
                                         ("http://head", False), ("head", False), ("ray://", False)])
def test_ray_address_is_checked_before_work(monkeypatch, address, ok):
    monkeypatch.setenv("RAY_ADDRESS", address)
    if ok:
        assert check_runner("ray") == "ray"
    else:
        with pytest.raises(BadInput, match="RAY_ADDRESS"):
            check_runner("ray")


def assigned() -> dict:
    """Runs in a Ray worker: what Ray gave this task, and the Prefect API it reports to."""
    import ray as ray_in_worker

    return {"resources": ray_in_worker.get_runtime_context().get_assigned_resources(),
            "api": os.environ.get("PREFECT_API_URL"), "pid": os.getpid()}


def test_a_local_head_gives_a_training_task_its_slots(prefect_server, monkeypatch):
    """~30 s. A task submitted inside gpu_request(2) holds 2 of the head's slots (Ray's own account of it); one
    outside holds none; both report to this session's Prefect API (not a server of their own); the head is gone
    once the runner exits."""
    from prefect import flow, task
    from prefect.settings import get_current_settings

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RLHFOPS_RAY_GPU_SLOTS", "2")
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test module is not importable in workers
    probe = task(assigned, name="probe")

    @flow
    def fan_out():
        with task_runner("ray") as runner:
            with gpu_request(2):
                training = runner.submit(probe, {})
            plain = runner.submit(probe, {})
            return training.result(), plain.result(), ray.cluster_resources()

    training, plain, cluster = fan_out()
    assert cluster[SLOT_RESOURCE] == 2.0 and cluster.get("GPU", 0) == 0
    assert training["resources"].get(SLOT_RESOURCE) == 2.0
    assert SLOT_RESOURCE not in plain["resources"]
    assert training["api"] == plain["api"] == get_current_settings().api.url
    assert training["pid"] != os.getpid()
    assert not ray.is_initialized()


def test_the_simulation_task_pickles_the_way_ray_sends_it():
    """Ray sends a task's function by value, globals included; `simulate_unit` refers to the timing clock (which
    holds a lock): it must arrive as the receiving process's own clock."""
    from tasks.sim import simulate_unit
    from tasks.timing import clock

    restored = ray.cloudpickle.loads(ray.cloudpickle.dumps(simulate_unit))
    assert restored.fn.__globals__["clock"] is clock
