"""One rich console for every command, and one progress display for every long command.

`make_console`: wide enough for result tables when output is not a terminal. `progress`: bars redrawn in place on a
terminal; plain, flushed lines when the output is a pipe or a file (cron, nohup, CI), where a rich bar would print
nothing until the command ends. Both displays are `flows.progress`'s, so a command and a flow report the same way."""

from __future__ import annotations


def make_console():
    """A rich Console (imported here, not at start-up: `rlhfops --help` does not need it)."""
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    return console


def print_line(console, line: str) -> None:
    """`line` as written (no markup, no highlighting, no wrapping), flushed at once: a pipe sees it now."""
    console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.file.flush()


class Progress:
    """Progress of a long command, by stages: `stage(name, total)` starts one (total None: unknown),
    `advance(n)` / `update(done)` move it, `status(text)` sets the bar's trailing text (terminal only), `note(msg)`
    prints a line. A context manager; also a `flows.progress.Reporter`, so a flow can report through it.

    On a terminal: one rich bar per stage (description and status, bar, done/total, elapsed), removed at the end when
    `transient`. Otherwise: `flows.progress.LineReporter`'s lines (`stage 1: <name> (0/24)`, `<name>: 12/24` every
    tenth, `done: <name> (24/24) in 18.7 s`), flushed as they happen."""

    def __init__(self, console, transient: bool = False, every: int | None = None) -> None:
        from flows.progress import LineReporter, RichReporter

        self.console = console
        self.name: str | None = None
        self.done = 0
        if console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bars

            self.bars = Bars(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=transient)
            self.reporter = RichReporter(self.bars, console)
        else:
            self.bars = None
            self.reporter = LineReporter(lambda line: print_line(console, line), every=every)

    def __enter__(self) -> Progress:
        if self.bars is not None:
            self.bars.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.bars is not None:
            self.bars.__exit__(*exc)
        elif exc[0] is None:  # a failed command says why; no "done" line
            self.reporter.close()

    def stage(self, name: str, total: int | None = None) -> None:
        self.reporter.stage(name, total)
        self.name, self.done = name, 0

    def advance(self, n: int = 1) -> None:
        self.done += n
        self.reporter.advance(n)

    def update(self, done: int) -> None:
        """Set the current stage's count (a callback that reports `done` so far rather than increments)."""
        if done > self.done:
            self.advance(done - self.done)

    def status(self, text: str) -> None:
        if self.bars is not None and self.reporter.task is not None:
            self.bars.update(self.reporter.task, description=f"{self.name}  {text}" if text else self.name)

    def note(self, message: str) -> None:
        self.reporter.note(message)


def progress(console, name: str | None = None, total: int | None = None, transient: bool = False,
             every: int | None = None) -> Progress:
    """`with progress(console, "E1: variant x seed", total=10) as p: ... p.advance()`: a `Progress` with its first
    stage already started when `name` is given."""
    p = Progress(console, transient=transient, every=every)
    if name is not None:
        p.stage(name, total)
    return p
