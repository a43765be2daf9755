"""Progress hooks for flows run from the CLI. Flows call them as their futures resolve (in the flow's own
thread, so this works with any task runner); the CLI installs a display, deployments keep the no-op.

Two displays: `RichReporter` (bars, redrawn in place) when the output is a terminal, `LineReporter` (one plain
line per stage, and one every tenth of a long stage or every `every` items) when it is not: under cron, nohup or CI
a bar would print nothing until the command ends."""

from __future__ import annotations

import time
from collections.abc import Callable
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


class LineReporter:
    """Plain, flushed lines for output that is not a terminal: `[  12.3 s] stage 2: <name> (0/24)` when a stage
    starts, `[  20.1 s]   <name>: 12/24` every `every` items (default: every tenth of the stage's total, every 10
    items when the total is unknown), and `[  31.0 s]   done: <name> (24/24) in 18.7 s` when the next stage starts
    or `close()` is called."""

    def __init__(self, write: Callable[[str], None], every: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write, self.every, self.clock = write, every, clock
        self.t0 = clock()
        self.stages = 0
        self.name: str | None = None
        self.total: int | None = None
        self.done = 0
        self.started = 0.0

    def _line(self, text: str) -> None:
        self.write(f"[{self.clock() - self.t0:7.1f} s] {text}")

    def _count(self) -> str:
        return f"{self.done}/{self.total}" if self.total else str(self.done)

    def _step(self) -> int:
        if self.every:
            return self.every
        return max(1, -(-self.total // 10)) if self.total else 10

    def stage(self, name: str, total: int | None = None) -> None:
        self.close()
        self.stages += 1
        self.name, self.total, self.done, self.started = name, total, 0, self.clock()
        self._line(f"stage {self.stages}: {name}" + (f" (0/{total})" if total else ""))

    def advance(self, n: int = 1) -> None:
        if self.name is None:
            return
        before, self.done = self.done, self.done + n
        step = self._step()
        if self.done // step > before // step and self.done != self.total:
            self._line(f"  {self.name}: {self._count()}")

    def note(self, message: str) -> None:
        self._line(message)

    def close(self) -> None:
        """End the current stage with its count and time."""
        if self.name is not None:
            self._line(f"  done: {self.name} ({self._count()}) in {self.clock() - self.started:.1f} s")
            self.name = None
