"""The one config loader: a YAML file (or a mapping) plus dotted overrides, validated strictly by a pydantic model,
with any problem a one-line `BadInput` naming the file or the override and the field. Also the one `flatten`
(nested mapping -> dotted keys, as MLflow params want them), `parse_overrides` (`key=value` strings, as typed at a
command line, into dotted overrides) and `config_path` (a `configs/...` path that resolves from any directory).

    cfg = load_config(ExperimentConfig, "configs/E1.yaml", {"workload.jobs": 50}, field="experiment")
    flatten({"ppo": {"kl_coef": 0.1}})   # {"ppo.kl_coef": 0.1}

Strict, so a typo cannot pass as a default: an empty file, a key given twice, a top level that is not a mapping and
a number written as a string (`actor_lr: '1.5e-4'`) are each refused naming the field. Values are validated in
pydantic's strict JSON mode: no string becomes a number, while a YAML list still fills a tuple field and a string a
`Literal`. Unquoted numbers are read as YAML 1.2 reads them (`1e-4` is a number, as it is in every other language;
YAML 1.1 made it a string).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from common.errors import BadInput, describe_validation_error
from common.validate import set_dotted

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
    """A config path as the user gave it when it exists; else a relative `configs/...` path (`configs/ppo-tiny.yaml`,
    `configs/sweeps/example.yaml`) is looked up among the shipped configs, so every default works from any directory
    and with a non-editable install. Anything else is returned unchanged (the loader then reports it missing)."""
    path = Path(path)
    if path.exists() or path.is_absolute() or len(path.parts) < 2 or path.parts[0] != CONFIGS or ".." in path.parts:
        return path
    shipped = config_dir().joinpath(*path.parts[1:])
    return shipped if shipped.is_file() else path


@functools.cache
def _yaml_loader():
    """PyYAML's safe loader, reading unquoted numbers as YAML 1.2 does (`1e-4`, `2E3`, `1.0e4` are numbers; YAML 1.1
    wanted a dot and a signed exponent)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))
    return Loader


