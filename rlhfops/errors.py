"""Bad-input handling shared by every command: one line naming the field and the fix, exit 2."""

from __future__ import annotations

from pydantic import ValidationError


class BadInput(Exception):
    """User input (config, trace file, CLI argument) is wrong; the message names the field and the fix."""


def describe_validation_error(err: ValidationError, source: str = "config") -> str:
    """Turn pydantic's multi-line report into one line: `source: field.path: problem`."""
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key (check the spelling against the documented fields)"
    more = len(err.errors()) - 1
    suffix = f" (+{more} more)" if more else ""
    return f"{source}: field '{loc}': {msg}{suffix}"
