"""What the Prefect UI's run form shows for each deployment: the schema `prefect deploy` sends
(`prefect.utilities.callables.parameter_schema` of the entrypoint's flow, as prefect/cli/deploy/_core.py does).

Choices come from the domain registries (an independent source: the trainer's overlap modes, the detector
registry, the experiment list, the canaries), every field has a description (a request model's fields too), and
the chaos/plumbing knobs are not top-level fields of the form (they sit in each flow's `internals` model,
tests/flows/test_job_request.py)."""

from __future__ import annotations

import importlib
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


def _full_schema(entrypoint: str) -> dict:
    return parameter_schema(_flow(entrypoint)).model_dump()


def _schema(entrypoint: str) -> dict:
    return _full_schema(entrypoint)["properties"]


def _model_fields(entrypoint: str, param: str) -> dict:
    """The fields of a flow parameter that is a pydantic model (the form's nested object)."""
    full = _full_schema(entrypoint)
    ref = full["properties"][param]["$ref"].rsplit("/", 1)[-1]
    return full["definitions"][ref]["properties"]


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
    for param, prop in props.items():  # a request model's fields are the form's nested fields: described too
        if "$ref" in prop:
            nested = _model_fields(deployment["entrypoint"], param)
            undescribed = [name for name, field in nested.items() if not field.get("description")]
            assert not undescribed, f"{deployment['name']}: no description for {param}.{undescribed}"
    # the deployment's default parameters are fields of the form (deploy would reject the others)
    assert set(deployment.get("parameters", {})) <= set(props)


def test_choices_match_the_domain_registries():
    from eval.detectors import DEFAULT_DETECTOR
    from eval.registry import EARLY_STOP_DETECTORS
    from infra.provision import RUNNERS
    from scheduling.experiments import EXPERIMENTS
    from training.benches.canaries import CANARIES
    from training.job.config import ALGORITHMS
    from training.trainer import OVERLAPS

    job = _model_fields("flows/rlhf_job.py:rlhf_job", "request")
    assert sorted(_enum(job["overlap"])) == sorted(OVERLAPS)
    assert _enum(job["algorithm"]) == list(ALGORITHMS)  # the form's drop-down: training.job.config's algorithms
    assert sorted(_enum(job["detector"])) == sorted(EARLY_STOP_DETECTORS)
    assert _enum(job["detector"])[0] == job["detector"]["default"] == DEFAULT_DETECTOR
    assert _enum(_model_fields("flows/simulate.py:scheduling_experiment", "request")["experiment"]) == EXPERIMENTS
    nightly = _schema("flows/nightly.py:nightly_sweep")
    assert _enum(nightly["experiments"]) == EXPERIMENTS
    assert _enum(nightly["canaries"]) == [c.name for c in CANARIES]
    assert sorted(_enum(nightly["runner"])) == sorted(RUNNERS)


def test_a_choice_outside_the_list_is_refused_before_the_flow_runs():
    from prefect.exceptions import ParameterTypeError

    from flows.rlhf_job import rlhf_job

    with pytest.raises(ParameterTypeError, match="overlap"):
        rlhf_job.validate_parameters({"request": {"overlap": "sideways"}})
    with pytest.raises(ParameterTypeError, match="algorithm"):
        rlhf_job.validate_parameters({"request": {"algorithm": "dpo"}})
    with pytest.raises(ParameterTypeError, match="group_size"):
        rlhf_job.validate_parameters({"request": {"group_size": 0}})
