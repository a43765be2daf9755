"""The customer-facing run state machine, driven by the alert catalog and the eval gates.

    QUEUED -> PROVISIONING -> RUNNING -> SUCCEEDED
                                 |  ^
                                 v  |
                DEGRADED(reason)  PAUSED_BY_GATE(reason)      any live state -> FAILED(class)

A paging alert whose action is `degrade` moves a live run to DEGRADED(reason); one whose action is
`pause` (reward hacking, KL blowup by default) pauses it at its next checkpoint: PAUSED_BY_GATE(reason).
An eval gate that says stop (EvalStop on the gate history) pauses it the same way. Advisory alerts are
recorded but never move the state (that is what demoting a noisy alert is for). A terminal FAILED
carries exactly one failure class (eval/attribution.py) and a reason a customer can act on.

The enums are part of the public API and append-only: add members at the end, never rename, reorder
or remove them (clients already depend on them; tests/eval/test_states.py pins the published prefix).
Illegal transitions raise `IllegalTransition`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class RunState(StrEnum):
    """Customer-facing run states. APPEND-ONLY."""

    QUEUED = "QUEUED"
    PROVISIONING = "PROVISIONING"
    RUNNING = "RUNNING"
    DEGRADED = "DEGRADED"
    PAUSED_BY_GATE = "PAUSED_BY_GATE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class FailureClass(StrEnum):
    """Why a run failed: exactly one per FAILED run. APPEND-ONLY."""

    #: the platform broke (worker lost, sync timeout, provisioning): spends the platform's error budget
    PLATFORM_FAULT = "platform_fault"
    #: the tenant's code broke (reward function or dataset errors): surfaced with logs and examples
    TENANT_CODE_FAULT = "tenant_code_fault"
    #: no fault, but training did not converge (dead, diverged, collapsed, hacked): surfaced with history
    ALGORITHMIC_NON_CONVERGENCE = "algorithmic_non_convergence"


TERMINAL = frozenset({RunState.SUCCEEDED, RunState.FAILED})
LIVE = frozenset({RunState.RUNNING, RunState.DEGRADED, RunState.PAUSED_BY_GATE})

#: allowed transitions; anything else raises. DEGRADED -> DEGRADED updates the reason (a second alert).
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.QUEUED: frozenset({RunState.PROVISIONING, RunState.FAILED}),
    RunState.PROVISIONING: frozenset({RunState.RUNNING, RunState.QUEUED, RunState.FAILED}),
    RunState.RUNNING: frozenset(
        {RunState.DEGRADED, RunState.PAUSED_BY_GATE, RunState.SUCCEEDED, RunState.FAILED, RunState.QUEUED}
    ),
    RunState.DEGRADED: frozenset(
        {RunState.RUNNING, RunState.DEGRADED, RunState.PAUSED_BY_GATE, RunState.SUCCEEDED, RunState.FAILED,
         RunState.QUEUED}
    ),
    RunState.PAUSED_BY_GATE: frozenset({RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED}),
    RunState.SUCCEEDED: frozenset(),
    RunState.FAILED: frozenset(),
}
_NEEDS_REASON = frozenset({RunState.DEGRADED, RunState.PAUSED_BY_GATE, RunState.FAILED})


class IllegalTransition(ValueError):
    """A transition the state machine does not allow (the message names both states)."""


@dataclass(frozen=True, slots=True)
class RunStatus:
    state: RunState
    reason: str = ""
    failure: FailureClass | None = None
    step: int | None = None
    at: float = 0.0

    @property
    def label(self) -> str:
        """The customer-facing form: `DEGRADED(reason)`, `FAILED(tenant_code_fault)`, `RUNNING`."""
        if self.state is RunState.FAILED and self.failure is not None:
            return f"FAILED({self.failure.value})"
        if self.state in (RunState.DEGRADED, RunState.PAUSED_BY_GATE):
            return f"{self.state.value}({self.reason})"
        return self.state.value


@dataclass
class RunStateMachine:
    run_id: str
    tenant: str | None = None
    history: list[RunStatus] = field(default_factory=list)
    #: advisory alerts seen (recorded, never move the state)
    advisories: list[Any] = field(default_factory=list)
    #: paging alerts seen, in order
    pages: list[Any] = field(default_factory=list)
    pending_pause: str = ""

    def __post_init__(self) -> None:
        if not self.history:
            self.history.append(RunStatus(RunState.QUEUED, at=time.time()))

    @property
    def status(self) -> RunStatus:
        return self.history[-1]

    @property
    def state(self) -> RunState:
        return self.status.state

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def transition(
        self, to: RunState, reason: str = "", failure: FailureClass | None = None, step: int | None = None
    ) -> RunStatus:
        to = RunState(to)
        if to not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"run {self.run_id}: illegal transition {self.state.value} -> {to.value}")
        if to in _NEEDS_REASON and not reason:
            raise IllegalTransition(f"run {self.run_id}: {to.value} needs a reason")
        if to is RunState.FAILED:
            if not isinstance(failure, FailureClass):
                raise IllegalTransition(f"run {self.run_id}: FAILED needs exactly one FailureClass")
        elif failure is not None:
            raise IllegalTransition(f"run {self.run_id}: only FAILED carries a failure class")
        status = RunStatus(to, reason=reason, failure=failure, step=step, at=time.time())
        self.history.append(status)
        return status

    # ------------------------------------------------------------------ driven by the platform
    def provision(self) -> RunStatus:
        return self.transition(RunState.PROVISIONING)

    def start(self) -> RunStatus:
        return self.transition(RunState.RUNNING)

    # ------------------------------------------------------------------ driven by the catalog
    def on_alert(self, event: Any) -> RunStatus | None:
        """An `eval.health.AlertEvent` fired. Paging alerts move a live run; advisory ones are recorded."""
        if event.severity != "paging":
            self.advisories.append(event)
            return None
        self.pages.append(event)
        if self.state not in LIVE:
            return None
        reason = f"{event.alert}: {event.reason}"
        if event.action == "pause":
            self.pending_pause = reason
            if self.state is RunState.RUNNING:
                return self.transition(RunState.DEGRADED, reason, step=_int(event.step))
            return None
        if self.state is RunState.PAUSED_BY_GATE:
            return None
        if self.state is RunState.DEGRADED:
            reason = f"{self.status.reason}; {reason}"
        return self.transition(RunState.DEGRADED, reason, step=_int(event.step))

    # ------------------------------------------------------------------ driven by the eval gates
    def on_checkpoint(
        self, step: int, gate_says_stop: bool = False, gate_reason: str = ""
    ) -> RunStatus | None:
        """A checkpoint landed (and its gate ran). A pending pause, or a gate that says stop, pauses here."""
        if self.state not in (RunState.RUNNING, RunState.DEGRADED):
            return None
        if self.pending_pause:
            reason, self.pending_pause = self.pending_pause, ""
            return self.transition(RunState.PAUSED_BY_GATE, reason, step=step)
        if gate_says_stop:
            why = gate_reason or "the held-out evaluation score stopped improving"
            return self.transition(RunState.PAUSED_BY_GATE, why, step=step)
        return None

    def resume(self) -> RunStatus:
        """Operator or customer resumes a paused (or recovered degraded) run."""
        return self.transition(RunState.RUNNING)

    # ------------------------------------------------------------------ the end
    def finish(self, attribution: Any, step: int | None = None) -> RunStatus:
        """Terminal state from an `eval.attribution.Attribution`: FAILED(class) or SUCCEEDED."""
        if attribution.failure_class is None:
            return self.transition(RunState.SUCCEEDED, attribution.reason, step=step)
        return self.transition(RunState.FAILED, attribution.reason, attribution.failure_class, step=step)

    def labels(self) -> list[str]:
        return [s.label for s in self.history]


def _int(step: Any) -> int | None:
    try:
        return int(step)
    except (TypeError, ValueError):
        return None
