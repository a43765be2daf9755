"""MLflow helpers, retry rules, fault plans, slots, provisioning templates: no Prefect server needed."""

from __future__ import annotations

import json
import re
import threading
import time

import pytest

from common.errors import BadInput
from infra import reporting as R
from infra import tracking as T


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating a SQLite store runs MLflow's migrations: seconds); tests keep apart
    by their own run keys and MLflow experiment names."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}")
        yield T.init_store()


def test_tracking_uri_is_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///rel/mlflow.db")
    assert T.tracking_uri() == f"sqlite:///{tmp_path / 'rel' / 'mlflow.db'}"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert T.tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert T.artifact_root(T.tracking_uri()) == (tmp_path / "mlruns").as_uri()


def test_safe_key_keeps_allowed_and_replaces_the_rest():
    assert T.safe_key("jct_mean/EvalStop(k=3)+SJF") == "jct_mean/EvalStop_k_3__SJF"
    assert T.safe_key("wasted/StopAt0.65-SRTF") == "wasted/StopAt0.65-SRTF"


def test_open_run_is_idempotent_and_replaces_unfinished_attempts(store):
    run_a, done = T.open_run("job-1", "job 1")
    assert not done
    # a second attempt while the first never finished: the dead attempt's run is replaced
    run_b, done = T.open_run("job-1", "job 1")
    assert not done and run_b != run_a
    assert T.client().get_run(run_a).info.lifecycle_stage == "deleted"
    T.finish(run_b)
    # a retry after the run finished finds it and does not log again
    run_c, done = T.open_run("job-1", "job 1")
    assert done and run_c == run_b
    active = T.client().search_runs([T.experiment_id()], filter_string=f"tags.`{T.KEY_TAG}` = 'job-1'")
    assert [r.info.run_id for r in active] == [run_b]


def test_parent_runs_are_reopened_not_replaced(store):
    parent, _ = T.open_run("flow/abc", "flow", reuse_unfinished=True)
    child, _ = T.open_run("flow/abc/child", "child", parent_run_id=parent)
    again, done = T.open_run("flow/abc", "flow", reuse_unfinished=True)
    assert again == parent and not done
    assert T.client().get_run(child).data.tags[T.PARENT_TAG] == parent


def test_step_metrics_are_batched_and_read_back(store):
    run, _ = T.open_run("train", "train")
    records = [{"step": s, "reward_mean": s / 10, "kl": float("nan"), "loss_policy": -s} for s in range(1, 801)]
    n = T.log_step_records(run, records)
    assert n == 1600  # NaN dropped, 2 finite metrics x 800 steps (two log_batch calls)
    hist = T.client().get_metric_history(run, "reward_mean")
    assert sorted(m.step for m in hist) == list(range(1, 801))
    assert {m.step: m.value for m in hist}[400] == pytest.approx(40.0)


def _nightly(exp: str, name: str, jct: dict[str, float], cost: float, grpo_cost: float | None = None) -> str:
    night, _ = T.open_run(f"flow/{name}", name, exp, tags={T.KIND_TAG: "nightly"})
    sim, _ = T.open_run(f"{name}/E2", "simulate E2", exp, parent_run_id=night,
                        tags={T.KIND_TAG: "scheduling_experiment"})
    var, _ = T.open_run(f"{name}/E2/default", "E2/default", exp, parent_run_id=sim,
                        tags={T.KIND_TAG: "sim_variant", T.NAMES_TAG: json.dumps({T.safe_key(k): k for k in jct})})
    T.log_params(var, {"experiment": "E2", "variant": "default"})
    T.log_metric_rows(var, [(f"jct_mean/{k}", v, 0) for k, v in jct.items()])
    job, _ = T.open_run(f"{name}/job", "acme/job", exp, parent_run_id=night,
                        tags={T.KIND_TAG: "rlhf_job", T.TENANT_TAG: "acme"})
    T.log_metrics(job, {"cost_usd": cost, "gpu_hours": 2 * cost})
    runs = [var, sim, job]
    if grpo_cost is not None:  # the same tenant's critic-free job: its own row of the tenant table, never summed in
        grpo, _ = T.open_run(f"{name}/grpo-job", "acme/grpo-job", exp, parent_run_id=night,
                             tags={T.KIND_TAG: "rlhf_job", T.TENANT_TAG: "acme", T.ALGORITHM_TAG: "grpo"})
        T.log_params(grpo, {"algorithm": "grpo", "ppo.group_size": 8})
        T.log_metrics(grpo, {"cost_usd": grpo_cost, "gpu_hours": 2 * grpo_cost})
        runs.append(grpo)
    for r in (*runs, night):
        T.finish(r)
    return night


