"""The live platform's scheduling loop as a domain object: which queued job starts next on a fixed pool of GPU
slots, and whether a running job stops at a checkpoint. The same policy objects the simulator drives
(`scheduling.policies.parse_scheduler`) see a `JobView` per job, filled from the live run and nothing else.

`flows/platform_round.py` owns the threads and futures; this object owns the decisions:

    live = LiveRound(policy, views, gpus=[1, 2, 1], slots=2)
    while not live.done:
        for i in live.to_start():            # highest priority first, while the slots last
            submit(i, observe=live.observer(i, total_steps=...))
        live.finished(wait_for_any_job())     # its slots go back to the pool

A round whose jobs arrive while it runs (a sweep asking Optuna for trials ahead of free slots) starts empty and
queues each job as it comes: `i = live.submit(view, gpus)`, then the same `to_start()` / `finished(i)` loop.

Jobs are not preempted: a running job keeps its slots until it completes or is stopped. Plain Python, no Prefect.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from scheduling.jobview import JobView


class LiveRound:
    """Placement and checkpoint decisions for one live round of `len(views)` jobs on `slots` GPU slots."""

    def __init__(self, policy: Any, views: list[JobView], gpus: list[int], slots: int):
        if len(views) != len(gpus):
            raise ValueError("gpus: one entry per job view")
        for i, g in enumerate(gpus):
            self._check_fits(i, g, slots)
        self.policy, self.views, self.gpus, self.slots = policy, list(views), list(gpus), slots
        self.pending: list[int] = list(range(len(views)))
        self.running: set[int] = set()
        self.free = slots
        #: job indices in the order they started
        self.order: list[int] = []
        # the policy's detector monitors are shared by every job thread
        self.lock = threading.Lock()

    @staticmethod
    def _check_fits(i: int, g: int, slots: int) -> None:
        if not 1 <= g <= slots:
            raise ValueError(f"jobs[{i}].gpus: {g} does not fit a pool of {slots} slots")

    def submit(self, view: JobView, gpus: int) -> int:
        """Queue one more job (it arrived after the round began); returns its index for `to_start` / `finished`."""
        i = len(self.views)
        self._check_fits(i, gpus, self.slots)
        with self.lock:
            self.views.append(view)
            self.gpus.append(gpus)
            self.pending.append(i)
        return i

    @property
    def done(self) -> bool:
        return not self.pending and not self.running

    def to_start(self) -> list[int]:
        """The queued jobs to start now: by the policy's priority (ties by submission order), each that fits the free
        slots (a big job waiting does not block a smaller one behind it)."""
        with self.lock:
            self.pending.sort(key=lambda i: (self.policy.priority(self.views[i]), i))
        started = []
        for i in list(self.pending):
            if self.gpus[i] <= self.free:
                self.pending.remove(i)
                self.free -= self.gpus[i]
                self.running.add(i)
                self.order.append(i)
                started.append(i)
        return started

    def finished(self, i: int) -> None:
        """Job `i` ended (any way): its slots go back to the pool."""
        self.running.remove(i)
        self.free += self.gpus[i]

    def on_checkpoint(self, i: int, step: int, metrics: Mapping[str, float], total_steps: int) -> str | None:
        """Job `i` reached a checkpoint: its view takes the step's eval score, SE, proxy reward and policy loss, and
        the policy decides; a stop comes back as the reason a tenant reads."""
        with self.lock:
            view = self.views[i]
            view.attained = float(step)
            view.progress = step / total_steps
            view.eval_history.append(float(metrics["gold_eval"]))
            view.loss_history.append(float(metrics["loss_policy"]))
            view.reward_history.append(float(metrics["reward_mean"]))
            view.progress_history.append(view.progress)
            view.eval_se = float(metrics["gold_eval_se"])
            stop = bool(self.policy.on_checkpoint(view))
        if not stop:
            return None
        return (f"the platform scheduler ({getattr(self.policy, 'name', 'early stop')}) stopped the job at step "
                f"{step}: its held-out score is declining")

    def observer(self, i: int, total_steps: int) -> Callable[[int, Mapping[str, float]], str | None]:
        """Job `i`'s per-checkpoint observer for `training.lifecycle.run_job`."""
        return lambda step, metrics: self.on_checkpoint(i, step, metrics, total_steps)
