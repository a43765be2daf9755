"""The one config loader: a YAML file (or a mapping) plus dotted overrides, validated strictly by a pydantic model,
with any problem a one-line `BadInput` naming the file or the override and the field. Also the one `flatten`
(nested mapping -> dotted keys, as MLflow params want them), `parse_overrides` (`key=value` strings, as typed at a
command line, into dotted overrides) and `config_path` (where the shipped `configs/` files are).

    cfg = load_config(ExperimentConfig, "configs/E1.yaml", {"workload.jobs": 50}, field="experiment")
    flatten({"ppo": {"kl_coef": 0.1}})   # {"ppo.kl_coef": 0.1}

The YAML reading and the dotted-override semantics live in `common/validate.py` (`read_yaml_mapping`,
`set_dotted`, `validate_with_overrides`); this module composes them so every caller loads configs the same way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from common.errors import BadInput
from common.validate import read_yaml_mapping, validate_with_overrides

Model = TypeVar("Model")

#: the directory users name in config paths (`configs/ppo-tiny.yaml`); shipped inside the distribution as the
#: `configs` package's data, so a non-editable install has it too
CONFIGS = "configs"


def config_dir() -> Path:
    """The shipped `configs/` directory. It sits beside `common/` both in a checkout (editable install) and in
    site-packages (a wheel ships it as the `configs` package's data), so it is found from the code's own
    location, never from the working directory; `importlib.resources` is the fallback for other layouts."""
    beside = Path(__file__).resolve().parents[1] / CONFIGS
    if beside.is_dir():
        return beside
    from importlib import resources

    return Path(str(resources.files(CONFIGS)))


def config_path(path: str | Path) -> Path:
    """A config path as the user gave it when it exists; else a relative `configs/<name>` is looked up among the
    shipped configs, so `configs/ppo-tiny.yaml` works from any directory and with a non-editable install.
    Anything else is returned unchanged (the loader then reports it missing)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) != 2 or path.parts[0] != CONFIGS:
        return path
    shipped = config_dir() / path.name
    return shipped if shipped.is_file() else path


def load_config(model: type[Model], source: str | Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None,
                *, field: str = "config", defaults: Mapping[str, Any] | None = None,
                check: Callable[[dict, str], None] | None = None) -> Model:
    """A validated `model` from a YAML file (or a mapping already read) plus dotted `overrides`
    ({"ppo.kl_coef": 0.01}). `field` names what the file is for in errors (`config`, `experiment`, `prices`);
    `defaults` fill top-level keys the file leaves out (e.g. a job's name from the file name); `check(raw,
    source)` inspects the raw tree before validation (e.g. `check_finite_tree`). Errors are one line naming the
    file (or the override) and the field; nothing is built or written."""
    if isinstance(source, Mapping):
        raw, label = copy.deepcopy(dict(source)), field
    else:
        path = config_path(source)
        raw, label = read_yaml_mapping(path, field), str(path)
    for key, value in (defaults or {}).items():
        raw.setdefault(key, value)
    if check is not None:
        check(raw, label)
    return validate_with_overrides(model, raw, dict(overrides or {}), label)


def read_config_mapping(path: str | Path, field: str = "config") -> tuple[dict[str, Any], Path]:
    """A config file's raw mapping (not yet validated: for a caller that rewrites some keys before validating) and
    the path it was read from (`config_path`: a missing `configs/<name>` resolves to the shipped copy)."""
    resolved = config_path(path)
    return read_yaml_mapping(resolved, field), resolved


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """`key.path=value` strings (values parsed as YAML scalars) into dotted overrides."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"override '{item}': expected key=value, e.g. workload.eval_noise.sigma=0.05")
        try:
            out[key.strip()] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise BadInput(f"override '{item}': the value is not valid YAML ({problem}; quote it or fix the "
                           "brackets)") from None
    return out


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as one level of dotted keys: {"ppo": {"kl_coef": 0.1}} -> {"ppo.kl_coef": 0.1}. Lists
    and other values are leaves; an empty section disappears (it holds no value)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{dotted}."))
        else:
            out[dotted] = value
    return out
