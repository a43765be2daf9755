"""A job's ranks as Ray Train workers (`infra/ray_train.py`): the `rlhf-job` flow with `gpus: 2` on `runner: ray`
(a local Ray head the job starts and stops), and two Ray nodes of one CPU each with one rank on each (placement
SPREAD). The naming of a failed run's rank is checked on Ray's own error objects, without Ray running.

Oracle: the one-process trainer at the same seed with keyed draws (world size 1): the same samples trained,
carried and generated, the same rewards and losses (the world-1 = world-2 equality of tests/training/test_ranks.py,
here through Ray Train's process group); the ledger's GPU-seconds recomputed from metrics.csv x 2 GPUs."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from tiny_job import tiny_config  # noqa: E402

ray = pytest.importorskip("ray", reason="the ray extra: pip install '.[ray]'")

STEPS = 3
PHASES = ("rollout", "score", "sync", "optim", "eval", "reward_fn")


def _cfg(cache, **over):
    return tiny_config(cache, seed=0, n_heldout_prompts=8, sampling="keyed", steps=STEPS, **over)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def one_process(cache):
    """The oracle: the same job in this process on one rank (keyed draws), its step records."""
    from training.trainer import Trainer

    return list(Trainer(_cfg(cache), "full", None, resume=False).run(STEPS))


def _same_as(rows: list[dict], oracle) -> None:
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert {int(r["world_size"]) for r in rows} == {2}
    assert [(int(r["samples_trained"]), int(r["deferred"]), int(r["tokens_generated"])) for r in rows] == \
        [(r.samples_trained, r.deferred, r.tokens_generated) for r in oracle]
    assert sum(r.deferred for r in oracle) > 0  # units were carried across steps
    for key in ("reward_mean", "loss_policy", "kl"):
        assert np.allclose([float(r[key]) for r in rows], [getattr(r, key) for r in oracle], rtol=1e-4,
                           atol=1e-5), key


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open()))


@pytest.mark.slow
def test_the_rlhf_job_flow_with_two_gpus_on_the_local_launcher(cache, one_process, prefect_server, mlflow_store,
                                                              tmp_path, monkeypatch):
    """The flow as the tests call it with `runner: thread`: the local launcher (the worker is rank 0). Rank 0 alone
    writes; the ledger charges 2 GPUs x each step's phases, each step once. `runner: ray` (two Ray Train workers on
    a local head started for the job) is the restart test below, which checks the same and more."""
    import pandas as pd

    # card locks of its own: the default folder is the host's, shared with the flows other tests run meanwhile
    monkeypatch.setenv("RLHFOPS_SLOT_DIR", str(tmp_path / "slot-cards"))

    from flows.rlhf_job import rlhf_job

    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(_cfg(cache).model_dump(mode="json", exclude={"config_dir"}), sort_keys=False))
    request = {"config": str(config), "tenant": "acme", "name": "two-ranks", "out_root": str(tmp_path / "jobs"),
               "run_dir": ".", "detector": None, "gpus": 2, "cluster_gpus": 2, "runner": "thread"}
    state = rlhf_job(request=request, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    assert summary["state"] == "SUCCEEDED" and summary["metrics"]["steps"] == STEPS
    out = tmp_path / "jobs"
    assert not (out / "ray-train").exists()  # Ray Train's own storage: not used
    rows = _rows(out / "metrics.csv")
    _same_as(rows, one_process)
    ledger = pd.read_csv(out / "ledger.csv").set_index("run_id").loc[summary["run_id"]]
    assert int(ledger["steps"]) == STEPS
    by_hand = 2 * sum(float(r[f"phase_{p}_s"]) for r in rows for p in PHASES)
    assert ledger["gpu_seconds"] == pytest.approx(by_hand, abs=1e-5 * STEPS * len(PHASES))


@pytest.mark.slow
def test_a_ray_rank_killed_once_restarts_the_job_from_its_checkpoint(cache, one_process, prefect_server,
                                                                     mlflow_store, tmp_path, monkeypatch):
    """The rlhf-job flow with `gpus: 2` on `runner: ray`: two Ray Train workers on a local head started for the job
    and gone after it. Rank 1's Ray worker exits at the start of step 2 on the job's first start only: the job
    restarts (a fresh Ray Train run on the same head), runs step 1 again without giving it twice, and ends SUCCEEDED
    with the one-process run's rows; rank 0 alone writes, MLflow holds each step once and the ledger charges exactly
    those steps x 2 GPUs."""
    import pandas as pd

    # card locks of its own: the default folder is the host's, shared with the flows other tests run meanwhile
    monkeypatch.setenv("RLHFOPS_SLOT_DIR", str(tmp_path / "slot-cards"))

    from flows.rlhf_job import rlhf_job
    from infra import tracking as T

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RLHFOPS_RAY_GPU_SLOTS", "2")
    cfg = _cfg(cache, fault={"kind": "rank_exit", "rank": 1, "at_step": 1, "times": 1})
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"config_dir"}), sort_keys=False))
    request = {"config": str(config), "tenant": "acme", "name": "ray-restart", "out_root": str(tmp_path / "jobs"),
               "run_dir": ".", "detector": None, "gpus": 2, "cluster_gpus": 2, "runner": "ray",
               "max_rank_restarts": 1}
    state = rlhf_job(request=request, return_state=True)
    assert state.is_completed(), state.message
    summary = state.result()
    out = tmp_path / "jobs"
    assert summary["state"] == "SUCCEEDED" and summary["metrics"]["steps"] == STEPS
    assert len(list(out.glob(".fault-rank_exit-rank1-*"))) == 1  # it fired once, and the job went on
    _same_as(_rows(out / "metrics.csv"), one_process)
    logged = {p: T.client().get_metric_history(summary["run_id"], f"phase_{p}_s") for p in PHASES}
    assert sorted(m.step for m in logged["rollout"]) == list(range(1, STEPS + 1))
    ledger = pd.read_csv(out / "ledger.csv").set_index("run_id").loc[summary["run_id"]]
    assert int(ledger["steps"]) == STEPS
    by_hand = 2 * sum(m.value for ms in logged.values() for m in ms)
    assert ledger["gpu_seconds"] == pytest.approx(by_hand, abs=1e-5 * STEPS * len(PHASES))
    assert (out / "ray-train").is_dir()  # Ray Train's own storage
    assert not ray.is_initialized()  # the job's head is gone with it


@pytest.fixture(scope="module")
def two_nodes():
    """Two Ray nodes of one CPU each on this machine (`ray.cluster_utils.Cluster`), this process their driver."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address, log_to_driver=False)
        assert len([n for n in ray.nodes() if n["Alive"]]) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_two_ray_nodes_one_rank_on_each(cache, one_process, two_nodes, tmp_path):
    """The ranks spread one per node: the run's records are the one-process run's."""
    from infra.ray_train import RayRanks

    ranks = RayRanks(_cfg(cache), "full", tmp_path / "run", 2, placement_strategy="SPREAD")
    records = list(ranks.run())
    assert len(set(ranks.nodes)) == 2, ranks.nodes  # one rank on each node
    assert [r.step for r in records] == list(range(1, STEPS + 1))
    _same_as(_rows(tmp_path / "run" / "metrics.csv"), one_process)
    # the gate's per-prompt records (the paired detector's evidence) came back from rank 0: its 8 prompts at step 2
    gold = {r.step: r.gold_eval for r in records}
    assert sorted(ranks.gate_records) == [2] and len(ranks.gate_records[2]) == 8
    assert np.mean([g.gold_score for g in ranks.gate_records[2]]) == pytest.approx(gold[2], abs=1e-9)


