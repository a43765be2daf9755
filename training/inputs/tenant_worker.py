"""Inside a tenant-code worker (training/inputs/tenant_code.py's pool; started by training/inputs/tenant_launch.py):
load the tenant's function and call it as TRL 1.16's GRPOTrainer calls a reward function, by keyword:
`fn(prompts=..., completions=..., completion_ids=..., **columns, trainer_state=..., log_metric=..., log_extra=...)`.

- `completions` are the decoded responses, or `[{"role": "assistant", "content": ...}]` per sample when the prompts
  are chat messages (TRL's conversational form); `completion_ids` the response token ids;
- `trainer_state` is a small object with `global_step` (the step being scored; the gate's: the checkpoint's step)
  and `max_steps`;
- `log_metric(name, value)` records a number: its mean over the call comes back with the scores (plain data) and
  becomes the step's metric `reward_fn/<name>`; `log_extra(column, values)` is accepted and dropped (TRL's
  completions table has no counterpart here);
- an async function is awaited (`asyncio.run`).

`signature_problem` is the load-time check (here with `inspect`, in the request's check with `ast`:
training/inputs/scorers.py `check_defined`): a function must take every keyword it is called with (`**kwargs`, or
each by name) and need no other. Stdlib only: the request's check imports it before the model stack loads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import faulthandler
import importlib.util
import inspect
import math
import multiprocessing
import numbers
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

#: lines of traceback kept per failed sample
TAIL_LINES = 5
#: the keywords every call passes besides the row's columns (TRL 1.16's names)
KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_metric", "log_extra")
#: the worker's log file inside its log folder, named by the worker's tag (tenant_launch._Context)
LOG_NAME = "worker-{}.log"

_cache: dict[tuple, Any] = {}  # loaded functions of this worker
_metrics: dict[str, list[float]] = {}  # what log_metric recorded during the current call


@dataclass
class TrainerState:
    """What a reward function may read of the training's progress (TRL passes its TrainerState)."""

    global_step: int = 0
    max_steps: int = 0


