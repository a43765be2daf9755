"""A tenant's own job through `rlhfops train`, as a new user runs it: their files (data, config, reward module) in a
folder outside the repository. Their reward function runs in its own processes and receives every other column of
the row it scores; when it raises on too many samples the job ends FAILED(tenant code fault) with the runbook's
one line, exit 1, examples in job.json and the last checkpoint kept; bad data exits 2 naming the file and line."""

from __future__ import annotations

import json

import pytest
from cli_helpers import run_cli_output
from tenant_job import ROWS, write_job


@pytest.mark.timeout(600)
def test_a_tenant_reward_function_trains_on_its_own_rows(tmp_path, capsys, monkeypatch):
    config = write_job(tmp_path / "tenant", "my_reward.py:score")
    monkeypatch.chdir(tmp_path)  # not the config's folder: its files must still be found
    code, out, err = run_cli_output(["train", config, "--overlap", "full", "--out", tmp_path / "run"], capsys,
                                    monkeypatch)
    assert code == 0, err
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
    assert all(0.0 <= float(r["reward_mean"]) <= 1.0 for r in rows)
    assert sum(float(r["reward_fn_cpu_s"]) for r in rows) > 0  # charged: the function's own processes' CPU
    assert all(float(r["phase_reward_fn_s"]) > 0 for r in rows)
    assert {float(r["gold_eval"]) for r in rows if r["gold_eval"] not in ("", "nan")} <= {0.0, 0.25, 0.5, 0.75, 1.0}
    # the job is scored by the tenant's gate, and its lines say so: no word of the synthetic task's gold scorer
    text = " ".join((out + err).split())
    assert "best gate score" in text and "gold" not in text.lower()
    assert "reward model" not in text and "proxy_score" not in text  # a function reward: no reward model built
    # its gate records have no proxy score (none exists: the column is optional, eval.prompt_records), no NaN; the
    # required `gold_score` column keeps its name (the prompts CSV format every reader depends on)
    records = (tmp_path / "run" / "gate_records.csv").read_text()
    assert records.splitlines()[0] == "run_id,step,prompt_id,gold_score,seed,response_len"
    assert "proxy_score" not in records and "nan" not in records.lower()
    from eval.prompt_records import load_prompt_records

    assert len(load_prompt_records(tmp_path / "run" / "gate_records.csv")) == 2 * 4  # 2 gates x 4 prompts
    # the rlhf-job flow's progress lines say the same (tasks.training.progress_line)
    from types import SimpleNamespace

    from tasks.training import progress_line, score_word
    from training.job.config import load_config

    word = score_word(load_config(config))
    line = progress_line(SimpleNamespace(step=2, reward_mean=0.5, kl=0.1, entropy=1.0, gold_eval=0.25), 4,
                         SimpleNamespace(machine=SimpleNamespace(status=SimpleNamespace(label="RUNNING"))), word)
    assert "gate score +0.250" in line and "gold" not in line


@pytest.mark.timeout(600)
def test_a_reward_function_that_raises_fails_the_job_as_the_tenants_fault(tmp_path, capsys, monkeypatch):
    config = write_job(tmp_path / "tenant", "my_reward.py:flaky")
    code, out, err = run_cli_output(["train", config, "--overlap", "none", "--out", tmp_path / "run",
                                     "--detector", "paired"], capsys, monkeypatch)
    assert code == 1
    text = " ".join((out + err).split())
    assert "tenant_code_fault" in text
    assert ("your reward function my_reward.py:flaky raised on 100.0% of samples (4 of 4) at step 3: ValueError: the "
            "answer checker crashed") in text
    job = json.loads((tmp_path / "run" / "job.json").read_text())
    assert job["state"].startswith("FAILED") and job["failure_class"] == "tenant_code_fault"
    assert "raised on 100.0% of samples (4 of 4) at step 3" in job["reason"]
    assert len(job["examples"]) == 4
    for example in job["examples"]:
        assert example["prompt"] in {r["question"] for r in ROWS}
        assert example["error"] == "ValueError: the answer checker crashed"
        assert "flaky" in example["traceback"] and "raise ValueError" in example["traceback"]
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert kept == ["step-000002"]  # the last checkpoint before the fault stays


