"""One typed job request (`training/job/request.py`) from every entry point: what it refuses, where it lets a job
write, the one supervisor it builds, and the run form Prefect makes of it.

Oracles: paths worked out by hand (os.path on the root the test made), the bounds as typed in the test, the
flows' source read with `ast` (constructor calls, flow names), and Prefect's own server-side validator
(`prefect.utilities.schema_tools.validate`, what `create_flow_run_from_deployment` runs) on the schema
`prefect deploy` sends."""

from __future__ import annotations

import ast
import json
import logging
import os
from pathlib import Path

import pytest
import yaml

from common.errors import BadInput

ROOT = Path(__file__).resolve().parents[2]

ESCAPING_NAMES = ["../../../../tmp/x", "..", "a/b", "/abs", "", " acme", "Acme", "a" * 64, "-lead", "x\x00y"]


@pytest.mark.parametrize("field", ["tenant", "name", "registered_model"])
@pytest.mark.parametrize("value", ESCAPING_NAMES)
def test_names_are_identifiers_and_the_error_names_the_field(field, value):
    from training.job.request import parse_request

    with pytest.raises(BadInput) as err:
        parse_request({field: value})
    line = str(err.value)
    assert line.startswith(f"{field}: ") and "\n" not in line, line


@pytest.mark.parametrize("value", ["acme", "a", "t0", "kl_sweep-1", "a" * 63])
def test_valid_names_pass(value):
    from training.job.request import parse_request

    req = parse_request({"tenant": value, "name": value})
    assert req.out_dir == Path("runs/jobs") / value / value


@pytest.mark.parametrize("fields, field", [
    ({"steps": -5}, "steps"), ({"steps": 0}, "steps"), ({"steps": 10_000_001}, "steps"),
    ({"gpus": -1}, "gpus"), ({"gpus": 0}, "gpus"), ({"cluster_gpus": 0}, "cluster_gpus"),
    ({"gpus": 5, "cluster_gpus": 4}, "gpus"), ({"overlap": "sideways"}, "overlap"),
    ({"detector": "bogus"}, "detector"), ({"alert_profile": "loud"}, "alert_profile"),
    ({"tenant": None}, "tenant"), ({"nmae": "x"}, "nmae"), ({"gpus": 1.5}, "gpus"),
    ({"algorithm": "dpo"}, "algorithm"), ({"group_size": 0}, "group_size"),
])
def test_out_of_range_and_unknown_fields_are_one_line_naming_the_field(fields, field):
    from training.job.request import parse_request

    with pytest.raises(BadInput) as err:
        parse_request(fields)
    line = str(err.value)
    assert line.startswith(f"{field}: ") and "\n" not in line, line


def test_the_run_directory_stays_inside_the_output_root(tmp_path):
    from training.job.request import parse_request

    root = tmp_path / "root"
    (tmp_path / "outside").mkdir()
    root.mkdir()
    os.symlink(tmp_path / "outside", root / "link")  # a link inside the root that points out of it
    for run_dir in ("../x", "a/../../x", str(tmp_path / "elsewhere"), "link", "link/job"):
        with pytest.raises(BadInput, match=r"^run_dir: "):
            parse_request({"out_root": str(root), "run_dir": run_dir})
    inside = parse_request({"out_root": str(root), "run_dir": "a/../b"})
    assert os.path.realpath(inside.out_dir) == os.path.join(os.path.realpath(root), "b")
    assert parse_request({"out_root": str(root), "run_dir": "."}).out_dir == root
    default = parse_request({"out_root": str(root), "tenant": "globex", "name": "j1"})
    assert default.out_dir == root / "globex" / "j1"


def test_checked_reads_every_file_once_and_names_the_field(tmp_path):
    from training.job.request import parse_request

    good = parse_request({"out_root": str(tmp_path), "steps": 7, "overrides": {"ppo.kl_coef": 0.2}}).checked()
    assert good.config.steps == 7 and good.config.ppo.kl_coef == 0.2 and "cpu" in good.gpu_hour
    cases = [({"overrides": {"ppo.kl_cof": 0.1}}, "override 'ppo.kl_cof=0.1'"),
             ({"gpu_kind": "h900"}, "gpu_kind: 'h900' has no price"),
             ({"config": str(tmp_path / "missing.yaml")}, "config:"),
             ({"alerts": str(tmp_path / "missing.yaml")}, "alerts"),
             ({"resume_paused": True}, "resume_paused:")]
    for fields, start in cases:
        with pytest.raises(BadInput) as err:
            parse_request({"out_root": str(tmp_path), **fields}).checked()
        assert start in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # checking wrote nothing


