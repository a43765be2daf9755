"""`infra.deployments`: what a caller of the `rlhf-job` deployment sends. The oracles are Prefect's own: the
parameters bind to the flow function's signature (`get_call_parameters`, what the engine does before the flow body
runs) and validate against the schema the deployment publishes (`validate`, what the server does before a flow run
exists); the request read back equals the one built."""

from __future__ import annotations

import pytest

from common.errors import BadInput

JOB = {"tenant": "tenant1", "name": "bench-0", "steps": 2, "cluster_gpus": 8, "out_root": "runs/bench",
       "run_dir": "bench-0"}


def _bind(params: dict) -> dict:
    from prefect.utilities.callables import get_call_parameters

    from flows.rlhf_job import rlhf_job

    return get_call_parameters(rlhf_job.fn, (), params)


def _schema() -> dict:
    from prefect.utilities.callables import parameter_schema

    from flows.rlhf_job import rlhf_job

    return parameter_schema(rlhf_job).model_dump()


def test_the_parameters_bind_to_the_flow_and_validate_against_its_deployed_schema():
    from prefect.utilities.schema_tools import validate

    from infra.deployments import job_parameters
    from training.job.request import JobRequest

    params = job_parameters(JOB, {"retry_delay_s": 0.5})
    assert set(params) == {"request", "internals"}
    bound = _bind(params)
    validate(params, _schema(), raise_on_error=True)
    assert JobRequest.model_validate(bound["request"]) == JobRequest(**JOB)
    assert bound["internals"] == {"retry_delay_s": 0.5}
    assert set(job_parameters(JobRequest(**JOB))) == {"request"}  # no internals given: the flow's safe defaults


def test_the_old_loose_parameters_are_what_the_flow_refuses():
    """What `bench platform` sent before the typed request: Prefect refuses it at binding."""
    from prefect.exceptions import ParameterBindError

    with pytest.raises(ParameterBindError, match="tenant"):
        _bind({"tenant": "t", "name": "n", "steps": 2, "cluster_gpus": 8, "out_dir": "x"})


@pytest.mark.parametrize(("job", "field"), [({**JOB, "steps": 0}, "steps"), ({**JOB, "out_dir": "x"}, "out_dir"),
                                             ({**JOB, "tenant": "A/B"}, "tenant")])
def test_a_bad_job_is_refused_naming_the_field_before_anything_is_submitted(job, field, monkeypatch):
    import prefect.deployments

    from infra.deployments import submit_job

    def never(*_a, **_k):
        raise AssertionError("submitted")

    monkeypatch.setattr(prefect.deployments, "run_deployment", never)
    with pytest.raises(BadInput, match=rf"^{field}: "):
        submit_job(job)
