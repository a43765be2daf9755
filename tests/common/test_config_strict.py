"""Config files are read strictly (`common/config.py`): an empty file, a key given twice, a top level that is not a
mapping and a number written as a string are each refused with one line naming the field, by the loader and by
the CLI (exit 2, before torch is imported)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import BaseModel, ConfigDict

from common.config import load_config, parse_overrides
from common.errors import BadInput

RLHFOPS = [sys.executable, "-m", "rlhfops.cli"]


class Ppo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    actor_lr: float = 1e-3
    epochs: int = 1


class Job(BaseModel):
    model_config = ConfigDict(extra="forbid")
    steps: int = 10
    ppo: Ppo = Ppo()
    pair: tuple[float, float] = (0.0, 1.0)


#: case -> (file text, what the one line must contain)
CASES = {
    "empty": ("# only a comment\n", "is empty"),
    "duplicate": ("steps: 5\nppo:\n  actor_lr: 0.001\n  epochs: 2\n  actor_lr: 0.002\n",
                  "field 'ppo.actor_lr' is given twice (lines 3 and 5"),
    "not_a_mapping": ("- steps\n- 5\n", "must hold a mapping of fields at the top level, not a list"),
    "number_as_string": ("steps: 5\nppo:\n  actor_lr: '1.5e-4'\n",
                         "field 'ppo.actor_lr': '1.5e-4' is text, not a number"),
}


def _cli(*args, cwd):
    return subprocess.run([*RLHFOPS, *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.parametrize("case", CASES)
def test_the_loader_refuses_it_in_one_line(tmp_path, case):
    text, needle = CASES[case]
    f = tmp_path / "job.yaml"
    f.write_text(text)
    with pytest.raises(BadInput) as err:
        load_config(Job, f, field="config")
    assert needle in str(err.value) and "\n" not in str(err.value)
    assert str(f) in str(err.value)  # the file is named too


@pytest.mark.parametrize("case", CASES)
def test_the_cli_exits_2_with_one_line_before_torch(tmp_path, case):
    """`rlhfops train BAD.yaml`, in a fresh interpreter that then reports whether torch was imported."""
    text, needle = CASES[case]
    f = tmp_path / "job.yaml"
    f.write_text(text)
    probe = ("import sys\nfrom rlhfops.cli import main\n"
             "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
             "print('torch' in sys.modules, code)\n")
    r = subprocess.run([sys.executable, "-c", probe, "train", str(f)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.stdout.split() == ["False", "2"], (r.stdout, r.stderr)
    assert needle in _one_line(r.stderr)


#: the same cases in an experiment YAML (`rlhfops simulate FILE`)
EXPERIMENT_CASES = {**CASES, "number_as_string": ("name: X\nschedulers: [SRTF-Est]\nworkload:\n  jobs: '40'\n",
                                                  "field 'workload.jobs': '40' is text, not a whole number"),
                    "duplicate": ("name: X\nworkload:\n  jobs: 40\n  gpus: 8\n  jobs: 50\n",
                                  "field 'workload.jobs' is given twice (lines 3 and 5")}


@pytest.mark.parametrize("case", EXPERIMENT_CASES)
def test_simulate_exits_2_with_one_line_and_writes_nothing(tmp_path, case):
    text, needle = EXPERIMENT_CASES[case]
    f = tmp_path / "exp.yaml"
    f.write_text(text)
    r = _cli("simulate", str(f), cwd=tmp_path)
    assert r.returncode == 2 and needle in _one_line(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]


def test_a_number_written_plainly_is_a_number_in_files_and_overrides(tmp_path):
    """YAML 1.2 numbers: `1e-4`, `2E3`, `1.0e4` unquoted are floats (YAML 1.1 read the first two as strings, which
    strict validation would then refuse); a list fills a tuple field; an int fills a float field."""
    f = tmp_path / "job.yaml"
    f.write_text("steps: 7\nppo: {actor_lr: 1e-4, epochs: 3}\npair: [2E3, 1.0e4]\n")
    cfg = load_config(Job, f)
    assert (cfg.steps, cfg.ppo.actor_lr, cfg.ppo.epochs, cfg.pair) == (7, 0.0001, 3, (2000.0, 10000.0))
    assert parse_overrides(["ppo.actor_lr=3e-5", "steps=4"]) == {"ppo.actor_lr": 3e-05, "steps": 4}
    assert load_config(Job, f, parse_overrides(["ppo.actor_lr=3e-5"])).ppo.actor_lr == 3e-05
    f.write_text("ppo: {actor_lr: 1}\n")
    assert load_config(Job, f).ppo.actor_lr == 1.0


def test_strings_are_refused_in_overrides_and_mappings_too(tmp_path):
    """A quoted number given as an override (a Prefect form's dict, `--set x="'1'"`) or in an inline mapping."""
    with pytest.raises(BadInput, match=r"^override 'ppo.actor_lr=0.1': field 'ppo.actor_lr': '0.1' is text"):
        load_config(Job, {"steps": 3}, {"ppo.actor_lr": "0.1"})
    with pytest.raises(BadInput, match=r"field 'steps': '3' is text, not a whole number"):
        load_config(Job, {"steps": "3"})
    with pytest.raises(BadInput, match=r"field 'steps'"):
        load_config(Job, {"steps": 3.5})  # no silent rounding either


@pytest.mark.parametrize("command", [["bench", "oppo", "--config"], ["detect", "t.csv", "--config"],
                                     ["sweep"], ["health", "t.csv", "--alerts"]])
def test_every_command_reads_its_config_strictly_before_torch(tmp_path, command):
    """The other commands that take a config file: the same one line for a key given twice, torch not imported."""
    (tmp_path / "t.csv").write_text("run_id,step,eval_score\na,1,0.5\n")
    f = tmp_path / "dup.yaml"
    f.write_text("a: 1\nb: {c: 2}\na: 3\n")
    probe = ("import sys\nfrom rlhfops.cli import main\n"
             "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
             "print('torch' in sys.modules, code)\n")
    r = subprocess.run([sys.executable, "-c", probe, *command, str(f)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.stdout.split() == ["False", "2"], (r.stdout, r.stderr)
    assert "field 'a' is given twice (lines 1 and 3" in _one_line(r.stderr)


def test_configs_paths_resolve_from_any_directory_for_experiments_and_sweep_specs(tmp_path, monkeypatch):
    """`configs/E1.yaml` and `configs/sweeps/example.yaml` (one folder deeper) name the shipped files from a directory
    that has no configs/; a file of the user's own there wins."""
    from common.config import config_dir, config_path
    from scheduling.experiments import load_experiment

    monkeypatch.chdir(tmp_path)
    assert config_path("configs/sweeps/example.yaml") == config_dir() / "sweeps" / "example.yaml"
    assert str(config_path("configs/../E1.yaml")) == "configs/../E1.yaml"  # never climbs out of the shipped folder
    assert load_experiment("configs/E1.yaml").name == "E1"
    (tmp_path / "configs" / "sweeps").mkdir(parents=True)
    (tmp_path / "configs" / "sweeps" / "example.yaml").write_text("name: mine\n")
    assert config_path("configs/sweeps/example.yaml").resolve() == tmp_path / "configs" / "sweeps" / "example.yaml"
