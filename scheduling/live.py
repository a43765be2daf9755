"""The live platform's scheduling loop as a domain object: which queued job starts next on a fixed pool of GPU
slots, and whether a running job stops at a checkpoint. The same policy objects the simulator drives
(`scheduling.policies.parse_scheduler`) see a `JobView` per job, filled from the live run and nothing else.

`flows/platform_round.py` owns the threads and futures; this object owns the decisions:

    live = LiveRound(policy, views, gpus=[1, 2, 1], slots=2)
    while not live.done:
        for i in live.to_start():            # highest priority first, while the slots last
            submit(i, observe=live.observer(i, total_steps=...))
        live.finished(wait_for_any_job())     # its slots go back to the pool

One supervisor, one detector: a policy wrapped by an early-stop detector (`NoisePatience+SRTF`, `Paired+SRTF`) places
jobs by its base policy, and its detector is not run here: each job's `eval.supervisor.RunSupervisor` runs it as
its eval gate (a platform round puts the rule in each job's request, `flows/params.py: scheduler_gate`, and hands
this object the base policy; `supervise(i, supervisor)` installs the policy's detector when a job's supervisor has
none), on the same evidence the gate sees (the means, and the per-prompt scores a paired detector needs), and
pauses the job there. The round reads
the supervisor's verdict (`verdict(i)`: state, reason, step and the evidence that paused it) instead of a second
copy of the detector deciding on a view of the means.

A round whose jobs arrive while it runs (a sweep asking Optuna for trials ahead of free slots) starts empty and
queues each job as it comes: `i = live.submit(view, gpus)`, then the same `to_start()` / `finished(i)` loop.

Jobs are not preempted: a running job keeps its slots until it completes or is stopped. Plain Python, no Prefect.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
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
        #: job index -> its `eval.supervisor.RunSupervisor` (`supervise`), whose verdicts the round reads
        self.supervisors: dict[int, Any] = {}
        # the views and the supervisors are shared by every job thread
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

    @property
    def gate_detector(self) -> Any:
        """The detector the round's jobs are gated by (the scheduler's early-stop part; None for a bare base policy)."""
        return getattr(self.policy, "detector", None)

    def supervise(self, i: int, supervisor: Any) -> None:
        """Job `i` runs under `supervisor`: the round reads its verdicts, and when the job's request named no gate
        detector the supervisor gets the round's (`gate_detector`, a fresh monitor): the one detector that decides."""
        det = self.gate_detector
        if det is not None and getattr(supervisor, "gate_detector", None) is None:
            supervisor.gate_detector, supervisor.gate_monitor = det, det.start()
        with self.lock:
            self.supervisors[i] = supervisor

    def on_checkpoint(self, i: int, step: int, metrics: Mapping[str, float], total_steps: int) -> str | None:
        """Job `i` reached a checkpoint (its supervisor has seen it and did not pause the job): its view takes the
        step's eval score, SE, proxy reward and policy loss, which the base policy ranks the queue by. The stop
        decision is the supervisor's, so nothing comes back here (None: go on)."""
        with self.lock:
            view = self.views[i]
            view.attained = float(step)
            view.progress = step / total_steps
            view.eval_history.append(float(metrics["gold_eval"]))
            view.loss_history.append(float(metrics["loss_policy"]))
            view.reward_history.append(float(metrics["reward_mean"]))
            view.progress_history.append(view.progress)
            view.eval_se = float(metrics["gold_eval_se"])
        return None

    def observer(self, i: int, total_steps: int) -> JobObserver:
        """Job `i`'s per-checkpoint observer for `training.job.lifecycle.run_job` (call its `attach(supervisor)` once
        the job's supervisor is built)."""
        return JobObserver(self, i, total_steps)

    def verdict(self, i: int) -> dict[str, Any]:
        """What job `i`'s supervisor decided: its state label, the reason and step of a pause, and the evidence
        that paused it (`evidence_of` its gate monitor). Empty before `supervise(i, ...)`."""
        sup = self.supervisors.get(i)
        if sup is None:
            return {}
        status = sup.machine.status
        out: dict[str, Any] = {"state": status.label, "step": status.step, "reason": status.reason}
        if status.state.value == "PAUSED_BY_GATE":
            out["evidence"] = evidence_of(getattr(sup, "gate_detector", None), getattr(sup, "gate_monitor", None))
        return out


