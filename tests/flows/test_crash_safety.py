"""Crash safety without Prefect: the registry's `best` alias, the MLflow run reaper, the run-directory lock, the
API-outage wait and the resumed job's history. MLflow is a real SQLite store in a temp directory."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from infra import tracking as T

RLHFOPS = [sys.executable, "-m", "rlhfops.cli"]




def _checkpoint(tmp_path: Path, name: str) -> str:
    d = tmp_path / "ckpt" / name
    d.mkdir(parents=True)
    (d / "weights.txt").write_text(name)
    return str(d)


def _register(tmp_path, job: str, score: float, run_state: str, model: str) -> dict:
    from tasks.training import register_checkpoint

    run_id, _ = T.open_run(f"test/{model}/{job}", job)
    best = {"checkpoint": _checkpoint(tmp_path, job), "step": 4, "eval_score": score, "eval_se": 0.01}
    out = register_checkpoint.fn(run_id, model, best, "acme", job, run_state=run_state)
    T.finish(run_id)
    return {**out, "run_id": run_id}


def _best_run(model: str) -> str:
    return T.client().get_model_version_by_alias(model, "best").run_id


# ---------------------------------------------------------------------------------------------------------
# the registry's best alias


def test_a_failed_run_never_takes_best_even_with_the_highest_score(store, tmp_path, model):
    good = _register(tmp_path, "good", 0.10, "SUCCEEDED", model)
    bad = _register(tmp_path, "bad", 0.90, "FAILED(algorithmic_non_convergence)", model)
    assert good["alias_best"] and not bad["alias_best"]
    assert _best_run(model) == good["run_id"]


def test_a_run_paused_by_the_gate_ends_succeeded_and_can_take_best(store, tmp_path, model):
    from eval.detectors import make_detector
    from eval.health import Catalog
    from eval.states import RunState
    from eval.supervisor import RunSupervisor

    # the label a gate-paused run ends with, from the real state machine
    sup = RunSupervisor("r", "acme", Catalog.from_file(None, algorithm="ppo").start(tenant="acme"),
                        gate_detector=make_detector("evalstop"))
    sup.begin()
    sup.machine.on_checkpoint(4, gate_says_stop=True)
    assert sup.machine.state is RunState.PAUSED_BY_GATE
    label = sup.finish(completed=True).label
    assert _register(tmp_path, "paused", 0.3, label, model)["alias_best"]


def test_a_higher_mean_without_per_prompt_evidence_does_not_move_best(store, tmp_path, model):
    # the holder took best as the first eligible version; these checkpoints have no gate records (no paired test is
    # possible), so no later score moves best, however high; the refusal is recorded on the version in one line
    first = _register(tmp_path, "first", 0.1234564, "SUCCEEDED", model)
    assert first["alias_best"]
    higher = _register(tmp_path, "higher", 0.9, "SUCCEEDED", model)
    assert not higher["alias_best"] and higher["promotion"].startswith("refused: this version has no per-prompt")
    assert _best_run(model) == first["run_id"]
    mv = T.client().get_model_version(model, str(higher["version"]))
    assert float(mv.tags["eval_score"]) == 0.9 and mv.tags["promotion.reason"] == higher["promotion"]
    # the paired test itself: tests/infra/test_promotion.py


@pytest.mark.parametrize("state,eligible", [
    ("SUCCEEDED", True), ("PAUSED_BY_GATE(declining)", True), ("FAILED(platform_fault)", False), ("", False),
])
def test_only_runs_that_ended_well_may_hold_best(state, eligible):
    from infra.promotion import eligible as is_eligible

    assert is_eligible(state) is eligible


# ---------------------------------------------------------------------------------------------------------
# the reaper


def _dead_pid() -> tuple[int, float]:
    """A pid and start time of a process that has exited."""
    import psutil

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    start = psutil.Process(p.pid).create_time()
    p.wait()
    return p.pid, start


def test_reaper_closes_runs_of_dead_processes_and_deletes_their_versions(store, tmp_path, model):
    c = T.client()
    host = socket.gethostname()
    dead_pid, dead_start = _dead_pid()
    # a run the dead process left RUNNING, with a model version registered from it before it died
    dead, _ = T.open_run("test/dead", "dead")
    T.set_tags(dead, {T.OWNER_PID_TAG: dead_pid, T.OWNER_START_TAG: repr(dead_start)})
    c.create_registered_model(model)
    mv = c.create_model_version(model, _checkpoint(tmp_path, "dead"), run_id=dead)
    c.set_registered_model_alias(model, "best", mv.version)
    # this live process's pid, but another start time: the pid was reused, the owner is gone
    reused, _ = T.open_run("test/reused", "reused")
    T.set_tags(reused, {T.OWNER_START_TAG: repr(float(T.owner_tags()[T.OWNER_START_TAG]) - 100.0)})
    live, _ = T.open_run("test/live", "live")  # owned by this process
    other_host, _ = T.open_run("test/other", "other")
    T.set_tags(other_host, {T.OWNER_HOST_TAG: host + "-elsewhere", T.OWNER_PID_TAG: dead_pid})
    no_owner = c.create_run(T.experiment_id()).info.run_id  # made by other code: no owner recorded
    finished, _ = T.open_run("test/finished", "finished")
    T.set_tags(finished, {T.OWNER_PID_TAG: dead_pid})
    T.finish(finished)

    assert sorted(T.reap_dead_runs()) == sorted([dead, reused])
    status = {r: c.get_run(r).info.status for r in (dead, reused, live, other_host, no_owner, finished)}
    assert status == {dead: "KILLED", reused: "KILLED", live: "RUNNING", other_host: "RUNNING",
                      no_owner: "RUNNING", finished: "FINISHED"}
    assert "died" in c.get_run(dead).data.tags[T.REAPED_TAG]
    assert c.get_run(dead).data.tags["failure_class"] == "platform_fault"
    assert c.search_model_versions(f"run_id = '{dead}'") == []
    with pytest.raises(Exception):  # noqa: B017 - the alias went with the version
        c.get_model_version_by_alias(model, "best")
    assert T.reap_dead_runs() == []  # idempotent


def test_a_reopened_parent_run_is_owned_by_the_process_that_reopened_it(store):
    run_id, _ = T.open_run("test/parent", "parent")
    T.set_tags(run_id, {T.OWNER_PID_TAG: _dead_pid()[0]})
    T.finish(run_id, "FAILED")
    again, _ = T.open_run("test/parent", "parent", reuse_unfinished=True)
    assert again == run_id
    assert T.client().get_run(run_id).data.tags[T.OWNER_PID_TAG] == str(os.getpid())
    assert T.reap_dead_runs() == []


# ---------------------------------------------------------------------------------------------------------
# the run-directory lock


def test_a_second_writer_gets_one_line_naming_the_directory_and_holder(tmp_path):
    from common.errors import BadInput
    from training.job.rundir import RunDirBusy, locked_run_dir

    with locked_run_dir(tmp_path / "run"):
        with pytest.raises(RunDirBusy) as err:
            with locked_run_dir(tmp_path / "run", "out_dir"):
                pass
    msg = str(err.value)
    assert isinstance(err.value, BadInput) and "\n" not in msg
    assert msg.startswith("out_dir: run directory") and str(tmp_path / "run") in msg and f"pid {os.getpid()}" in msg
    with locked_run_dir(tmp_path / "run"):  # released: free again
        pass


def test_a_writer_that_loses_the_race_by_milliseconds_still_names_the_holder(tmp_path):
    """The holder takes the lock, then names itself: a second writer arriving in between (a clean-clone CI run saw
    'in use by another process' from two trains started together) waits briefly for the name."""
    import json
    import threading

    from filelock import FileLock

    from training.job.rundir import HOLDER_NAME, LOCK_NAME, RunDirBusy, locked_run_dir

    run = tmp_path / "run"
    run.mkdir()
    lock = FileLock(run / LOCK_NAME, timeout=0, thread_local=False)
    lock.acquire()  # held, but not yet named
    late = threading.Timer(0.3, lambda: (run / HOLDER_NAME).write_text(
        json.dumps({"pid": 4242, "host": "elsewhere", "since": 0.0})))
    late.start()
    try:
        with pytest.raises(RunDirBusy, match="in use by pid 4242 on elsewhere"):
            with locked_run_dir(run):
                pass
    finally:
        late.join()
        lock.release()


def test_the_lock_is_held_across_processes_and_freed_by_kill_9(tmp_path):
    from training.job.rundir import RunDirBusy, locked_run_dir

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from training.job.rundir import locked_run_dir
        with locked_run_dir({str(tmp_path / 'run')!r}):
            print('held', flush=True)
            time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"pid {holder.pid}"):
            with locked_run_dir(tmp_path / "run"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with locked_run_dir(tmp_path / "run"):  # the kernel dropped the dead holder's lock
        pass


def test_train_on_a_locked_run_directory_exits_2_before_any_work(tmp_path):
    from training.job.rundir import locked_run_dir

    out = tmp_path / "run"
    t0 = time.time()
    with locked_run_dir(out):
        r = subprocess.run([*RLHFOPS, "train", "configs/ppo-tiny.yaml", "--out", str(out)], capture_output=True,
                           text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --out: run directory") and "in use by pid" in lines[0]
    assert not (out / "metrics.csv").exists() and not (out / "checkpoints").exists()
    assert time.time() - t0 < 60  # refused before the models are built


# ---------------------------------------------------------------------------------------------------------
# waiting out an API outage


def test_wait_for_api_backs_off_then_gives_up_with_one_line(monkeypatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.provision import APIUnreachable, wait_for_api

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    slept: list[float] = []
    clock = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    def sleep(d):
        slept.append(d)
        clock[0] += d

    with temporary_settings({PREFECT_API_URL: f"http://127.0.0.1:{port}/api"}):
        with pytest.raises(APIUnreachable) as err:
            wait_for_api(budget_s=40, max_delay_s=10, sleep=sleep)
    assert slept == [1, 2, 4, 8, 10, 10]  # 35 s waited; the next 10 s would pass the 40-s budget
    assert "unreachable for 35 s" in str(err.value) and "\n" not in str(err.value)


def test_wait_for_api_returns_at_once_on_the_temporary_server():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from infra.provision import wait_for_api

    with temporary_settings({PREFECT_API_URL: None}):
        assert wait_for_api(budget_s=0, sleep=lambda d: pytest.fail("slept")) == 0.0


# ---------------------------------------------------------------------------------------------------------
# a resumed job's history


def test_replay_feeds_the_supervisor_the_steps_up_to_the_checkpoint_exactly(tmp_path):
    from training.checkpoint import MetricsCSV
    from training.metrics import StepRecord

    originals = [StepRecord(step=i, policy_version=i, reward_mean=0.1 * i, kl=0.5 + i / 3, gold_eval=(
        0.2 + i / 7 if i % 2 == 0 else math.nan), entropy=1.0 / i, tokens_generated=100 * i, delta=i % 3,
        phase_seconds={"rollout": 0.25 * i, "optim": 0.125}) for i in range(1, 7)]
    w = MetricsCSV(tmp_path / "metrics.csv", 0)
    for rec in originals:
        w.write(rec)
    w.close()

    class Machine:
        state = None

    class Recorder:
        machine = Machine()
        seen: list = []

        def observe(self, rec):
            self.seen.append(rec)

    from tasks.training import replay_history

    sup = Recorder()
    flat = replay_history(tmp_path, 4, sup)
    assert [r.step for r in sup.seen] == [1, 2, 3, 4]  # only up to the checkpoint resumed from
    for got, want in zip(sup.seen, originals[:4], strict=True):
        a, b = got.flat(), want.flat()
        assert a.keys() == b.keys()
        for k in a:
            assert (math.isnan(a[k]) and math.isnan(b[k])) if isinstance(b[k], float) and math.isnan(b[k]) \
                else a[k] == b[k], k
    assert flat == [r.flat() for r in sup.seen]
    assert replay_history(tmp_path, 0, sup) == []  # a fresh start replays nothing
