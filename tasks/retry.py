"""Retries for tasks that can fail transiently, the rule that never retries bad input, and fault injection.

Transient: a worker that fails to start, a checkpoint write, a tracking call (SQLite busy, network).
Never retried: bad input (`BadInput`, pydantic `ValidationError`) and other deterministic errors
(`ValueError`, `TypeError`, `KeyError`, `AttributeError`): running the same code on the same input again
gives the same error, so a retry only delays the one-line message the user needs.

Fault injection (`fail_rate`): a task calls `maybe_fail(site, key, rate, seed)` at the points where real
failures happen (before the work starts, between opening a tracking run and finishing it). Whether an
attempt fails is a deterministic function of (seed, site, key, attempt number), so a failing sweep can
be replayed exactly.
"""

from __future__ import annotations

import functools
import hashlib
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import ValidationError

from common.errors import BadInput

#: attempts = 1 + RETRIES; with 30% injected failures per attempt a task fails for good with
#: probability 0.3**6 ~ 0.07%
RETRIES = 5
NEVER_RETRY: tuple[type[BaseException], ...] = (BadInput, ValidationError, ValueError, TypeError, KeyError,
                                                AttributeError)


class InjectedFault(RuntimeError):
    """A transient failure injected on purpose (tests, chaos runs)."""


def is_transient(exc: BaseException) -> bool:
    return not isinstance(exc, NEVER_RETRY) and not is_permanent(exc)


#: errors of the code or its environment, not of the moment: a retry runs into the same error
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (ImportError, NameError, SyntaxError, NotImplementedError,
                                                     AssertionError, RecursionError)


def is_permanent(exc: BaseException) -> bool:
    """A programming or environment error (an import that fails, a name that does not exist, ...), here or
    anywhere in the exception's cause chain (a compute-pool process's `WorkerStartError` is an ImportError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, PERMANENT_ERRORS):
            return True
        seen.add(id(exc))
        exc = exc.__cause__
    return False


def retry_transient(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry unless the failure is bad input or another deterministic error."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - the state re-raises whatever the task raised
        return is_transient(exc)
    return False


def backoff(base_s: float, retries: int = RETRIES) -> list[float]:
    """Exponential backoff: base, 2*base, 4*base, ... (Prefect adds jitter on top)."""
    return [base_s * 2 ** i for i in range(retries)]


#: the attempt number of the innermost `with_retries` call in progress (None outside one)
_attempt: ContextVar[int | None] = ContextVar("rlhfops_attempt", default=None)
F = TypeVar("F", bound=Callable[..., Any])


def with_retries(fn: Callable[..., Any], *args: Any, delays: list[float] | None = None, jitter: float = 0.5,
                 **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with the tasks' retry rule, in-process: transient failures (`is_transient`) are
    retried after `delays` (default `backoff(1.0)`, each stretched by a random share of up to `jitter`), bad
    input fails at once. For short calls where a whole task run is overkill (opening and closing a flow run's
    MLflow run); `attempt()` sees the attempt number, so fault injection replays the same way as in a task.
    Retries are logged at INFO to the flow run's log (the Prefect UI), like task retries."""
    delays = backoff(1.0) if delays is None else list(delays)
    for i in range(len(delays) + 1):
        token = _attempt.set(i + 1)
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if i == len(delays) or not is_transient(exc):
                raise
            _log_retry(getattr(fn, "__name__", "call"), i + 1, len(delays) + 1, exc)
        finally:
            _attempt.reset(token)
        time.sleep(delays[i] * (1 + jitter * random.random()))
    raise AssertionError("unreachable")


def _log_retry(name: str, n: int, of: int, exc: BaseException) -> None:
    import logging

    try:
        from prefect.logging import get_run_logger

        logger = get_run_logger()
    except Exception:  # noqa: BLE001 - outside a flow or task run
        logger = logging.getLogger("rlhfops.retry")
    logger.info("%s: attempt %d of %d failed (%s: %s); retrying", name, n, of, type(exc).__name__, exc)


def retried(fn: F) -> F:
    """Decorator form of `with_retries`: the wrapped function takes an extra keyword `retry_delay_s` (the
    first backoff delay, default 1 s)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, retry_delay_s: float = 1.0, **kwargs: Any) -> Any:
        return with_retries(fn, *args, delays=backoff(retry_delay_s), **kwargs)

    return wrapper  # type: ignore[return-value]


def attempt() -> int:
    """The attempt number (1 on the first try) of the innermost `with_retries` call, else of this task run, else
    1 (outside Prefect)."""
    n = _attempt.get()
    if n is not None:
        return n
    try:
        from prefect.runtime import task_run

        return int(task_run.run_count or 1)
    except Exception:  # noqa: BLE001
        return 1


def should_fail(site: str, key: str, rate: float, seed: int, attempt_no: int) -> bool:
    if rate <= 0:
        return False
    h = hashlib.blake2b(f"{seed}|{site}|{key}|{attempt_no}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2 ** 64 < rate


def fault_site(key: str, rate: float, seed: int, attempt_no: int, sites: tuple[str, ...]) -> str | None:
    """Where this attempt fails, if the plan fails it: each attempt fails with probability `rate` (not once
    per site), at one of the task's fault sites."""
    if not should_fail("attempt", key, rate, seed, attempt_no):
        return None
    h = hashlib.blake2b(f"{seed}|site|{key}|{attempt_no}".encode(), digest_size=8).digest()
    return sites[int.from_bytes(h, "big") % len(sites)]


def maybe_fail(site: str, key: str, rate: float = 0.0, seed: int = 0, sites: tuple[str, ...] | None = None) -> None:
    """Raise `InjectedFault` at `site` on the attempts the fault plan picks. `sites`: every fault site of the
    calling task, so that an attempt fails at most once whatever the number of sites."""
    n = attempt()
    if fault_site(key, rate, seed, n, sites or (site,)) == site:
        raise InjectedFault(f"injected transient failure at {site} for {key} (attempt {n})")
