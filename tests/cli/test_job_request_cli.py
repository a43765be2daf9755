"""The CLI side of the job request: `rlhfops train` and `rlhfops platform` refuse a bad job in one line naming the
field (exit 2), before any work, the Prefect server or torch, and write nothing.

In-process CLI in a scratch directory with the work entry points tripwired (as tests/cli/test_bad_input.py does);
the torch check runs the CLI in a fresh interpreter, where `sys.modules` is the oracle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import WorkStarted, run_cli
from cli_helpers import tripwire as _tripwire

from rlhfops import cli

REPO = Path(__file__).resolve().parents[2]




@pytest.fixture
def scratch(tmp_path, monkeypatch):
    import rlhfops.commands.flowrun as flowrun
    import training.job.lifecycle
    import training.trainer

    for target in ((training.trainer, "Trainer"), (training.job.lifecycle, "run_job"), (flowrun, "start_prefect_api"),
                   (flowrun, "run_flow")):
        monkeypatch.setattr(*target, _tripwire)
    monkeypatch.setattr(flowrun, "prefect_env", lambda verbose=False: None)  # would set this process's environment
    monkeypatch.chdir(tmp_path)
    return tmp_path




def _jobs(d: Path, jobs) -> str:
    (d / "jobs.json").write_text(json.dumps(jobs))
    return "jobs.json"


CASES = [
    # the cases: a job named out of --out (was: trained outside it, exit 0), a misspelled override (was: a
    # 25-line traceback), train into /proc (was: exit 1 with a traceback)
    ("platform-job-escapes", lambda d: _jobs(d, [{"tenant": "acme", "name": "../../../x"}]),
     ["platform", "--jobs", "jobs.json", "--out", "round"], ["jobs[0].name: '../../../x' is not a valid name"]),
    ("platform-misspelled-override", lambda d: _jobs(d, [{"tenant": "acme", "name": "a",
                                                          "overrides": {"ppo.kl_cof": 0.1}}]),
     ["platform", "--jobs", "jobs.json", "--out", "round"], ["jobs[0] (acme/a)", "'ppo.kl_cof=0.1'", "unknown key"]),
    ("platform-empty-tenant", lambda d: _jobs(d, [{"tenant": "", "name": "a"}]),
     ["platform", "--jobs", "jobs.json", "--out", "round"], ["jobs[0].tenant: '' is not a valid tenant"]),
    ("platform-gpus-over-slots", lambda d: _jobs(d, [{"tenant": "acme", "name": "a", "gpus": 3}]),
     ["platform", "--jobs", "jobs.json", "--slots", "2", "--out", "round"], ["jobs[0].gpus:", "cluster has 2"]),
    ("train-out-proc", None, ["train", str(REPO / "configs" / "ppo-tiny.yaml"), "--out", "/proc/x"],
     ["out: '/proc/x' cannot be created"]),
    ("train-steps-negative", None, ["train", str(REPO / "configs" / "ppo-tiny.yaml"), "--steps", "-5", "--out", "r"],
     ["steps: -5 is out of range"]),
    ("train-overlap", None, ["train", str(REPO / "configs" / "ppo-tiny.yaml"), "--overlap", "sideways", "--out", "r"],
     ["overlap: 'sideways' is not one of"]),
    ("train-gpus-batch", None, ["train", str(REPO / "configs" / "ppo-tiny.yaml"), "--gpus", "3", "--out", "r"],
     ["ppo.batch_size: 16 samples", "do not divide over 3 ranks"]),
]


@pytest.mark.parametrize("case_id, setup, argv, needles", CASES, ids=[c[0] for c in CASES])
def test_a_bad_job_exits_2_with_one_line_naming_the_field(case_id, setup, argv, needles, scratch, capsys,
                                                           monkeypatch):
    if setup is not None:
        setup(scratch)
    before = sorted(p.relative_to(scratch) for p in scratch.rglob("*"))
    code, lines = run_cli(argv, capsys, monkeypatch)
    assert code == 2, (case_id, code, lines)
    assert len(lines) == 1 and lines[0].startswith("error: "), (case_id, lines)
    for needle in needles:
        assert needle in lines[0], (case_id, needle, lines[0])
    assert sorted(p.relative_to(scratch) for p in scratch.rglob("*")) == before
    assert not Path("/proc/x").exists()


def test_a_good_job_reaches_the_work(scratch, capsys, monkeypatch):
    """The control: the same commands with valid input get past every check to the tripwire."""
    _jobs(scratch, [{"tenant": "acme", "name": "a", "overrides": {"ppo.kl_coef": 0.1}}])
    for argv in (["platform", "--jobs", "jobs.json", "--out", "round"],
                 ["train", str(REPO / "configs" / "ppo-tiny.yaml"), "--out", "run", "--steps", "3"]):
        monkeypatch.setattr(sys, "argv", ["rlhfops", *argv])
        with pytest.raises(WorkStarted):
            cli.main()


def test_train_reports_a_config_error_before_importing_torch(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("ppo: {actor_lr: 2.0}\n")
    code = ("import sys\nfrom rlhfops import cli\n"
            f"sys.argv = ['rlhfops', 'train', {str(bad)!r}, '--out', {str(tmp_path / 'run')!r}]\n"
            "try:\n    cli.main()\nexcept SystemExit as e:\n    print('EXIT', e.code, 'torch' in sys.modules)\n"
            "    print('HEAVY', [m for m in ('numpy', 'transformers', 'eval.health') if m in sys.modules])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "EXIT 2 False" in done.stdout, (done.stdout, done.stderr)
    assert "HEAVY []" in done.stdout, done.stdout  # not even numpy: the error comes before the heavy imports
    (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert "ppo.actor_lr" in line and "<= 1" in line
    assert not (tmp_path / "run").exists()


def test_resume_builds_the_same_request_and_refuses_a_bad_name_before_the_server(scratch, capsys, monkeypatch):
    """A paused run whose job.json names a tenant that is not an identifier (hand-edited, or from before names were
    checked) is refused in one line; a good one gets to the server start (the tripwire)."""
    import yaml

    run = scratch / "run"
    run.mkdir()
    (run / "config.resolved.yaml").write_text((REPO / "configs" / "ppo-tiny.yaml").read_text())
    done = {"state": "PAUSED_BY_GATE(x)", "run_id": "r1", "best_step": 2, "paused_step": 4, "reason": "x",
            "tenant": "../acme", "name": "j", "overlap": "full", "gpus": 1}
    (run / "job.json").write_text(json.dumps(done))
    code, lines = run_cli(["resume", str(run)], capsys, monkeypatch)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: tenant: '../acme'"), lines
    (run / "job.json").write_text(json.dumps({**done, "tenant": "acme"}))
    assert yaml.safe_load((run / "config.resolved.yaml").read_text())["steps"] > 0
    monkeypatch.setattr(sys, "argv", ["rlhfops", "resume", str(run)])
    with pytest.raises(WorkStarted):
        cli.main()
