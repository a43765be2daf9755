"""A job's eval-gate detector as the request names it: a registered early-stop rule and its parameters
(`DetectorSpec`), the text form (`paired(margin=0.1)`) and the platform's settings for parameters a name leaves out
(`DETECTOR_DEFAULTS`). Its own module so that `training.job.lifecycle` (which builds a job's detector) and
`training.job.request` (which validates it) both use it without importing each other."""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

#: eval.registry.EARLY_STOP_DETECTORS, the platform default (eval.detectors.DEFAULT_DETECTOR) first
DetectorName = Literal["noisepatience", "divergence", "evalstop", "stopat", "lossplateau", "patience", "cusum", "bocpd",
                       "paired"]
#: The parameters a job's gate detector gets when its request names the rule without them: the platform's settings,
#: stated here once for every entry point (the `rlhf-job` flow and its run form, `rlhfops train` and `resume`, the
#: nightly's job, each job of a platform round, whose scheduler names the rule). Explicit parameters override them
#: (`paired(margin=0)`). The paired rule's margin is 0.1 in gold units: a pause needs a decline beyond 0.1; with the
#: class default of 0 the default round's healthy 12-step job was paused at a real dip (docs/orchestration.md). The
#: class defaults (eval/paired.py: margin 0) stay what `rlhfops detect`, the simulator and the corpus replays use.
DETECTOR_DEFAULTS: Mapping[str, Mapping[str, Any]] = MappingProxyType({"paired": MappingProxyType({"margin": 0.1})})


def with_platform_settings(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """`params` over the platform's settings for the rule `name` (`DETECTOR_DEFAULTS`; none for other rules): what a
    job's gate and a sweep's detector pruner run when they name the rule without a parameter."""
    return {**DETECTOR_DEFAULTS.get(name.strip().lower(), {}), **params}


_DETECTOR_TEXT = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*(?:\((?P<args>[^()]*)\))?\s*$")
DETECTOR_SYNTAX = "write NAME or NAME(param=value, ...), e.g. paired or paired(margin=0.1)"


def _text_value(text: str) -> Any:
    """A parameter's value as written: a whole number, a number, true/false, none, else the text itself."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_detector_text(text: str) -> dict[str, Any]:
    """`paired(margin=0.1, alpha=0.05)` -> {"name": "paired", "params": {"margin": 0.1, "alpha": 0.05}}; ValueError
    (saying how to write it) for anything else."""
    m = _DETECTOR_TEXT.match(text)
    if not m:
        raise ValueError(f"cannot read {text!r}: {DETECTOR_SYNTAX}")
    params: dict[str, Any] = {}
    for item in (m.group("args") or "").split(","):
        if not item.strip():
            continue
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key or not value:
            raise ValueError(f"cannot read {item.strip()!r} in {text!r}: {DETECTOR_SYNTAX}")
        if key in params:
            raise ValueError(f"{key!r} is given twice in {text!r}: give each parameter once")
        params[key] = _text_value(value)
    return {"name": m.group("name"), "params": params}


def _param_problem(name: str, params: Mapping[str, Any]) -> tuple[str, str] | None:
    """(path, message) for the first parameter the rule `name` does not take, or takes with another type or value;
    None when the rule is built with all of them (over its class defaults: no file is read)."""
    import inspect

    from eval.registry import detector_class  # numpy; only for a request that gives parameters

    cls = detector_class(name)
    accepted = {k: p for k, p in inspect.signature(cls.__init__).parameters.items()
                if k != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    for key, value in params.items():
        p = accepted.get(key)
        if p is None:
            return (f"params.{key}", f"{name} has no parameter {key!r} (its parameters: {', '.join(accepted)}); "
                    "remove it or use one of those")
        ann, default = str(p.annotation), p.default
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if ann == "bool" or isinstance(default, bool):
            ok, what = isinstance(value, bool), "true or false"
        elif ann == "int":
            ok, what = number and float(value).is_integer(), "a whole number"
        elif ann.startswith("float"):
            ok, what = number or (value is None and "None" in ann), "a number"
        else:
            ok, what = True, ""
        if not ok:
            default = DETECTOR_DEFAULTS.get(name, {}).get(key, default)
            return f"params.{key}", f"{value!r} is not {what} (the default is {default!r})"
    try:
        cls(**params)
        return None
    except (ValueError, TypeError) as err:
        whole = str(err)
    for key, value in params.items():  # name the parameter the rule refuses on its own, if one is
        try:
            cls(**{key: value})
        except (ValueError, TypeError) as err:
            default = DETECTOR_DEFAULTS.get(name, {}).get(key, accepted[key].default)
            return (f"params.{key}", f"{value!r} is refused ({err}); give a value the rule accepts, or leave it out "
                    f"for the default ({default!r})")
    return "params", f"{dict(params)} are refused together ({whole}); change one of them"


class DetectorSpec(BaseModel):
    """A job's eval-gate detector: a registered early-stop rule and its parameters, validated once, here. Written as a
    mapping `{"name": "paired", "params": {"margin": 0.1}}` or as text: `paired`, `paired(margin=0.1)`. A rule named
    without a parameter gets the platform's setting for it (`DETECTOR_DEFAULTS`), else its calibrated threshold
    (configs/detectors.yaml), else its class default; `params` holds what was given and the platform's settings, so
    the request says what the job runs. `build()` makes the detector."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: DetectorName = Field(description="the early-stop rule (eval/registry.py), e.g. paired or noisepatience")
    params: dict[str, Any] = Field(default_factory=dict, description='its parameters, e.g. {"margin": 0.1} (empty: '
                                   "the platform's settings, then its calibrated thresholds, then its class defaults)")

    @model_validator(mode="before")
    @classmethod
    def _written(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = parse_detector_text(value)
        if isinstance(value, Mapping) and isinstance(value.get("name"), str):
            name = value["name"].strip().lower()
            params = value.get("params")
            params = {} if params is None else params
            if isinstance(params, Mapping):
                params = with_platform_settings(name, params)
            value = {**value, "name": name, "params": params}
        return value

    @model_validator(mode="after")
    def _takes_its_params(self) -> DetectorSpec:
        problem = _param_problem(self.name, self.params) if self.params else None
        if problem:
            raise PydanticCustomError("detector_param", "{path}: {msg}", {"path": problem[0], "msg": problem[1]})
        return self

    @property
    def label(self) -> str:
        """The spec as text, as it is written back (job.json, MLflow): `evalstop`, `paired(margin=0.1)`."""
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params.items())})"

    def __str__(self) -> str:
        return self.label

    def build(self) -> Any:
        """The detector (`eval.detectors.make_detector`: class defaults, calibrated thresholds, then `params`)."""
        from eval.detectors import make_detector

        return make_detector(self.name, **self.params)


def build_detector(detector: DetectorSpec | str | Mapping[str, Any] | None) -> Any:
    """The detector object a job's gate runs, from a `DetectorSpec`, its text or mapping (None: none). Entry points
    validate the detector at the edge (`training.job.request.parse_detector`), so a spec arrives here already
    checked."""
    if detector is None:
        return None
    spec = detector if isinstance(detector, DetectorSpec) else DetectorSpec.model_validate(detector)
    return spec.build()
