"""One rich console for every command: wide enough for result tables when output is not a terminal."""

from __future__ import annotations


def make_console():
    """A rich Console (imported here, not at start-up: `rlhfops --help` does not need it)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console