def _init_worker(cwd: str, memory_mb: int, log_dir: str, trainer_pid: int, max_tasks: int = 0) -> None:
    """`trainer_pid` 0: sandboxed (the pid is not ours to see; the sandbox dies with the trainer); `max_tasks`:
    RLIMIT_NPROC, counted per user namespace, so only in the sandbox (0: none)."""
    with contextlib.suppress(PermissionError):  # in the sandbox it already leads a session (bwrap --new-session)
        os.setpgrp()  # a group of its own: the trainer kills it and whatever it started with one killpg
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = memory_mb * 2**20 if hard == resource.RLIM_INFINITY else min(memory_mb * 2**20, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # hard too: tenant code may not raise it again
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file in the tenant's folder
    if max_tasks:
        resource.setrlimit(resource.RLIMIT_NPROC, (max_tasks, max_tasks))
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    me = multiprocessing.current_process()
    name = LOG_NAME.format(getattr(me, "worker_tag", os.getpid()))
    fd = os.open(os.path.join(log_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    faulthandler.enable(file=2)  # a crash leaves the tenant's stack in the log (the error's traceback tail)
    alive = getattr(me, "alive_fd", None)
    if alive is not None:
        _as_seen_by_the_pool(_read_line(alive))
    threading.Thread(target=_watch_trainer, args=(trainer_pid, alive), daemon=True).start()


def _read_line(fd: int) -> int:
    data = b""
    while not data.endswith(b"\n"):
        got = os.read(fd, 32)
        if not got:
            break
        data += got
    return int(data or 0)


class _PidAs:
    """`os` for pebble's worker loop, whose getpid() is the pid the pool knows this worker by (its sandbox's, seen
    from the trainer): pebble acknowledges a task with os.getpid() and finds the worker of a timed-out or expired
    task by it (pebble 5's `task_transaction`)."""

    def __init__(self, pid: int):
        self._pid = pid

    def getpid(self) -> int:
        return self._pid

    def __getattr__(self, name):
        return getattr(os, name)


def _as_seen_by_the_pool(pid: int) -> None:
    if pid and pid != os.getpid():
        import pebble.pool.process

        pebble.pool.process.os = _PidAs(pid)


def _watch_trainer(trainer_pid: int, alive_fd: int | None) -> None:
    # a worker busy in tenant code does not notice the closed pipe; once the trainer is gone (its end of `alive_fd`
    # closed, or this worker's parent changed), stop the whole group
    if alive_fd is not None:
        with contextlib.suppress(OSError):
            while os.read(alive_fd, 1):
                pass
    else:
        while os.getppid() == trainer_pid:
            time.sleep(0.5)
    os.killpg(0, signal.SIGKILL)


class _Problem(Exception):
    """Something the tenant's function did that fails the whole call: kind, the message's words, error, tail."""

    def __init__(self, kind: str, what: str, error: str = "", tail: str = ""):
        super().__init__(what)
        self.kind, self.what, self.error, self.tail = kind, what, error or what, tail


def _cpu() -> float:
    t = os.times()  # the tenant's reaped child processes count too
    return time.process_time() + t.children_user + t.children_system


def _describe(err: BaseException) -> str:
    return " ".join(f"{type(err).__name__}: {err}".split())[:300]


def _tail(err: BaseException) -> str:
    lines = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip().splitlines()
    return "\n".join(lines[-TAIL_LINES:])


def _fatal(err: BaseException) -> _Problem | None:
    """The failures no sample-by-sample retry can help: memory and leaving the process."""
    text = str(err)
    if isinstance(err, MemoryError) or (isinstance(err, OSError) and err.errno == errno.ENOMEM) or any(
            s in text for s in ("can't allocate memory", "Cannot allocate memory", "Unable to allocate",
                                "failed to map segment")):  # the last: a shared library (e.g. CUDA's) too big
        return _Problem("memory", "", _describe(err), _tail(err))
    if isinstance(err, SystemExit):
        return _Problem("exit", f"exited the process (sys.exit({err.code!r}))", _describe(err), _tail(err))
    return None


def _load(ref):
    key = (ref.file, ref.module, ref.name, ref.code_hash)
    if key in _cache:
        return _cache[key]
    try:
        if ref.file is not None:
            name = "_tenant_" + re.sub(r"\W", "_", ref.file.stem) + "_" + ref.code_hash[:8]  # never shadows a module
            spec = importlib.util.spec_from_file_location(name, ref.file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # dataclasses and pickling look the module up
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(name, None)
                raise
        else:
            module = importlib.import_module(ref.module)
    except BaseException as err:
        raise (_fatal(err) or _Problem("load", f"could not be loaded: {_describe(err)}", _describe(err), _tail(err))) \
            from None
    fn = getattr(module, ref.name, None)
    if fn is None:
        raise _Problem("load", f"could not be loaded: {ref.file.name if ref.file else ref.module} defines no "
                               f"{ref.name!r}")
    if not callable(fn):
        raise _Problem("load", f"could not be loaded: {ref.name} is a {type(fn).__name__}, not a function")
    _cache[key] = fn
    return fn


def _is_chat(prompt: Any) -> bool:
    """A prompt in TRL's conversational form: a list of messages with roles."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def _log_metric(name: str, value: float) -> None:
    _metrics.setdefault(str(name), []).append(float(value))


def _log_extra(column: str, values: list) -> None:
    """TRL's completions-table columns: accepted, not kept."""


async def _awaited(awaitable):
    return await awaitable


def _call_tenant(fn, prompts: list, completions: list, columns: dict, extra: dict) -> Any:
    if prompts and _is_chat(prompts[0]):
        completions = [[{"role": "assistant", "content": c}] for c in completions]
    ids = extra.get("completion_ids") or [[] for _ in completions]
    state = TrainerState(int(extra.get("step", 0)), int(extra.get("max_steps", 0)))
    got = fn(prompts=prompts, completions=completions, completion_ids=ids, **columns, trainer_state=state,
             log_metric=_log_metric, log_extra=_log_extra)
    if inspect.isawaitable(got):
        got = asyncio.run(_awaited(got))
    return got


def signature_problem(name: str, params: list[tuple[str, str, bool]], columns: list[str] | tuple[str, ...]
                      ) -> str | None:
    """Why a function with `params` ([(name, kind, has_default)], kind one of inspect.Parameter's kind names) cannot
    be called with TRL's keywords and `columns`, with the fix; None when it can."""
    passed = [*KEYWORDS, *columns]
    kinds = {p: k for p, k, _ in params}
    shown = ", ".join(("**" if k == "VAR_KEYWORD" else "*" if k == "VAR_POSITIONAL" else "") + p
                      for p, k, _ in params)
    call = "prompts=, completions=, completion_ids=, trainer_state=, log_metric=, log_extra=" + "".join(
        f", {c}=" for c in columns)
    if "VAR_KEYWORD" not in kinds.values():
        missing = [k for k in passed if kinds.get(k) not in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY")]
        if missing:
            return (f"{name}({shown}) is called by keyword as TRL calls a reward function ({call}) and does not take "
                    f"{', '.join(missing)}: add **kwargs to its parameters, e.g. def {name}(completions, **kwargs)")
    for p, kind, default in params:
        if kind == "POSITIONAL_ONLY" and not default:
            return (f"{name}({shown}) takes {p} by position only, but it is called by keyword ({call}): write "
                    f"def {name}(completions, **kwargs)")
        if kind in ("POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY") and not default and p not in passed:
            return (f"{name}({shown}) needs {p}, which it is not called with (neither one of TRL's keywords nor a "
                    f"column{': ' + ', '.join(columns) if columns else ''}): give it a default or name a column")
    return None


def _check_signature(fn, ref, columns) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: it will tell at its first call
        return
    params = [(p.name, p.kind.name, p.default is not inspect.Parameter.empty) for p in sig.parameters.values()]
    problem = signature_problem(ref.name, params, list(columns))
    if problem:
        raise _Problem("signature", problem)


def _validate(got: Any, n: int, offset: int) -> list[float | None]:
    if hasattr(got, "ndim") and hasattr(got, "tolist"):  # a numpy array or torch tensor
        if got.ndim != 1:
            raise _Problem("return", f"returned a {got.ndim}-D array, not a list of scores")
        got = got.tolist()
    if not isinstance(got, list | tuple):
        raise _Problem("return", f"returned {type(got).__name__}, not a list of scores")
    if len(got) != n:
        raise _Problem("return", f"returned {len(got)} score{'s' * (len(got) != 1)} for {n} "
                                 f"completion{'s' * (n != 1)}")
    out: list[float | None] = []
    for i, raw in enumerate(got):
        value = raw.item() if getattr(raw, "ndim", None) == 0 and hasattr(raw, "item") else raw  # numpy, torch
        value = bool(value) if type(value).__name__ == "bool_" else value
        if value is None:
            out.append(None)
            continue
        if not isinstance(value, numbers.Real):
            raise _Problem("return", f"returned a non-number at index {offset + i} ({repr(raw)[:40]}, "
                                     f"{type(raw).__name__})")
        value = float(value)
        if not math.isfinite(value):
            raise _Problem("return", f"returned {'NaN' if math.isnan(value) else value} at index {offset + i}")
        out.append(value)
    return out


def _score(fn, prompts: list, completions: list, columns: dict, extra: dict) -> dict:
    try:
        got = _call_tenant(fn, prompts, completions, columns, extra)
    except BaseException as err:
        if fatal := _fatal(err):
            raise fatal from None
    else:
        return {"scores": _validate(got, len(completions), 0), "failures": []}
    scores, failures = [], []  # the batch raised: which samples raise?
    for i in range(len(completions)):
        one = {**extra, "completion_ids": (extra.get("completion_ids") or [[]] * len(completions))[i:i + 1]}
        try:
            got = _call_tenant(fn, prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in columns.items()},
                               one)
        except BaseException as err:
            if fatal := _fatal(err):
                raise fatal from None
            scores.append(None)
            failures.append((i, _describe(err), _tail(err)))
        else:
            scores.extend(_validate(got, 1, i))
    return {"scores": scores, "failures": failures}


def _run(ref, batch: tuple | None, timeout_s: float, token: str, columns: tuple[str, ...] = ()) -> dict:
    """A task of the pool: load `ref` and check its signature against `columns` (batch None), or score a batch
    (prompts, completions, columns, extra: completion_ids, step, max_steps). Returns plain data (never the
    tenant's objects): {"kind": "ok", scores, failures, metrics} or a _Problem's fields; "cpu" either way."""
    os.write(2, f"\n== {token} ==\n".encode())  # where this call's output starts in the log
    start = _cpu()
    _metrics.clear()
    # just before the pool's kill, the stack goes to the log: where a stopped function was stuck
    faulthandler.dump_traceback_later(max(timeout_s - 0.3, 0.8 * timeout_s), exit=False, file=2)
    try:
        fn = _load(ref)
        if batch is None:
            _check_signature(fn, ref, columns)
            out = {"kind": "ok", "scores": [], "failures": []}
        else:
            out = {"kind": "ok", **_score(fn, *batch)}
        out["metrics"] = {k: sum(v) / len(v) for k, v in _metrics.items() if v}
    except _Problem as p:
        out = {"kind": p.kind, "what": p.what, "error": p.error, "tail": p.tail}
    finally:
        faulthandler.cancel_dump_traceback_later()
        with contextlib.suppress(Exception):  # the tenant may have replaced or closed them
            sys.stdout.flush(), sys.stderr.flush()
    out["cpu"] = _cpu() - start
    return out
