"""The compute pool: simulation units are CPU-bound pure Python. Threads orchestrate; the CPU work of a thread-runner
task goes to one process pool per flow process (`spawn`, so no thread state is forked), sized to the cores. Under Ray
the work runs inline in the Ray worker. A worker that cannot import the task's code, or dies, is named
(`WorkerStartError`, `WorkerProcessDied`) and a broken pool is replaced."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from typing import Any

_pool_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None
_pool_users = 0


@contextmanager
def compute_pool(workers: int | None = None) -> Iterator[None]:
    """Open the process pool that thread-runner tasks send CPU work to (nested opens share one pool).
    `workers=1` keeps everything in-process (no pool)."""
    global _pool, _pool_users
    workers = workers or os.cpu_count() or 1
    with _pool_lock:
        if _pool is None and workers > 1:
            _pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
        _pool_users += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users -= 1
            if _pool_users == 0 and _pool is not None:
                _pool.shutdown(wait=True, cancel_futures=True)
                _pool = None


def compute(fn: Callable[..., Any], *args: Any) -> Any:
    """Run CPU-bound `fn(*args)` in the compute pool when one is open, else inline (Ray workers, tests).
    A pool process that dies raises `WorkerStartError` (it cannot start here: not retried) or
    `WorkerProcessDied` (retried, on a fresh pool), each saying why."""
    pool = _pool
    if pool is None:
        return fn(*args)
    try:
        return pool.submit(fn, *args).result()
    except BrokenProcessPool as err:
        _replace_broken_pool(pool)
        raise worker_death(fn, err) from err


class WorkerStartError(ImportError):
    """A compute-pool process cannot start in this environment (it dies importing what the task needs): every
    retry would die the same way."""


class WorkerProcessDied(RuntimeError):
    """A compute-pool process died mid-task (killed, out of memory) although a fresh one starts fine."""


def diagnose_worker_start(fn: Callable[..., Any]) -> str | None:
    """Start a fresh interpreter as a `spawn` pool process starts (this process's `sys.path`, this directory) and
    import what `fn` needs. Returns the last line of its error, or None when it starts fine. A pool process that
    dies at import only tells the pool `BrokenProcessPool`; this finds out why."""
    code = ("import json, sys; sys.path[:] = json.loads(sys.argv[1]); import concurrent.futures.process; "
            f"import {fn.__module__}")
    try:
        done = subprocess.run([sys.executable, "-c", code, json.dumps(sys.path)], capture_output=True, text=True,
                              timeout=300, cwd=os.getcwd())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit code {done.returncode}"


def worker_death(fn: Callable[..., Any], err: BaseException) -> Exception:
    """The error a task raises when its compute-pool process died: the root cause in the message."""
    cause = diagnose_worker_start(fn)
    if cause is not None:
        return WorkerStartError(
            f"a compute-pool process died starting {fn.__module__}.{fn.__name__} ({type(err).__name__}); a fresh "
            f"process with the same sys.path fails with: {cause} (a module on sys.path shadowing a standard-library "
            "or installed one does this: see tests/flows/test_module_names.py)")
    return WorkerProcessDied(f"a compute-pool process died running {fn.__module__}.{fn.__name__} "
                             f"({type(err).__name__}: {err}); a fresh process starts fine, so it was likely killed "
                             "(out of memory?)")


def _replace_broken_pool(pool: ProcessPoolExecutor) -> None:
    """A broken pool refuses all work: give the pool's users a fresh one so that a retried task can run."""
    global _pool
    with _pool_lock:
        if _pool is pool:
            _pool = ProcessPoolExecutor(max_workers=pool._max_workers, mp_context=mp.get_context("spawn"))
    pool.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------------