def test_report_compares_tonight_with_last_night(store):
    _nightly("two-nights", "mon", {"EvalStop(k=3)+SJF": 100.0, "FIFO": 200.0}, cost=1.0, grpo_cost=0.25)
    time.sleep(0.01)
    tue = _nightly("two-nights", "tue", {"EvalStop(k=3)+SJF": 90.0, "FIFO": 210.0}, cost=1.5, grpo_cost=0.5)
    rep = R.nightly_report("two-nights")
    assert rep["tonight"].run_id == tue
    s = rep["schedulers"].set_index(["scheduler", "metric"])
    assert s.loc[("EvalStop(k=3)+SJF", "jct_mean"), "delta"] == pytest.approx(-10.0)
    assert s.loc[("FIFO", "jct_mean"), "last"] == pytest.approx(200.0)
    # per tenant and algorithm: the PPO job (no algorithm tag: a run from before the field) against last night's
    # PPO job, the GRPO job against last night's GRPO job
    t = rep["tenants"].set_index(["tenant", "algorithm", "metric"])
    assert t.loc[("acme", "ppo", "cost_usd"), "delta"] == pytest.approx(0.5)
    assert t.loc[("acme", "grpo", "cost_usd"), ["tonight", "last"]].tolist() == pytest.approx([0.5, 0.25])
    assert t.loc[("acme", "grpo", "jobs"), "tonight"] == 1
    md = R.report_markdown(rep)
    assert "EvalStop(k=3)+SJF" in md and "| acme | ppo | cost_usd |" in md and "| acme | grpo | cost_usd |" in md


def test_report_with_one_nightly_has_no_last(store):
    _nightly("one-night", "only", {"FIFO": 1.0}, cost=0.1)
    rep = R.nightly_report("one-night")
    assert rep["last"] is None and rep["schedulers"]["last"].isna().all()


def test_retry_condition_never_retries_bad_input():
    from pydantic import BaseModel, ConfigDict, ValidationError

    from tasks.retry import InjectedFault, is_transient

    class M(BaseModel):
        model_config = ConfigDict(extra="forbid")

    with pytest.raises(ValidationError) as err:
        M.model_validate({"x": 1})
    assert not is_transient(BadInput("config: field 'x'"))
    assert not is_transient(err.value)
    assert not is_transient(KeyError("x"))
    assert is_transient(InjectedFault("boom"))
    assert is_transient(OSError("disk full"))
    assert is_transient(TimeoutError())


def test_plain_retries_follow_the_task_rule_and_number_attempts():
    """`with_retries` (tracking open/close without a task run of their own): transient failures are retried with
    the attempt number visible to the fault plan, bad input fails at once, and the last failure propagates."""
    from tasks.retry import InjectedFault, attempt, retried, with_retries

    seen = []

    def flaky(fail_until: int) -> int:
        seen.append(attempt())
        if attempt() < fail_until:
            raise InjectedFault("transient")
        return attempt()

    assert with_retries(flaky, 3, delays=[0.0] * 5) == 3 and seen == [1, 2, 3]
    seen.clear()
    with pytest.raises(InjectedFault):
        with_retries(flaky, 99, delays=[0.0, 0.0])
    assert seen == [1, 2, 3]
    calls = []

    @retried
    def bad(x: int) -> None:
        calls.append(x)
        raise BadInput("field 'x': wrong")

    with pytest.raises(BadInput):
        bad(1, retry_delay_s=0.0)
    assert calls == [1]
    assert attempt() == 1  # outside any retried call or task run


def test_fault_plan_is_deterministic_and_hits_its_rate():
    from tasks.retry import should_fail

    picks = [should_fail("site", f"k{i}", 0.3, 7, 1) for i in range(4000)]
    assert abs(sum(picks) / len(picks) - 0.3) < 0.03
    assert picks == [should_fail("site", f"k{i}", 0.3, 7, 1) for i in range(4000)]
    assert not any(should_fail("site", f"k{i}", 0.0, 7, 1) for i in range(100))


