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

import hashlib

from pydantic import ValidationError

from rlhfops.errors import BadInput

#: attempts = 1 + RETRIES; with 30% injected failures per attempt a task fails for good with
#: probability 0.3**6 ~ 0.07%
RETRIES = 5
NEVER_RETRY: tuple[type[BaseException], ...] = (BadInput, ValidationError, ValueError, TypeError, KeyError,
                                                AttributeError)


class InjectedFault(RuntimeError):
    """A transient failure injected on purpose (tests, chaos runs)."""


def is_transient(exc: BaseException) -> bool:
    return not isinstance(exc, NEVER_RETRY)


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


def attempt() -> int:
    """This task run's attempt number (1 on the first try), or 1 outside Prefect."""
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
