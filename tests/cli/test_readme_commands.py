"""The README's command table names every command `rlhfops --help` offers, and nothing else.

The commands come from the CLI itself: the root click group typer builds from `rlhfops.cli.app`, each command
loaded (a group's own subcommands listed too, e.g. `bench sim`, `stack up`), and each name is checked against the
root help text a user sees. The README side is its `## Commands` table: a row's first cell is the command as typed
(`rlhfops bench sim [--quick] ...`). A new command needs a row; a renamed or removed one must lose its row.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer
from typer.testing import CliRunner

from rlhfops.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


def cli_commands() -> set[str]:
    """Every command path of the CLI: "simulate", ..., and for a group each "group sub" ("bench sim", ...)."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="rlhfops")  # typer's own (vendored) click Context
    paths = set()
    for name in root.list_commands(ctx):
        cmd = root.get_command(ctx, name)
        assert cmd is not None, name
        if hasattr(cmd, "list_commands"):  # a group (`bench`, `stack`): its subcommands are what users type
            sub_ctx = cmd.context_class(cmd, info_name=name, parent=ctx)
            subs = cmd.list_commands(sub_ctx)
            assert subs, f"group {name} has no commands"
            paths.update(f"{name} {sub}" for sub in subs)
        else:
            paths.add(name)
    return paths


def readme_commands(text: str, groups: set[str]) -> set[str]:
    """The command paths named by the first cells of the README's `## Commands` table."""
    section = re.search(r"^## Commands\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert section, "README has no '## Commands' section"
    paths = set()
    for line in section.group(1).splitlines():
        cell = re.match(r"\| `rlhfops ([^`]*)`", line)
        if not cell:
            continue
        words = cell.group(1).split()
        paths.add(f"{words[0]} {words[1]}" if words[0] in groups and len(words) > 1 else words[0])
    return paths


def test_every_cli_command_has_a_readme_row_and_every_row_a_command():
    cli = cli_commands()
    assert {"simulate", "detect", "train", "nightly", "bench sim", "stack up"} <= cli  # the tree was walked
    groups = {path.split()[0] for path in cli if " " in path}
    documented = readme_commands(README.read_text(), groups)
    assert not cli - documented, f"commands missing from the README's table: {sorted(cli - documented)}"
    assert not documented - cli, f"README rows for commands the CLI does not have: {sorted(documented - cli)}"


def test_the_root_help_lists_the_same_commands():
    """What a user reads: `rlhfops --help` names each top-level command the walk above found."""
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    listed = set(re.findall(r"^[│|]?\s+([a-z][a-z-]+)\s{2,}", out, flags=re.M))
    top = {path.split()[0] for path in cli_commands()}
    assert top <= listed, f"not in rlhfops --help: {sorted(top - listed)}"


def test_the_readme_parser_reads_groups_and_ignores_other_tables():
    text = ("## Where to look\n| `rlhfops fake` | not the command table |\n"
            "## Commands\n| command | does |\n| --- | --- |\n"
            "| `rlhfops simulate E1..E8 [--plots]` | x |\n| `rlhfops bench sim [--quick]` | y |\n"
            "| `rlhfops detect --calibrate X` | z |\n## Next\n| `rlhfops later` | w |\n")
    assert readme_commands(text, {"bench"}) == {"simulate", "bench sim", "detect"}
