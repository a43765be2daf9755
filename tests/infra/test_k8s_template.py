"""The Kubernetes work pool's base job template (infra/k8s/gpu-base-job-template.json) checked against Prefect's
work-pool schema and the Kubernetes API schema (the `kubernetes` client's models). Not run on a cluster here."""

from __future__ import annotations

import json
import shlex

import pytest

from infra.provision import k8s_base_job_template

kubernetes = pytest.importorskip("kubernetes", reason="the stack extra: pip install '.[stack]'")

#: what a deployment would supply; everything else takes the variables' defaults
VALUES = {"name": "rlhf-job-abc", "image": "registry.example/rlhfops:1.0", "command": "prefect flow-run execute",
          "env": {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}, "labels": {"app": "rlhfops"},
          "service_account_name": "rlhfops", "cpu_limit": "8", "memory_limit": "32Gi", "gpu_count": "2"}


def defaults(template: dict) -> dict:
    return {k: v["default"] for k, v in template["variables"]["properties"].items() if "default" in v}


def render(template: dict, values: dict) -> dict:
    """The job manifest a Prefect Kubernetes worker would submit: the job configuration with the variables
    applied (Prefect's own templating), then what prefect-kubernetes does before submitting: the `env` mapping
    becomes a list of name/value pairs and the command string an argument list."""
    from prefect.utilities.templating import apply_values

    config = apply_values(template["job_configuration"], {**defaults(template), **values})
    manifest = config["job_manifest"]
    for container in manifest["spec"]["template"]["spec"]["containers"]:
        if isinstance(container.get("env"), dict):
            container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]
        if isinstance(container.get("args"), str):
            container["args"] = shlex.split(container["args"])
    return manifest


def as_v1job(manifest: dict):
    """Deserialize into the client's V1Job with client-side validation (required fields, enums)."""
    from kubernetes.client import ApiClient, Configuration

    conf = Configuration()
    conf.client_side_validation = True
    return ApiClient(conf).deserialize(json.dumps(manifest), "V1Job", "application/json")


def leaves(obj, path=""):
    """Every leaf of a JSON document as (path, value as text): the API takes quantities as numbers or strings."""
    if isinstance(obj, dict):
        return {x for k, v in obj.items() for x in leaves(v, f"{path}.{k}")}
    if isinstance(obj, list):
        return {x for i, v in enumerate(obj) for x in leaves(v, f"{path}[{i}]")}
    return {(path, str(obj).lower() if isinstance(obj, bool) else str(obj))}


def unknown_fields(manifest: dict) -> set:
    """Fields the Kubernetes schema does not have: the client drops them when it deserializes (the API server
    would reject them, or silently ignore them), so they are what is missing after a round trip."""
    from kubernetes.client import ApiClient

    round_trip = ApiClient().sanitize_for_serialization(as_v1job(manifest))
    return leaves(manifest) - leaves(round_trip)


def test_template_passes_prefects_work_pool_schema():
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import validate

    template = k8s_base_job_template()
    WorkPoolCreate(name="k8s-gpu", type="kubernetes", base_job_template=template)  # every placeholder declared
    validate({**defaults(template), **VALUES}, template["variables"], raise_on_error=True,
             ignore_required=False, preprocess=True)


def test_job_manifest_is_a_valid_v1job_requesting_gpus():
    manifest = render(k8s_base_job_template(), VALUES)
    assert unknown_fields(manifest) == set()
    job = as_v1job(manifest)
    pod = job.spec.template.spec
    (container,) = pod.containers
    assert container.image == VALUES["image"]
    assert container.args == ["prefect", "flow-run", "execute"]
    assert container.resources.limits["nvidia.com/gpu"] == "2" == container.resources.requests["nvidia.com/gpu"]
    assert pod.restart_policy == "Never" and job.spec.backoff_limit == 0
    assert pod.node_selector == {"nvidia.com/gpu.present": "true"}
    assert [(t.key, t.effect) for t in pod.tolerations] == [("nvidia.com/gpu", "NoSchedule")]
    assert [(e.name, e.value) for e in container.env] == [("MLFLOW_TRACKING_URI", "http://mlflow:5000")]


def test_round_trip_catches_a_misplaced_field():
    """The check itself: a Job field put in the pod spec (where the API has no such field) is reported."""
    manifest = render(k8s_base_job_template(), VALUES)
    manifest["spec"]["template"]["spec"]["parallelism"] = 1
    assert unknown_fields(manifest) == {(".spec.template.spec.parallelism", "1")}
