"""The sandbox around tenant code (training/inputs/sandbox.py), tried as a hostile tenant would: one reward function
file per escape, driven through the real pool. Each test asserts that the attempt failed (the function reports what
it managed, and the host is checked too), that the job went on (the pool answers the next call) and that the trainer
(this process) lives. The escapes: another process's environment, signalling the trainer, another tenant's folder
read and written, a connection to a service on 127.0.0.1, a detached (setsid) child outliving the job, a fork bomb.
Without a working bwrap these tests fail: the platform's set-up installs it (README)."""

from __future__ import annotations

import os
import socket
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from common.errors import BadInput
from training.inputs import sandbox
from training.inputs.tenant_code import FunctionRef, TenantFunctionPool, parse_ref

MEMORY_MB = 1024
SECRET = "s3cr3t-" + uuid.uuid4().hex


def tenant(folder: Path, name: str, code: str, fn: str = "score") -> FunctionRef:
    (folder / f"{name}.py").write_text(textwrap.dedent(code))
    return parse_ref(f"{name}.py:{fn}", folder, "reward.ref")


def procs_with(marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in "ZX":
                        out.append(int(entry.name))
            except OSError:
                continue
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tenant-a")


@pytest.fixture(scope="module")
def pool(folder):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RLHFOPS_SECRET_TOKEN", SECRET)  # a platform setting in the trainer's environment
        with TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB, sandbox="bwrap") as p:
            yield p


@pytest.fixture(scope="module")
def good(folder) -> FunctionRef:
    return tenant(folder, "good_reward", """
        def score(completions, **kwargs):
            return [float(len(c)) for c in completions]
    """)


def went_on(pool, good) -> None:
    """The job went on (the pool answers) and the trainer lives (this process, its pid unchanged)."""
    assert pool.call(good, ["p", "q"], ["ab", "abcd"], {}, timeout_s=30).scores == [2.0, 4.0]
    assert os.getpid() == TRAINER_PID and os.path.exists(f"/proc/{TRAINER_PID}")


TRAINER_PID = os.getpid()


def test_another_process_environment_is_out_of_reach(pool, folder, good, monkeypatch):
    monkeypatch.setenv("RLHFOPS_SECRET_TOKEN", SECRET)
    ref = tenant(folder, "environ_reward", f"""
        import os
        def score(completions, trainer, **kwargs):
            seen = ""
            for pid in [trainer[0], 1, os.getppid()] + [p for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    seen += open(f"/proc/{{pid}}/environ", "rb").read().decode(errors="replace")
                except OSError:
                    pass
            seen += repr(dict(os.environ))
            return [float({SECRET!r} in seen), float("RLHFOPS" in seen or "PYTEST" in seen)]
    """)
    got = pool.call(ref, ["p", "q"], ["a", "b"], {"trainer": [os.getpid()] * 2}, timeout_s=30)
    assert got.scores == [0.0, 0.0] and got.errors == []
    went_on(pool, good)


def test_the_trainer_cannot_be_found_or_signalled(pool, folder, good):
    ref = tenant(folder, "signal_reward", """
        import os, signal
        def score(completions, trainer, **kwargs):
            sent = 0.0
            for sig in (0, signal.SIGTERM):
                try:
                    os.kill(trainer[0], sig)
                    sent += 1
                except OSError:
                    pass
            others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
            return [sent, float(len(others))]
    """)
    got = pool.call(ref, ["p", "q"], ["a", "b"], {"trainer": [os.getpid()] * 2}, timeout_s=30)
    assert got.scores[0] == 0.0  # neither signal 0 nor SIGTERM reached anyone by the trainer's pid
    assert got.scores[1] <= 2.0  # only the sandbox's own processes are there (its init, the worker, a thread's pid)
    went_on(pool, good)


