"""The `rlhfops` command line. Each command lives in `rlhfops/commands/<name>.py` and registers itself.

Start-up is lazy: `LAZY_COMMANDS` names each command's module and one-line help, so `rlhfops --help` imports no
command module and `rlhfops simulate ...` imports only `rlhfops/commands/simulate.py` (which imports its heavy
libraries inside the functions that need them). A module in `COMMAND_MODULES` that `LAZY_COMMANDS` does not
name is imported and registered at start-up, as before. `tests/cli/test_cli_startup.py` keeps the help lines equal
to the commands' own docstrings.
"""

from __future__ import annotations

import importlib
import sys

import typer
from typer.core import TyperCommand, TyperGroup


class LazyGroup(TyperGroup):
    """The root group: commands of `LAZY_COMMANDS` are built on first use, from their module's `register`."""

    _listing = False

    def list_commands(self, ctx) -> list[str]:
        return [*LAZY_COMMANDS, *(name for name in super().list_commands(ctx) if name not in LAZY_COMMANDS)]

    def get_command(self, ctx, cmd_name: str):
        if cmd_name in self.commands or cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, short_help = LAZY_COMMANDS[cmd_name]
        if self._listing:  # the root help lists names and one-liners: import nothing for it
            return TyperCommand(cmd_name, help=short_help)
        self.commands[cmd_name] = load_command(module, cmd_name)
        return self.commands[cmd_name]

    def format_help(self, ctx, formatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def load_command(module: str, name: str):
    """The click command `name` that `rlhfops/commands/<module>.py` registers."""
    holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(f"rlhfops.commands.{module}").register(holder)
    return typer.main.get_group(holder).commands[name]


app = typer.Typer(
    cls=LazyGroup,
    help="rlhfops: OPPO-accelerated RLHF training, EvalStop scheduling, run health, Prefect + MLflow.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules under rlhfops/commands that define `register(app)`. Order is the order in --help.
COMMAND_MODULES: list[str] = [
    "simulate", "detect", "health", "bench", "train", "canary", "nightly", "report", "traces", "platform",
    "resume", "sweep", "promote", "paired_report", "stack",
]



@app.callback()
def _root() -> None:
    """rlhfops: OPPO-accelerated RLHF training, EvalStop scheduling, run health, Prefect + MLflow."""


#: command -> (module under rlhfops/commands, help shown by `rlhfops --help`: the first paragraph of the command's
#: docstring, cut with " ..." where long). Order: as in --help.
LAZY_COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": ("simulate", "Run an EvalStop experiment: prints the table, writes summary.csv, jobs.csv, "
                 "per_seed.csv and tenants.csv (plots with --plots)."),
    "reproduce": ("simulate", "Run E1-E8 (5 seeds) and write the paper's Tables 1-5, 7-9 beside ours as markdown."),
    "compare-detectors": ("simulate", "Every detector on E7 (Gaussian, Student-t, AR(1) noise) and E8: precision, "
                          "recall, FPR, JCT, wasted compute, detection delay, regret; writes docs/detectors.md."),
    "select-detector": ("simulate", "Choose the default detector's shape (mean window, patience, drawdown, deep-drop "
                        "path) on the corpus parts already seen, by the rule of studies/detector_selection.py ..."),
    "detector-frontier": ("simulate", "In hindsight, the most useful stops every shape of the selection grid "
                          "reaches on a corpus split at each number of calibration-fleet runs stopped ..."),
    "detect": ("detect", "Replay every run of a trace through a detector; write verdicts; print useful recall, "
               "false-stop rate, quality kept and precision/recall/FPR if labelled. With --prompts, the paired rule "
               "on per-prompt scores. With --calibrate, recalibrate instead."),
    "health": ("health", "Run the run-health alert catalog over every run of a trace; write an alerts CSV; print a "
               "table."),
    "bench": ("bench", "Benchmarks; each writes a JSON with every figure measured."),
    "train": ("train", "Train a policy with PPO (+ OPPO overlap); writes OUT/metrics.csv, OUT/checkpoints/, "
              "OUT/summary.json; with MLFLOW_TRACKING_URI set, also an MLflow run ..."),
    "canary": ("canary", "Run real small PPO jobs with injected faults (frozen weight sync, constant reward, "
               "oversized LR, gameable reward, behaviour/proximal policy mismatch, carried tokens duplicated) plus a "
               "healthy control ..."),
    "nightly": ("nightly", "Run the nightly sweep flow locally: E1-E8 simulation matrix, detector comparison, a real "
                "RLHF job ..."),
    "report": ("report", "Compare tonight's nightly with the previous one: per scheduler ..."),
    "record-traces": ("traces", "Train configs/ppo-hack.yaml (label 1) and configs/ppo-healthy.yaml (label 0) for "
                      "each seed and write their eval-gate checkpoints as one Trace CSV ..."),
    "platform": ("platform", "Run one live round: tenants' PPO jobs queued at once, placed on --slots worker slots "
                 "by --scheduler ..."),
    "resume": ("resume", "Resume a paused run: the `rlhf-job` flow with `resume_paused` on the run directory; the run "
               "continues from ..."),
    "sweep": ("sweep", "Run a sweep: Optuna samples the settings, each trial is a PPO job on the sweep's GPU slots, "
              "the platform's ..."),
    "promote": ("promote", "Promote a registered version to a model's best alias only if it beats the current best "
                "by the paired test on the same held-out prompts and gate ..."),
    "paired-report": ("paired_report", "Replay the per-prompt corpus through the paired rule (with the gate's "
                      "extension batches) and the mean-only default on the same records ..."),
    "stack": ("stack", "A local PostgreSQL-backed stack: Prefect server, MLflow server, Optuna storage."),
}

for _name in COMMAND_MODULES:
    if _name not in {module for module, _help in LAZY_COMMANDS.values()}:
        importlib.import_module(f"rlhfops.commands.{_name}").register(app)


def main() -> None:
    """Console-script entry: bad input becomes one line on stderr and exit code 2 (typer already exits 2
    on usage errors)."""
    try:
        app()
    except Exception as err:
        # imported here: pydantic is not needed to start (a ValidationError implies it is loaded anyway)
        from pydantic import ValidationError

        from common.errors import BadInput, describe_validation_error

        if isinstance(err, BadInput):
            # one line, whatever the message carried (a path or a quoted value may hold a newline)
            typer.echo("error: " + " ".join(str(err).split()), err=True)
            sys.exit(2)
        if isinstance(err, ValidationError):
            typer.echo(f"error: {describe_validation_error(err)}", err=True)
            sys.exit(2)
        raise


if __name__ == "__main__":
    main()
