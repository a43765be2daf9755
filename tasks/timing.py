"""Where the nightly's wall time goes: domain work, tracking, and what is left (orchestration).

Tasks wrap their domain call (`with clock.span("work")`) and their MLflow calls (`span("tracking")`).
The union of the work intervals is the time during which some domain work ran; the union of work and
tracking is the time during which anything useful ran. What remains of the wall time is orchestration:
the temporary Prefect server's start, task and flow-run state transitions, futures, threads waiting on
each other. Intervals are wall-clock (`time.time()`), so work done in a compute-pool process is counted
through the thread that waits for it; Ray workers (other processes, other machines) are not seen.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping [start, end) intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


class Clock:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: dict[str, list[tuple[float, float]]] = {}

    def reset(self) -> None:
        with self._lock:
            self.spans = {}

    def __reduce__(self):
        # Ray pickles a task's function by value, globals included: in another process it is that process's clock
        return (process_clock, ())

    @contextmanager
    def span(self, kind: str) -> Iterator[None]:
        t0 = time.time()
        try:
            yield
        finally:
            t1 = time.time()
            with self._lock:
                self.spans.setdefault(kind, []).append((t0, t1))

    def covered(self, *kinds: str, since: float = 0.0, until: float = float("inf")) -> float:
        with self._lock:
            iv = [(max(s, since), min(e, until)) for k in kinds for s, e in self.spans.get(k, [])]
        return union_length([(s, e) for s, e in iv if e > s])

    def breakdown(self, start: float, end: float) -> dict[str, float]:
        """Seconds of [start, end]: wall, work, tracking (when no work ran), orchestration (the rest)."""
        wall = end - start
        work = self.covered("work", since=start, until=end)
        useful = self.covered("work", "tracking", since=start, until=end)
        orch = max(0.0, wall - useful)
        return {"wall_s": wall, "work_s": work, "tracking_s": useful - work, "orchestration_s": orch,
                "orchestration_frac": orch / wall if wall > 0 else 0.0}


clock = Clock()


def process_clock() -> Clock:
    return clock


class StageTimes:
    """Each stage's wall seconds (`<stage>_s`) and the part of them that was orchestration (`Clock.breakdown`): the one
    helper the flows time their stages with.

        times = StageTimes()
        with times.stage("matrix"):
            ...
        times.wall, times.orchestration   # {"matrix_s": 12.3}, {"matrix": 0.4}
    """

    def __init__(self, source: Clock | None = None) -> None:
        self.clock = source or clock
        self.wall: dict[str, float] = {}
        self.orchestration: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        t0 = time.time()
        yield
        t1 = time.time()
        self.wall[f"{name}_s"] = t1 - t0
        self.orchestration[name] = self.clock.breakdown(t0, t1)["orchestration_s"]
