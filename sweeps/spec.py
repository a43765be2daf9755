"""The sweep spec: a team's own nightly search over a base PPO job (YAML, strict like every other config).

    name: kl-lr                       # the study's name (Optuna) and the sweep's MLflow parent run
    base: configs/ppo-tiny.yaml       # the job config every trial starts from (a path or a mapping)
    overrides: {steps: 36}            # dotted fields fixed for every trial
    space:                            # dotted job-config fields to vary, one distribution each
      ppo.kl_coef: {log_uniform: [0.005, 0.3]}
      ppo.actor_lr: {uniform: [1.0e-4, 2.0e-3]}
      oppo.chunk_size: {choice: [8, 16, 32]}
      ppo.num_ppo_epochs: {grid: [1, 2]}
    sampler: {kind: tpe, seed: 0}     # grid | random | tpe
    trials: 12
    seeds_per_trial: 1                # each trial trains this many seeds (seed, seed+1, ...); objective: their mean
    tenant: acme
    concurrency: 2                    # GPU slots the sweep holds at once (one trial per `gpus_per_trial`)
    scheduler: SJF-Est                # which queued trial takes a freed slot (scheduling.policies; default FIFO)
    queue_depth: 4                    # trials asked ahead and waiting for a slot (default: 0 under FIFO)
    budget: {gpu_hours: 2.0, wall_s: 3600}   # either or both; reached: no new trials start
    objective: {direction: maximize}  # the held-out gate score at each trial's kept checkpoint
    pruning: {detector: incumbent}    # the default; median | wilcoxon | a detector's name | none

Everything is checked here, before a study is opened or a slot is taken; an error raises `BadInput` naming the
field (`space.ppo.kl_coeff: ...`). Prefect-, MLflow- and CLI-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from common.errors import BadInput, describe_validation_error, validated
from training.job.detector_spec import with_platform_settings
from training.job.request import check_name, parse_request

KINDS = ("grid", "choice", "uniform", "log_uniform")
#: a sweep name's longest: its model name `<name>-sweep` is a name of at most 63 characters
MAX_NAME = 63 - len("-sweep")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ParamSpace(_Strict):
    """One varied field: exactly one of the four kinds. `grid`/`choice`: the values; `uniform`/`log_uniform`:
    [low, high] (integers on both ends draw integers)."""

    grid: list[Any] | None = None
    choice: list[Any] | None = None
    uniform: tuple[int, int] | tuple[float, float] | None = None
    log_uniform: tuple[int, int] | tuple[float, float] | None = None

    @field_validator("uniform", "log_uniform", mode="before")
    @classmethod
    def _ends(cls, v: Any) -> Any:
        """Integers on both ends stay integers (the sampler draws integers), a float on either end makes both floats.
        Left to pydantic's union, a YAML list [4, 12] came out (4.0, 12.0) and the range drew floats."""
        if isinstance(v, (list, tuple)) and len(v) == 2 and not any(isinstance(x, bool) for x in v):
            if all(isinstance(x, int) for x in v):
                return tuple(v)
            if all(isinstance(x, (int, float)) for x in v):
                return tuple(float(x) for x in v)
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> ParamSpace:
        given = [k for k in KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {', '.join(given) or 'none'})")
        kind = given[0]
        if kind in ("grid", "choice"):
            values = getattr(self, kind)
            if not values:
                raise ValueError(f"{kind}: give at least one value")
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{kind}: values repeat")
        else:
            low, high = getattr(self, kind)
            if not low < high:
                raise ValueError(f"{kind}: low {low} must be below high {high}")
            if kind == "log_uniform" and low <= 0:
                raise ValueError(f"log_uniform: low {low} must be > 0")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) is not None)

    def candidates(self) -> list[Any]:
        """Values that stand for the whole range when checking it against the job config: every listed value, or
        both ends."""
        kind = self.kind
        return list(getattr(self, kind))


class SamplerSpec(_Strict):
    kind: Literal["grid", "random", "tpe"] = "tpe"
    seed: int = Field(0, ge=0, le=2**32 - 1)
    #: TPE: random trials before the model takes over (Optuna's default is 10)
    startup_trials: int = Field(10, ge=1, le=10_000)


class BudgetSpec(_Strict):
    """Either or both; when one is reached no new trial starts (trials already running finish)."""

    gpu_hours: float | None = Field(None, gt=0)
    wall_s: float | None = Field(None, gt=0)


class ObjectiveSpec(_Strict):
    #: the held-out gate score (gold eval on prompts training never sees) at the trial's kept checkpoint
    metric: Literal["heldout"] = "heldout"
    direction: Literal["maximize", "minimize"] = "maximize"


