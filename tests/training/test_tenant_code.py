"""The tenant-code pool (training/inputs/tenant_code.py): tenant functions run in other processes, with a clean
environment, the config's folder as working directory, a timeout and a memory limit; whatever they do wrong is a
TenantCodeError in the runbook's words, the trainer (this process) lives on, and the pool answers the next call.

The tenant functions are small files written into tmp folders. One pool is shared by the module (a failure only
replaces a worker); the tests that need their own settings start their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from common.errors import BadInput
from eval.attribution import SampleErrorSummary, TenantCodeError
from tests.processes import alive
from training.inputs.tenant_code import FunctionRef, TenantFunctionPool, parse_ref

MEMORY_MB = 1024
TIMEOUT_S = 2.0
ROOT = Path(__file__).resolve().parents[2]


def tenant(folder: Path, name: str, code: str, fn: str = "score") -> FunctionRef:
    """Write `code` to folder/name.py and return the reference to its function `fn`."""
    (folder / f"{name}.py").write_text(textwrap.dedent(code))
    return parse_ref(f"{name}.py:{fn}", folder, "reward.ref")


def procs_with(marker: str) -> list[int]:
    """The host pids of the processes whose command line holds `marker` (a tenant's pids inside its sandbox are not
    the host's)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    out.append(int(entry.name))
            except OSError:
                continue
    return out


def started(marker: str, timeout: float = 30.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pids := procs_with(marker):
            return pids
        time.sleep(0.05)
    raise AssertionError(f"no process with {marker!r} started within {timeout} s")


def sleep_marker() -> str:
    """A `sleep` argument no other process has: its processes are found by it."""
    return f"600.{uuid.uuid4().int % 10**9:09d}"


def gone_soon(pids: list[int], timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("config")


@pytest.fixture(scope="module")
def pool(folder):
    with TenantFunctionPool(folder, workers=2, memory_mb=MEMORY_MB) as p:
        yield p


@pytest.fixture(scope="module")
def plain_pool(folder):
    """The operator's switch: RLHFOPS_TENANT_SANDBOX=none (a worker in a process group of its own, killed whole)."""
    with TenantFunctionPool(folder, workers=2, memory_mb=MEMORY_MB, sandbox="none") as p:
        yield p


@pytest.fixture(scope="module")
def good(folder) -> FunctionRef:
    return tenant(folder, "good_reward", """
        def score(prompts, completions, **columns):
            return [float(len(c)) for c in completions]
    """)


def still_answers(pool: TenantFunctionPool, good: FunctionRef) -> None:
    got = pool.call(good, ["p1", "p2"], ["ab", "abcd"], {}, timeout_s=30)
    assert got.scores == [2.0, 4.0] and got.errors == []


def failure(pool, ref, n: int = 3, timeout_s: float = TIMEOUT_S) -> TenantCodeError:
    with pytest.raises(TenantCodeError) as info:
        pool.call(ref, [f"prompt {i}" for i in range(n)], [f"completion {i}" for i in range(n)],
                  {"answer": list(range(n))}, timeout_s=timeout_s)
    err = info.value
    assert "\n" not in str(err) and str(err).startswith(f"your reward function {ref.text} ")
    assert isinstance(err.summary, SampleErrorSummary) and err.examples
    assert set(err.examples[0]) == {"prompt", "completion", "error", "traceback"}
    return err


def test_runs_in_another_process_with_the_columns(pool, folder):
    ref = tenant(folder, "pid_reward", """
        import os
        def score(prompts, completions, answer, parent, **kwargs):
            return [float(os.getpid()), float(os.getpid() != parent[0]), float(sum(answer))]
    """)
    got = pool.call(ref, ["a", "b", "c"], ["x", "y", "z"], {"answer": [1, 2, 3], "parent": [os.getpid()] * 3},
                    timeout_s=30)
    assert got.scores[0] != os.getpid() and got.scores[1:] == [1.0, 6.0]


def test_working_directory_home_and_imports_are_the_config_folder(pool, folder):
    (folder / "answer.txt").write_text("42")
    (folder / "helper.py").write_text("FACTOR = 2\n")
    ref = tenant(folder, "cwd_reward", """
        import os
        from helper import FACTOR
        def score(prompts, completions, **columns):
            return [float(open("answer.txt").read()) * FACTOR, float(os.environ["HOME"] == os.getcwd())]
    """)
    assert pool.call(ref, ["a", "b"], ["x", "y"], {}, timeout_s=30).scores == [84.0, 1.0]


def test_the_platform_settings_are_not_visible(folder, monkeypatch):
    secrets = {"MLFLOW_TRACKING_URI": "sqlite:///secret.db", "PREFECT_API_URL": "http://prefect:4200/api",
               "DATABASE_URL": "postgresql://u:pw@db/x", "RLHFOPS_SECRET_TOKEN": "s3cr3t",
               "AWS_SECRET_ACCESS_KEY": "aws-key-value"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    ref = tenant(folder, "env_reward", f"""
        import os, sys
        KEYS = {sorted(secrets)!r}
        VALUES = {sorted(secrets.values())!r}
        def score(prompts, completions, **columns):
            proc = open("/proc/self/environ", "rb").read().decode()
            return [float(any(k in os.environ for k in KEYS)),
                    float(any(k in proc or v in proc for k, v in zip(KEYS, VALUES))),
                    float(os.environ.get("TENANT_SETTING") == "on"),
                    float(any(v in " ".join(sys.argv) for v in VALUES))]
    """)
    with TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB, env={"TENANT_SETTING": "on"}) as own:
        got = own.call(ref, ["a"] * 4, ["x"] * 4, {}, timeout_s=30)
    assert got.scores == [0.0, 0.0, 1.0, 0.0]


def test_samples_that_raise_score_none_with_their_traceback_the_rest_are_scored(pool, folder):
    ref = tenant(folder, "partial_reward", """
        def score(prompts, completions, **columns):
            out = []
            for c in completions:
                if "bad" in c:
                    raise ValueError(f"cannot score {c!r}")
                out.append(None if c == "skip" else 1.0)
            return out
    """)
    got = pool.call(ref, ["p0", "p1", "p2", "p3", "p4"], ["good", "bad one", "skip", "fine", "bad"], {},
                    timeout_s=30)
    assert got.scores == [1.0, None, None, 1.0, None]
    assert [(e.index, e.prompt, e.completion) for e in got.errors] == [(1, "p1", "bad one"), (4, "p4", "bad")]
    assert got.errors[0].error == "ValueError: cannot score 'bad one'"
    assert "partial_reward.py" in got.errors[0].traceback_tail and "raise ValueError" in got.errors[0].traceback_tail


def stuck_with_child(folder, name, marker):
    """A tenant function that starts `sleep <marker>` and never returns."""
    return tenant(folder, name, f"""
        import os, subprocess
        def score(prompts, completions, **columns):
            child = subprocess.Popen(["sleep", {marker!r}])
            while True:
                pass
    """)


@pytest.mark.parametrize("which", ["pool", "plain_pool"])
def test_a_hang_is_stopped_with_the_processes_it_started(request, folder, good, which):
    pool = request.getfixturevalue(which)
    marker = sleep_marker()
    ref = stuck_with_child(folder, f"hang_reward_{which}", marker)
    cpu = pool.cpu_seconds
    start = time.monotonic()
    err = failure(pool, ref)
    assert time.monotonic() - start < TIMEOUT_S + 10
    assert "did not return within 2 s (reward.timeout_s) on a batch of 3 samples; it was stopped" in str(err)
    assert f"it was stopped at hang_reward_{which}.py, line " in str(err)
    assert f"hang_reward_{which}.py" in err.examples[0]["traceback"]
    assert gone_soon(procs_with(marker)) and not procs_with(marker)
    assert pool.cpu_seconds - cpu >= TIMEOUT_S * 0.9
    still_answers(pool, good)


@pytest.mark.parametrize("body, words", [
    ("os._exit(3)", "exited the process (exit code 3)"),
    ("import ctypes; ctypes.string_at(0)", "exited the process (killed by signal SIGSEGV)"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "exited the process (killed by signal SIGKILL)"),
    ("raise SystemExit(4)", "exited the process (sys.exit(4))"),
    ("os._exit(0)", "exited the process (exit code 0)"),
], ids=["exit", "segfault", "sigkill", "sys-exit", "exit-0"])
@pytest.mark.parametrize("which", ["pool", "plain_pool"])
def test_leaving_the_process_is_the_tenants_fault(request, folder, good, body, words, which):
    pool = request.getfixturevalue(which)
    marker = sleep_marker()
    ref = tenant(folder, "exit_reward", f"""
        import os, signal, subprocess
        def score(prompts, completions, **columns):
            child = subprocess.Popen(["sleep", {marker!r}])  # must not outlive the worker
            {body}
    """)
    err = failure(pool, ref)
    assert words in str(err) and "on a batch of 3 samples" in str(err)
    assert err.examples[0]["prompt"] == "prompt 0"
    if "SystemExit" not in body:  # sys.exit is caught in the worker, which lives on (and so may the child)
        assert gone_soon(procs_with(marker))
    still_answers(pool, good)


@pytest.mark.parametrize("body", [
    "b = bytearray(4 * 2**30)",
    # what a C++ extension (torch, tokenizers) does when an allocation fails
    "os.write(2, b\"terminate called after throwing an instance of 'std::bad_alloc'\\n\"); os.abort()",
], ids=["MemoryError", "died"])
def test_exceeding_the_memory_limit(pool, folder, good, body):
    ref = tenant(folder, "memory_reward", f"""
        import os
        def score(prompts, completions, **columns):
            {body}
            return [0.0 for _ in completions]
    """)
    err = failure(pool, ref)
    assert f"exceeded its memory limit ({MEMORY_MB} MiB, reward.memory_mb) on a batch of 3 samples" in str(err)
    still_answers(pool, good)


@pytest.mark.parametrize("ret, words", [
    ("[1.0]", "returned 1 score for 3 completions"),
    ("[1.0] * 4", "returned 4 scores for 3 completions"),
    ("[1.0, 'abc', 2.0]", "returned a non-number at index 1 ('abc', str)"),
    ("[1.0, 2.0, float('nan')]", "returned NaN at index 2"),
    ("[float('inf'), 1.0, 2.0]", "returned inf at index 0"),
    ("1.0", "returned float, not a list of scores"),
], ids=["short", "long", "str", "nan", "inf", "scalar"])
def test_a_bad_return_is_refused_never_broadcast(pool, folder, good, ret, words):
    ref = tenant(folder, "return_reward", f"""
        def score(prompts, completions, **columns):
            return {ret}
    """)
    err = failure(pool, ref)
    assert words in str(err)
    still_answers(pool, good)


def test_numbers_of_every_kind_are_scores(pool, folder):
    ref = tenant(folder, "kinds_reward", """
        import fractions
        import numpy as np
        def score(prompts, completions, **columns):
            return np.array([1, 2.5, 3]) if completions[0] == "array" else [
                True, np.float32(0.5), np.int64(2), fractions.Fraction(1, 4), None]
    """)
    assert pool.call(ref, ["p"] * 5, ["list"] * 5, {}, timeout_s=30).scores == [1.0, 0.5, 2.0, 0.25, None]
    assert pool.call(ref, ["p"] * 3, ["array"] * 3, {}, timeout_s=30).scores == [1.0, 2.5, 3.0]


@pytest.mark.parametrize("code, fn, words", [
    ("def score(prompts, completions:\n    return []\n", "score", "could not be loaded: SyntaxError"),
    ("import no_such_module_here\n", "score", "could not be loaded: ModuleNotFoundError: No module named"),
    ("def other(prompts, completions):\n    return []\n", "score", "load_reward.py defines no 'score'"),
    ("score = 3\n", "score", "could not be loaded: score is a int, not a function"),
], ids=["syntax", "import", "no-name", "not-callable"])
def test_code_that_cannot_be_loaded(pool, folder, good, code, fn, words):
    ref = tenant(folder, "load_reward", code, fn)
    with pytest.raises(TenantCodeError) as info:
        pool.check(ref, timeout_s=30, role="gate function")
    assert str(info.value).startswith("your gate function load_reward.py:score could not be loaded")
    assert words in str(info.value) and "\n" not in str(info.value)
    err = failure(pool, ref)  # a call says the same
    assert words in str(err)
    still_answers(pool, good)


def test_check_loads_in_a_worker_not_here(pool, folder):
    ref = tenant(folder, "side_reward", """
        import os
        LOADED_IN = os.getpid()
        def score(prompts, completions, **columns):
            return [float(LOADED_IN)] * len(completions)
    """)
    pool.check(ref, timeout_s=30, role="reward function")
    assert "side_reward" not in " ".join(sys.modules)
    assert pool.call(ref, ["p"], ["c"], {}, timeout_s=30).scores != [float(os.getpid())]


def test_parse_ref(folder, tmp_path, monkeypatch):
    ref = tenant(folder, "ref_reward", "def score(p, c):\n    return []\n")
    assert (ref.file, ref.module, ref.name, ref.field) == (folder / "ref_reward.py", None, "score", "reward.ref")
    assert len(ref.code_hash) == 16
    (tmp_path / "notes.txt").write_text("x")
    for text, words in [("ref_reward.py", "names no function"), ("missing.py:score", "file 'missing.py'"),
                        ("notes.txt:score", "is not a .py file"), ("ref_reward.py:2score", "not a Python function"),
                        ("no_such_pkg.mod:score", "module 'no_such_pkg.mod'")]:
        with pytest.raises(BadInput) as info:
            parse_ref(text, folder if "reward" in text else tmp_path, "reward.ref")
        assert words in str(info.value) and str(info.value).startswith("reward.ref: ")
    # package.module form: found (next to the config) without running the package's code here
    pkg = tmp_path / "tenantpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(f"try:\n    open({str(tmp_path / 'ran')!r}, 'w').write('x')\n"
                                     "except OSError:\n    pass\n")  # read-only in the sandbox
    (pkg / "scoring.py").write_text("def score(prompts, completions, **c):\n    return [7.0] * len(completions)\n")
    ref = parse_ref("tenantpkg.scoring:score", tmp_path, "gate.ref")
    assert ref.module == "tenantpkg.scoring" and ref.file is None and not (tmp_path / "ran").exists()
    with TenantFunctionPool(tmp_path, workers=1, memory_mb=MEMORY_MB) as own:
        assert own.call(ref, ["p"], ["c"], {}, timeout_s=30).scores == [7.0]


def test_close_is_prompt_while_a_worker_is_stuck_with_a_child(folder):
    marker = sleep_marker()
    ref = stuck_with_child(folder, "stuck_reward", marker)
    own = TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB)
    ended = []

    def call():  # ends with an error once the pool is closed under it
        try:
            own.call(ref, ["p"], ["c"], {}, timeout_s=600)
        except Exception as err:  # noqa: BLE001 (which error is pebble's business; that it ends is the point)
            ended.append(err)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    stuck = started(marker) + [p.pid for p in own._context.processes]
    start = time.monotonic()
    own.close()
    own.close()  # idempotent
    assert time.monotonic() - start < 5
    assert gone_soon(stuck, timeout=5)
    caller.join(10)
    assert not caller.is_alive() and ended


def test_workers_and_their_children_die_with_the_trainer(folder, tmp_path):
    """A trainer that is killed leaves nothing behind; the trainer here is a plain script without a __main__ guard
    (spawn would re-run it in every worker if the pool passed the trainer's main module on)."""
    marker = sleep_marker()
    tenant(folder, "orphan_reward", f"""
        import os, subprocess
        def score(prompts, completions, **columns):
            child = subprocess.Popen(["sleep", {marker!r}])
            while True:
                pass
    """)
    script = tmp_path / "trainer.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from training.inputs.tenant_code import TenantFunctionPool, parse_ref
        pool = TenantFunctionPool(Path({str(folder)!r}), workers=1)
        pool.call(parse_ref("orphan_reward.py:score", Path({str(folder)!r}), "reward.ref"), ["p"], ["c"], {{}},
                  timeout_s=600)
    """))
    trainer = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path)
    try:
        stuck = started(marker)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    assert gone_soon(stuck, timeout=10)


def test_cpu_seconds_count_the_workers_time(folder, good):
    ref = tenant(folder, "busy_reward", """
        import time
        def score(prompts, completions, **columns):
            end = time.process_time() + 0.3
            while time.process_time() < end:
                pass
            return [1.0] * len(completions)
    """)
    with TenantFunctionPool(folder, workers=1, memory_mb=MEMORY_MB) as own:
        assert own.cpu_seconds == 0.0
        own.call(ref, ["p"], ["c"], {}, timeout_s=30)
        assert 0.28 <= own.cpu_seconds < 2.0