def test_bad_tenant_data_exits_2_naming_the_file_and_line(tmp_path, capsys, monkeypatch):
    config = write_job(tmp_path / "tenant", "my_reward.py:score")
    lines = (tmp_path / "tenant" / "train.jsonl").read_text().splitlines()
    lines[6] = '{"question": "broken", "answer": '
    (tmp_path / "tenant" / "train.jsonl").write_text("\n".join(lines) + "\n")
    code, out, err = run_cli_output(["train", config, "--out", tmp_path / "run"], capsys, monkeypatch)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "task.train" in line and "train.jsonl" in line and "line 7" in line
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_missing_reward_file_exits_2_naming_the_field(tmp_path, capsys, monkeypatch):
    config = write_job(tmp_path / "tenant", "nowhere.py:score")
    code, _out, err = run_cli_output(["train", config, "--out", tmp_path / "run"], capsys, monkeypatch)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "reward.ref" in line and "nowhere.py" in line


@pytest.mark.parametrize(("ref", "source", "expected"), [
    ("my_reward.py:nothing", None, "my_reward.py defines no 'nothing' at its top level (it defines: ROWS, exact, "
                                   "flaky, json, os, score)"),
    ("broken.py:score", "def score(prompts, completions):\n    return [\n", "broken.py line 2: "),
])
def test_a_ref_to_no_function_exits_2_before_any_work(tmp_path, capsys, monkeypatch, ref, source, expected):
    """Read with `ast`, never imported in the trainer: a name the file does not define, or a file that does not
    parse, is bad input found before any slot is taken (the tenant's code is loaded only in a worker)."""
    config = write_job(tmp_path / "tenant", ref)
    if source is not None:
        (tmp_path / "tenant" / ref.split(":")[0]).write_text(source)
    code, _out, err = run_cli_output(["train", config, "--out", tmp_path / "run"], capsys, monkeypatch)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "reward.ref" in line and expected in line



HOSTILE = '''
import os, subprocess

def score(prompts, completions, trainer_state, log_metric, **kwargs):
    """A hostile tenant in a real job: reads every environ it can see, leaves a detached child, scores on."""
    seen = ""
    for pid in os.listdir("/proc"):
        try:
            seen += open(f"/proc/{pid}/environ", "rb").read().decode(errors="replace")
        except OSError:
            pass
    log_metric("leaked", float("PLATFORM_SECRET_VALUE" in seen))
    subprocess.Popen(["setsid", "sleep", MARKER], start_new_session=True)
    return [float(len(c) % 2) for c in completions]
'''


@pytest.mark.timeout(600)
def test_a_hostile_reward_in_a_real_job_is_contained_and_its_metrics_are_recorded(tmp_path, capsys, monkeypatch):
    """Through `rlhfops train`: the job completes, the function saw no platform setting, its detached child died
    with the job, a list of two functions with weights trained it, and log_metric reached metrics.csv."""
    import csv
    import time
    import uuid
    from pathlib import Path

    marker = f"600.{uuid.uuid4().int % 10**9:09d}"
    config = write_job(tmp_path / "tenant", "my_reward.py:score", steps=2)
    (tmp_path / "tenant" / "hostile.py").write_text(f"MARKER = {marker!r}\n" + HOSTILE)
    text = config.read_text().replace("ref: my_reward.py:score", "ref: [hostile.py:score, my_reward.py:score]\n"
                                      "  weights: [2.0, 0.5]")
    config.write_text(text)
    monkeypatch.setenv("RLHFOPS_TEST_SETTING", "PLATFORM_SECRET_VALUE")
    code, out, err = run_cli_output(["train", config, "--overlap", "none", "--out", tmp_path / "run"], capsys,
                                    monkeypatch)
    assert code == 0, err
    assert "tenant code sandbox: bwrap" in " ".join(out.split())
    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert all(float(r["reward_fn/leaked"]) == 0.0 for r in rows)
    assert all(float(r["reward_fn/score_0/mean"]) in (0.0, 0.25, 0.5, 0.75, 1.0) for r in rows)
    # the weighted sum: 2 x hostile + 0.5 x my_reward, the same parity score each: 2.5 x the parity mean
    assert all(abs(float(r["reward_mean"]) - 2.5 * float(r["reward_fn/score_0/mean"])) < 1e-6 for r in rows)

    def left() -> list[int]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if marker.encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    pass
        return found

    end = time.monotonic() + 10
    while left() and time.monotonic() < end:
        time.sleep(0.1)
    assert not left()


def test_without_a_sandbox_a_tenant_job_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    from training.inputs import sandbox

    config = write_job(tmp_path / "tenant", "my_reward.py:score")
    monkeypatch.delenv(sandbox.SANDBOX_ENV, raising=False)
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    code, _out, err = run_cli_output(["train", config, "--out", tmp_path / "run"], capsys, monkeypatch)
    assert code == 2
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert "bubblewrap (bwrap)" in line and "apt-get install -y bubblewrap" in line
    assert "RLHFOPS_TENANT_SANDBOX=none" in line
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
