"""One job, as asked for: `JobRequest`, validated once at the edge, and `build`, the one place a job's `JobSpec` and
its `RunSupervisor` are made.

    request = parse_request({"tenant": "acme", "name": "kl-sweep-1", "steps": 40})   # BadInput naming the field
    checked = request.checked()                        # the files it names; BadInput naming the field
    spec, supervisor = build(request, checked, run_id=run.run_id, ledger=ledger)
    outcome = run_job(spec, hooks=hooks, supervisor=supervisor)

Every entry point (the `rlhf-job` flow and its run form, `rlhfops train`, `rlhfops resume`, the nightly's job, each
job of a platform round) builds a `JobRequest`. Its fields carry their bounds, choices and descriptions, so the
Prefect run form is generated from it and a deployment's server refuses an out-of-range value before a flow run
exists. Checks in two steps, both before anything is provisioned or written:

- the model itself (pydantic, no I/O): names are identifiers, numbers in range, choices from the registries, the
  run directory resolves under `out_root`, `gpus <= cluster_gpus`;
- `JobRequest.checked()` (files, once per run of the request): the training config with its overrides and steps
  (`training.job.config`), the detector with its calibrated thresholds, the alert catalog, the price of `gpu_kind`
  (`check_gpu_kind`), and for `resume_paused` a paused run in the run directory.

The gate detector is a `DetectorSpec` (`{name, params}`, or text: `paired`, `paired(margin=0.1)`): a registered rule
and parameters it takes with values it accepts (`detector.params.margin: -1 is refused (...)`), a rule named without
a parameter getting the platform's setting for it (`DETECTOR_DEFAULTS`: the paired rule's margin 0.1, stated once
for every entry point).

The knobs the run form does not show (chaos injection, the first retry delay, the MLflow parent run) are
`JobInternals`, with safe defaults. Plain Python: no Prefect, no MLflow; torch is not imported here (a config error
is reported in well under a second).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from common.errors import BadInput, describe_validation_error
from training.job.detector_spec import (  # noqa: F401  (the request's detector contract, re-exported)
    DETECTOR_DEFAULTS,
    DETECTOR_SYNTAX,
    DetectorName,
    DetectorSpec,
    parse_detector_text,
)

#: tenant, job and model names: what may become a directory name, an MLflow tag and a registry name
NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
NAME_RULE = "1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit"

#: training.trainer.OVERLAPS (tests/flows/test_flow_forms.py keeps them equal; the trainer imports torch)
Overlap = Literal["none", "intra", "inter", "full"]
#: the alert catalog's profiles in configs/alerts.yaml (None: production thresholds)
AlertProfile = Literal["canary"]
#: training.job.config.ALGORITHMS (tests/flows/test_flow_forms.py keeps them equal): the form's drop-down
Algorithm = Literal["ppo", "grpo", "rloo"]
#: the request's typed config fields and the dotted config field each sets (the form's drop-downs and numbers; the
#: same fields as `overrides` would, which may not say otherwise)
CONFIG_FIELDS = {"device": "device", "dtype": "dtype", "algorithm": "algorithm", "group_size": "ppo.group_size"}

DEFAULT_CONFIG = "configs/ppo-tiny.yaml"
DEFAULT_OUT_ROOT = "runs/jobs"
#: infra.tracking.DEFAULT_EXPERIMENT (the domain does not import infra)
DEFAULT_EXPERIMENT = "rlhfops"


def check_name(value: Any, field: str) -> str:
    """`value` is a tenant/job/model name (`NAME_PATTERN`); raises ValueError naming `field` otherwise."""
    if not isinstance(value, str) or not re.fullmatch(NAME_PATTERN, value):
        raise ValueError(f"{value!r} is not a valid {field}: use {NAME_RULE}")
    return value


def under_root(root: str | Path, relative: str | Path, field: str) -> Path:
    """`root / relative`, refused (ValueError naming `field`) unless it resolves inside `root` (`..` or an
    absolute path outside it, also through a symbolic link)."""
    rel = Path(relative)
    if rel.is_absolute():
        raise ValueError(f"{str(relative)!r} must be a path relative to the output root {str(root)!r}")
    base = Path(root).resolve()
    target = (base / rel).resolve()
    if target != base and base not in target.parents:
        raise ValueError(f"{str(relative)!r} leaves the output root {str(root)!r}; give a path inside it")
    return Path(root) / rel


def job_name(text: str) -> str:
    """A valid job name made from any text (a config file's stem): lowercased, other characters as '-'."""
    name = re.sub(r"[^a-z0-9_-]+", "-", text.lower()).strip("-_")[:63]
    return name or "job"


def check_gpu_kind(gpu_kind: str, gpu_hour: Mapping[str, Any] | None = None, *, prices: str | Path | None = None,
                   field: str = "gpu_kind") -> None:
    """The one price check: `gpu_kind` has a price per GPU-hour in the price table (`gpu_hour`, or the `gpu_hour`
    section of the `prices` file, default configs/prices.yaml). Raises BadInput naming `field`."""
    if gpu_hour is None:
        gpu_hour = price_table_kinds(prices)
    if gpu_kind not in gpu_hour:
        known = ", ".join(sorted(gpu_hour)) or "none"
        raise BadInput(f"{field}: '{gpu_kind}' has no price (priced: {known}; add it under gpu_hour in "
                       f"{prices or 'configs/prices.yaml'})")


def price_table_kinds(prices: str | Path | None = None) -> dict[str, Any]:
    """The `gpu_hour` section of a price file (default: the shipped configs/prices.yaml)."""
    from common.config import config_dir, read_config_mapping

    path = prices if prices is not None else config_dir() / "prices.yaml"
    raw, _ = read_config_mapping(path, "prices")
    table = raw.get("gpu_hour")
    if not isinstance(table, dict):
        raise BadInput(f"prices: '{path}' has no gpu_hour mapping (GPU kind -> price per GPU-hour)")
    return table


def _spec_error(err: ValidationError) -> tuple[str, str]:
    """(path inside the spec, message) of a `DetectorSpec` validation error: `("params.margin", "...")`, or `("", ...)`
    for an unknown rule name."""
    first = err.errors()[0]
    kind, ctx = first["type"], first.get("ctx") or {}
    loc = ".".join(str(p) for p in first["loc"])
    if kind == "detector_param":
        return ctx["path"], ctx["msg"]
    if kind == "literal_error":
        return "", f"{first.get('input')!r} is not one of {ctx.get('expected')}"
    if not loc:  # the text did not read as NAME(param=value, ...)
        return "", str(first["msg"]).removeprefix("Value error, ")
    return loc, describe(err).removeprefix(f"{loc}: ")


class _SpecInvalid(ValueError):
    """A detector spec that does not validate: `path` inside the spec ("params.margin"; "" for the rule's name or
    text that does not read as NAME(param=value, ...)) and the message."""

    def __init__(self, path: str, msg: str):
        super().__init__(msg)
        self.path, self.msg = path, msg


def _validated_spec(value: Any) -> DetectorSpec | None:
    """The one check of a detector value (text, mapping or spec; None: no gate), shared by the edge
    (`parse_detector`) and `JobRequest`'s validator; `_SpecInvalid` naming the part that is wrong."""
    if value is None or isinstance(value, DetectorSpec):
        return value
    try:
        return DetectorSpec.model_validate(value)
    except ValidationError as err:
        raise _SpecInvalid(*_spec_error(err)) from None


def parse_detector(value: Any, field: str = "detector") -> DetectorSpec | None:
    """A `DetectorSpec` from text, a mapping or a spec (None: no gate); BadInput naming `field` and the part that is
    wrong: `detector.params.margin: -1 is refused (...)`, `--detector: 'nope' is not one of (...)`."""
    try:
        return _validated_spec(value)
    except _SpecInvalid as err:
        raise BadInput(f"{field}.{err.path}: {err.msg}" if err.path else f"{field}: {err.msg}") from None


class RunInternals(BaseModel):
    """What a flow run takes that a person filling the run form should not need: the first retry delay and the
    MLflow run to nest under (the nightly's). The defaults are the safe ones (1 s, no parent)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    retry_delay_s: float = Field(1.0, ge=0.0, le=600.0, description="first retry's delay in seconds (doubles)")
    parent_run_id: str | None = Field(None, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                                      description="MLflow run id to nest the run under (empty: top level)")


class JobInternals(RunInternals):
    """`RunInternals` plus chaos injection for a job (injected transient failures; default none)."""

    fail_rate: float = Field(0.0, ge=0.0, le=1.0, description="chaos: probability of an injected transient failure "
                             "at each retried call (0: none)")
    fault_seed: int = Field(0, ge=0, le=2**32 - 1, description="chaos: seed of the injected failures")


@dataclass(frozen=True)
class CheckedJob:
    """What `JobRequest.checked()` read and validated: the training config, the alert catalog, the price table's
    kinds, and the paused run a `resume_paused` request continues."""

    config: Any  # training.job.config.TrainConfig
    catalog: Any  # eval.health.Catalog
    gpu_hour: dict[str, Any]
    paused: Any = None  # training.job.lifecycle.PausedRun


class JobRequest(BaseModel):
    """One tenant's RL job (PPO, GRPO or RLOO: `algorithm`; OPPO overlap) under the run-health catalog and an eval
    gate; the best checkpoint is registered under the tenant's model. Every field is validated here, before anything
    is provisioned."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    config: str | dict[str, Any] = Field(
        DEFAULT_CONFIG, description="job config YAML (configs/ppo-tiny.yaml: a healthy job; configs/ppo-hack.yaml "
        "over-optimises the proxy reward on purpose; configs/ppo-arith.yaml: a data set with built-in rewards; "
        "configs/grpo-arith.yaml: the same data set with GRPO, no critic), or "
        "the config itself as a mapping. Your own job: a YAML in your folder with task: {kind: dataset, train: "
        "train.jsonl, heldout: heldout.jsonl, prompt_key: question}, reward: {kind: function, ref: "
        "my_reward.py:score} and optionally gate: {kind: function, ref: my_reward.py:exact}; relative paths are "
        "read from the config file's folder")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description='dotted config fields to change, e.g. {"ppo.kl_coef": 0.2, "seed": 1}, '
        'or your data and reward: {"task.train": "train-v2.jsonl", "reward.ref": "my_reward.py:score", '
        '"gate.ref": "my_reward.py:exact"} (paths relative to the config file\'s folder)')
    tenant: str = Field("acme", pattern=NAME_PATTERN, description="the customer the job is charged to: its ledger, "
                        f"MLflow tag and <tenant>-policy model ({NAME_RULE})")
    name: str = Field("ppo-tiny", pattern=NAME_PATTERN,
                      description=f"the job's name within the tenant ({NAME_RULE})")
    overlap: Overlap = Field("full", description="OPPO overlap: none (sequential PPO), intra (stream chunks to the "
                             "scorers while decoding), inter (start B+delta prompts, train on the first B), full "
                             "(both)")
    steps: int | None = Field(None, ge=1, le=10_000_000, description="PPO steps (empty: the config's steps)")
    gpus: int = Field(1, ge=1, le=4096, description="GPU worker slots the job holds while it trains, and the "
                      "data-parallel ranks it trains on (docs/ranks.md)")
    runner: Literal["thread", "ray"] = Field("thread", description="where a job on several GPUs runs its ranks: "
                                             "thread (the worker's machine: the worker is rank 0 and spawns the "
                                             "others) or ray (one Ray Train worker per rank on the Ray cluster at "
                                             "RAY_ADDRESS, else a local Ray head)")
    max_rank_restarts: int = Field(1, ge=0, le=100, description="a job on several GPUs whose rank dies, hangs or "
                                   "raises is restarted from its last checkpoint this many times, then FAILED "
                                   "naming the rank")
    cluster_gpus: int = Field(4, ge=1, le=4096, description="size of the GPU slot pool (the Prefect global "
                              "concurrency limit gpu-slots)")
    device: str | None = Field(None, max_length=16, description="where the job's models "
                               "and tensors live: auto (CUDA when present; the job's GPU slot picks the card), cpu, "
                               "cuda or cuda:N (empty: the config's device)")
    dtype: Literal["float32", "bfloat16"] | None = Field(None, description="the forward passes' precision: float32, "
                                                         "or bfloat16 with float32 master weights (empty: the "
                                                         "config's dtype)")
    algorithm: Algorithm | None = Field(None, description="the training algorithm: ppo (a learned critic, GAE), "
                                        "grpo (group-relative advantages, no critic) or rloo (leave-one-out "
                                        "baseline, no critic); each fills the ppo fields the config leaves out with "
                                        "its own defaults (grpo: 8 completions per prompt, no KL) (empty: the "
                                        "config's algorithm)")
    group_size: int | None = Field(None, ge=1, le=65536, description="completions sampled per prompt "
                                   "(ppo.group_size): grpo and rloo need at least 2, and the config's "
                                   "ppo.batch_size must be a multiple of it (empty: the config's, else the "
                                   "algorithm's default: ppo 1, grpo 8, rloo 2)")
    gpu_kind: str = Field("cpu", min_length=1, max_length=64, description="priced GPU kind for the tenant's ledger "
                          "(a key of gpu_hour in the price table)")
    # a rule's name (the form's drop-down) or {name, params}; always a `DetectorSpec` (or None) once validated
    detector: DetectorSpec | DetectorName | None = Field(
        "noisepatience", validate_default=True, description="the eval-gate early-stop detector that may pause the "
        "job at a checkpoint: a name (noisepatience, the platform default: held-out score well below its best for "
        "several checkpoints, by the run's own noise, while the proxy reward still rises; paired: the paired rule on "
        "per-prompt scores, margin 0.1), or {name, params} to set its parameters, e.g. {\"name\": \"paired\", "
        "\"params\": {\"margin\": 0.05}}; empty: no gate")
    alerts: str | None = Field(None, description="alert catalog YAML (empty: configs/alerts.yaml)")
    alert_profile: AlertProfile | None = Field(None, description="alert threshold profile (empty: production "
                                               "thresholds; canary: short test windows)")
    prices: str | None = Field(None, description="price table YAML (empty: configs/prices.yaml)")
    out_root: str = Field(DEFAULT_OUT_ROOT, min_length=1, description="output root: the job writes only under it")
    run_dir: str | None = Field(None, min_length=1, description="the run directory, relative to out_root "
                                "(empty: <tenant>/<name>); it must stay inside out_root")
    registered_model: str | None = Field(None, pattern=NAME_PATTERN, description="model registry name for the best "
                                         "checkpoint (empty: <tenant>-policy)")
    resume: bool = Field(True, description="continue an interrupted job from the newest checkpoint in its run "
                         "directory; a directory whose job ended is started over. Off: always start over")
    resume_paused: bool = Field(False, description="continue the run the eval gate paused in the run directory "
                                "(PAUSED_BY_GATE) from its kept best checkpoint")
    mlflow_experiment: str = Field(DEFAULT_EXPERIMENT, min_length=1, max_length=200,
                                   description="MLflow experiment the job's run goes to")

    @field_validator("overrides", mode="before")
    @classmethod
    def _no_overrides(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("detector", mode="before")
    @classmethod
    def _detector(cls, value: Any) -> Any:
        try:
            return _validated_spec(value)
        except _SpecInvalid as err:
            raise PydanticCustomError("detector_spec", "{msg}", {"path": err.path, "msg": err.msg}) from None

    @field_validator("device")
    @classmethod
    def _device(cls, value: str | None) -> str | None:
        from training.job.config import check_device_text

        return value if value is None else check_device_text(value)

    @field_validator("tenant", "name", "registered_model", mode="before")
    @classmethod
    def _name(cls, value: Any, info) -> Any:
        return value if value is None and info.field_name == "registered_model" else check_name(value, info.field_name)

    @model_validator(mode="after")
    def _paths_and_sizes(self) -> JobRequest:
        if self.gpus > self.cluster_gpus:
            raise ValueError(f"gpus: the job asks for {self.gpus} slots but the cluster has {self.cluster_gpus} "
                             "(cluster_gpus)")
        try:
            under_root(self.out_root, self.run_dir or Path(self.tenant) / self.name, "run_dir")
        except ValueError as err:
            raise ValueError(f"run_dir: {err}") from None
        return self

    # ----------------------------------------------------------------------------------------------- derived
    @property
    def job(self) -> str:
        return f"{self.tenant}/{self.name}"

    @property
    def out_dir(self) -> Path:
        """The run directory: `out_root/run_dir` (default `out_root/<tenant>/<name>`), inside `out_root`."""
        return Path(self.out_root) / (self.run_dir or Path(self.tenant) / self.name)

    @property
    def model_name(self) -> str:
        return self.registered_model or f"{self.tenant}-policy"

    @property
    def config_label(self) -> str:
        """The config as an MLflow param: its path, or `inline`."""
        return self.config if isinstance(self.config, str) else "inline"

    def checked(self) -> CheckedJob:
        """Everything the request names on disk, read and validated (BadInput naming the field). Not cached: the
        files and the run directory may change between two runs of the same request; a caller checks once and
        hands the result to `build`."""
        return _check(self)


def _check(request: JobRequest) -> CheckedJob:
    from common.validate import check_out_dir
    from training.job.config import resolve_config
    from training.job.lifecycle import JOB_DONE, paused_run

    check_out_dir(request.out_root, "out_root")
    check_out_dir(request.out_dir, "run_dir")
    overrides = dict(request.overrides)
    if request.steps is not None:
        overrides["steps"] = request.steps
    for key, dotted in CONFIG_FIELDS.items():
        value = getattr(request, key)
        if value is None:
            continue
        if dotted in overrides and overrides[dotted] != value:
            raise BadInput(f"{key}: {value!r}, but overrides sets {dotted} to {overrides[dotted]!r}: give one")
        overrides[dotted] = value
    cfg = resolve_config(request.config, overrides)  # first: a config error before numpy, eval or torch is imported
    from training.job.device import check_named_cuda

    check_named_cuda(cfg.device)  # refused here, before any slot or model, when absent
    from training.distributed.plan import check_world

    check_world(cfg, request.gpus)  # a batch or group count that does not divide over the job's ranks: exit 2
    from training.inputs.job_inputs import check_inputs

    check_inputs(cfg)  # a tenant's data files and function refs: bad data is bad input, found before any slot
    from eval.health import Catalog

    if request.detector is not None:  # its parameters were checked by the model; here with the calibrated thresholds
        try:
            request.detector.build()
        except (ValueError, KeyError) as err:
            raise BadInput(f"detector: {err}") from None
    gpu_hour = price_table_kinds(request.prices)
    check_gpu_kind(request.gpu_kind, gpu_hour, prices=request.prices)
    catalog = Catalog.from_file(request.alerts, algorithm=cfg.algorithm, profile=request.alert_profile)
    paused = None
    if request.resume_paused:
        paused = paused_run(request.out_dir)
        if paused is None:
            raise BadInput(f"resume_paused: {request.out_dir} holds no run paused by the eval gate (its {JOB_DONE} "
                           "does not say PAUSED_BY_GATE with a kept checkpoint); leave resume_paused off to start "
                           "the job over")
    return CheckedJob(cfg, catalog, dict(gpu_hour), paused)


def parse_request(data: JobRequest | Mapping[str, Any], source: str = "") -> JobRequest:
    """A `JobRequest` from a mapping (a form, a JSON list entry, keyword arguments); a wrong field raises one-line
    BadInput naming it (`name: ...`, or `<source>.name: ...`). Only the model's own checks: call `.checked()` for
    the files."""
    if isinstance(data, JobRequest):
        return data
    if not isinstance(data, Mapping):
        raise BadInput(f"{source or 'request'}: must be a mapping of job fields, not {type(data).__name__}")
    try:
        return JobRequest.model_validate(dict(data))
    except ValidationError as err:
        raise BadInput(describe(err, source)) from None


def parse_internals(data: RunInternals | Mapping[str, Any] | None, source: str = "internals",
                    model: type[RunInternals] = JobInternals) -> Any:
    """`model` (`JobInternals`, `RunInternals`) from a mapping (None: the safe defaults); BadInput naming the
    field."""
    if data is None:
        return model()
    if isinstance(data, model):
        return data
    if isinstance(data, BaseModel):
        data = data.model_dump(exclude_unset=True)
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise BadInput(describe(err, source)) from None


def describe(err: ValidationError, source: str = "") -> str:
    """One line for a request's validation error, naming the field: `steps: -5 is out of range: give a value >= 1`
    (`source` prefixes it: `jobs[2].name: ...`); a cross-field rule names its field itself."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    kind, ctx = first["type"], first.get("ctx") or {}
    if not loc:
        text = str(first["msg"]).removeprefix("Value error, ")
        return f"{source}.{text}" if source else text  # the rule's message starts with its field
    if kind == "detector_spec":  # the part of the detector that is wrong: detector.params.margin
        path = f"{loc}.{ctx['path']}" if ctx.get("path") else loc
        return f"{source}.{path}: {ctx['msg']}" if source else f"{path}: {ctx['msg']}"
    if kind == "literal_error":
        msg = f"{first.get('input')!r} is not one of {ctx.get('expected')}"
    else:
        full = describe_validation_error(err, source="")
        msg = full.removeprefix(f": field '{loc}': ").replace("Value error, ", "", 1)
        if len(err.errors()) > 1:
            msg = msg.rsplit(" (+", 1)[0]
    return f"{source}.{loc}: {msg}" if source else f"{loc}: {msg}"


def build(request: JobRequest, checked: CheckedJob | None = None, *, run_id: str = "", ledger: Any = None,
          metrics: Any = None, pausable: bool = True, resume: Any = None, run_through_pause: bool = False):
    """The job's `training.job.lifecycle.JobSpec` and its `eval.supervisor.RunSupervisor` (alert catalog, the gate
    detector `request.detector` specifies, with its parameters, fitted to the job's planned looks, planned steps,
    ledger and metrics to charge) from a request and its `checked()` result (checked here when not given). A platform
    round's jobs carry its scheduler's rule in their requests, so the round and every other entry point decide with a
    detector built here. `pausable`: a stop pauses the run (PAUSED_BY_GATE, resumable; the live paths) rather than
    ending it; `run_through_pause`: train on past a pause and past a page that fails the run (the fault canaries
    only: every other job stops once it can only end FAILED). `resume`: the `PausedRun` to continue (default: the
    one a `resume_paused` request found)."""
    from training.job.lifecycle import JobSpec, make_supervisor

    checked = checked if checked is not None else request.checked()
    spec = JobSpec(tenant=request.tenant, name=request.name, config=checked.config, run_id=run_id,
                   out_dir=request.out_dir, overlap=request.overlap, gpus=request.gpus, gpu_kind=request.gpu_kind,
                   detector=request.detector, alerts=request.alerts, alert_profile=request.alert_profile,
                   pausable=pausable, resume=resume if resume is not None else checked.paused,
                   run_through_pause=run_through_pause, runner=request.runner,
                   max_rank_restarts=request.max_rank_restarts)
    return spec, make_supervisor(spec, ledger=ledger, metrics=metrics, catalog=checked.catalog)
