"""The sandbox around every tenant-code worker: bubblewrap (`bwrap`, Debian's `bubblewrap`), never namespace code of
our own.

Each worker of `TenantFunctionPool` (training/inputs/tenant_code.py) is exec'd as `env -i bwrap ARGS -- python ...`:
bwrap itself starts from an emptied environment (with `--unshare-pid` bwrap stays PID 1 inside, and its
/proc/1/environ would show whatever bwrap was started with). Inside, the worker has
- its own PID namespace (`--unshare-pid`, a fresh /proc): it sees no platform process and can signal none; the
  namespace dies with bwrap (`--die-with-parent`: bwrap with the trainer, the namespace's init with bwrap), so every
  process the tenant started, `setsid` or not, dies when the worker is killed or the trainer goes;
- its own network namespace with only a loopback of its own (`--unshare-net`; also IPC, UTS, cgroup);
- a filesystem of its own: an empty root with, read-only, the system's /usr (and /bin, /lib... as their links), the
  Python runtime and installed packages (sys.prefix, sys.base_prefix), the platform's packages the worker imports
  (`WORKER_PACKAGES`), the job's config folder (its working directory) and a FILE.py ref outside it; writable, a
  private tmpfs scratch `/tmp` (TMPDIR) of `memory_mb` and the pool's log folder; nothing else of the host (no other
  tenant's folder, run root, MLflow store or home directory);
- an unprivileged user (`--unshare-user --uid 65534`: nobody, even when the platform runs as root), no capabilities
  (`--cap-drop ALL`), no new privileges (bwrap sets PR_SET_NO_NEW_PRIVS), a session of its own (`--new-session`),
  at most `MAX_TASKS` processes and threads (RLIMIT_NPROC, counted per user namespace: a fork bomb is bounded) and
  `memory_mb` of address space (the worker sets both);
- the allow-list environment of `tenant_code._worker_env`, set with `--setenv`.

The operator's switch: `RLHFOPS_TENANT_SANDBOX=none` in the platform's environment runs tenant code unsandboxed (a
single-user machine). It is an environment setting, never a config key: a tenant cannot switch the sandbox off. A job
with tenant code on a machine without a working bwrap fails before it takes a slot (`require`: BadInput, exit 2: the
job cannot run as submitted here, retrying will not help, and the line says what to install).

Must stay light: the request's check calls `require` before the model stack loads (no torch, no transformers).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from common.errors import BadInput

#: the operator's switch (environment only): unset or `bwrap` sandboxes tenant code, `none` does not
SANDBOX_ENV = "RLHFOPS_TENANT_SANDBOX"
#: the one command that installs the tool (Debian/Ubuntu; `dnf install bubblewrap` on Fedora/RHEL)
INSTALL = "apt-get install -y bubblewrap"
#: the sandbox's user and group inside its user namespace (nobody/nogroup)
SANDBOX_UID = 65534
#: processes and threads the sandbox's user may have (RLIMIT_NPROC, per user namespace since Linux 5.14): bounds a
#: fork bomb; the worker itself uses about 6 (bwrap's init, the interpreter, pebble's and the watchdog's threads)
MAX_TASKS = 128
#: where the pool's log folder is mounted inside (the worker's stdout/stderr)
LOG_INSIDE = "/run/rlhfops/log"
#: the platform's packages a worker imports (the pool's worker side: training.inputs.tenant_code, common.errors,
#: eval.attribution), mounted read-only from where this process loaded them
WORKER_PACKAGES = ("common", "eval", "training")
#: host paths whose read-only view the runtime needs besides the Python prefixes (those missing are skipped)
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc/ld.so.cache",
                "/etc/localtime")


class SandboxUnavailable(BadInput):
    """No working sandbox on this machine for a job with tenant code (exit 2, before any slot is taken)."""


def mode() -> str:
    """`bwrap` (the default) or `none` (the operator's RLHFOPS_TENANT_SANDBOX=none); BadInput on another value."""
    value = os.environ.get(SANDBOX_ENV, "").strip().lower()
    if value in ("", "bwrap"):
        return "bwrap"
    if value == "none":
        return "none"
    raise SandboxUnavailable(f"{SANDBOX_ENV}={value!r}: use 'bwrap' (the default: tenant code runs in a bubblewrap "
                             "sandbox) or 'none' (the operator's single-user machine)")


def find_bwrap() -> str | None:
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.access("/usr/bin/bwrap", os.X_OK) else None)


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str | None:
    """None when bwrap can build this module's kind of sandbox here, else its error (one line)."""
    argv = [bwrap, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-all", "--unshare-user",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--cap-drop", "ALL", "--die-with-parent",
            "--new-session", "--", "/bin/true"]
    try:
        done = subprocess.run(argv, env={}, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"{type(err).__name__}: {err}"
    if done.returncode != 0:
        return " ".join(done.stderr.decode(errors="replace").split())[:200] or f"exit code {done.returncode}"
    return None


def require() -> str:
    """The sandbox tenant code runs in: `bwrap`, checked to work here, or `none` when the operator said so;
    SandboxUnavailable (exit 2) in one line naming the tool and how to install it otherwise."""
    if mode() == "none":
        return "none"
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailable(
            f"tenant code runs only in a sandbox and bubblewrap (bwrap) is not installed on this machine: install "
            f"it ({INSTALL}), or on a single-user machine the operator may set {SANDBOX_ENV}=none")
    problem = _probe(bwrap)
    if problem is not None:
        raise SandboxUnavailable(
            f"tenant code runs only in a sandbox and bubblewrap ({bwrap}) cannot make one on this machine "
            f"({problem}): allow unprivileged user namespaces or run as root, or on a single-user machine the "
            f"operator may set {SANDBOX_ENV}=none")
    return "bwrap"


def describe() -> str:
    """What a job's records say about the sandbox its tenant code ran in: `bwrap` or `none` (never raises)."""
    try:
        return mode()
    except BadInput:
        return "invalid"


def _chain(path: str, depth: int = 0) -> tuple[list[tuple[str, str]], str]:
    """([(link, its target as written)] met while resolving `path`, the real path): inside, the same links are made
    so that `path` resolves as it does here."""
    links: list[tuple[str, str]] = []
    at = "/"
    for part in Path(os.path.abspath(path)).parts[1:]:
        here = os.path.join(at, part)
        if os.path.islink(here) and depth < 32:
            target = os.readlink(here)
            links.append((here, target))
            sub, at = _chain(os.path.normpath(os.path.join(at, target)), depth + 1)
            links += sub
        else:
            at = here
    return links, at


def _package_dirs() -> list[str]:
    out = []
    for name in WORKER_PACKAGES:
        module = sys.modules.get(name)
        out += list(getattr(module, "__path__", []) or [])
    return out


def filesystem(cwd: Path, extra_ro: list[str] | tuple[str, ...] = ()) -> list[str]:
    """bwrap's arguments for the worker's view of the filesystem (see the module docstring), without the scratch
    and log mounts."""
    wanted = [p for p in SYSTEM_PATHS if os.path.lexists(p)]
    wanted += [sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    wanted += _package_dirs() + [str(cwd), *map(str, extra_ro)]
    links: dict[str, str] = {}
    binds: list[str] = []
    for path in wanted:
        chain, real = _chain(path)
        links.update(chain)
        if os.path.exists(real):
            binds.append(real)
    binds = sorted(set(binds), key=lambda p: (p.count("/"), p))
    kept: list[str] = []
    for path in binds:  # a path inside one already mounted is there
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    args: list[str] = []
    for path in kept:
        args += ["--ro-bind", path, path]
    for link, target in links.items():
        if not any(link.startswith(k.rstrip("/") + "/") for k in kept) and link not in kept:
            args += ["--symlink", target, link]
    return args


def argv(bwrap: str, *, cwd: Path, log_dir: Path, scratch_mb: int, env: dict[str, str],
         extra_ro: list[str] | tuple[str, ...] = (), shm: list[str] | tuple[str, ...] = ()) -> list[str]:
    """bwrap's command line up to and including `--`: the worker's command follows. `shm`: the POSIX semaphores
    (/dev/shm files) of the pool's channel the worker must open."""
    args = [bwrap, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "tenant",
            "--proc", "/proc", "--dev", "/dev", "--size", str(int(scratch_mb) * 2**20), "--tmpfs", "/tmp"]
    args += filesystem(cwd, extra_ro)
    args += ["--bind", str(log_dir), LOG_INSIDE]
    for path in shm:
        args += ["--bind", path, path]
    args += ["--chdir", str(cwd), "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return [*args, "--"]


def check_argv(args: list[str]) -> None:
    """Run `args` (an `argv(...)` prefix) with /bin/true: RuntimeError with bwrap's words when it cannot set up the
    sandbox (a platform fault, never the tenant's)."""
    done = subprocess.run([*args, "/bin/true"], env={}, capture_output=True, timeout=60, check=False)
    if done.returncode != 0:
        words = " ".join(done.stderr.decode(errors="replace").split())[:300]
        raise RuntimeError(f"the tenant-code sandbox could not start: {words or f'exit code {done.returncode}'}")


#: where a sandbox's pids cgroup is made when this process may (root): cgroup v1's pids controller or v2's tree
CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


def _tree(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def confine(pid: int, tag: str, limit: int = MAX_TASKS) -> str | None:
    """Put the sandbox started as `pid` (bwrap) and everything under it into a pids cgroup of its own bounded at
    `limit` tasks; the cgroup's path, or None when this process cannot make one. RLIMIT_NPROC (set inside) does not
    bound a platform that runs as root: the sandbox's user is root outside its namespace, which the kernel exempts.
    Called before the worker is handed its task, so whatever the tenant starts is born inside it."""
    for root in CGROUP_ROOTS:
        base = Path(root)
        if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
            continue
        group = base / f"rlhfops-tenant-{tag}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / "pids.max").write_text(str(limit))
            todo = [pid]
            while todo:  # move, then list its children: a child born after the move is born inside
                p = todo.pop()
                with contextlib.suppress(ProcessLookupError, OSError):
                    (group / "cgroup.procs").write_text(str(p))
                todo += _tree(p)
            return str(group)
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
    return None


def release(group: str | None, wait_s: float = 0.0) -> bool:
    """Remove a sandbox's pids cgroup once its processes are gone (waiting up to `wait_s` for them); True when it is
    gone."""
    end = time.monotonic() + wait_s
    while group:
        try:
            os.rmdir(group)
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)
        else:
            return True
    return True
