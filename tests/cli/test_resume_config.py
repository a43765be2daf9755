"""`rlhfops resume RUN_DIR` reads the paused run's `config.resolved.yaml` with the strict config reader: a missing
file or a key given twice (a hand edit) is one line naming the file (exit 2) before the Prefect server starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import WorkStarted, run_cli, tripwire

REPO = Path(__file__).resolve().parents[2]
DONE = {"state": "PAUSED_BY_GATE(x)", "run_id": "r1", "best_step": 2, "paused_step": 4, "reason": "x",
        "tenant": "acme", "name": "j", "overlap": "full", "gpus": 1}


@pytest.fixture
def paused(tmp_path, monkeypatch):
    """A paused run's directory (job.json, and the shipped tiny config as its resolved config); the server start and
    the flow tripwired."""
    import rlhfops.commands.flowrun as flowrun

    monkeypatch.setattr(flowrun, "start_prefect_api", tripwire)
    monkeypatch.setattr(flowrun, "run_flow", tripwire)
    monkeypatch.setattr(flowrun, "prefect_env", lambda verbose=False: None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "job.json").write_text(json.dumps(DONE))
    (run / "config.resolved.yaml").write_text((REPO / "configs" / "ppo-tiny.yaml").read_text())
    return run


def test_a_good_resolved_config_gets_to_the_server_start(paused, monkeypatch):
    import sys

    from rlhfops import cli

    monkeypatch.setattr(sys, "argv", ["rlhfops", "resume", str(paused)])
    with pytest.raises(WorkStarted):
        cli.main()


def test_a_key_given_twice_in_the_resolved_config_is_one_line(paused, capsys, monkeypatch):
    cfg = paused / "config.resolved.yaml"
    text = cfg.read_text()
    n = len(text.splitlines())
    cfg.write_text(text.rstrip("\n") + "\nsteps: 3\n")  # the shipped config sets steps on one line already
    first = next(i for i, ln in enumerate(text.splitlines(), 1) if ln.startswith("steps:"))
    code, err = run_cli(["resume", paused], capsys, monkeypatch)
    assert code == 2 and len(err) == 1, err
    assert f"field 'steps' is given twice (lines {first} and {n + 1}" in err[0] and "config.resolved.yaml" in err[0]


def test_a_missing_resolved_config_is_one_line(paused, capsys, monkeypatch):
    (paused / "config.resolved.yaml").unlink()
    code, err = run_cli(["resume", paused], capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and "config.resolved.yaml' not found" in err[0], err
