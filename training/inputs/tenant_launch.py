"""Launching a tenant-code worker (training/inputs/tenant_code.py's pool): exec'd fresh with a clean environment, in
the bubblewrap sandbox of training/inputs/sandbox.py (or, when the operator switched it off, as the trainer's user in
a process group of its own), killed whole.

`_CleanPopen` is the stdlib's spawn launcher with these changes: the child is exec'd through `env -i` with the
allow-listed environment (sandboxed: `env -i bwrap ... -- python ...`, so bwrap's own PID 1 keeps no variable of the
trainer's); it gets neither the trainer's __main__ (never re-run there), argv (may carry secrets) nor authkey (would
let it talk to the trainer's multiprocessing managers); a pipe whose end the trainer holds tells it when the trainer
is gone; and every signal becomes SIGKILL of the whole sandbox (its PID namespace) or of the worker's process group.
`_CleanPopen._launch` follows CPython 3.11-3.13's.
"""

from __future__ import annotations

import io
import multiprocessing.context
import multiprocessing.synchronize
import os
import signal
import sys
import uuid
from multiprocessing import popen_spawn_posix, reduction, spawn, util
from pathlib import Path

from training.inputs import sandbox as sandboxes

#: the program that execs the worker (or bwrap) with nothing but the allow-listed environment
ENV_PROGRAM = "/usr/bin/env"


class _Recorder(reduction.ForkingPickler):
    """Pickles like multiprocessing's spawn and notes the named semaphores (the pool channel's locks) it passes:
    inside the sandbox the worker opens them by their /dev/shm files."""

    def __init__(self, file, protocol=None):
        super().__init__(file, protocol)
        self.semaphores: list[str] = []

    def reducer_override(self, obj):
        if isinstance(obj, multiprocessing.synchronize.SemLock) and getattr(obj._semlock, "name", None):
            self.semaphores.append("/dev/shm/sem." + obj._semlock.name.lstrip("/"))
        return NotImplemented


class _CleanPopen(popen_spawn_posix.Popen):
    def _launch(self, process_obj):  # CPython's Popen._launch, changes marked
        from multiprocessing import resource_tracker

        tracker_fd = resource_tracker.getfd()
        self._fds.append(tracker_fd)
        process_obj.authkey = os.urandom(32)  # changed: a key of its own
        alive_r, alive_w = os.pipe()  # changed: the worker reads EOF on alive_r once this process is gone
        self._fds.append(alive_r)
        process_obj.alive_fd = alive_r
        prep_data = spawn.get_preparation_data(process_obj._name)
        for key in ("init_main_from_name", "init_main_from_path"):  # changed: the worker needs nothing from __main__
            prep_data.pop(key, None)
        prep_data.update(sys_argv=["rlhfops-tenant-worker"], authkey=process_obj.authkey,  # changed
                         dir=str(process_obj.launch.cwd))  # the trainer's own folder is not the worker's
        fp = io.BytesIO()
        multiprocessing.context.set_spawning_popen(self)
        try:
            semaphores = []  # changed: notes the semaphores it passes
            for obj in (prep_data, process_obj):
                pickler = _Recorder(fp)
                pickler.dump(obj)
                semaphores += pickler.semaphores
        finally:
            multiprocessing.context.set_spawning_popen(None)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            # changed: env -i execs the interpreter (or bwrap) with only these variables (the pid stays the same)
            launch = process_obj.launch
            if launch.sandbox == "bwrap":
                prefix = sandboxes.argv(launch.bwrap, cwd=launch.cwd, log_dir=launch.log_dir,
                                        scratch_mb=launch.scratch_mb, env=launch.env, extra_ro=launch.extra_ro,
                                        shm=semaphores)
                argv = [ENV_PROGRAM, "-i", *prefix, *cmd]
            else:
                argv = [ENV_PROGRAM, "-i", *[f"{k}={v}" for k, v in launch.env.items()], *cmd]
            self.sandboxed = launch.sandbox == "bwrap"
            self.pid = util.spawnv_passfds(os.fsencode(ENV_PROGRAM), argv, self._fds)
            self.sentinel = parent_r
            if self.sandboxed:  # changed: a pids cgroup bounds the sandbox's processes before the worker has its task
                self.cgroup = sandboxes.confine(self.pid, process_obj.worker_tag)
            os.write(alive_w, f"{self.pid}\n".encode())  # changed: the worker's pid as this process sees it
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            self.finalizer = util.Finalize(self, util.close_fds,
                                           [fd for fd in (parent_r, parent_w, alive_w) if fd is not None])
            for fd in (child_r, child_w, alive_r):
                if fd is not None:
                    os.close(fd)

    def _kill_group(self) -> bool:
        if getattr(self, "sandboxed", False):
            # bwrap: its sandbox's init dies with it (--die-with-parent), and with the init the whole PID namespace
            try:
                os.kill(self.pid, signal.SIGKILL)
                return True
            except ProcessLookupError:
                return False
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
        code = super().poll(flag)
        if code is not None and getattr(self, "sandboxed", False):
            if code > 128:  # bwrap exits 128 + N when the worker was killed by signal N: say it as multiprocessing does
                self.returncode = code = -(code - 128)
            if sandboxes.release(getattr(self, "cgroup", None)):
                self.cgroup = None
        return code


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    @staticmethod
    def _Popen(process_obj):
        return _CleanPopen(process_obj)


class Launch:
    """How the pool's workers start: the sandbox (`bwrap` or `none`), bwrap's path, the config folder, the log folder
    (the host's), the scratch size, FILE.py refs outside the folder (read-only), the allow-listed environment."""

    def __init__(self, sandbox: str, cwd: Path, log_dir: Path, scratch_mb: int, env: dict[str, str],
                 extra_ro: tuple[str, ...] = ()):
        self.sandbox, self.cwd, self.log_dir, self.scratch_mb = sandbox, cwd, log_dir, scratch_mb
        self.env, self.extra_ro = env, extra_ro
        self.bwrap = sandboxes.find_bwrap() if sandbox == "bwrap" else None

    def __reduce__(self):  # never pickled into a worker: it holds nothing the worker needs
        return (type(None), ())


class _Context(multiprocessing.context.SpawnContext):
    """A spawn context whose processes start as `launch` says; it keeps them so close() can kill them all."""

    def __init__(self, launch: Launch):
        self.launch = launch
        self.processes: list[_WorkerProcess] = []

    def Process(self, *args, **kwargs):  # noqa: N802 (multiprocessing's name)
        process = _WorkerProcess(*args, **kwargs)
        process.launch = self.launch
        process.worker_tag = uuid.uuid4().hex[:12]  # names its log file (its pid inside a sandbox is not ours)
        # the newest 64: every live worker (the newest ones) and the recently ended (their exit codes are looked up)
        self.processes = [*self.processes[-63:], process]
        return process


def worker_env(cwd: Path, extra: dict[str, str] | None, sandbox: str = "none") -> dict[str, str]:
    """An allow-list: nothing of the platform's settings (PREFECT_*, MLFLOW_*, DATABASE_URL, tokens) gets through.
    Sandboxed, TMPDIR is the sandbox's private scratch /tmp and PATH the system's."""
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(cwd), "LANG": os.environ.get("LANG", "C.UTF-8"),
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONDONTWRITEBYTECODE": "1"}  # no __pycache__ left in the tenant's folder
    env.update({k: os.environ[k] for k in ("LC_ALL", "TMPDIR", "PYTHONHASHSEED") if k in os.environ})
    if sandbox == "bwrap":
        env.update(TMPDIR="/tmp", PATH=f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin")
    env.update(extra or {})
    return env
