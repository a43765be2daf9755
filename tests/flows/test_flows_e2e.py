"""Flows under Prefect's test harness (one temporary server per test session), MLflow in temp SQLite stores.

What runs for real here: the simulator fan-out, the retries under injected failures, a PPO job on the
tiny synthetic task with the supervisor, the registry, and a trimmed nightly. Nothing is stubbed."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from infra import tracking as T


def _runs(kind: str | None = None) -> pd.DataFrame:
    import mlflow

    df = mlflow.search_runs(experiment_names=[T.DEFAULT_EXPERIMENT], max_results=10_000)
    if kind is not None and len(df):
        df = df[df[f"tags.{T.KIND_TAG}"] == kind]
    return df


def _direct_summary(exp: str, seeds: list[int]) -> pd.DataFrame:
    from scheduling.experiments import aggregate, load_experiment, run_units, units_for

    cfg = load_experiment(exp).model_copy(update={"seeds": seeds})
    per_seed, jobs = run_units(units_for(cfg), workers=1)
    return aggregate(per_seed, jobs)


def test_scheduling_experiment_matches_the_simulator_and_tracks_runs(prefect_server, mlflow_store, tmp_path):
    from prefect.client.orchestration import get_client

    from flows.simulate import scheduling_experiment
    from scheduling.request import ExperimentRequest

    state = scheduling_experiment(ExperimentRequest(experiment="E1", seeds=[42, 123], out_dir=str(tmp_path / "E1"),
                                                    workers=1), return_state=True)
    assert state.is_completed()
    res = state.result()
    got = pd.read_csv(tmp_path / "E1" / "summary.csv")
    want = _direct_summary("E1", [42, 123])
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    assert (tmp_path / "E1" / "E1.png").is_file()

    parent = _runs("scheduling_experiment")
    assert len(parent) == 1 and parent.iloc[0]["status"] == "FINISHED"
    assert parent.iloc[0][f"tags.{T.FLOW_RUN_TAG}"] == str(state.state_details.flow_run_id)
    assert parent.iloc[0][f"tags.{T.DEPLOYMENT_TAG}"] == "local"
    children = _runs("sim_variant")
    assert len(children) == 1 and set(children[f"tags.{T.PARENT_TAG}"]) == {res["run_id"]}
    fifo = want[want.scheduler == "FIFO"].iloc[0]
    assert children.iloc[0]["metrics.jct_mean/FIFO"] == pytest.approx(fifo.jct_mean)
    arts = {a.path for a in T.client().list_artifacts(res["run_id"])}
    assert {"summary.csv", "per_seed.csv", "config.yaml", "tenants.csv", "E1.png"} <= arts
    # the same files as `rlhfops simulate` (scheduling.request.write_experiment): tenants.csv from the ledger
    assert {p.name for p in (tmp_path / "E1").iterdir()} == {"summary.csv", "per_seed.csv", "jobs.csv", "tenants.csv",
                                                            "config.yaml", "E1.png"}
    with get_client(sync_client=True) as c:
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        found = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["summary-e1"])))
    assert found and len(json.loads(found[0].data)) == len(want)


@pytest.mark.slow
def test_sweep_survives_30pct_injected_failures_with_one_run_per_unit(prefect_server, mlflow_store, tmp_path):
    """30% of task attempts fail (worker start, tracking open, mid-logging); the sweep completes with the
    same numbers and MLflow holds exactly one run per variant: none lost, none duplicated."""
    from mlflow.entities import ViewType
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.simulate import scheduling_experiment
    from scheduling.experiments import load_experiment
    from scheduling.request import ExperimentRequest
    from tasks.retry import fault_site
    from tasks.tracking import VARIANT_FAULT_SITES
    from training.job.request import JobInternals

    seeds = [42, 123]
    state = scheduling_experiment(ExperimentRequest(experiment="E6", seeds=seeds, out_dir=str(tmp_path / "E6"),
                                                    workers=1),
                                  internals=JobInternals(fail_rate=0.3, fault_seed=3, retry_delay_s=0.01),
                                  return_state=True)
    assert state.is_completed(), state.message
    got = pd.read_csv(tmp_path / "E6" / "summary.csv")
    pd.testing.assert_frame_equal(got, _direct_summary("E6", seeds).reset_index(drop=True), check_dtype=False)

    variants = [v.name for v in load_experiment("E6").variants]
    children = _runs("sim_variant")
    assert sorted(children["tags.mlflow.runName"]) == sorted(f"E6/{v}" for v in variants)  # one each
    assert (children["status"] == "FINISHED").all()
    assert len(_runs("scheduling_experiment")) == 1
    # the fault plan really hit: tasks ran more than once, and attempts that died mid-logging left runs
    # that the retry replaced (deleted), not duplicated
    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    with get_client(sync_client=True) as c:
        trs = c.read_task_runs(flow_run_filter=flow_run)
    assert sum(tr.run_count > 1 for tr in trs) >= 3

    def mid_faults(variant: str) -> int:
        """Attempts that died between opening the run and finishing it, before the first clean attempt."""
        n, attempt = 0, 1
        while (site := fault_site(f"E6/{variant}", 0.3, 3, attempt, VARIANT_FAULT_SITES)) is not None:
            n += site == "tracking-mid"
            attempt += 1
        return n

    expected_deleted = sum(mid_faults(v) for v in variants)
    deleted = T.client().search_runs([T.experiment_id()], run_view_type=ViewType.DELETED_ONLY)
    # every attempt that died mid-logging left a run, and the next attempt replaced it (deleted, not kept)
    assert expected_deleted > 0 and len(deleted) == expected_deleted


def test_subflows_under_no_heartbeats_start_no_heartbeat_thread(prefect_server):
    """Subflows called directly or from a submitted task inside `no_heartbeats()` see no heartbeat interval (so
    Prefect starts no heartbeat thread for them and their exit does not wait on one); the parent keeps its own."""
    from prefect import flow, task
    from prefect.settings import get_current_settings
    from prefect.task_runners import ThreadPoolTaskRunner

    from infra.provision import no_heartbeats

    @flow
    def child() -> int | None:
        return get_current_settings().flows.heartbeat_frequency

    @task
    def via_task() -> int | None:
        return child()

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=2))
    def parent() -> tuple:
        own = get_current_settings().flows.heartbeat_frequency
        with no_heartbeats():
            return own, child(), via_task.submit().result()

    own, direct, submitted = parent()
    assert own is not None and direct is None and submitted is None


def test_bad_config_field_fails_the_job_before_any_slot(prefect_server, mlflow_store, tmp_path):
    from flows.rlhf_job import rlhf_job
    from infra import provision

    provision._slot_pools.clear()
    state = rlhf_job(request={"config": "configs/ppo-tiny.yaml", "overrides": {"ppo.kl_coeff": 0.1},
                              "out_root": str(tmp_path / "j")}, return_state=True)
    assert state.is_failed()
    assert "ppo.kl_coeff" in state.message and "unknown key" in state.message
    assert provision._slot_pools == {}  # no slot pool was even provisioned
    assert _runs().empty  # nothing was tracked either
    assert not (tmp_path / "j").exists()


#: a smaller job than the nightly's, so the test stays short: fewer reward-model pairs and SFT steps
TINY_JOB = {"task.n_pairs": 200, "task.sft_steps": 60, "ppo.batch_size": 16, "ppo.max_new_tokens": 24}


@pytest.mark.slow
def test_nightly_quick_end_to_end_mlflow_contents(prefect_server, mlflow_store, tmp_path):
    """A trimmed `nightly --quick` (two experiments, one seed, an 8-step job, the control canary), run twice:
    asserts the runs, tags, metrics, artifacts and registry entry MLflow holds, and the second night's report."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import flows.nightly as N

    state = N.nightly_sweep(quick=True, experiments=["E1", "E2"], seeds=[42], detectors=False, job_steps=8,
                            job_overrides=TINY_JOB, canaries=["control"], canary_steps=10, platform_steps=6,
                            platform_jobs=[{"tenant": "globex", "name": "a", "overrides": TINY_JOB},
                                           {"tenant": "initech", "name": "b", "overrides": TINY_JOB}],
                            sweep=False, out_dir=str(tmp_path / "n1"), cache_dir=str(tmp_path / "cache"), workers=1,
                            return_state=True)
    assert state.is_completed(), state.message
    res = state.result()

    night = _runs("nightly")
    assert len(night) == 1
    n = night.iloc[0]
    assert n.status == "FINISHED" and n[f"tags.{T.FLOW_RUN_TAG}"] == str(state.state_details.flow_run_id)
    assert n[f"tags.{T.DEPLOYMENT_TAG}"] == "local" and n[f"tags.{T.TENANT_TAG}"] == "platform"
    assert 0 <= n["metrics.orchestration_frac"] < 1 and n["metrics.work_s"] > 0
    sims = _runs("scheduling_experiment")
    assert sorted(sims["params.experiment"]) == ["E1", "E2"]
    assert set(sims[f"tags.{T.PARENT_TAG}"]) == {n.run_id}
    variants = _runs("sim_variant")
    assert len(variants) == 2 and variants["metrics.jct_mean/EvalStop_SRTF"].notna().all()

    job = _runs("rlhf_job")
    assert len(job) == 1
    j = job.iloc[0]
    assert j[f"tags.{T.TENANT_TAG}"] == "acme" and j[f"tags.{T.PARENT_TAG}"] == n.run_id
    # a healthy 8-step job under production alert windows (20+ steps) cannot page: it must succeed
    assert j["tags.run_state"] == "SUCCEEDED" and j["tags.decision"] == "completed", j["tags.reason"]
    assert j["metrics.cost_usd"] > 0 and j["metrics.gpu_hours"] > 0
    assert j["metrics.steps"] == len(T.client().get_metric_history(j.run_id, "reward_mean"))
    assert j["params.ppo.batch_size"] == "16"
    arts = {a.path for a in T.client().list_artifacts(j.run_id)}
    assert {"best_checkpoint", "ledger.csv", "config.resolved.yaml", "scores.json", "metrics.csv"} <= arts
    assert "actor" in {a.path.split("/")[-1] for a in T.client().list_artifacts(j.run_id, "best_checkpoint")}

    mv = T.client().get_model_version_by_alias("acme-policy", "best")
    assert mv.run_id == j.run_id
    assert float(mv.tags["eval_score"]) == pytest.approx(j["metrics.best_eval"], abs=1e-5)
    ev = _runs("evaluation")
    assert len(ev) == 1 and ev.iloc[0]["metrics.eval_score"] == pytest.approx(j["metrics.best_eval"], abs=1e-5)
    platform = _runs("platform")
    assert len(platform) == 1 and platform.iloc[0][f"tags.{T.PARENT_TAG}"] == n.run_id
    pjobs = _runs("platform_job")
    assert sorted(pjobs[f"tags.{T.TENANT_TAG}"]) == ["globex", "initech"]
    assert set(pjobs[f"tags.{T.PARENT_TAG}"]) == {platform.iloc[0].run_id} and (pjobs["metrics.cost_usd"] > 0).all()
    assert platform.iloc[0]["tags.slots_backend"] == "prefect"  # the slots were a Prefect global limit
    canary = _runs("canary")
    assert list(canary["tags.mlflow.runName"]) == ["canary control"]
    assert {"report.md", "timing.json", "summary.csv"} <= {a.path for a in T.client().list_artifacts(n.run_id)}
    assert "## Where the time went" in res.report
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["nightly-report"])))
    assert arts and "Nightly report" in arts[0].data

    # a second night (simulation only): the report now compares it with the first
    state2 = N.nightly_sweep(quick=True, experiments=["E2"], seeds=[42], detectors=False, job=False, canaries=[],
                             platform=False, sweep=False, out_dir=str(tmp_path / "n2"), workers=1, return_state=True)
    assert state2.is_completed(), state2.message
    from infra.reporting import nightly_report

    rep = nightly_report(tonight_id=state2.result().run_id)
    assert rep["last"].run_id == n.run_id
    s = rep["schedulers"]
    e2 = s[(s.experiment == "E2") & (s.metric == "jct_mean")]
    assert len(e2) and (e2["delta"].abs() < 1e-9).all()  # same seed, same simulator: no change
    tenants = rep["tenants"]
    assert {"acme", "globex", "initech"} <= set(tenants["tenant"])  # last night's tenants, none tonight
    assert tenants[tenants.metric == "cost_usd"]["tonight"].isna().all()

    # a third night with only its sweep stage (one trial of the example spec): the sweep's MLflow parent run is
    # nested under the nightly's, its trial under the sweep's, and the nightly times the stage
    state3 = N.nightly_sweep(quick=True, experiments=["E1"], seeds=[42], detectors=False, job=False, canaries=[],
                             platform=False, sweep_trials=1, out_dir=str(tmp_path / "n3"),
                             cache_dir=str(tmp_path / "cache"), workers=1, return_state=True)
    assert state3.is_completed(), state3.message
    res3 = state3.result()
    assert res3.sweep["trials_done"] == 1 and res3.stages["sweep_s"] > 0
    sweep_run = T.client().get_run(res3.sweep["mlflow_run_id"])
    assert sweep_run.data.tags[T.PARENT_TAG] == res3.run_id
    trials = _runs("sweep-trial")
    assert len(trials) == 1 and trials.iloc[0][f"tags.{T.PARENT_TAG}"] == sweep_run.info.run_id
