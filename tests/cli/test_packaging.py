"""A non-editable install works: the wheel carries `configs/` as package data, and the CLI run from a directory
without a checkout finds the shipped experiments, PPO configs, prices, alert thresholds and detector defaults.

The wheel is built offline (`--no-build-isolation`, setuptools from this environment) from a copy of the tracked
sources, installed with `--target` into a scratch directory and put first on PYTHONPATH, so the child process
imports the installed copy, not this checkout (the test asserts where each package came from); the stack's
dependencies come from this environment."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["common", "configs", "training", "scheduling", "studies", "eval", "infra", "tasks", "flows", "rlhfops"]


def _pip(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], cwd=cwd, check=True,
                   timeout=300)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path_factory.mktemp("wheel")
    # setuptools from this environment when it has one (offline, fast); else pip's isolated build fetches it
    # from the configured index
    offline = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    _pip("wheel", "--no-deps", *offline, "-w", str(wheels), ".", cwd=src)
    target = tmp_path_factory.mktemp("site")
    _pip("install", "--no-deps", "--no-index", "--target", str(target), *map(str, wheels.glob("*.whl")), cwd=src)
    return target


def _run(installed: Path, cwd: Path, *cmd: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(installed), "MPLBACKEND": "Agg"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_wheel_install_runs_simulate_from_another_directory(installed, tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    # the child imports the installed copy, and the shipped YAML lies in it
    probe = _run(installed, work, sys.executable, "-c", (
        "import common, configs, scheduling, rlhfops; from common.config import config_dir;"
        "print(common.__file__); print(configs.__file__); print(scheduling.__file__); print(rlhfops.__file__);"
        "print(config_dir())"))
    assert probe.returncode == 0, probe.stderr
    paths = probe.stdout.split()
    assert all(p.startswith(str(installed)) for p in paths), paths
    shipped = sorted(p.name for p in Path(paths[-1]).glob("*.yaml"))
    assert shipped == sorted(p.name for p in (REPO / "configs").glob("*.yaml"))

    # every shipped-config lookup below the CLI, by `configs/...` path and by default, from this directory
    loads = _run(installed, work, sys.executable, "-c", (
        "from training.job.config import load_config; from infra.ledger import load_prices;"
        "from eval.health import load_alerts_config; from eval.detectors import make_detector;"
        "print(load_config('configs/ppo-tiny.yaml').name, load_prices().gpu_hour['cpu'],"
        " len(load_alerts_config().alerts), type(make_detector('divergence')).__name__)"))
    assert loads.returncode == 0, loads.stderr
    assert loads.stdout.split()[:2] == ["ppo-tiny", "0.05"]

    rlhfops = installed / "bin" / "rlhfops"
    res = _run(installed, work, str(rlhfops), "simulate", "E1", "--seeds", "42", "--out", "e1", "--workers", "1")
    assert res.returncode == 0, res.stderr[-2000:]
    summary = pd.read_csv(work / "e1" / "summary.csv")
    assert set(summary["experiment"]) == {"E1"} and len(summary) == 9  # the nine schedulers of E1
