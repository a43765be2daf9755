"""Bad-input handling shared by every command: one line naming the field and the fix, exit 2."""

from __future__ import annotations

from pydantic import ValidationError


class BadInput(Exception):
    """User input (config, trace file, CLI argument) is wrong; the message names the field and the fix."""


_BOUNDS = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


#: fields holding a union chosen by its `kind` (field name -> the kinds): pydantic puts the chosen kind in an error's
#: location (`task.dataset.train`), which is not a key anyone writes; modules that declare such unions register them
UNION_KINDS: dict[str, frozenset[str]] = {}


def register_union_kinds(field: str, kinds: set[str] | frozenset[str]) -> None:
    UNION_KINDS[field] = frozenset(UNION_KINDS.get(field, frozenset()) | set(kinds))


def _written_location(loc: tuple) -> list[str]:
    """An error location as the user wrote the keys: a union's kind after its field left out."""
    out: list[str] = []
    for part in loc:
        if out and out[-1] in UNION_KINDS and str(part) in UNION_KINDS[out[-1]]:
            continue
        out.append(str(part))
    return out


def describe_validation_error(err: ValidationError, source: str = "config") -> str:
    """Turn pydantic's multi-line report into one line: `source: field.path: problem`."""
    first = err.errors()[0]
    loc = ".".join(_written_location(first["loc"])) or "<root>"
    msg = first["msg"]
    kind, ctx, given = first["type"], first.get("ctx") or {}, first.get("input")
    if kind == "union_tag_invalid":
        msg = f"kind {ctx.get('tag')!r} is not one of {ctx.get('expected_tags')} (set `kind` to one of them)"
    elif kind == "extra_forbidden":
        msg = "unknown key (check the spelling against the documented fields)"
    elif kind in _BOUNDS and _BOUNDS[kind] in ctx:
        # say what was given and what is allowed: the bound is the fix
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        msg = f"{given!r} is out of range: give a value {op} {ctx[_BOUNDS[kind]]}"
    elif kind in ("float_type", "int_type", "bool_type") and isinstance(given, str):
        # strict configs: a quoted number is text, never converted
        what = {"float_type": "a number", "int_type": "a whole number", "bool_type": "true or false"}[kind]
        msg = f"{given!r} is text, not {what} (write it without quotes)"
    elif kind == "finite_number":
        msg = f"{given!r} is not a finite number (give a finite value)"
    more = len(err.errors()) - 1
    suffix = f" (+{more} more)" if more else ""
    if kind == "value_error" and not first["loc"]:
        # a rule across fields: its own message names the fields (`ppo.group_size: grpo needs ...`)
        return f"{source}: {msg.removeprefix('Value error, ')}{suffix}"
    return f"{source}: field '{loc}': {msg}{suffix}"


def validated(model: type, data: object, source: str):
    """`model.model_validate(data)`, or `BadInput` with pydantic's report as one line: `source: field.path: problem`."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise BadInput(describe_validation_error(err, source=source)) from None