def test_one_price_check_for_jobs_and_sweeps(tmp_path):
    from tasks.sweep import prepare
    from training.job.request import check_gpu_kind

    prices = tmp_path / "prices.yaml"
    prices.write_text(yaml.safe_dump({"gpu_hour": {"a10": "1.10"}}))
    check_gpu_kind("a10", prices=str(prices))
    with pytest.raises(BadInput, match=r"^gpu_kind: 'cpu' has no price \(priced: a10;"):
        check_gpu_kind("cpu", prices=str(prices))
    spec = yaml.safe_load((ROOT / "configs" / "sweeps" / "example.yaml").read_text())
    spec["base"] = str(ROOT / "configs" / "ppo-tiny.yaml")
    spec["gpu_kind"] = "h900"
    with pytest.raises(BadInput, match=r"^gpu_kind: 'h900' has no price \(priced: a100, cpu"):
        prepare(spec)


def test_build_gives_the_supervisor_its_planned_steps_detector_and_charges(tmp_path):
    from eval.detectors import DEFAULT_DETECTOR
    from training.job.request import build, parse_request

    req = parse_request({"out_root": str(tmp_path), "steps": 13, "gpus": 2, "gpu_kind": "h100",
                         "tenant": "globex", "name": "j"})
    ledger = object()
    spec, sup = build(req, run_id="run-7", ledger=ledger)
    assert sup.planned_steps == 13 == spec.steps  # what the gate's short-run phase needs
    assert sup.gate_detector.name == DEFAULT_DETECTOR and sup.ledger is ledger
    assert (sup.n_gpus, sup.gpu_kind, sup.machine.run_id, sup.machine.tenant) == (2, "h100", "run-7", "globex")
    assert spec.out_dir == tmp_path / "globex" / "j" and spec.pausable and spec.resume is None
    _, no_gate = build(parse_request({"out_root": str(tmp_path), "detector": None}))
    assert no_gate.gate_detector is None


def test_the_forms_algorithm_reaches_the_same_config_as_the_overrides(tmp_path):
    """The typed `algorithm` and `group_size` (the form's drop-down and number) set the config fields `overrides`
    would, the algorithm's defaults following; a request that says two things is refused naming the field, and so
    is a combination the config refuses (grpo with one completion per prompt), before anything is provisioned."""
    from training.job.config import uses_critic
    from training.job.request import parse_request

    typed = parse_request({"out_root": str(tmp_path), "algorithm": "grpo", "group_size": 4}).checked().config
    dotted = parse_request({"out_root": str(tmp_path),
                            "overrides": {"algorithm": "grpo", "ppo.group_size": 4}}).checked().config
    assert typed == dotted
    # configs/ppo-tiny.yaml's own kl_coef (0.2) stays; GRPO's defaults fill what it leaves out (the KL in the loss,
    # no batch whitening)
    assert (typed.algorithm, typed.ppo.group_size, typed.ppo.kl_coef) == ("grpo", 4, 0.2)
    assert (typed.ppo.kl_in, typed.ppo.whiten_advantages) == ("loss", False)
    assert not uses_critic(typed)
    with pytest.raises(BadInput, match=r"^algorithm: 'grpo', but overrides sets algorithm to 'rloo': give one$"):
        parse_request({"out_root": str(tmp_path), "algorithm": "grpo", "overrides": {"algorithm": "rloo"}}).checked()
    with pytest.raises(BadInput, match=r"grpo needs at least 2 completions per prompt"):
        parse_request({"out_root": str(tmp_path), "algorithm": "grpo", "group_size": 1}).checked()


#: the project's packages (pyproject.toml's import-linter root_packages)
PACKAGES = ("common", "training", "scheduling", "eval", "sweeps", "studies", "infra", "tasks", "flows", "rlhfops")


