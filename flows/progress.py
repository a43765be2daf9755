"""Progress hooks for flows run from the CLI. Flows call them as their futures resolve (in the flow's own
thread, so this works with any task runner); the CLI installs a rich display, deployments keep the no-op."""

from __future__ import annotations

from typing import Protocol


class Reporter(Protocol):
    def stage(self, name: str, total: int | None = None) -> None: ...

    def advance(self, n: int = 1) -> None: ...

    def note(self, message: str) -> None: ...


class _Quiet:
    def stage(self, name: str, total: int | None = None) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        pass


reporter: Reporter = _Quiet()


def install(r: Reporter | None) -> None:
    global reporter
    reporter = r or _Quiet()


class RichReporter:
    """One progress bar per stage on a rich console."""

    def __init__(self, progress, console) -> None:
        self.progress, self.console = progress, console
        self.task = None

    def stage(self, name: str, total: int | None = None) -> None:
        if self.task is not None:
            self.progress.update(self.task, completed=self.progress.tasks[-1].total or 1)
            self.progress.stop_task(self.task)
        self.task = self.progress.add_task(name, total=total)

    def advance(self, n: int = 1) -> None:
        if self.task is not None:
            self.progress.advance(self.task, n)

    def note(self, message: str) -> None:
        self.console.print(message)
