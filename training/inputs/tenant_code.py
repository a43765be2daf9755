"""Run the tenant's own code (a reward or gate function, FILE.py:NAME or package.module:NAME) outside the trainer.

Tenant code is untrusted: it may hang, exit, crash, eat memory, start processes, read the environment or the host's
files, signal processes or open connections; none of that may take the trainer down, reach the platform or another
tenant, or count as a platform fault. `TenantFunctionPool` runs it in the workers of a `pebble.ProcessPool`
(per-call timeouts, killed workers replaced), each one (training/inputs/tenant_launch.py)
- exec'd fresh (spawn, never forked) through `env -i` with an allow-list environment (PATH, LANG, LC_ALL, TMPDIR,
  PYTHONHASHSEED; HOME = the config's folder; one OpenMP/BLAS thread; plus `env`), without the trainer's __main__,
  argv or multiprocessing authkey;
- inside the bubblewrap sandbox of training/inputs/sandbox.py: its own PID and network namespaces, a filesystem of
  the runtime, the platform's worker code and the config's folder read-only and a private scratch /tmp, an
  unprivileged user with no capabilities, a bound on its processes; the whole sandbox is SIGKILLed on every kill
  (timeout, close, a crash noticed) and dies with the trainer. The operator may switch it off
  (RLHFOPS_TENANT_SANDBOX=none): then the worker leads its own process group, killed whole, as the trainer's user;
- limited to `memory_mb` of address space (RLIMIT_AS; no core files), in the config's folder (cwd, sys.path[0]),
  with its stdout/stderr (prints, faulthandler's dumps) in `log_dir`; a watchdog thread ends it once the trainer is
  gone (EOF on a pipe the trainer holds).

The call is TRL's, by keyword (training/inputs/tenant_worker.py); the function's signature is checked when it is
loaded (`check`), a mismatch is BadInput. Every other failure is a `TenantCodeError` (eval/attribution.py) with one
line in the runbook's words naming the role and the function ("your reward function my_reward.py:score did not
return within 30 s (reward.timeout_s) on a batch of 64 samples; it was stopped ..."), `examples` (prompt,
completion, error, traceback tail) and a summary. A batch that raises is re-run one sample at a time within the same
timeout: samples that raise score None, as `SampleFailure`s. A score is None or a finite real number (int, float,
numpy/torch scalars, bool as 1.0/0.0 like TRL); a str, NaN, inf, or any count but one score per completion is
refused (never broadcast or truncated).

Limits: unsandboxed, the worker runs as the trainer's OS user (its files, the trainer's /proc/<pid>/environ) and
children moved to another session (setsid) escape the group kill. The watchdog needs the GIL.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, wait
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pebble import ProcessExpired, ProcessPool

from common.errors import BadInput
from eval.attribution import PlatformError, SampleError, SampleErrorSummary, TenantCodeError
from training.inputs import sandbox as sandboxes
from training.inputs.tenant_launch import Launch, _Context, worker_env
from training.inputs.tenant_worker import LOG_NAME, TAIL_LINES, _init_worker, _run

#: how long a call may wait for a worker to start on top of its own timeout (spawn imports on a loaded machine)
START_GRACE_S = 120.0
#: examples of a whole-batch failure kept on the error (the batch's first samples, to reproduce it)
MAX_EXAMPLES = 3


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
    metrics: dict[str, float] = field(default_factory=dict)  # log_metric's means over the call


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


# ---- the trainer's side -----------------------------------------------------------------------------------------


def _call_output(log_dir: Path, token: str) -> tuple[str | None, str]:
    """(the worker's tag, what it wrote during the call marked `token`: prints, faulthandler's dump), from its log."""
    marker = f"== {token} =="
    for path in log_dir.glob(LOG_NAME.format("*")):
        with contextlib.suppress(OSError), path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 2**20))
            text = f.read().decode(errors="replace")
            if marker in text:
                return path.stem.split("-", 1)[1], text.split(marker, 1)[1]
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

    def __init__(self, cwd: Path, workers: int = 2, memory_mb: int = 2048, env: dict[str, str] | None = None,
                 sandbox: str | None = None):
        """`sandbox`: `bwrap` or `none`; by default what the operator's RLHFOPS_TENANT_SANDBOX says, and a machine
        without a working bwrap is refused here (sandbox.SandboxUnavailable, BadInput)."""
        self.cwd = Path(cwd).resolve()
        if not self.cwd.is_dir():
            raise ValueError(f"tenant code working directory {self.cwd} is not a folder")
        self.workers, self.memory_mb = min(max(1, int(workers)), 32), int(memory_mb)  # _Context keeps 64
        self.sandbox = sandbox or sandboxes.require()
        self.env = worker_env(self.cwd, env, self.sandbox)
        self._extra_ro: tuple[str, ...] = ()  # FILE.py refs outside the folder, mounted read-only in the sandbox
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
        """Start the pool if need be (first use, broken by a worker that died idle, or a FILE.py ref outside the
        folder the sandbox does not show yet) and hand it the call."""
        ref = args[0]
        with self._lock:
            if (self.sandbox == "bwrap" and ref.file is not None and not ref.file.is_relative_to(self.cwd)
                    and str(ref.file) not in self._extra_ro):
                self._extra_ro = (*self._extra_ro, str(ref.file))
                self._stop_locked()
            if self._pool is not None and not self._pool.active:
                self._stop_locked()
            if self._pool is None:
                self._start_locked()
            future = self._pool.schedule(_run, args=args, timeout=args[2])
            return future, self._closed, self._context, self.log_dir

    def _start_locked(self) -> None:
        self.log_dir = Path(tempfile.mkdtemp(prefix="rlhfops-tenant-"))
        launch = Launch(self.sandbox, self.cwd, self.log_dir, self.memory_mb, self.env, self._extra_ro)
        if self.sandbox == "bwrap":
            # bwrap refusing to set up (a mount, a namespace) is the platform's fault, never the tenant's: ask it once
            try:
                sandboxes.check_argv(sandboxes.argv(launch.bwrap, cwd=self.cwd, log_dir=self.log_dir,
                                                    scratch_mb=self.memory_mb, env=self.env, extra_ro=self._extra_ro))
            except RuntimeError as err:
                raise PlatformError(str(err)) from None
            initargs = (str(self.cwd), self.memory_mb, sandboxes.LOG_INSIDE, 0, sandboxes.MAX_TASKS)
        else:
            initargs = (str(self.cwd), self.memory_mb, str(self.log_dir), os.getpid(), 0)
        self._context = _Context(launch)
        self._pool = ProcessPool(max_workers=self.workers, context=self._context, initializer=_init_worker,
                                 initargs=initargs)
        self._closed = Future()  # done when this pool is stopped: calls under way end then

    def _add_cpu(self, seconds: float) -> None:
        with self._lock:
            self.cpu_seconds += seconds

    def _submit(self, ref: FunctionRef, batch: tuple | None, timeout_s: float, columns: tuple[str, ...] = ()) -> dict:
        for attempt in (1, 2):
            token = uuid.uuid4().hex
            future, closed, context, log_dir = self._schedule(ref, batch, timeout_s, token, columns)
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
                tag, output = _call_output(log_dir, token)
                code = next((p.exitcode for p in context.processes if getattr(p, "worker_tag", None) == tag), None)
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
                "signature": "",
                "return": f"{out.get('what')}; it must return one score (a number, or None for no score) per "
                          "completion; fix it and resubmit"}[kind]
        if kind == "signature":  # bad input: the function cannot be called as the contract says
            raise BadInput(f"{ref.field}: {ref.text}: {out['what']}")
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

    def call(self, ref: FunctionRef, prompts: list, completions: list[str], columns: dict[str, list], *,
             timeout_s: float, role: str = "reward function", completion_ids: list[list[int]] | None = None,
             step: int = 0, max_steps: int = 0) -> CallResult:
        """Score a batch in a worker (called as TRL calls a reward function: training/inputs/tenant_worker.py);
        TenantCodeError for anything but scores and per-sample raises."""
        if len(prompts) != len(completions) or any(len(v) != len(completions) for v in columns.values()):
            raise ValueError("prompts, completions and every column must be aligned")
        extra = {"completion_ids": [list(map(int, c)) for c in completion_ids] if completion_ids is not None else None,
                 "step": int(step), "max_steps": int(max_steps)}
        batch = (list(prompts), list(completions), {k: list(v) for k, v in columns.items()}, extra)
        out = self._submit(ref, batch, timeout_s)
        if out["kind"] != "ok":
            self._raise(out, ref, role, batch, timeout_s)
        failures = [SampleFailure(i, batch[0][i], batch[1][i], error, tail) for i, error, tail in out["failures"]]
        return CallResult(out["scores"], failures, dict(out.get("metrics") or {}))

    def check(self, ref: FunctionRef, *, timeout_s: float, role: str, columns: list[str] | tuple[str, ...] = ()
              ) -> None:
        """Import the function in a worker (never here), check it is callable and takes the keywords it will be
        called with (TRL's and `columns`): TenantCodeError if it cannot be loaded, BadInput on its signature."""
        out = self._submit(ref, None, timeout_s, tuple(columns))
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
        for process in context.processes:  # the sandboxes' pids cgroups, once their processes are gone
            sandboxes.release(getattr(getattr(process, "_popen", None), "cgroup", None), wait_s=2.0)
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the workers and everything they started (idempotent); a later call starts fresh ones."""
        with self._lock:
            self._stop_locked()
