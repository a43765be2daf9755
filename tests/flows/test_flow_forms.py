"""What the Prefect UI's run form shows for each deployment: the schema `prefect deploy` sends
(`prefect.utilities.callables.parameter_schema` of the entrypoint's flow, as prefect/cli/deploy/_core.py does).

Choices come from the domain registries (an independent source: the trainer's overlap modes, the detector
registry, the experiment list, the canaries), every field has a description, and the chaos/plumbing knobs
are not in the form but still reach the internal flows."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest
import yaml
from prefect.utilities.callables import parameter_schema

ROOT = Path(__file__).resolve().parents[2]
INTERNAL_KNOBS = {"fail_rate", "fault_seed", "retry_delay_s", "parent_run_id", "progress_stage"}


def _deployments() -> list[dict]:
    return yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]


def _flow(entrypoint: str):
    path, name = entrypoint.split(":")
    return getattr(importlib.import_module(path.removesuffix(".py").replace("/", ".")), name)


def _schema(entrypoint: str) -> dict:
    return parameter_schema(_flow(entrypoint)).model_dump()["properties"]


def _enum(prop: dict) -> list:
    """The choices of a field, whether it is `Literal[...]`, `Literal[...] | None` or `list[Literal[...]]`."""
    for option in [prop, *prop.get("anyOf", [])]:
        if "enum" in option:
            return option["enum"]
        if "items" in option and "enum" in option["items"]:
            return option["items"]["enum"]
    raise AssertionError(f"no choices in {prop}")


@pytest.mark.parametrize("deployment", _deployments(), ids=lambda d: d["name"])
def test_the_form_describes_every_field_and_hides_internal_knobs(deployment):
    props = _schema(deployment["entrypoint"])
    assert not INTERNAL_KNOBS & set(props), f"{deployment['name']}: internal knobs in the form"
    undescribed = [name for name, prop in props.items() if not prop.get("description")]
    assert not undescribed, f"{deployment['name']}: no description for {undescribed}"
    # the deployment's default parameters are fields of the form (deploy would reject the others)
    assert set(deployment.get("parameters", {})) <= set(props)


def test_choices_match_the_domain_registries():
    from eval.detectors import DEFAULT_DETECTOR
    from eval.registry import EARLY_STOP_DETECTORS
    from infra.provision import RUNNERS
    from scheduling.experiments import EXPERIMENTS
    from training.canaries import CANARIES
    from training.trainer import OVERLAPS

    job = _schema("flows/rlhf_job.py:rlhf_job")
    assert sorted(_enum(job["overlap"])) == sorted(OVERLAPS)
    assert sorted(_enum(job["detector"])) == sorted(EARLY_STOP_DETECTORS)
    assert _enum(job["detector"])[0] == job["detector"]["default"] == DEFAULT_DETECTOR
    assert _enum(_schema("flows/simulate.py:scheduling_experiment")["experiment"]) == EXPERIMENTS
    nightly = _schema("flows/nightly.py:nightly_sweep")
    assert _enum(nightly["experiments"]) == EXPERIMENTS
    assert _enum(nightly["canaries"]) == [c.name for c in CANARIES]
    assert sorted(_enum(nightly["runner"])) == sorted(RUNNERS)


def test_a_choice_outside_the_list_is_refused_before_the_flow_runs():
    from prefect.exceptions import ParameterTypeError

    from flows.rlhf_job import rlhf_job

    with pytest.raises(ParameterTypeError, match="overlap"):
        rlhf_job.validate_parameters({"overlap": "sideways"})


@pytest.mark.parametrize("public, internal", [
    ("flows/rlhf_job.py:rlhf_job", "flows/rlhf_job.py:rlhf_job_internal"),
    ("flows/simulate.py:scheduling_experiment", "flows/simulate.py:scheduling_experiment_internal"),
    ("flows/evaluate.py:evaluate_checkpoint", "flows/evaluate.py:evaluate_checkpoint_internal"),
    ("flows/nightly.py:nightly_sweep", "flows/nightly.py:nightly_sweep_internal"),
])
def test_the_public_flow_forwards_every_field_to_the_internal_one(public, internal, monkeypatch):
    """Call the public flow's body with a distinct value per field and see each arrive, under its own name, at
    the internal flow's body; the internal flow keeps the knobs the form hides."""
    pub, intern = _flow(public), _flow(internal)
    params = inspect.signature(pub.fn).parameters
    assert INTERNAL_KNOBS & set(inspect.signature(intern.fn).parameters)
    received = {}
    monkeypatch.setattr(intern, "fn", lambda **kw: received.update(kw) or "ran")
    sent = {name: f"value-of-{name}" for name in params}
    assert pub.fn(**sent) == "ran"
    assert received == sent