def _calls(name: str) -> list[str]:
    """`file:line` of every call of `name(...)` in the project's packages (not the tests)."""
    found = []
    for path in (p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")):
        rel = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                fn = node.func
                called = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if called == name:
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_one_place_makes_a_run_supervisor():
    sites = _calls("RunSupervisor")
    assert len(sites) == 1 and sites[0].startswith("training/job/lifecycle.py:"), sites


def test_each_flow_is_one_function():
    """No `_internal` twins: every `@flow(name=...)` in flows/ names a different flow."""
    names = []
    for path in sorted((ROOT / "flows").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                for dec in node.decorator_list:
                    if isinstance(dec, ast.Call) and getattr(dec.func, "id", "") == "flow":
                        name = next(k.value.value for k in dec.keywords if k.arg == "name")
                        names.append((name, f"{path.name}:{node.name}"))
    assert names and len({n for n, _ in names}) == len(names), names
    assert not [where for _, where in names if where.endswith("_internal")]


# ------------------------------------------------------------------------------------------------ the run form
def _deployment_schema(entrypoint: str) -> dict:
    import importlib

    from prefect.utilities.callables import parameter_schema

    path, name = entrypoint.split(":")
    flow = getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)
    return parameter_schema(flow).model_dump()


def _deployment(name: str) -> dict:
    return next(d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"] if d["name"] == name)


@pytest.mark.parametrize("bad", [{"name": "../../../../tmp/x"}, {"tenant": ""}, {"steps": -5}, {"gpus": -1},
                                 {"tenant": "a/b"}, {"nmae": "x"}, {"overlap": "sideways"}, {"algorithm": "dpo"},
                                 {"group_size": 0}])
def test_the_deployment_server_refuses_a_bad_request_before_a_flow_run_exists(bad):
    """What `prefect deployment run rlhf-job/rlhf-job -p request='{...}'` meets on the server: the parameters (the
    deployment's defaults updated by the run's, as the server merges them) against the deployed schema."""
    from prefect.utilities.schema_tools import ValidationError, validate

    dep = _deployment("rlhf-job")
    schema = _deployment_schema(dep["entrypoint"])
    validate({**dep["parameters"], "request": {**dep["parameters"]["request"]}}, schema, raise_on_error=True)
    with pytest.raises(ValidationError):
        validate({**dep["parameters"], "request": {**dep["parameters"]["request"], **bad}}, schema,
                 raise_on_error=True)


def test_the_form_has_bounds_choices_and_descriptions_and_hides_internal_knobs():
    schema = _deployment_schema("flows/rlhf_job.py:rlhf_job")
    assert set(schema["properties"]) == {"request", "internals"}
    fields = schema["definitions"]["JobRequest"]["properties"]
    for name in ("steps", "gpus", "cluster_gpus", "group_size"):
        ints = [o for o in [fields[name], *fields[name].get("anyOf", [])] if o.get("type") == "integer"]
        assert ints[0]["minimum"] == 1, name
    assert fields["tenant"]["pattern"] == fields["name"]["pattern"]
    assert all(f.get("description") for f in fields.values())
    for entry in ("flows/rlhf_job.py:rlhf_job", "flows/evaluate.py:evaluate_checkpoint", "flows/sweep.py:sweep"):
        s = _deployment_schema(entry)
        knobs = s["definitions"][s["properties"]["internals"]["$ref"].rsplit("/", 1)[-1]]["properties"]
        assert {"parent_run_id", "retry_delay_s"} <= set(knobs), entry
        assert not {"parent_run_id", "retry_delay_s", "fail_rate", "fault_seed"} & set(s["properties"]), entry


def test_a_top_level_field_is_refused_at_the_flows_first_check():
    """`-p name=...` (the parameters before the request model) does not bind: the flow run fails before its
    body, with nothing written."""
    from prefect.exceptions import ParameterTypeError, SignatureMismatchError

    from flows.rlhf_job import rlhf_job

    with pytest.raises(SignatureMismatchError, match=r"expects parameters \['request', 'internals'\] .*\['name'\]"):
        rlhf_job.validate_parameters({"name": "../../../../tmp/x"})
    with pytest.raises(ParameterTypeError, match="tenant"):
        rlhf_job.validate_parameters({"request": {"tenant": ""}})
    # what a JSON schema cannot say (the run directory resolves inside the output root) the model says here
    with pytest.raises(ParameterTypeError, match="run_dir"):
        rlhf_job.validate_parameters({"request": {"run_dir": "../../x"}})


# ------------------------------------------------------------------------------------------- the flow itself
@pytest.mark.parametrize("bad", [{"name": "../../../../tmp/x"}, {"tenant": ""}, {"steps": -5},
                                 {"group_size": 3, "algorithm": "grpo"}])  # 3 does not divide the batch of 16
def test_a_bad_request_fails_the_flow_run_with_nothing_written_or_registered(bad, prefect_server, mlflow_store,
                                                                            tmp_path, monkeypatch):
    from flows.rlhf_job import rlhf_job
    from infra import tracking as T

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    state = rlhf_job(request=bad, return_state=True)
    assert state.is_failed()
    assert next(iter(bad)) in state.message
    assert list(work.iterdir()) == [] and not (tmp_path / "x").exists()
    assert T.client().search_registered_models() == []
    assert T.find_run(T.DEFAULT_EXPERIMENT, f"flow/{state.state_details.flow_run_id}") is None


# ------------------------------------------------------------------------------------------ the platform round
@pytest.mark.parametrize("jobs, start", [
    ([{"tenant": "acme", "name": "../../../x"}], "jobs[0].name: "),
    ([{"tenant": "acme", "name": "a"}, {"tenant": "", "name": "b"}], "jobs[1].tenant: "),
    ([{"tenant": "acme", "name": "a", "overrides": {"ppo.kl_cof": 0.1}}], "jobs[0] (acme/a): override 'ppo.kl_cof"),
    ([{"tenant": "acme", "name": "a", "gpus": 3}], "jobs[0].gpus: "),
    ([{"tenant": "acme", "name": "a", "gpus": True}], "jobs[0].gpus: "),
    ([{"tenant": "acme", "name": "a", "steps_factor": 0}], "jobs[0].steps_factor: "),
    ([{"tenant": "acme", "name": "a", "gpuss": 1}], "jobs[0].gpuss: "),
    ([{"tenant": "acme", "name": "a"}, {"tenant": "acme", "name": "a"}], "jobs[1].name: "),
    (["acme"], "jobs: "),
])
def test_a_round_refuses_bad_jobs_naming_the_entry(jobs, start, tmp_path):
    from flows.params import check_round, round_requests

    with pytest.raises(BadInput) as err:
        check_round(round_requests(jobs, steps=8, slots=2, out_dir=str(tmp_path / "round"),
                                   cache_dir=str(tmp_path / "cache")))
    assert str(err.value).startswith(start) and "\n" not in str(err.value), str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_round_job_writes_under_the_rounds_output(tmp_path):
    from flows.params import DEFAULT_JOBS, round_requests

    reqs = round_requests(DEFAULT_JOBS, steps=16, slots=2, out_dir=str(tmp_path / "round"))
    assert [r.out_dir for r in reqs] == [tmp_path / "round" / j["tenant"] / j["name"] for j in DEFAULT_JOBS]
    assert [r.steps for r in reqs] == [16, 16, 16, 16, 8]  # the 'short' job: steps_factor 0.5
    assert {r.detector for r in reqs} == {None}  # the round's scheduler stops jobs, not a gate of their own


# ---------------------------------------------------------------------------------------------- evaluate's score
def test_the_evaluation_score_is_a_log_line_and_a_table_artifact(prefect_server):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterKey,
        FlowRunFilter,
        FlowRunFilterId,
    )

    from flows.evaluate import score_report

    result = {"eval_score": 0.4321, "eval_se": 0.0123, "lower95": 0.4321 - 1.96 * 0.0123, "n": 32,
              "unparseable_rate": 0.0625, "passed": True, "run_id": "r-1"}

    @flow
    def scored() -> str:
        from prefect.runtime import flow_run

        score_report("models:/acme-policy/3", result, 0.3)
        return flow_run.id

    class Keep(logging.Handler):
        def emit(self, record):
            logs.append(record.getMessage())

    logs: list[str] = []
    run_logger, keep = logging.getLogger("prefect.flow_runs"), Keep(logging.INFO)
    level = run_logger.level
    run_logger.addHandler(keep)
    run_logger.setLevel(logging.INFO)  # the session's harness runs Prefect at WARNING
    try:
        fid = scored()
    finally:
        run_logger.removeHandler(keep)
        run_logger.setLevel(level)
    with get_client(sync_client=True) as c:
        arts = c.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[
            "evaluate-models--acme-policy-3"])), flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[fid])))
    (art,) = arts
    (row,) = art.data if isinstance(art.data, list) else json.loads(art.data)
    assert row["eval_score"] == 0.4321 and row["gate"] == "passed" and row["n"] == 32
    assert row["lower95"] == pytest.approx(0.4321 - 1.96 * 0.0123, abs=1e-6)
    line = next(m for m in logs if m.startswith("models:/acme-policy/3: held-out score"))
    assert "+0.4321 ± 0.0123" in line and "lower 95% +0.4080" in line and "gate passed" in line