def test_another_tenants_folder_is_neither_read_nor_written(pool, folder, good, tmp_path):
    other = tmp_path / "tenant-b"
    other.mkdir()
    (other / "data.jsonl").write_text(SECRET)
    ref = tenant(folder, "folder_reward", f"""
        import os
        def score(completions, **kwargs):
            read = wrote = 0.0
            for path in [{str(other / "data.jsonl")!r}, "/root/.bashrc", "/etc/shadow"]:
                try:
                    read += float({SECRET!r} in open(path).read() or path != {str(other / "data.jsonl")!r})
                except OSError:
                    pass
            for path in [{str(other / "planted.txt")!r}, "own-folder.txt"]:
                try:
                    open(path, "w").write("x")
                    wrote += 1
                except OSError:
                    pass
            scratch = os.path.join(os.environ["TMPDIR"], "scratch.txt")
            open(scratch, "w").write("ok")  # its private scratch is writable
            return [read, wrote, float(open(scratch).read() == "ok")]
    """)
    got = pool.call(ref, ["p"] * 3, ["a"] * 3, {}, timeout_s=30)
    assert got.scores == [0.0, 0.0, 1.0]
    assert not (other / "planted.txt").exists() and not (folder / "own-folder.txt").exists()
    went_on(pool, good)


def test_a_service_on_the_hosts_loopback_is_unreachable(pool, folder, good):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    ref = tenant(folder, "net_reward", f"""
        import socket
        def score(completions, **kwargs):
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
                return [1.0] * len(completions)
            except OSError:
                return [0.0] * len(completions)
    """)
    try:
        got = pool.call(ref, ["p"], ["a"], {}, timeout_s=30)
        with pytest.raises(TimeoutError):
            server.accept()  # nobody came
    finally:
        server.close()
    assert got.scores == [0.0]
    went_on(pool, good)


def test_a_detached_child_does_not_outlive_the_job(folder, good):
    marker = f"600.{uuid.uuid4().int % 10**9:09d}"
    ref = tenant(folder, "detach_reward", f"""
        import subprocess
        def score(completions, **kwargs):
            subprocess.Popen(["setsid", "sleep", {marker!r}], start_new_session=True)
            return [1.0] * len(completions)
    """)
    with TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB, sandbox="bwrap") as own:
        assert own.call(ref, ["p"], ["a"], {}, timeout_s=30).scores == [1.0]
        end = time.monotonic() + 10
        while not procs_with(marker) and time.monotonic() < end:
            time.sleep(0.05)
        assert procs_with(marker)  # it runs while the job does
        went_on(own, good)
    end = time.monotonic() + 10
    while procs_with(marker) and time.monotonic() < end:
        time.sleep(0.1)
    assert not procs_with(marker)  # the job's end took it along


def test_a_fork_bomb_is_bounded(folder, good):
    ref = tenant(folder, "bomb_reward", """
        import os, time
        def score(completions, **kwargs):
            children = 0
            while children < 5000:
                try:
                    pid = os.fork()
                except OSError:
                    break
                if pid == 0:
                    time.sleep(60)
                    os._exit(0)
                children += 1
            return [float(children)] * len(completions)
    """)
    with TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB, sandbox="bwrap") as own:
        got = own.call(ref, ["p"], ["a"], {}, timeout_s=60)
        assert 0 < got.scores[0] < sandbox.MAX_TASKS
        went_on(own, good)


def test_the_worker_is_an_unprivileged_user_with_no_capabilities(pool, folder, good):
    ref = tenant(folder, "whoami_reward", """
        import os
        def score(completions, **kwargs):
            status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
            return [float(os.getuid()), float(int(status["CapEff"].strip(), 16)), float(status["NoNewPrivs"].strip())]
    """)
    assert pool.call(ref, ["p"] * 3, ["a"] * 3, {}, timeout_s=30).scores == [65534.0, 0.0, 1.0]
    went_on(pool, good)


def test_without_a_working_bwrap_a_job_with_tenant_code_is_refused_in_one_line(monkeypatch, folder):
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    with pytest.raises(BadInput) as info:
        sandbox.require()
    line = str(info.value)
    assert "\n" not in line and "bubblewrap (bwrap)" in line and sandbox.INSTALL in line
    assert f"{sandbox.SANDBOX_ENV}=none" in line
    with pytest.raises(BadInput):
        TenantFunctionPool(folder, workers=1)
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "none")  # the operator's switch
    assert sandbox.require() == "none" and TenantFunctionPool(folder, workers=1).sandbox == "none"
    monkeypatch.setenv(sandbox.SANDBOX_ENV, "off")
    with pytest.raises(BadInput, match="use 'bwrap'"):
        sandbox.require()
