"""The `rlhfops` command line. Each command lives in `rlhfops/commands/<name>.py` and registers itself."""

from __future__ import annotations

import importlib
import sys

import typer
from pydantic import ValidationError

from common.errors import BadInput, describe_validation_error

app = typer.Typer(
    help="rlhfops: OPPO-accelerated RLHF training, EvalStop scheduling, run health, Prefect + MLflow.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules under rlhfops/commands that define `register(app)`. Order is the order in --help.
COMMAND_MODULES: list[str] = [
    "simulate", "detect", "health", "bench", "train", "canary", "nightly", "report", "traces", "platform",
]
COMMAND_MODULES.append("stack")  # rlhfops stack up|down|env|status (infra/stack.py)



@app.callback()
def _root() -> None:
    """rlhfops: OPPO-accelerated RLHF training, EvalStop scheduling, run health, Prefect + MLflow."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"rlhfops.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry: bad input becomes one line on stderr and exit code 2 (typer already exits 2
    on usage errors)."""
    try:
        app()
    except BadInput as err:
        # one line, whatever the message carried (a path or a quoted value may hold a newline)
        typer.echo("error: " + " ".join(str(err).split()), err=True)
        sys.exit(2)
    except ValidationError as err:
        typer.echo(f"error: {describe_validation_error(err)}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