class PruningSpec(_Strict):
    #: `incumbent` (the default): prune a trial when its paired per-prompt gate evidence says it cannot beat the best
    #: checkpoint another trial recorded, at level alpha (eval.incumbent_pruner); `median` / `wilcoxon`: Optuna's;
    #: `default` or another registered early-stop detector by name; `none`
    detector: str = "incumbent"
    #: the pruner's parameters; a detector's parameters that are left out get the platform's setting
    #: (training.job.detector_spec.DETECTOR_DEFAULTS: the paired rule's margin 0.1, as in every job), else the
    #: calibrated thresholds in configs/detectors.yaml
    params: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _platform_settings(self) -> PruningSpec:
        # the same settings a job's gate gets for a rule named without them, so `pruning: {detector: paired}` prunes
        # a trial on the evidence that would pause the same run as a job
        self.params = with_platform_settings(self.detector, self.params)
        return self


class SweepSpec(_Strict):
    #: the study's name, its directory and its model's (`<name>-sweep`): a job/model name
    #: (training.job.request.NAME_RULE)
    name: str
    base: str | dict[str, Any]
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, ParamSpace]
    sampler: SamplerSpec = Field(default_factory=SamplerSpec)
    trials: int = Field(ge=1, le=100_000)
    seeds_per_trial: int = Field(1, ge=1, le=100)
    #: whose ledger the trials are charged to: a tenant name, as in every job request (training.job.request.NAME_RULE)
    tenant: str = "acme"
    concurrency: int = Field(1, ge=1, le=4096, description="GPU slots the sweep holds at once")
    gpus_per_trial: int = Field(1, ge=1, le=4096)
    gpu_kind: str = "cpu"
    #: the price table YAML every trial is checked against and charged with (empty: configs/prices.yaml)
    prices: str | None = None
    overlap: Literal["none", "intra", "inter", "full"] = "none"
    #: which queued trial takes a freed slot: a base policy of `scheduling.policies` (FIFO: Optuna's ask order;
    #: SJF-Est: the smallest estimated trial first). A detector-wrapped name (EvalStop+SJF) is refused: the sweep's
    #: pruner (`pruning`) is what stops a trial at a checkpoint
    scheduler: str = "FIFO"
    #: trials asked of Optuna ahead and waiting for a slot, beyond those that start at once (empty: none under
    #: FIFO, which starts them in ask order anyway; `concurrency // gpus_per_trial` under any other scheduler)
    queue_depth: int | None = Field(None, ge=0, le=10_000)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    objective: ObjectiveSpec = Field(default_factory=ObjectiveSpec)
    pruning: PruningSpec = Field(default_factory=PruningSpec)
    #: Optuna storage: a database URL (postgresql://..., sqlite:////abs/path.db); empty: a SQLite file in out_dir
    storage: str | None = None
    #: where trials write their run directories (empty: runs/sweeps/<name>)
    out_dir: str | None = None
    #: the model registry name the best trial's checkpoint goes to (empty: <tenant>-policy)
    registered_model: str | None = None
    mlflow_experiment: str = "rlhfops"

    @field_validator("name", "tenant", "registered_model", mode="before")
    @classmethod
    def _job_name(cls, value: Any, info) -> Any:
        if value is None and info.field_name == "registered_model":
            return value
        try:
            check_name(value, f"sweep.{info.field_name}")
            if info.field_name == "name" and len(value) > MAX_NAME:
                raise ValueError(f"{value!r} is too long for sweep.name: give at most {MAX_NAME} characters (its "
                                 "model, <name>-sweep, is a model name of at most 63)")
        except ValueError as err:  # no "Value error, " prefix: the line already names the field
            raise PydanticCustomError("sweep_name", str(err).replace("{", "{{").replace("}", "}}")) from None
        return value

    @field_validator("scheduler")
    @classmethod
    def _known_scheduler(cls, name: str) -> str:
        scheduler_policy(name)  # raises ValueError naming the valid policies
        return name.strip()

    @model_validator(mode="after")
    def _check(self) -> SweepSpec:
        if not self.space:
            raise ValueError("space: give at least one field to vary (e.g. ppo.kl_coef: {log_uniform: [0.01, 0.3]})")
        if self.sampler.kind == "grid":
            bad = [k for k, p in self.space.items() if p.kind not in ("grid", "choice")]
            if bad:
                raise ValueError(f"sampler.kind grid needs grid or choice values for every field; "
                                 f"'{bad[0]}' is {self.space[bad[0]].kind}")
        if self.concurrency < self.gpus_per_trial:
            raise ValueError(f"concurrency {self.concurrency} is below gpus_per_trial {self.gpus_per_trial}: "
                             "no trial could start")
        return self

    @property
    def model_name(self) -> str:
        """The registered model the best trial goes to: `registered_model`, else `<name>-sweep`, the sweep's own
        (a trial reaches a job's `<tenant>-policy` only through `rlhfops promote`)."""
        return self.registered_model or f"{self.name}-sweep"

    @property
    def parallel_trials(self) -> int:
        return self.concurrency // self.gpus_per_trial

    @property
    def lookahead(self) -> int:
        """Trials kept asked and waiting beyond the free slots (`queue_depth`, or its default)."""
        if self.queue_depth is not None:
            return self.queue_depth
        return 0 if scheduler_policy(self.scheduler).name == "FIFO" else self.parallel_trials

    @property
    def run_dir(self) -> Path:
        return Path(self.out_dir or Path("runs") / "sweeps" / self.name)

    @property
    def storage_url(self) -> str:
        if self.storage:
            return self.storage
        return f"sqlite:///{(self.run_dir / 'optuna.db').resolve()}"

    def grid_size(self) -> int:
        return math.prod(len(p.candidates()) for p in self.space.values() if p.kind in ("grid", "choice"))


