"""Parameter types of the deployed flows: what the Prefect UI's run form offers.

Prefect builds a deployment's form from the flow's signature (`prefect.utilities.callables.parameter_schema`):
a `Literal` becomes a drop-down of its values, and the `Args:` section of the flow's docstring becomes each
field's description. The choices here mirror the registries in the domain code; tests/flows/test_flow_forms.py
fails when they drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, ValidationError, field_validator

from common.errors import BadInput

# a job's choices live with its request (training/job/request.py): the overlap modes, the detectors, the alert profiles
from training.job.config import default_cache_dir
from training.job.request import (  # noqa: F401 - re-exported for the flows
    NAME_PATTERN,
    NAME_RULE,
    AlertProfile,
    DetectorName,
    JobRequest,
    Overlap,
    check_name,
    describe,
    parse_request,
)

#: scheduling.experiments.EXPERIMENTS
ExperimentName = Literal["E1", "E2", "E3", "E4", "E5", "E6", "E7", "E8"]
#: infra.provision.RUNNERS
RunnerKind = Literal["thread", "ray"]
#: training.benches.canaries.CANARIES
CanaryName = Literal["control", "frozen_sync", "constant_reward", "oversized_lr", "gameable_reward",
                     "behaviour_mismatch", "duplicated_carry", "grpo_control", "grpo_constant_reward"]


#: the default round: five tenants, one job each; two are set up to over-optimise the proxy reward. The gameable
#: job's bonus (2.0 per trigger character from step 2) makes its held-out score fall fast enough after its peak for
#: the gate to see it before its KL passes the health catalog's ceiling (with 1.0 the paging alert came first and
#: ended it FAILED: docs/orchestration.md)
DEFAULT_JOBS: list[dict[str, Any]] = [
    {"tenant": "acme", "name": "healthy-kl", "overrides": {"ppo.kl_coef": 0.2}},
    {"tenant": "globex", "name": "gameable", "overrides": {"fault.kind": "gameable_reward", "fault.bonus": 2.0,
                                                            "fault.at_step": 2}},
    {"tenant": "initech", "name": "healthy", "overrides": {}},
    {"tenant": "umbrella", "name": "weak-kl", "overrides": {"ppo.kl_coef": 0.0, "ppo.actor_lr": 1e-3}},
    {"tenant": "hooli", "name": "short", "overrides": {}, "steps_factor": 0.5},
]


class RoundJob(BaseModel):
    """One entry of a platform round's `jobs`: a tenant's job on the round's shared small PPO config."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    tenant: str = Field(pattern=NAME_PATTERN, description=f"the customer the job is charged to ({NAME_RULE})")
    name: str = Field(pattern=NAME_PATTERN, description=f"the job's name within the tenant ({NAME_RULE})")
    config: str | None = Field(None, min_length=1, description="the tenant's own PPO config YAML (e.g. a dataset "
                               "config: task: {kind: dataset, ...}, reward: {kind: function, ref: "
                               "my_reward.py:score}), run for the round's steps; in a jobs file, relative to the "
                               "file's folder. Empty: the round's shared small config")
    overrides: dict[str, Any] = Field(default_factory=dict, description='dotted config fields, e.g. '
                                      '{"ppo.kl_coef": 0.1} or {"reward.ref": "my_reward.py:score"}')
    gpus: StrictInt = Field(1, ge=1, le=4096, description="GPU worker slots the job holds")
    steps_factor: StrictFloat | StrictInt = Field(1.0, gt=0, le=100, description="the job's steps as a multiple "
                                                  "of the round's steps")

    @field_validator("tenant", "name", mode="before")
    @classmethod
    def _name(cls, value: Any, info) -> Any:
        return check_name(value, info.field_name)


def platform_job_config(steps: int, cache_dir: str, seed: int = 0) -> dict[str, Any]:
    """The canaries' small PPO job (training/benches/canaries.py) with a gate and a checkpoint every 2 steps; one torch
    thread per job so concurrent jobs share the cores instead of oversubscribing them, and a fixed chunk size (the
    chunk tuner picks by wall time, which would make a job's numbers depend on the machine's load). The gate is
    sized for the paired rule to decide: 64 held-out prompts per checkpoint (scored with the run's fixed sampling
    seed), and for a close decision the pool's other 32 for both checkpoints, up to 128 extra prompt evaluations
    per run (`eval_extra_budget`); each job's paired rule spends its alpha over its own planned checkpoints
    (`training.job.lifecycle.planned_gate`). `seed`: the config's seed (the warm start, the prompts and the training
    all change with it)."""
    from training.benches.canaries import base_config

    raw = base_config(steps, 0, cache_dir)
    raw.update(name="platform-ppo", seed=seed, eval_every=2, checkpoint_every=2, eval_prompts=64, eval_extra_batch=32,
               eval_extra_budget=128)
    raw["task"]["n_heldout_prompts"] = 96
    raw["oppo"] = {"torch_threads": 1, "tune_chunk": False}
    return raw


