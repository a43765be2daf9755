"""The `rlhfops` command line. Each command lives in `rlhfops/commands/<name>.py` and registers itself."""

from __future__ import annotations

import importlib
import sys

import typer
from pydantic import ValidationError

from rlhfops.errors import BadInput, describe_validation_error

app = typer.Typer(
    help="rlhfops: OPPO-accelerated RLHF training, EvalStop scheduling, run health, Prefect + MLflow.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules under rlhfops/commands that define `register(app)`. Order is the order in --help.
COMMAND_MODULES: list[str] = []

for _name in COMMAND_MODULES:
    importlib.import_module(f"rlhfops.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry: bad input becomes one line on stderr and exit code 2."""
    try:
        app(standalone_mode=False)
    except BadInput as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except ValidationError as err:
        typer.echo(f"error: {describe_validation_error(err)}", err=True)
        sys.exit(2)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except SystemExit:
        raise
    except (typer.BadParameter, typer.Abort) as err:  # pragma: no cover - click formats these
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)
    except Exception as err:  # click usage errors
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