def test_work_clock_union():
    from tasks.timing import Clock, union_length

    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    c = Clock()
    c.spans = {"work": [(10.0, 14.0), (12.0, 15.0)], "tracking": [(14.5, 16.0), (17.0, 18.0)]}
    b = c.breakdown(10.0, 20.0)
    assert b["work_s"] == 5 and b["tracking_s"] == pytest.approx(2.0) and b["orchestration_s"] == pytest.approx(3.0)


def test_local_slot_pool_blocks_until_slots_free():
    from infra.provision import SlotPool

    pool = SlotPool(3, backend="local")
    with pytest.raises(BadInput):
        with pool.take(4):
            pass
    order = []

    def job(name, n, hold):
        with pool.take(n):
            order.append(("start", name))
            time.sleep(hold)
        order.append(("end", name))

    a = threading.Thread(target=job, args=("a", 2, 0.3))
    a.start()
    time.sleep(0.05)
    b = threading.Thread(target=job, args=("b", 2, 0.0))  # needs 2, only 1 free until a ends
    b.start()
    a.join()
    b.join()
    assert order.index(("end", "a")) < order.index(("start", "b"))


def test_ray_runner_without_the_extra_is_a_one_line_bad_input():
    from infra.provision import check_runner

    try:
        import prefect_ray  # noqa: F401
    except ImportError:
        with pytest.raises(BadInput, match=r"pip install '\.\[ray\]'"):
            check_runner("ray")
    with pytest.raises(BadInput, match="^runner: 'dask'"):
        check_runner("dask")
    assert check_runner("thread") == "thread"


def test_k8s_template_requests_gpus_and_declares_every_placeholder():
    from infra.provision import k8s_base_job_template

    t = k8s_base_job_template()
    text = json.dumps(t["job_configuration"])
    used = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", text))
    declared = set(t["variables"]["properties"])
    assert used <= declared, used - declared
    container = t["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "{{ gpu_count }}"
    assert int(t["variables"]["properties"]["gpu_count"]["default"]) >= 1


def test_prefect_yaml_declares_the_five_deployments():
    from pathlib import Path

    import yaml

    spec = yaml.safe_load((Path(__file__).resolve().parents[2] / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in spec["deployments"]}
    assert set(deps) == {"nightly-sweep", "rlhf-job", "simulate", "evaluate", "sweep"}
    assert deps["nightly-sweep"]["schedules"][0]["cron"] == "0 2 * * *"
    for d in deps.values():
        module, func = d["entrypoint"].split(":")
        mod = __import__(module.removesuffix(".py").replace("/", "."), fromlist=[func])
        flow_obj = getattr(mod, func)
        # every declared parameter is one the flow accepts
        assert set(d.get("parameters", {})) <= set(flow_obj.parameters.properties), d["name"]


def test_report_command_prints_the_comparison(store, tmp_path):
    from typer.testing import CliRunner

    from rlhfops.cli import app

    _nightly("cli-report", "mon", {"EvalStop(k=3)+SJF": 100.0}, cost=1.0)
    time.sleep(0.01)
    _nightly("cli-report", "tue", {"EvalStop(k=3)+SJF": 80.0}, cost=2.0, grpo_cost=0.5)
    out = tmp_path / "report.md"
    res = CliRunner().invoke(app, ["report", "--mlflow-experiment", "cli-report", "--metrics", "jct_mean",
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "EvalStop(k=3)+SJF" in res.output and "80 / 100 / -20" in res.output
    assert "| acme | ppo | cost_usd | 2 | 1 | 1 |" in out.read_text()
    assert "| acme | grpo | cost_usd | 0.5 | — | — |" in out.read_text()  # no GRPO job last night
    assert "grpo" in res.output  # the tenant table's algorithm column
    bad = CliRunner().invoke(app, ["report", "--metrics", "jct"])
    assert bad.exit_code != 0 and isinstance(bad.exception, BadInput)


def test_nightly_command_rejects_bad_arguments_before_starting_anything():
    from typer.testing import CliRunner

    from rlhfops.cli import app

    for args, needle in ((["--seeds", "4x"], "--seeds"), (["--fail-rate", "1.5"], "--fail-rate"),
                         (["--runner", "dask"], "runner: 'dask'")):
        res = CliRunner().invoke(app, ["nightly", *args])
        assert isinstance(res.exception, BadInput) and needle in str(res.exception), args
