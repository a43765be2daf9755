"""What the CLI's bad-input tests share: a tripwire that says a command got past validation and started work, and
`run_cli`, which runs `rlhfops ARGS` in this process and returns its exit code and the non-empty stderr lines."""

from __future__ import annotations

import sys

import pytest

from rlhfops import cli


class WorkStarted(BaseException):
    """Raised by the tripwires: the command got past validation and started real work."""


def tripwire(*_a, **_k):
    raise WorkStarted


def run_cli_output(args: list, capsys, monkeypatch) -> tuple[int, str, str]:
    """`rlhfops ARGS` in this process: its exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["rlhfops", *map(str, args)])
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except WorkStarted:
        pytest.fail(f"{args}: passed validation and started work")
    out = capsys.readouterr()
    return code, out.out, out.err


def run_cli(args: list, capsys, monkeypatch) -> tuple[int, list[str]]:
    """`rlhfops ARGS` in this process: its exit code and its non-empty stderr lines."""
    code, _out, err = run_cli_output(args, capsys, monkeypatch)
    return code, [ln for ln in err.splitlines() if ln.strip()]
