"""One rich console for every command: wide enough for result tables when output is not a terminal."""

from __future__ import annotations

from rich.console import Console


def make_console() -> Console:
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console
