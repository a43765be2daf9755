"""The Prefect-restart fault case of `rlhfops bench platform` (issue 16), at unit level: `infra.stack.restart_service`
against a stand-in server (a few lines of Python answering the health URL with its own PID), the bench's flag
checks (exit 2 before any stack starts), and its verdicts on hand-built MLflow runs (half-written, clear end).
The bench itself is a measurement run by hand (docs/stack.md). Wall: about 15 s."""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
import urllib.request
from types import SimpleNamespace

import pytest
from stack_helpers import base_env, cli

from common.errors import BadInput
from infra import stack as S
from infra.bench_platform import JOB_FINAL_METRICS, JOB_FINAL_TAGS, clear_end, job_run_gaps
from tests.processes import alive

#: a stand-in for `prefect server start`: answers every GET with its own PID (so the test sees which process holds
#: the port), on the port the stack's config names
STUB_SERVER = """
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if len(sys.argv) > 2:
            with open(sys.argv[2], "a") as f:
                f.write(self.path + "\\n")
        body = str(os.getpid()).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def answering_pid(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2) as r:
            return int(r.read())
    except OSError:
        return None


def test_restart_service_replaces_the_process_on_the_same_port_and_records_it(tmp_path, monkeypatch):
    cfg = S.StackConfig(tmp_path, pg_port=S.free_port(), prefect_port=S.free_port(), mlflow_port=S.free_port())
    monkeypatch.setattr(S, "prefect_command",
                        lambda c: ([sys.executable, "-c", STUB_SERVER, str(c.prefect_port)], dict(os.environ)))
    first = S._spawn("prefect", *S.prefect_command(cfg), tmp_path)
    S.write_state(tmp_path, {"config": cfg.to_json(), "sessions": {"prefect": first}})
    new = None
    try:
        S._wait_http(f"{cfg.prefect_api_url}/health", first, "prefect", tmp_path, 30)
        assert answering_pid(cfg.prefect_port) == first
        seen_while_down = []

        def sleep(s):  # the down window: nothing may answer on the port, the old process must be gone
            seen_while_down.append((s, answering_pid(cfg.prefect_port), alive(first)))

        t0 = time.time()
        rec = S.restart_service(tmp_path, "prefect", down_s=7.5, sleep=sleep, timeout_s=30, log=lambda *_: None)
        new = rec["new_pid"]
        assert seen_while_down == [(7.5, None, False)]
        assert rec["old_pid"] == first and new != first
        assert alive(new) and not alive(first)
        assert answering_pid(cfg.prefect_port) == new  # the same port, answered by the new process
        state = S.read_state(tmp_path)
        assert state["sessions"]["prefect"] == new
        assert int((tmp_path / "pids" / "prefect.pid").read_text()) == new
        assert [(r["service"], r["old_pid"], r["new_pid"]) for r in state["restarts"]] == [("prefect", first, new)]
        assert t0 <= rec["stopped_at"] <= rec["answered_at"] <= time.time()
        assert rec["down_s"] == pytest.approx(rec["answered_at"] - rec["stopped_at"])
        # `down` goes by the state file: it must stop the new process, and find nothing left
        assert S.down(tmp_path, log=lambda *_: None) == {}
        assert not alive(new)
    finally:
        for pid in (first, new):
            if pid and alive(pid):
                S.stop_session(pid, grace_s=2)


def test_restart_service_refuses_postgres_and_a_service_that_is_not_running(tmp_path):
    S.write_state(tmp_path, {"config": S.StackConfig(tmp_path).to_json(), "sessions": {}})
    with pytest.raises(BadInput, match="service: 'postgres' cannot be restarted"):
        S.restart_service(tmp_path, "postgres", log=lambda *_: None)
    with pytest.raises(S.StackError, match="prefect is not running"):
        S.restart_service(tmp_path, "prefect", log=lambda *_: None)


@pytest.mark.parametrize("args, flag", [
    (["--restart-prefect-after", "0"], "--restart-prefect-after"),
    (["--restart-prefect-after", "-5"], "--restart-prefect-after"),
    (["--restart-prefect-after", "20", "--prefect-down", "-1"], "--prefect-down"),
    (["--prefect-down", "30"], "--prefect-down"),
])
def test_bench_restart_flags_exit_2_naming_the_flag_before_any_stack_starts(tmp_path, args, flag):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "rlhfops-bench-stack-*")))
    stack = tmp_path / "stack"
    done = cli(["bench", "platform", "--dir", str(stack), *args], base_env(), tmp_path, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"error: {flag}:"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not stack.exists()
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "rlhfops-bench-stack-*"))) == before


def test_engine_entry_waits_for_the_api_then_hands_the_flow_run_to_prefects_engine(tmp_path):
    """A flow-run process started while the server is down (what a process worker does during a restart): Prefect's
    engine alone exits 1 at its first request; through infra.engine_entry it waits, and once the API answers the
    engine asks it for the flow run (the stand-in answers nonsense, so the engine then fails: that is Prefect's)."""
    import subprocess

    port, requests = S.free_port(), tmp_path / "requests.log"
    flow_run_id = "6f1d3c2a-0000-4000-8000-000000000001"
    env = {**base_env(), "PREFECT_API_URL": f"http://127.0.0.1:{port}/api", "PREFECT__FLOW_RUN_ID": flow_run_id,
           "PREFECT_HOME": str(tmp_path / "prefect-home")}
    entry = subprocess.Popen([sys.executable, "-m", "infra.engine_entry"], env=env, cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stub = None
    try:
        time.sleep(6)  # imports, then at least two refused health checks
        assert entry.poll() is None, f"exited while the API was down: {entry.stderr.read()[-2000:]}"
        stub = subprocess.Popen([sys.executable, "-c", STUB_SERVER, str(port), str(requests)], cwd=tmp_path)
        entry.wait(timeout=120)
        paths = requests.read_text().splitlines()
        assert paths[0] == "/api/health"
        assert any(flow_run_id in p for p in paths[1:]), paths
    finally:
        for proc in (entry, stub):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def run(status: str, metrics: dict | None = None, tags: dict | None = None):
    return SimpleNamespace(info=SimpleNamespace(status=status),
                           data=SimpleNamespace(metrics=metrics or {}, tags=tags or {}))


WHOLE_METRICS = {k: 1.0 for k in JOB_FINAL_METRICS} | {"best_step": 3.0}
WHOLE_TAGS = {k: "x" for k in JOB_FINAL_TAGS} | {"run_state": "SUCCEEDED"}


def test_half_written_job_runs_are_named_and_whole_ones_pass():
    version = object()
    assert job_run_gaps(run("FINISHED", WHOLE_METRICS, WHOLE_TAGS), [version]) == []
    # a job that ended FINISHED before its summary metrics and tags were written
    assert job_run_gaps(run("FINISHED", {"cost_usd": 0.1}, {}), [version]) == (
        [f"metric {k} missing" for k in JOB_FINAL_METRICS if k != "cost_usd"]
        + [f"tag {k} missing" for k in JOB_FINAL_TAGS])
    # SUCCEEDED with a kept checkpoint registers exactly one version
    assert job_run_gaps(run("FINISHED", WHOLE_METRICS, WHOLE_TAGS), []) == [
        "0 registered versions (want 1 for run_state SUCCEEDED)"]
    assert job_run_gaps(run("FINISHED", WHOLE_METRICS, WHOLE_TAGS), [version, version]) == [
        "2 registered versions (want 1 for run_state SUCCEEDED)"]
    # no checkpoint kept (best_step NaN), or a state that does not register: no version wanted
    assert job_run_gaps(run("FINISHED", WHOLE_METRICS | {"best_step": float("nan")}, WHOLE_TAGS), []) == []
    assert job_run_gaps(run("FINISHED", WHOLE_METRICS, WHOLE_TAGS | {"run_state": "STOPPED_EARLY"}), []) == []
    # a failed run says why, and registers nothing
    assert job_run_gaps(run("FAILED", tags={"failure_class": "platform_fault", "error": "ConnectError: x"}), []) == []
    assert job_run_gaps(run("KILLED", tags={"failure_class": "platform_fault", "reason": "reaped"}), []) == []
    assert job_run_gaps(run("FAILED"), [version]) == ["FAILED without a failure_class tag",
                                                      "FAILED without a reason or error tag",
                                                      "FAILED yet 1 registered versions"]


def test_clear_end_needs_a_final_prefect_state_that_mlflow_agrees_with():
    assert clear_end(True, True, run("FINISHED"), 1)
    assert clear_end(True, False, run("FAILED"), 1)  # Crashed in Prefect, closed FAILED in MLflow
    assert clear_end(True, False, run("KILLED"), 1)
    assert clear_end(True, False, None, 0)  # crashed before it opened a run: nothing written
    assert not clear_end(False, False, run("FINISHED"), 1)  # stuck Pending/Running in Prefect
    assert not clear_end(True, False, run("RUNNING"), 1)  # left RUNNING in MLflow
    assert not clear_end(True, True, run("FAILED"), 1)  # the stores disagree
    assert not clear_end(True, False, run("FINISHED"), 1)
    assert not clear_end(True, True, None, 0)  # Completed with no MLflow run: lost
    assert not clear_end(True, True, run("FINISHED"), 2)  # duplicated


def test_retry_unreachable_waits_and_retries_only_a_failure_to_reach_the_api(monkeypatch):
    """What a fresh Prefect client raises during a restart (a ConnectError, or an error raised from one, as the GPU
    slot acquisition's ConcurrencySlotAcquisitionError) is retried after waiting for the API; anything else is not."""
    import httpx

    from infra import provision

    waits = []
    monkeypatch.setattr(provision, "wait_for_api", lambda *a, **k: waits.append(1) or 0.0)

    def failing(errors):
        calls = []

        def fn():
            calls.append(1)
            if errors:
                raise errors.pop(0)
            return "done"
        return fn, calls

    def raised_from(err):
        try:
            raise err
        except Exception as inner:
            try:
                raise RuntimeError("Unable to acquire concurrency slots") from inner
            except RuntimeError as outer:
                return outer

    fn, calls = failing([httpx.ConnectError("refused"), raised_from(httpx.ConnectError("refused"))])
    assert provision.retry_unreachable(fn) == "done" and len(calls) == 3 and len(waits) == 2
    waits.clear()
    fn, calls = failing([ValueError("bad")])
    with pytest.raises(ValueError):
        provision.retry_unreachable(fn)
    assert len(calls) == 1 and waits == []
    fn, calls = failing([httpx.ConnectError("refused")] * 3)
    with pytest.raises(httpx.ConnectError):
        provision.retry_unreachable(fn, attempts=3)
    assert len(calls) == 3 and len(waits) == 2