def _duplicate_key(node, path: str = "", seen: set[int] | None = None) -> tuple[str, int, int] | None:
    """The first key given twice in one mapping of a composed YAML document: (dotted field, first line, second
    line), or None. Merge keys (`<<`) are the one allowed repetition."""
    import yaml

    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias to a node already walked
        return None
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            if name is not None and key.tag != "tag:yaml.org,2002:merge":
                if name in lines:
                    return f"{path}{name}", lines[name], key.start_mark.line + 1
                lines[name] = key.start_mark.line + 1
            found = _duplicate_key(value, f"{path}{name}." if name is not None else path, seen)
            if found:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found = _duplicate_key(item, f"{path.removesuffix('.')}[{i}].", seen)
            if found:
                return found
    return None


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document (None when there is none), read strictly: a key given twice is an error naming it."""
    import yaml

    loader = _yaml_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        dup = _duplicate_key(node)
        if dup is not None:
            field, first, second = dup
            raise BadInput(f"{source}: field '{field}' is given twice (lines {first} and {second}; keep one)")
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise BadInput(f"{source} is not valid YAML{where} ({problem}; fix the syntax)") from None
    finally:
        loader.dispose()


def read_yaml_mapping(path: str | Path, field: str) -> dict:
    """The mapping in a YAML config file, read strictly. `field` names what the file is for (`config`, `alerts`,
    ...). A missing, unreadable, non-UTF-8, invalid or empty file, a key given twice and a top level that is not a
    mapping are each one line naming the file and the fix."""
    path = Path(path)
    if path.is_dir():
        raise BadInput(f"{field}: '{path}' is a directory (pass a YAML file)")
    if not path.is_file():
        raise BadInput(f"{field}: file '{path}' not found (pass a YAML file)")
    try:
        data = path.read_bytes()
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise BadInput(f"{field}: '{path}' is not UTF-8 text (byte 0x{err.object[err.start]:02x} on line {line}; "
                       "save the file as UTF-8)") from None
    except OSError as err:
        raise BadInput(f"{field}: cannot read '{path}' ({err.strerror})") from None
    raw = parse_yaml(text, f"{field}: '{path}'")
    if raw is None:
        raise BadInput(f"{field}: '{path}' is empty (give the fields to set; a config never runs on defaults alone)")
    if not isinstance(raw, dict):
        raise BadInput(f"{field}: '{path}' must hold a mapping of fields at the top level, not a "
                       f"{type(raw).__name__}")
    return raw


def _json_value(value: Any) -> Any:
    """A value JSON cannot hold as it is: a numpy scalar as its Python number, anything else (a path, a date) as
    text."""
    item = getattr(value, "item", None)
    return item() if callable(item) else str(value)


def validate_strict(model: type[Model], tree: Mapping[str, Any]) -> Model:
    """`model` from a parsed tree in pydantic's strict JSON mode: a number must be a number (`'1.5e-4'` is refused,
    an int fills a float), a list fills a tuple, a string a `Literal` or a path. Raises `ValidationError`."""
    return model.model_validate_json(json.dumps(tree, default=_json_value), strict=True)


def _set_fields(model: Any) -> dict[str, Any]:
    """`model` as a JSON tree of the fields that were set (pydantic's `model_fields_set`), recursively; a nested
    model left to its default keeps what that default instance was built with (a section whose default names some of
    its fields, as scheduling's `lora` job type), so an override into it still finds them."""
    from pydantic import BaseModel

    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            sub = _set_fields(value)
            if name in model.model_fields_set or sub:
                out[name] = sub
        elif name in model.model_fields_set:
            out[name] = model.model_dump(mode="json", include={name})[name]
    return out


def _override_for(loc: str, overrides: Mapping[str, Any]) -> str | None:
    for key in overrides:
        if loc == key or loc.startswith(key + ".") or key.startswith(loc + "."):
            return key
    return None


def validate_with_overrides(model: type[Model], raw: dict, overrides: Mapping[str, Any] | None, source: str) -> Model:
    """Validate `raw` (read from `source`), then apply dotted `overrides` on top of the validated values and
    validate again, so an error in the file names the file and an error in an override names the override
    (`override 'ppo.actor_lr=1e308': field 'ppo.actor_lr': ...`). Overrides may fill a section the file leaves
    to its defaults (`workload.lora.eval_minutes=2` on a file without `workload.lora`)."""
    from pydantic import ValidationError

    overrides = dict(overrides or {})
    try:
        base = validate_strict(model, raw)
    except ValidationError as err:
        if overrides:  # an override may supply what the file lacks
            tree = copy.deepcopy(raw)
            for key, value in overrides.items():
                set_dotted(tree, key, value)
            try:
                return validate_strict(model, tree)
            except ValidationError:
                pass
        raise BadInput(describe_validation_error(err, source=source)) from None
    if not overrides:
        return base
    # what the file set, not every default: a default that depends on another field (a training config's
    # `algorithm` picks the ppo defaults) follows an override of that field
    tree = _set_fields(base)
    for key, value in overrides.items():
        set_dotted(tree, key, value)
    try:
        return validate_strict(model, tree)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        key = _override_for(loc, overrides) if loc else None
        if key is None:
            # a cross-field rule broke: name every override, any of them may be the cause
            label = "overrides " + ", ".join(f"'{k}={overrides[k]}'" for k in overrides)
        else:
            label = f"override '{key}={overrides[key]}'"
        raise BadInput(describe_validation_error(err, source=label)) from None


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
    """`key.path=value` strings (values parsed as YAML, as in a config file: `1e-4` is a number, `'1e-4'` a string)
    into dotted overrides."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"override '{item}': expected key=value, e.g. workload.eval_noise.sigma=0.05")
        try:
            out[key.strip()] = yaml.load(raw, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
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
