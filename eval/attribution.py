"""Failure attribution: every terminal run gets exactly one class and a reason a customer can act on.

Three classes (eval/states.py `FailureClass`), extending the infra-vs-user split of the platform SLOs:
platform fault (spends the platform error budget), tenant code fault (the reward function or dataset
raised; surfaced with examples), algorithmic non-convergence (no fault; surfaced with the health
history). A run without any of them SUCCEEDED.

    guard = RewardFunctionGuard(tenant_reward_fn)        # wraps the tenant's reward function
    rewards = [guard(sample) for sample in batch]         # raising samples score NaN and are recorded
    ...
    attribution = attribute(RunEvidence(completed=True, reward_errors=guard.summary(),
                                        alerts=live.fired.values()))
    machine.finish(attribution)

Plain Python: no Prefect or MLflow here.
"""

from __future__ import annotations

import math
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from eval.states import FailureClass


class PlatformError(RuntimeError):
    """Raised by platform code for platform failures (worker lost, weight-sync timeout, provisioning)."""


class TenantCodeError(RuntimeError):
    """Raised when tenant code (reward function, dataset) failed in a way the run cannot continue from."""

    def __init__(self, message: str, summary: SampleErrorSummary | None = None):
        super().__init__(message)
        self.summary = summary


@dataclass(frozen=True, slots=True)
class SampleError:
    sample: str
    error: str


@dataclass(frozen=True, slots=True)
class SampleErrorSummary:
    calls: int
    failures: int
    examples: tuple[SampleError, ...]
    error_types: tuple[str, ...]

    @property
    def rate(self) -> float:
        return self.failures / self.calls if self.calls else 0.0


