"""Run the tenant's own code (a reward or gate function, FILE.py:NAME or package.module:NAME) outside the trainer.

Tenant code is untrusted: it may hang, exit, crash, eat memory, start processes or read the environment; none of that
may take the trainer down, leak the platform's settings or count as a platform fault. `TenantFunctionPool` runs it
in the workers of a `pebble.ProcessPool` (per-call timeouts, killed workers replaced), each one
- exec'd fresh (spawn, never forked) through `env -i` with an allow-list environment (PATH, LANG, LC_ALL, TMPDIR,
  PYTHONHASHSEED; HOME = the config's folder; one OpenMP/BLAS thread; plus `env`), so even /proc/self/environ is
  clean; without the trainer's __main__ (so it starts the same under pytest, a console script or Prefect), argv
  or multiprocessing authkey (`_CleanPopen`);
- the leader of its own process group: every kill (timeout, close, a crash noticed) SIGKILLs the group, so what the
  tenant started dies too; a watchdog thread kills the group once the trainer is gone (PR_SET_PDEATHSIG would fire
  when the *thread* that started the worker exits, and kill the worker alone, orphaning its children);
- limited to `memory_mb` of address space (RLIMIT_AS; no core files), in the config's folder (cwd, sys.path[0]),
  with its stdout/stderr (prints, faulthandler's dumps) in `log_dir`.

Every failure is a `TenantCodeError` (eval/attribution.py) with one line in the runbook's words naming the role and
the function ("your reward function my_reward.py:score did not return within 30 s (reward.timeout_s) on a batch of
64 samples; it was stopped ..."), `examples` (prompt, completion, error, traceback tail) and a summary. A batch that
raises is re-run one sample at a time within the same timeout: samples that raise score None, as `SampleFailure`s.
A score is None or a finite real number (int, float, numpy/torch scalars, bool as 1.0/0.0 like TRL); a str, NaN,
inf, or any count but one score per completion is refused (never broadcast or truncated).

Limits: the worker runs as the trainer's OS user (it can read that user's files, the trainer's /proc/<pid>/environ);
children moved to another session (setsid) escape the group kill; the watchdog needs the GIL. Real isolation needs
another user or a container. `_CleanPopen._launch` follows CPython 3.11-3.13's.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import hashlib
import importlib.machinery
import importlib.util
import io
import math
import multiprocessing.context
import numbers
import os
import re
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from multiprocessing import popen_spawn_posix, reduction, spawn, util
from pathlib import Path
from typing import Any

from pebble import ProcessExpired, ProcessPool

from common.errors import BadInput
from eval.attribution import PlatformError, SampleError, SampleErrorSummary, TenantCodeError

#: the program that execs the worker with nothing but the allow-listed environment
ENV_PROGRAM = "/usr/bin/env"
#: how long a call may wait for a worker to start on top of its own timeout (spawn imports on a loaded machine)
START_GRACE_S = 120.0
#: examples of a whole-batch failure kept on the error (the batch's first samples, to reproduce it)
MAX_EXAMPLES = 3
#: lines of traceback kept per failed sample
TAIL_LINES = 5


@dataclass(frozen=True)
class FunctionRef:
    """A tenant function as the config names it; `code_hash` identifies the code that ran (job records)."""

    text: str  # as written in the config, e.g. "my_reward.py:score" or "pkg.mod:score"
    file: Path | None  # absolute path of the .py file (FILE.py:NAME form), else None
    module: str | None  # package.module:NAME form
    name: str  # the function's name
    code_hash: str  # sha256 hex (first 16) of the file's (or the module's source file's) bytes
    field: str  # the config field it came from, e.g. "reward.ref", for messages


@dataclass
class SampleFailure:
    index: int
    prompt: str
    completion: str
    error: str  # "ValueError: message"
    traceback_tail: str  # the traceback's last lines


@dataclass
class CallResult:
    scores: list[float | None]  # aligned with the completions; None: no score, or the sample raised
    errors: list[SampleFailure]  # one per sample that raised


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def parse_ref(text: str, base_dir: Path, field: str) -> FunctionRef:
    """FILE.py:NAME (relative to base_dir, the config's folder) or package.module:NAME; BadInput naming `field`
    otherwise. A module is looked up without being imported: its code must never run in the trainer."""
    where, _, name = str(text).rpartition(":")
    if not where or not name:
        raise BadInput(f"{field}: {text!r} names no function: write FILE.py:NAME (next to the config) or "
                       "package.module:NAME")
    if not name.isidentifier():
        raise BadInput(f"{field}: {name!r} in {text!r} is not a Python function name: write FILE.py:NAME")
    base = Path(base_dir)
    path = base / where
    if where.endswith(".py") or "/" in where or os.sep in where or path.exists():
        if not path.is_file():
            raise BadInput(f"{field}: file {where!r} of {text!r} not found in {base}: give FILE.py:NAME relative "
                           "to the config's folder")
        if path.suffix != ".py":
            raise BadInput(f"{field}: {where!r} of {text!r} is not a .py file: give FILE.py:NAME")
        path = path.resolve()
        return FunctionRef(str(text), path, None, name, _hash(path.read_bytes()), field)
    spec = _find_module(where, base)
    if spec is None:
        raise BadInput(f"{field}: module {where!r} of {text!r} not found (looked in {base} and the Python path): "
                       "give FILE.py:NAME or an installed package.module:NAME")
    origin = spec.origin if spec.has_location and spec.origin else None
    data = Path(origin).read_bytes() if origin and Path(origin).is_file() else str(text).encode()
    return FunctionRef(str(text), None, where, name, _hash(data), field)


def _find_module(module: str, base: Path) -> Any:
    """The module's spec, found part by part: importlib.util.find_spec would run a dotted name's parent packages."""
    parts = module.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    search = [str(base)] + [p or os.getcwd() for p in sys.path]  # the worker's path: its cwd, then the trainer's
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search)
    for part in parts[1:]:
        if spec is None or not spec.submodule_search_locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(part, list(spec.submodule_search_locations))
    return spec


# ---- launching a worker: exec'd with a clean environment, killed with its process group ------------------------


class _CleanPopen(popen_spawn_posix.Popen):
    """The stdlib's spawn launcher with three changes: the child is exec'd through `env -i` with the allow-listed
    environment; it gets neither the trainer's __main__ (never re-run there), argv (may carry secrets) nor authkey
    (would let it talk to the trainer's multiprocessing managers); and every signal becomes SIGKILL of the worker's
    whole process group."""

    def _launch(self, process_obj):  # CPython's Popen._launch, changes marked
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        process_obj.authkey = os.urandom(32)  # changed: a key of its own
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in ("init_main_from_name", "init_main_from_path"):  # changed: the worker needs nothing from __main__
            prep_data.pop(key, None)
        prep_data.update(sys_argv=["rlhfops-tenant-worker"], authkey=process_obj.authkey)  # changed
        fp = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            multiprocessing.context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            # changed: env -i execs the interpreter with only these variables (the pid stays the same)
            pairs = [f"{k}={v}" for k, v in process_obj.worker_env.items()]
            self.pid = util.spawnv_passfds(os.fsencode(ENV_PROGRAM), [ENV_PROGRAM, "-i", *pairs, *cmd], self._fds)
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds, [fd for fd in (parent_r, parent_w) if fd is not None])
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)

    def _kill_group(self) -> bool:
        # the worker leads its own group (setpgrp in _init_worker), so its group id is its pid; while this process
        # has not reaped it, that id cannot name anyone else's group
        try:
            os.killpg(self.pid, signal.SIGKILL)
            return True
        except (ProcessLookupError, PermissionError):  # still starting: no group of its own yet
            return False

    def _send_signal(self, sig):
        # pebble terminates a timed-out worker with SIGTERM to the pid alone; whatever the tenant started must go too
        if self.returncode is None and not self._kill_group():
            super()._send_signal(signal.SIGKILL)

    def poll(self, flag=os.WNOHANG):
        if self.returncode is None:
            # a worker that died on its own (exit, crash) may leave the tenant's children behind: kill its group
            # before it is reaped, while its pid is still reserved
            try:
                exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT | (flag & os.WNOHANG))
            except ChildProcessError:
                exited = None
            if exited is not None:
                self._kill_group()
        return super().poll(flag)


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj):
        return _CleanPopen(process_obj)


class _Context(multiprocessing.context.SpawnContext):
    """A spawn context whose processes start with `env` only; it keeps them so close() can kill them all."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.processes: list[_WorkerProcess] = []

    def Process(self, *args, **kwargs):  # noqa: N802 (multiprocessing's name)
        process = _WorkerProcess(*args, **kwargs)
        process.worker_env = self.env
        # the newest 64: every live worker (the newest ones) and the recently ended (their exit codes are looked up)
        self.processes = [*self.processes[-63:], process]
        return process


def _worker_env(cwd: Path, extra: dict[str, str] | None) -> dict[str, str]:
    """An allow-list: nothing of the platform's settings (PREFECT_*, MLFLOW_*, DATABASE_URL, tokens) gets through."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(cwd), "LANG": os.environ.get("LANG", "C.UTF-8"),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ left in the tenant's folder
    env.update({k: os.environ[k] for k in ("LC_ALL", "TMPDIR", "PYTHONHASHSEED") if k in os.environ})
    env.update(extra or {})
    return env


# ---- inside a worker --------------------------------------------------------------------------------------------

_cache: dict[tuple, Any] = {}  # loaded functions of this worker


def _init_worker(cwd: str, memory_mb: int, log_dir: str, trainer_pid: int) -> None:
    os.setpgrp()  # a group of its own: the trainer kills it and whatever it started with one killpg
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    limit = memory_mb * 2**20 if hard == resource.RLIM_INFINITY else min(memory_mb * 2**20, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # hard too: tenant code may not raise it again
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash leaves no core file in the tenant's folder
    os.chdir(cwd)
    sys.path.insert(0, cwd)
    fd = os.open(os.path.join(log_dir, f"worker-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for target in (1, 2):
        os.dup2(fd, target)
    os.close(fd)
    faulthandler.enable(file=2)  # a crash leaves the tenant's stack in the log (the error's traceback tail)
    threading.Thread(target=_watch_trainer, args=(trainer_pid,), daemon=True).start()


def _watch_trainer(trainer_pid: int) -> None:
    # a worker busy in tenant code does not notice the closed pipe; once the trainer is gone, stop the whole group
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


def _load(ref: FunctionRef):
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


def _call_tenant(fn, prompts: list, completions: list, columns: dict) -> Any:
    return fn(prompts, completions, **columns)


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


def _score(fn, prompts: list, completions: list, columns: dict) -> dict:
    try:
        got = _call_tenant(fn, prompts, completions, columns)
    except BaseException as err:
        if fatal := _fatal(err):
            raise fatal from None
    else:
        return {"scores": _validate(got, len(completions), 0), "failures": []}
    scores, failures = [], []  # the batch raised: which samples raise?
    for i in range(len(completions)):
        try:
            got = _call_tenant(fn, prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in columns.items()})
        except BaseException as err:
            if fatal := _fatal(err):
                raise fatal from None
            scores.append(None)
            failures.append((i, _describe(err), _tail(err)))
        else:
            scores.extend(_validate(got, 1, i))
    return {"scores": scores, "failures": failures}


def _run(ref: FunctionRef, batch: tuple | None, timeout_s: float, token: str) -> dict:
    """A task of the pool: load `ref` and, given a batch (prompts, completions, columns), score it. Returns plain
    data (never the tenant's objects): {"kind": "ok", scores, failures} or a _Problem's fields; "cpu" either way."""
    os.write(2, f"\n== {token} ==\n".encode())  # where this call's output starts in the log
    start = _cpu()
    # just before the pool's kill, the stack goes to the log: where a stopped function was stuck
    faulthandler.dump_traceback_later(max(timeout_s - 0.3, 0.8 * timeout_s), exit=False, file=2)
    try:
        fn = _load(ref)
        out = {"kind": "ok", "scores": [], "failures": []} if batch is None else {"kind": "ok", **_score(fn, *batch)}
    except _Problem as p:
        out = {"kind": p.kind, "what": p.what, "error": p.error, "tail": p.tail}
    finally:
        faulthandler.cancel_dump_traceback_later()
        with contextlib.suppress(Exception):  # the tenant may have replaced or closed them
            sys.stdout.flush(), sys.stderr.flush()
    out["cpu"] = _cpu() - start
    return out


# ---- the trainer's side -----------------------------------------------------------------------------------------


def _call_output(log_dir: Path, token: str) -> tuple[int | None, str]:
    """(the worker's pid, what it wrote during the call marked `token`: prints, faulthandler's dump), from its log."""
    marker = f"== {token} =="
    for path in log_dir.glob("worker-*.log"):
        with contextlib.suppress(OSError), path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 2**20))
            text = f.read().decode(errors="replace")
            if marker in text:
                return int(path.stem.split("-")[1]), text.split(marker, 1)[1]
    return None, ""


def _stack(output: str) -> tuple[str, str]:
    """From a faulthandler dump: (where the tenant's code was, the innermost frames outermost first)."""
    for block in output.split("(most recent call first):")[1:]:
        frames = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]
        ours = [i for i, ln in enumerate(frames) if ln.endswith((" in _call_tenant", " in _load"))]
        if ours:
            tenant = frames[:ours[0]][:TAIL_LINES]
            if not tenant:
                return "", ""
            m = re.match(r'File "(.*)", line (\d+) in (\S+)', tenant[0])
            where = f"{os.path.basename(m[1])}, line {m[2]}, in {m[3]}" if m else tenant[0]
            return where, "\n".join(reversed(tenant))
    return "", ""


class TenantFunctionPool:
    """Worker processes for tenant functions, started on the first call and kept warm until close()."""

    def __init__(self, cwd: Path, workers: int = 2, memory_mb: int = 2048, env: dict[str, str] | None = None):
        self.cwd = Path(cwd).resolve()
        if not self.cwd.is_dir():
            raise ValueError(f"tenant code working directory {self.cwd} is not a folder")
        self.workers, self.memory_mb = min(max(1, int(workers)), 32), int(memory_mb)  # _Context keeps 64
        self.env = _worker_env(self.cwd, env)
        #: CPU seconds (user+sys, the worker's and its reaped children's, measured in the worker around each call);
        #: a call that was stopped or died counts its wall time until then (an upper bound for single-threaded code)
        self.cpu_seconds = 0.0
        self.log_dir: Path | None = None  # the workers' stdout/stderr, removed by close()
        self._pool: ProcessPool | None = None
        self._context: _Context | None = None
        self._lock = threading.Lock()
        self._closed: Future = Future()

    def __enter__(self) -> TenantFunctionPool:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _schedule(self, *args) -> tuple:
        """Start the pool if need be (first use, or broken by a worker that died idle) and hand it the call."""
        with self._lock:
            if self._pool is not None and not self._pool.active:
                self._stop_locked()
            if self._pool is None:
                self.log_dir = Path(tempfile.mkdtemp(prefix="rlhfops-tenant-"))
                self._context = _Context(self.env)
                self._pool = ProcessPool(max_workers=self.workers, context=self._context, initializer=_init_worker,
                                         initargs=(str(self.cwd), self.memory_mb, str(self.log_dir), os.getpid()))
                self._closed = Future()  # done when this pool is stopped: calls under way end then
            future = self._pool.schedule(_run, args=args, timeout=args[2])
            return future, self._closed, self._context, self.log_dir

    def _add_cpu(self, seconds: float) -> None:
        with self._lock:
            self.cpu_seconds += seconds

    def _submit(self, ref: FunctionRef, batch: tuple | None, timeout_s: float) -> dict:
        for attempt in (1, 2):
            token = uuid.uuid4().hex
            future, closed, context, log_dir = self._schedule(ref, batch, timeout_s, token)
            started = time.monotonic()
            # pebble's timeout counts from when a worker takes the call; these bounds only keep a pool that cannot
            # start workers (or stop one) from hanging the trainer, and close() ends the wait (pebble's stop may not)
            wait([future, closed], timeout=timeout_s + START_GRACE_S, return_when=FIRST_COMPLETED)
            if not future.done() and future.running() and not closed.done():
                wait([future, closed], timeout=timeout_s + 30, return_when=FIRST_COMPLETED)
            if not future.done():
                future.cancel()
                raise PlatformError("the tenant-code pool was closed during the call" if closed.done() else
                                    f"the tenant-code pool did not run {ref.text} within "
                                    f"{timeout_s + START_GRACE_S:g} s (no worker started?)")
            try:
                out = future.result()
            except BrokenProcessPool:  # another worker died while idle: this call never started, so run it again
                if attempt == 2:
                    raise
                continue
            except FutureTimeout:
                pid, output = _call_output(log_dir, token)
                code = next((p.exitcode for p in context.processes if p.pid == pid), None)
                if code is not None and code >= 0:  # os._exit(0): pebble only notices it at the timeout
                    self._add_cpu(time.monotonic() - started)
                    return self._expired(code, output)
                self._add_cpu(min(time.monotonic() - started, timeout_s))
                where, tail = _stack(output)
                return {"kind": "timeout", "where": where, "tail": tail}
            except ProcessExpired as err:
                self._add_cpu(time.monotonic() - started)
                return self._expired(err.exitcode, _call_output(log_dir, token)[1])
            self._add_cpu(out["cpu"])
            return out
        raise AssertionError("unreachable")

    @staticmethod
    def _expired(code: int | None, output: str) -> dict:
        where, tail = _stack(output)
        tail = tail or "\n".join([ln for ln in output.splitlines() if ln.strip()][-TAIL_LINES:])
        if any(s in output for s in ("MemoryError", "bad_alloc", "Cannot allocate memory", "out of memory")):
            return {"kind": "memory", "error": "the process died out of memory", "tail": tail}
        names = {s.value: s.name for s in signal.Signals}
        how = f"killed by signal {names.get(-code, -code)}" if code is not None and code < 0 else f"exit code {code}"
        return {"kind": "exit", "what": f"exited the process ({how})", "error": f"the process exited ({how})",
                "where": where, "tail": tail}

    def _raise(self, out: dict, ref: FunctionRef, role: str, batch: tuple | None, timeout_s: float) -> None:
        section, kind, n = ref.field.rsplit(".", 1)[0], out["kind"], len(batch[1]) if batch is not None else 0
        on = f"on a batch of {n} sample{'s' * (n != 1)}" if batch is not None else "while loading"
        at = f" at {out['where']}" if out.get("where") else ""
        what = {"timeout": f"did not return within {timeout_s:g} s ({section}.timeout_s) {on}; it was stopped{at}; "
                           f"make it faster or raise {section}.timeout_s",
                "memory": f"exceeded its memory limit ({self.memory_mb} MiB, {section}.memory_mb) {on}; it was "
                          f"stopped; use less memory or raise {section}.memory_mb",
                "exit": f"{out.get('what')} {on}{at}; a {role} must return its scores, not end the process; fix it "
                        "and resubmit",
                "load": f"{out.get('what')}; fix it and resubmit",
                "return": f"{out.get('what')}; it must return one score (a number, or None for no score) per "
                          "completion; fix it and resubmit"}[kind]
        error = f"TimeoutError: no return within {timeout_s:g} s" if kind == "timeout" else out["error"]
        samples = list(zip(batch[0], batch[1], strict=True))[:MAX_EXAMPLES] if batch is not None else [("", "")]
        examples = [{"prompt": str(p)[:500], "completion": str(c)[:500], "error": error,
                     "traceback": out.get("tail", "")} for p, c in samples]
        summary = SampleErrorSummary(max(n, 1), max(n, 1), tuple(
            SampleError(sample=f"{e['prompt']!r} -> {e['completion']!r}"[:200], error=error[:200]) for e in examples),
            (kind,))
        err = TenantCodeError(f"your {role} {ref.text} {what}", summary)
        err.examples = examples
        raise err

    def call(self, ref: FunctionRef, prompts: list[str], completions: list[str], columns: dict[str, list], *,
             timeout_s: float, role: str = "reward function") -> CallResult:
        """Score a batch in a worker; TenantCodeError for anything but scores and per-sample raises."""
        if len(prompts) != len(completions) or any(len(v) != len(completions) for v in columns.values()):
            raise ValueError("prompts, completions and every column must be aligned")
        batch = (list(prompts), list(completions), {k: list(v) for k, v in columns.items()})
        out = self._submit(ref, batch, timeout_s)
        if out["kind"] != "ok":
            self._raise(out, ref, role, batch, timeout_s)
        failures = [SampleFailure(i, batch[0][i], batch[1][i], error, tail) for i, error, tail in out["failures"]]
        return CallResult(out["scores"], failures)

    def check(self, ref: FunctionRef, *, timeout_s: float, role: str) -> None:
        """Import the function in a worker (never here) and check it is callable; TenantCodeError if not."""
        out = self._submit(ref, None, timeout_s)
        if out["kind"] != "ok":
            self._raise(out, ref, role, None, timeout_s)

    def _stop_locked(self) -> None:
        pool, context, log_dir = self._pool, self._context, self.log_dir
        self._pool = self._context = None
        if pool is None:
            return
        pool.stop()
        self._closed.set_result(None)
        for process in context.processes:  # kill every group now: close() never waits on tenant code
            with contextlib.suppress(Exception):
                process.kill()
        # pebble's join reaps the (dead) workers and its threads; bounded, so a surprise there cannot hang close()
        joiner = threading.Thread(target=pool.join, daemon=True)
        joiner.start()
        joiner.join(10)
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the workers and everything they started (idempotent); a later call starts fresh ones."""
        with self._lock:
            self._stop_locked()
