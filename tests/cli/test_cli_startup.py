"""CLI start-up: `rlhfops --help` imports no command module and no heavy library, `simulate` draws no plot unless
asked (no matplotlib), the domain modules on the simulate path import scipy.stats only where it is used, and the
help listed without importing the commands says what the commands' own docstrings say. Wall times are measured
by `rlhfops bench cli`, not asserted here (they depend on the machine's load)."""

from __future__ import annotations

import importlib
import json
import statistics
import subprocess
import sys

import typer

from rlhfops.cli import COMMAND_MODULES, LAZY_COMMANDS, load_command

HEAVY = ("numpy", "pandas", "scipy", "matplotlib", "torch", "prefect", "mlflow", "pydantic", "yaml", "scheduling",
         "studies", "training", "eval", "infra", "flows", "tasks", "rlhfops.commands")


def _modules_after(code: str) -> set[str]:
    """Module names loaded by a fresh interpreter after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return set(json.loads(res.stdout.strip().splitlines()[-1]))


def _loaded(modules: set[str], prefix: str) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in modules)


def test_help_imports_no_command_module_and_no_heavy_library():
    modules = _modules_after(
        "import sys\nfrom rlhfops import cli\nsys.argv = ['rlhfops', '--help']\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass")
    assert [h for h in HEAVY if _loaded(modules, h)] == []


def test_simulate_draws_plots_only_when_asked(tmp_path):
    run = ("import sys\nfrom rlhfops import cli\nsys.argv = ['rlhfops', 'simulate', 'E1', '--seeds', '42', "
           f"'--jobs', '20', '--workers', '1', '--out', {str(tmp_path / 'e1')!r}]\n"
           "try:\n    cli.main()\nexcept SystemExit as e:\n    assert not e.code, e.code")
    modules = _modules_after(run)
    assert (tmp_path / "e1" / "summary.csv").is_file() and not list((tmp_path / "e1").glob("*.png"))
    assert not _loaded(modules, "matplotlib")
    assert _loaded(modules, "scipy.stats")  # the p-values need it: the probe sees a real run


def test_simulate_path_imports_no_scipy_stats_at_import_time():
    modules = _modules_after("import scheduling.experiments, scheduling.policies, eval.detectors, infra.ledger")
    assert not _loaded(modules, "scipy.stats") and not _loaded(modules, "matplotlib")


def _first_paragraph(command) -> str:
    return " ".join((command.help or "").split("\n\n")[0].split())


def test_listed_help_is_what_each_command_says():
    """The one-liners of `rlhfops --help` (written in cli.py so the listing imports nothing) are the start of each
    command's own docstring; a command renamed, moved or re-described fails here."""
    for name, (module, listed) in LAZY_COMMANDS.items():
        command = load_command(module, name)
        assert command.name == name
        assert _first_paragraph(command).startswith(listed.removesuffix(" ...")), name


def test_every_registered_command_is_listed():
    holder = typer.Typer()
    for module in COMMAND_MODULES:
        importlib.import_module(f"rlhfops.commands.{module}").register(holder)
    group = typer.main.get_group(holder)
    from typer.testing import CliRunner

    from rlhfops.cli import app

    listed = CliRunner().invoke(app, ["--help"]).output
    assert sorted(group.commands) == sorted(LAZY_COMMANDS)
    assert all(name in listed for name in group.commands)


def test_bench_cli_figures_are_median_and_best_of_the_runs(monkeypatch, tmp_path):
    """The JSON's arithmetic, on a stand-in command (a bare interpreter) instead of the real CLI."""
    from rlhfops.commands import bench_cli

    monkeypatch.setattr(bench_cli, "_command", lambda: [sys.executable, "-c", "pass"])
    result = bench_cli.bench_cli(3)
    for name in ("python_startup", "help", "simulate_e1"):
        runs = result[f"{name}_runs_s"]
        assert len(runs) == 3 and all(r > 0 for r in runs)
        assert result[f"{name}_s"] == sorted(runs)[1] == statistics.median(runs)
        assert result[f"{name}_best_s"] == min(runs)
        assert result[f"{name}_cpu_s"] >= 0