def scheduler_policy(name: str):
    """The placement policy a sweep's `scheduler` names (`scheduling.policies.parse_scheduler`), base policies only.
    Raises ValueError naming the valid ones."""
    from scheduling.policies import BASES, EarlyStop, parse_scheduler

    valid = ", ".join(sorted(BASES))
    try:
        policy = parse_scheduler(name)
    except ValueError as err:  # its message lists the bases when the base is unknown; a bad detector part does not
        raise ValueError(str(err) if "bases:" in str(err) else f"{err}; give one of: {valid}") from None
    if isinstance(policy, EarlyStop):
        raise ValueError(f"'{name}' wraps an early-stop detector; a sweep's trials are stopped by its pruner (set "
                         f"pruning.detector to '{policy.detector.name}'): give a base policy, one of: {valid}")
    return policy


def _error_field(err: ValidationError) -> str:
    return describe_validation_error(err, source="sweep spec")


def parse_spec(raw: dict[str, Any], source: str = "sweep spec") -> SweepSpec:
    return validated(SweepSpec, raw, source)


def load_spec(path: str | Path, trials: int | None = None) -> SweepSpec:
    """Read and check a sweep spec file: the spec's own fields, then every varied field against the job config
    (each listed value and both ends of each range must make a valid job). `trials` overrides the spec's."""
    from common.config import load_config

    spec = load_config(SweepSpec, path, {"trials": trials} if trials is not None else None, field="spec")
    check_against_job(spec, base_dir=Path(path).resolve().parent)
    # the base as found here: a path relative to the spec's folder reaches every trial (the CLI, the flow and the
    # runner take the spec, not its folder)
    return spec.model_copy(update={"base": resolve_base(spec, Path(path).resolve().parent)})


def resolve_base(spec: SweepSpec, base_dir: Path | None = None) -> str | dict[str, Any]:
    """The base job config: a mapping as given, a path as given when it exists (relative to the working
    directory, as every other config), else relative to the spec's own folder."""
    if isinstance(spec.base, dict):
        return spec.base
    path = Path(spec.base)
    if not path.is_file() and base_dir is not None and (base_dir / path).is_file():
        return str(base_dir / path)
    return spec.base


def trial_config(spec: SweepSpec, params: dict[str, Any], seed_index: int = 0, base_dir: Path | None = None):
    """The `TrainConfig` one trial (and seed) trains: the base config, the spec's fixed overrides, the trial's
    params, and the seed (the base seed + the seed's index)."""
    from training.job.config import resolve_config

    base = resolve_base(spec, base_dir)
    overrides = {**spec.overrides, **params}
    cfg = resolve_config(base, overrides)
    if seed_index:
        cfg = resolve_config(base, {**overrides, "seed": cfg.seed + seed_index})
    return cfg


