"""Submitting runs of the `rlhf-job` deployment: the one place a caller turns a job into deployment parameters.

A caller builds the typed request (`training.job.request.JobRequest`, and `JobInternals` when it sets any) and hands it
here; the parameters are the request's own JSON form under the flow's parameter names. A change of the flow's
signature or of the request model then fails here, in a test (tests/infra/test_deployments_submit.py), not on a
server after the run was queued (a loose mapping of old parameter names once crashed every run of
`bench platform`: "SignatureMismatchError: Function expects parameters ['request', 'internals']").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.job.request import JobInternals, JobRequest, parse_internals, parse_request

#: the deployment `prefect.yaml` declares for `flows/rlhf_job.py:rlhf_job`
RLHF_JOB = "rlhf-job/rlhf-job"


def job_parameters(request: JobRequest | Mapping[str, Any],
                   internals: JobInternals | Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `rlhf-job` deployment's parameters for one job: `{"request": ..., "internals": ...}` as JSON, each
    validated by its model first (BadInput naming the field); `internals` only when given."""
    params: dict[str, Any] = {"request": parse_request(request).model_dump(mode="json", exclude_defaults=True)}
    if internals is not None:
        params["internals"] = parse_internals(internals).model_dump(mode="json", exclude_defaults=True)
    return params


def submit_job(request: JobRequest | Mapping[str, Any], internals: JobInternals | Mapping[str, Any] | None = None,
               *, timeout: float | None = 0, **options: Any) -> Any:
    """Queue one `rlhf-job` deployment run (Prefect's `run_deployment`; `timeout=0`: return at once with the flow
    run, whose id the caller polls); `options` go to `run_deployment` (tags, a flow run name)."""
    from prefect.deployments import run_deployment

    return run_deployment(RLHF_JOB, parameters=job_parameters(request, internals), timeout=timeout, **options)