class RewardFunctionGuard:
    """Wrap a tenant reward function: a sample on which it raises scores `fallback` (NaN by default,
    so the trainer can drop it) and is recorded with its error. Keeps the first `max_examples` examples."""

    def __init__(self, fn: Callable[..., float], fallback: float = math.nan, max_examples: int = 5):
        self.fn = fn
        self.fallback = fallback
        self.max_examples = max_examples
        self.calls = 0
        self.failures = 0
        self.examples: list[SampleError] = []
        self.error_types: dict[str, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> float:
        self.calls += 1
        try:
            return float(self.fn(*args, **kwargs))
        except Exception as err:  # tenant code may raise anything; that is what we are recording
            self.failures += 1
            kind = type(err).__name__
            self.error_types[kind] = self.error_types.get(kind, 0) + 1
            if len(self.examples) < self.max_examples:
                sample = repr(args[0] if len(args) == 1 else args)[:200]
                self.examples.append(SampleError(sample=sample, error=f"{kind}: {err}"[:200]))
            return self.fallback

    def summary(self) -> SampleErrorSummary:
        kinds = tuple(sorted(self.error_types, key=lambda k: -self.error_types[k]))
        return SampleErrorSummary(self.calls, self.failures, tuple(self.examples), kinds)


@dataclass
class RunEvidence:
    """What is known about a run when it ends."""

    #: the run reached its planned end, or a gate stopped it with a checkpoint kept
    completed: bool
    #: the exception that ended the run, if any
    exception: BaseException | None = None
    #: per-sample reward-function failures over the run
    reward_errors: SampleErrorSummary | None = None
    #: paging alert events (eval.health.AlertEvent) that fired during the run
    alerts: Iterable[Any] = ()
    #: module-name or file-path prefixes of tenant code (for exceptions raised inside it)
    tenant_code: tuple[str, ...] = ()
    #: (paused at step, reason, resumed from checkpoint step) for each eval-gate pause the run was resumed from
    pauses: tuple[tuple[int | None, str, int], ...] = ()


@dataclass(frozen=True)
class Attribution:
    #: None when the run succeeded
    failure_class: FailureClass | None
    reason: str
    examples: tuple[str, ...] = field(default_factory=tuple)


def _raised_in_tenant_code(exc: BaseException, prefixes: tuple[str, ...]) -> bool:
    if isinstance(exc, TenantCodeError):
        return True
    if not prefixes:
        return False
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    inner = frames[-1]  # where it was raised
    return any(inner.filename.startswith(p) or p in inner.filename for p in prefixes)


def _example_text(example: dict) -> str:
    """One failed sample as a line a tenant reads: the prompt, the completion, the error and the traceback's end."""
    tail = str(example.get("traceback", "")).strip().splitlines()[-3:]
    prompt, completion = str(example.get("prompt", ""))[:200], str(example.get("completion", ""))[:200]
    return (f"prompt {prompt!r} -> completion {completion!r} -> {example.get('error', '')}"
            + (f" ({' | '.join(tail)})" if tail else ""))


def _attached(items: tuple[str, ...], what: str) -> str:
    """`, 3 examples attached` when there are any, else nothing: a line points only at what the run's record holds
    (`training.job.lifecycle.job_record` writes an attribution's examples into job.json)."""
    n = len(items)
    return f", {n} {what}{'s' * (n != 1)} attached" if n else ""


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x >= 0.001 else f"{100 * x:.2f}%"


def attribute(evidence: RunEvidence, tenant_error_rate: float = 0.01) -> Attribution:
    """Exactly one class for a failed run (or success). Precedence follows causality: the exception
    that ended the run decides first (raised in tenant code: tenant fault; anywhere else: platform fault,
    since the platform owns every other line that ran); then tenant code that failed on too many
    samples; then paging run-mechanics alerts (platform) and paging algorithmic alerts
    (non-convergence); a run that stopped early with none of these
    is a platform fault."""
    errs = evidence.reward_errors
    examples = tuple(f"{e.sample} -> {e.error}" for e in errs.examples) if errs else ()
    exc = evidence.exception
    if exc is not None:
        if isinstance(exc, TenantCodeError) and getattr(exc, "examples", None) is not None:
            # the platform's tenant-code pool (training/inputs/scorers.py) already said what the code did, in the
            # runbook's words; its examples are the samples (prompt, completion, error, traceback tail)
            return Attribution(FailureClass.TENANT_CODE_FAULT, str(exc),
                               tuple(_example_text(e) for e in exc.examples))
        if _raised_in_tenant_code(exc, evidence.tenant_code):
            summary = getattr(exc, "summary", None) or errs
            detail = f"{type(exc).__name__}: {exc}"
            if summary is not None and summary.failures:
                ex = tuple(f"{e.sample} -> {e.error}" for e in summary.examples)
                return Attribution(
                    FailureClass.TENANT_CODE_FAULT,
                    f"your reward function raised on {_pct(summary.rate)} of samples ({summary.failures} of "
                    f"{summary.calls}){_attached(ex, 'example')}; fix it and resubmit",
                    ex,
                )
            return Attribution(
                FailureClass.TENANT_CODE_FAULT,
                f"your code raised {detail}; the traceback is attached; fix it and resubmit",
                tuple(traceback.format_exception_only(type(exc), exc)),
            )
        return Attribution(
            FailureClass.PLATFORM_FAULT,
            f"the run stopped because of a platform problem ({type(exc).__name__}: {exc}); it was not caused "
            "by your code or data and counts against the platform's error budget; retry the run",
            (),
        )
    if errs is not None and errs.calls and errs.rate >= tenant_error_rate:
        kinds = ", ".join(errs.error_types[:3])
        return Attribution(
            FailureClass.TENANT_CODE_FAULT,
            f"your reward function raised on {_pct(errs.rate)} of samples ({errs.failures} of {errs.calls}; "
            f"{kinds}){_attached(examples, 'example')}; fix it and resubmit",
            examples,
        )
    pages = [a for a in evidence.alerts if getattr(a, "severity", "paging") == "paging"]
    mechanics = [a for a in pages if getattr(a, "layer", "algorithmic") == "mechanics"]
    if mechanics:  # the platform failed to run the job properly (e.g. weight sync stalled)
        reasons = "; ".join(dict.fromkeys(a.reason for a in mechanics))
        return Attribution(
            FailureClass.PLATFORM_FAULT,
            f"{reasons}; it was not caused by your code or data and counts against the platform's error "
            "budget; retry the run",
            tuple(f"{a.alert} at step {a.step:g}: {a.detail}" for a in mechanics),
        )
    if pages:
        reasons = "; ".join(dict.fromkeys(a.reason for a in pages))
        names = ", ".join(dict.fromkeys(a.alert for a in pages))
        return Attribution(
            FailureClass.ALGORITHMIC_NON_CONVERGENCE,
            f"no platform or code fault, but training did not converge: {reasons} ({names}); "
            "check the reward design, learning rate and KL coefficient; the health history is attached",
            tuple(f"{a.alert} at step {a.step:g}: {a.detail}" for a in pages),
        )
    if not evidence.completed:
        return Attribution(
            FailureClass.PLATFORM_FAULT,
            "the run ended before its planned end without an error from your code; this is a platform "
            "problem and counts against the platform's error budget; retry the run",
            (),
        )
    if evidence.pauses:
        resumed = "; ".join(f"paused at step {step} by the eval gate ({why}), resumed from the checkpoint at step "
                            f"{start}" for step, why, start in evidence.pauses)
        return Attribution(None, f"completed ({resumed})", examples)
    return Attribution(None, "completed", examples)
