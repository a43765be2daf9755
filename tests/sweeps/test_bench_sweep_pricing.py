"""`rlhfops bench sweep`'s load-free GPU-seconds (sweeps/bench.py `priced`, `compare`): every step a
run trained is charged what the same step cost in the unpruned run, so a pruned run that ran on a busier machine is
not charged its slowdown. Oracle: run directories written here with per-step phase times the test chose, and the
sums kept by the test."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sweeps.bench import compare, priced


def write_run(root: Path, steps: dict[int, int], cost) -> None:
    """trial-NNNN/seed-0/metrics.csv for each trial with its steps; phase seconds rollout = cost(trial, step), optim
    0.5."""
    for trial, n in steps.items():
        d = root / f"trial-{trial:04d}" / "seed-0"
        d.mkdir(parents=True)
        with (d / "metrics.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "gold_eval", "phase_rollout_s", "phase_optim_s"])
            for s in range(1, n + 1):
                w.writerow([s, "nan", cost(trial, s), 0.5])


def run(per_trial: dict[int, int], params: dict[int, dict], best: float = 0.5) -> dict:
    return {"gpu_seconds": 0.0, "steps_trained": sum(per_trial.values()), "wall_s": 1.0, "best_score": best,
            "best_se": 0.1, "per_trial": [{"number": n, "params": params[n]} for n in per_trial]}


def test_a_pruned_run_on_a_busier_machine_is_charged_the_unpruned_runs_prices(tmp_path):
    params = {0: {"kl": 0.1}, 1: {"kl": 0.2}, 2: {"kl": 0.3}}
    full = {0: 6, 1: 6, 2: 6}
    cut = {0: 6, 1: 2, 2: 3}
    write_run(tmp_path / "unpruned", full, lambda t, s: 1.0 + t + 0.1 * s)
    write_run(tmp_path / "pruned", cut, lambda t, s: 3 * (1.0 + t + 0.1 * s))  # 3x slower per step: load
    runs = {"unpruned": run(full, params), "pruned": run(cut, params)}
    dirs = {k: tmp_path / k for k in runs}
    priced(runs, dirs, gpus_per_trial=2)

    def total(steps):  # the unpruned run's prices for these steps, x 2 GPUs
        return 2 * sum(1.0 + t + 0.1 * s + 0.5 for t, n in steps.items() for s in range(1, n + 1))

    assert runs["unpruned"]["gpu_seconds_priced"] == pytest.approx(total(full))
    assert runs["pruned"]["gpu_seconds_priced"] == pytest.approx(total(cut))
    assert runs["pruned"]["steps_unpriced"] == 0
    runs["unpruned"]["gpu_seconds"], runs["pruned"]["gpu_seconds"] = total(full), 3 * total(cut)
    compare(runs)
    assert runs["pruned"]["gpu_seconds_saved_frac"] == pytest.approx(1 - total(cut) / total(full))
    assert runs["pruned"]["gpu_seconds_measured_saved_frac"] == pytest.approx(1 - 3 * total(cut) / total(full))


def test_a_trial_whose_setting_differs_is_charged_as_measured(tmp_path):
    write_run(tmp_path / "unpruned", {0: 4}, lambda t, s: 1.0)
    write_run(tmp_path / "pruned", {0: 2}, lambda t, s: 7.0)
    runs = {"unpruned": run({0: 4}, {0: {"kl": 0.1}}), "pruned": run({0: 2}, {0: {"kl": 0.9}})}
    priced(runs, {k: tmp_path / k for k in runs}, gpus_per_trial=1)
    assert runs["pruned"]["gpu_seconds_priced"] == pytest.approx(2 * 7.5) and runs["pruned"]["steps_unpriced"] == 2