def trial_request(spec: SweepSpec, params: dict[str, Any], number: int, seed_index: int = 0,
                  base_dir: Path | None = None, source: str = ""):
    """The `training.job.request.JobRequest` one trial (and seed) runs as: the base config with the spec's fixed
    overrides, the trial's params and the seed (the base seed + the seed's index: `trial_config`), charged to the
    spec's tenant and GPU kind, in `<out_dir>/trial-NNNN/seed-S`, with no gate detector (the sweep's pruner stops a
    trial). `source` prefixes a field's error (`sweep`: the check before the sweep starts)."""
    overrides = {**spec.overrides, **params}
    if seed_index:
        overrides["seed"] = trial_config(spec, params, seed_index, base_dir).seed
    return parse_request({"config": resolve_base(spec, base_dir), "overrides": overrides, "tenant": spec.tenant,
                          "name": f"trial-{number:04d}-seed-{seed_index}", "overlap": spec.overlap,
                          "gpus": spec.gpus_per_trial, "cluster_gpus": spec.concurrency, "gpu_kind": spec.gpu_kind,
                          "prices": spec.prices, "detector": None, "out_root": str(spec.run_dir),
                          "run_dir": f"trial-{number:04d}/seed-{seed_index}", "resume": False,
                          "mlflow_experiment": spec.mlflow_experiment}, source or f"trial-{number:04d}")


def valid_job(base: str | dict[str, Any], overrides: dict[str, Any]):
    """The job config `base` with `overrides`, checked as a job's request checks it: the config itself, then what it
    names on disk (a tenant's data files and reward/gate function refs: `training.inputs.job_inputs.check_inputs`)."""
    from training.inputs.job_inputs import check_inputs
    from training.job.config import resolve_config

    cfg = resolve_config(base, overrides)
    check_inputs(cfg)
    return cfg


#: an integer range of at most this many values is checked value by value (`checked_values`): a range such as
#: `ppo.group_size: {uniform: [2, 8]}` has valid ends and invalid values inside (3 does not divide a batch of 16)
MAX_CHECKED_RANGE = 64
#: ... and paired with another field's values value by value when it has at most this many (else by its ends), so the
#: pair check stays a few hundred config validations (about 5 ms each) per pair of fields
MAX_PAIRED_RANGE = 16


def checked_values(space: ParamSpace, most: int = MAX_CHECKED_RANGE) -> list[Any]:
    """The values of a varied field the spec check tries: every listed value, every integer of an integer range of at
    most `most` values, else both ends of the range."""
    if space.kind in ("uniform", "log_uniform"):
        low, high = getattr(space, space.kind)
        if isinstance(low, int) and isinstance(high, int) and high - low < most:
            return list(range(low, high + 1))
    return space.candidates()


def check_against_job(spec: SweepSpec, base_dir: Path | None = None) -> None:
    """Every varied field must exist in the job config and every listed value (both ends of a range) must make a
    valid job, its data files and function refs included (`valid_job`); so must every integer inside a short integer
    range (`checked_values`), and every pair of two fields' values (`algorithm: grpo` with `ppo.group_size: 1`, a
    `ppo.group_size` that does not divide a varied `ppo.batch_size`): a trial may draw any of them. Raises BadInput
    naming `space.<field>`, and for a pair both fields."""
    from training.job.config import resolve_config

    base = resolve_base(spec, base_dir)
    try:
        valid_job(base, dict(spec.overrides))
    except BadInput as err:
        raise BadInput(f"base/overrides: {err}") from None
    for path, space in spec.space.items():
        if path in spec.overrides:
            raise BadInput(f"space.{path}: also fixed under overrides (vary it or fix it, not both)")
        ends = space.candidates()
        for value in checked_values(space):
            try:  # the files a value names are read for the listed values and the ends; the config alone inside
                (valid_job if value in ends else resolve_config)(base, {**spec.overrides, path: value})
            except BadInput as err:
                where = "" if value in ends else f" (inside {space.kind} {list(ends)}: list the values with choice)"
                raise BadInput(f"space.{path}: {value!r}{where} does not make a valid job ({err})") from None
        if path == "seed" and spec.seeds_per_trial > 1:
            raise BadInput("space.seed: the seed is varied by seeds_per_trial; do not vary it in the space too")
    values = {path: checked_values(space, MAX_PAIRED_RANGE) for path, space in spec.space.items()}
    paths = list(values)
    for i, first in enumerate(paths):  # the config alone: each value's files were read above
        for second in paths[i + 1:]:
            for a in values[first]:
                for b in values[second]:
                    try:
                        resolve_config(base, {**spec.overrides, first: a, second: b})
                    except BadInput as err:
                        raise BadInput(f"space.{first}: {a!r} with space.{second}: {b!r} does not make a valid job "
                                       f"({err}); vary them so that every pair is valid, or fix one under "
                                       "overrides") from None
    trial_request(spec, {}, 0, 0, base_dir, source="sweep")  # the job fields every trial's request takes