@pytest.mark.slow
def test_a_stop_between_steps_ends_every_rank_after_that_step(cache, two_nodes, tmp_path):
    """The driver stops the run after step 2 of 3 and takes its time first (a supervisor's verdict, an MLflow
    write): rank 0 waits for its word, so no rank trains step 3; the run directory ends at step 2."""
    import time

    from infra.ray_train import RayRanks

    out = tmp_path / "run"
    run = RayRanks(_cfg(cache), "full", out, 2, placement_strategy="SPREAD").run()
    assert [next(run).step, next(run).step] == [1, 2]
    time.sleep(8.0)  # several steps' time for a rank 0 that did not wait
    run.close()
    assert [int(r["step"]) for r in _rows(out / "metrics.csv")] == [1, 2]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002"]
    assert (out / "summary.json").is_file()


@pytest.mark.slow
def test_a_hung_ray_rank_is_named_in_one_line_within_the_collective_timeout(cache, two_nodes, tmp_path, monkeypatch):
    """A live Ray Train run whose rank 1 hangs at the start of step 2: the collective timeout reaches the Ray Train
    workers' process group, and the run ends in one line naming the rank. A rank that dies under Ray is the restart
    test's fault; the naming of a dead rank is checked on Ray's own error objects below."""
    kind, line = "rank_hang", r"^rank 1 hung in step 2: no answer within the 10 s collective timeout$"
    from infra.ray_train import RayRanks
    from training.distributed.launch import RankFailed

    monkeypatch.setenv("RLHFOPS_COLLECTIVE_TIMEOUT_S", "10")
    cfg = _cfg(cache, fault={"kind": kind, "rank": 1, "at_step": 1})
    got = []
    with pytest.raises(RankFailed, match=line) as err:
        for rec in RayRanks(cfg, "full", tmp_path / "run", 2, placement_strategy="SPREAD").run():
            got.append(rec.step)
    assert got == [1] and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------ naming a failed run's rank
def _worker_group_error(failures: dict):
    from ray.train import WorkerGroupError

    return WorkerGroupError("Training failed due to worker errors", failures)


def test_a_failed_ray_run_names_its_rank_in_one_line():
    from eval.attribution import TenantCodeError
    from infra.ray_train import rank_failure
    from training.distributed.launch import RankFailed

    died = RuntimeError("A worker health check failed.\nWorker info: ...")  # what Ray reports for a dead worker
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:37070")
    timeout = RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 10000ms for recv")
    own = ValueError("bad shapes\nmore")
    named = {
        "died": rank_failure(_worker_group_error({0: gloo, 1: died}), 2, 2),
        "raised": rank_failure(_worker_group_error({0: gloo, 1: own}), 3, 2),
        "hung": rank_failure(_worker_group_error({0: timeout}), 2, 2),
    }
    assert all(isinstance(e, RankFailed) and "\n" not in str(e) for e in named.values())
    assert str(named["died"]).startswith("rank 1 died in step 2")
    assert str(named["raised"]) == "rank 1 failed in step 3: ValueError: bad shapes"
    assert str(named["hung"]).startswith("rank 1 hung in step 2")
    tenant = TenantCodeError("your reward function raised")
    assert rank_failure(_worker_group_error({1: tenant}), 2, 2) is tenant
    assert str(rank_failure(RuntimeError("controller gone"), 4, 2)) == \
        "the Ray Train run failed in step 4: controller gone"