def jobs_relative_to(jobs: Any, folder: str | Path) -> Any:
    """A jobs file's entries with each relative `config` path read from the file's `folder` (as a config's own
    paths are read from its folder); anything else as it is (`round_requests` checks it)."""
    if not isinstance(jobs, list):
        return jobs
    return [{**j, "config": str(Path(folder) / j["config"])}
            if isinstance(j, dict) and isinstance(j.get("config"), str) and j["config"]
            and not Path(j["config"]).is_absolute() else j for j in jobs]


def round_requests(jobs: list[Any], *, steps: int, slots: int, gpu_kind: str = "cpu", alerts: str | None = None,
                   alert_profile: str | None = None, out_dir: str = "results/platform",
                   cache_dir: str | None = None, detector: Any = None, seed: int = 0) -> list[JobRequest]:
    """A platform round's `jobs` as `JobRequest`s (each on the round's shared small config, or the tenant's own
    `config` file, for the round's steps; each job's run directory `out_dir/<tenant>/<name>`, its gate
    `detector`: the round scheduler's early-stop rule, `scheduler_gate`; None: no gate; the shared config's `seed`),
    checked before anything starts. BadInput names `jobs[i].<field>`."""
    if not isinstance(jobs, list) or not all(isinstance(j, dict | RoundJob) for j in jobs):
        raise BadInput("jobs: every entry must be an object {tenant, name, config, overrides, gpus, steps_factor}")
    out: list[JobRequest] = []
    seen: dict[tuple[str, str], int] = {}
    for i, entry in enumerate(jobs):
        source = f"jobs[{i}]"
        try:
            job = entry if isinstance(entry, RoundJob) else RoundJob.model_validate(entry)
        except ValidationError as err:
            raise BadInput(describe(err, source)) from None
        if (job.tenant, job.name) in seen:
            raise BadInput(f"{source}.name: '{job.tenant}/{job.name}' is also jobs[{seen[job.tenant, job.name]}] "
                           "(each job of a round needs its own run directory: rename one)")
        seen[job.tenant, job.name] = i
        job_steps = max(4, round(steps * float(job.steps_factor)))
        cache = cache_dir or default_cache_dir()  # as a config without cache_dir
        config = job.config if job.config is not None else platform_job_config(job_steps, cache, seed)
        out.append(parse_request({"config": config, "overrides": job.overrides,
                                  "tenant": job.tenant, "name": job.name, "overlap": "full", "steps": job_steps,
                                  "gpus": job.gpus, "cluster_gpus": slots, "gpu_kind": gpu_kind, "detector": detector,
                                  "alerts": alerts, "alert_profile": alert_profile, "out_root": out_dir}, source))
    return out


def scheduler_gate(scheduler: str) -> Any:
    """The round's jobs' gate detector: the early-stop part of `scheduler` as a `training.job.request.DetectorSpec`
    (`Paired+SRTF` -> paired with the platform's margin, `EvalStop(k=3)+SJF` -> evalstop(k=3)), or None for a bare
    base policy. Each job's request carries it, so its supervisor's detector is built by the one builder, with the
    platform's settings (`training.job.request.DETECTOR_DEFAULTS`). BadInput names `scheduler`."""
    from scheduling.policies import scheduler_detector
    from training.job.request import parse_detector

    try:
        part = scheduler_detector(scheduler)
    except ValueError as err:
        raise BadInput(f"scheduler: {err}") from None
    return None if part is None else parse_detector({"name": part[0], "params": part[1]}, "scheduler")


def check_round(requests: list[JobRequest]) -> list[Any]:
    """Each request's `checked()` (training config, catalog, price), an error naming the job: `jobs[i]: ...`."""
    out = []
    for i, request in enumerate(requests):
        try:
            out.append(request.checked())
        except BadInput as err:
            raise BadInput(f"jobs[{i}] ({request.job}): {err}") from None
    return out