class JobObserver:
    """A job's observer: `(step, metrics) -> None` fills the job's view at each checkpoint; `attach(supervisor)`
    hands the round the job's supervisor (and, where needed, the round's gate detector)."""

    def __init__(self, live: LiveRound, i: int, total_steps: int):
        self.live, self.i, self.total_steps = live, i, total_steps

    def __call__(self, step: int, metrics: Mapping[str, float]) -> str | None:
        return self.live.on_checkpoint(self.i, step, metrics, self.total_steps)

    def attach(self, supervisor: Any) -> None:
        self.live.supervise(self.i, supervisor)

    @property
    def gate_detector(self) -> Any:
        """The round's gate detector, installed in a job's supervisor that has none (`LiveRound.supervise`; a platform
        round's jobs carry the scheduler's rule in their requests, so their supervisors are built with it)."""
        return self.live.gate_detector

    def verdict(self) -> dict[str, Any]:
        return self.live.verdict(self.i)


def evidence_of(detector: Any, monitor: Any) -> dict[str, Any]:
    """The evidence a gate monitor stopped on, as a job's record keeps it: for the paired rule the comparison(s)
    whose confidence sequence lay below -margin (reference step, current step, prompts paired, mean difference, its
    bounds, the level; with a relative margin the contrast's mean and upper bound, which decided, and the first
    checkpoint's step) and the checkpoint it keeps; for a detector on means, its name and parameters."""
    out: dict[str, Any] = {"detector": getattr(detector, "name", None)}
    params = getattr(detector, "params", None)
    if callable(params):
        out["params"] = params()
    comparisons = getattr(monitor, "comparisons", None)
    if comparisons:
        margin = float(getattr(detector, "margin", 0.0))
        rho = float(getattr(detector, "relative_margin", 0.0))
        # the bound a pair fires on: with a relative margin, its contrast's (current - (1 - rho) reference - rho first)
        fired = [c for c in comparisons if (c.c_upper if rho else c.upper) < -margin] or list(comparisons)
        out["comparisons"] = [{"reference_step": c.reference_step, "step": c.step, "prompts": c.n,
                               "mean_diff": c.mean, "lower": c.lower, "upper": c.upper, "alpha": c.alpha,
                               **({"contrast_mean": c.c_mean, "contrast_upper": c.c_upper} if rho else {})}
                              for c in fired]
        if rho and getattr(monitor, "steps", None):
            out["first_step"] = monitor.steps[0]
        kept = getattr(monitor, "kept_step", math.nan)
        if kept == kept:
            out["kept_step"] = kept
    return out


def describe_evidence(evidence: Mapping[str, Any] | None) -> str:
    """One line for a pause's evidence (`evidence_of`), what a tenant reads: for the paired rule the comparison that
    fired (`step 16 is 0.378 below step 12 on 96 paired prompts, upper bound -0.043 below -margin (0) at level
    2.2e-04; paired keeps step 12`; with a relative margin the bound is its contrast's: `..., 0.300 beyond 0.125 x
    its gain over step 0, upper bound ...`), else the detector and its parameters."""
    if not evidence:
        return "none recorded"
    comparisons = evidence.get("comparisons")
    if comparisons:
        params = evidence.get("params") or {}
        margin = float(params.get("margin", 0.0))
        rho = float(params.get("relative_margin", 0.0))
        contrast = bool(rho) and all("contrast_upper" in c for c in comparisons)
        c = min(comparisons, key=lambda c: c["contrast_upper" if contrast else "upper"])
        beyond = (f", {-c['contrast_mean']:.3f} beyond {rho:g} x its gain over step "
                  f"{evidence.get('first_step', math.nan):g}" if contrast else "")
        return (f"step {c['step']:g} is {-c['mean_diff']:.3f} below step {c['reference_step']:g} on {c['prompts']} "
                f"paired prompts{beyond}, upper bound {c['contrast_upper' if contrast else 'upper']:+.3f} below "
                f"-margin ({margin:g}) at level {c['alpha']:.1e}; "
                f"{evidence.get('detector')} keeps step {evidence.get('kept_step', c['reference_step']):g}")
    params = evidence.get("params") or {}
    args = ", ".join(f"{k}={v:g}" if isinstance(v, int | float) else f"{k}={v}" for k, v in params.items())
    return f"{evidence.get('detector')}({args}) said stop"
