"""`tasks.bench_sweep.run_bench` and `sweeps.bench.bench_result` (what `rlhfops bench sweep` writes) with the sweeps
replaced by hand-made ones: each variant gets its own spec (name, out_dir under the work directory, its pruner, the
spec's pruning params only for the pruner the spec names), the JSON keeps the keys docs/ARCHITECTURE.md lists, and the
savings are the ones the test computes from the steps it chose. No training runs."""

from __future__ import annotations

import csv
import math

import pytest

from common.errors import BadInput

#: the keys of `bench sweep`'s JSON as the CLI wrote them when the measurement lived in rlhfops/commands/bench_sweep.py
TOP_KEYS = {"spec", "sampler", "sampler_seed", "trials", "concurrency", "pruner", "order", "unpruned", "pruned",
            "median", "wilcoxon", "gpu_seconds_saved_frac", "wall_saved_frac", "steps_saved_frac", "best_score_gap",
            "best_within_one_se", "acceptance", "python", "machine", "cpus"}
RUN_KEYS = {"pruner", "pruning_params", "load_avg_1m", "gpu_seconds", "wall_s", "trials", "trials_pruned",
            "trials_failed", "steps_trained", "best_score", "best_se", "best_trial", "best_params", "mlflow_run_id",
            "per_trial", "gpu_seconds_priced", "steps_unpriced", "gpu_seconds_saved_frac",
            "gpu_seconds_measured_saved_frac", "steps_saved_frac", "wall_saved_frac", "best_score_gap",
            "best_within_one_se"}
TRIAL_KEYS = {"number", "params", "state", "objective", "objective_se", "best_step", "pruned_at", "stop_reason",
              "steps", "gpu_seconds", "wall_s"}
#: steps each variant trains per trial (two trials); every step costs 1 s of rollout
STEPS = {"incumbent": [6, 2], "median": [6, 4], "none": [6, 6], "wilcoxon": [6, 5]}


@pytest.fixture
def base():
    from tasks.sweep import prepare

    spec, _ = prepare("configs/sweeps/example.yaml", 2)
    return spec


def fake_sweep(seen: list):
    def sweep(spec, ledger, prune: bool) -> dict:
        seen.append((spec, prune))
        steps = STEPS[spec.pruning.detector if prune else "none"]
        trials = []
        for n, k in enumerate(steps):
            d = spec.run_dir / f"trial-{n:04d}" / "seed-0"
            d.mkdir(parents=True)
            with (d / "metrics.csv").open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["step", "phase_rollout_s"])
                w.writerows([s, 1.0] for s in range(1, k + 1))
            trials.append({"number": n, "params": {"ppo.kl_coef": 0.01 * (n + 1)}, "state": "COMPLETE",
                           "objective": 0.5 + 0.1 * n, "objective_se": 0.05, "best_step": k, "pruned_at": None,
                           "stop_reason": None, "steps": k, "gpu_seconds": float(k), "wall_s": float(k),
                           "ignored": "not kept"})
        return {"gpu_seconds": float(sum(steps)), "wall_s": float(sum(steps)), "trials_done": len(steps),
                "trials_pruned": sum(k < 6 for k in steps), "trials_failed": 0, "trials": trials,
                "best": {"number": 1, "objective": 0.6, "objective_se": 0.05, "params": trials[1]["params"]},
                "mlflow_run_id": f"run-{spec.name}"}

    return sweep


def test_the_four_runs_are_priced_compared_and_keep_their_keys(base, tmp_path, monkeypatch):
    import training.trainer
    from sweeps.bench import bench_result
    from tasks.bench_sweep import run_bench

    monkeypatch.setattr(training.trainer, "Trainer", lambda *a, **k: None)  # the warm start: no model here
    work = tmp_path / "work"
    (work / "stale").mkdir(parents=True)
    seen = []
    runs = run_bench(base, work, fake_sweep(seen))
    assert not (work / "stale").exists()  # emptied first
    assert [(s.name, s.pruning.detector, s.run_dir, prune) for s, prune in seen] == [
        ("example-unpruned", "none", work / "unpruned", False), ("example-pruned", "incumbent", work / "pruned", True),
        ("example-median", "median", work / "median", True), ("example-wilcoxon", "wilcoxon", work / "wilcoxon", True)]
    assert [dict(s.pruning.params) for s, _ in seen] == [{}, {"alpha": 0.05, "margin": 0.0}, {}, {}]

    result = bench_result("configs/sweeps/example.yaml", base, runs)
    assert set(result) == TOP_KEYS and result["order"] == ["unpruned", "pruned", "median", "wilcoxon"]
    for label in result["order"]:
        r = result[label]
        assert set(r) == RUN_KEYS and all(set(t) == TRIAL_KEYS for t in r["per_trial"])
        assert len(r["load_avg_1m"]) == 2 and r["mlflow_run_id"] == f"run-example-{label}"
    assert [result[k]["pruner"] for k in result["order"]] == ["none", "incumbent", "median", "wilcoxon"]
    assert result["pruned"]["pruning_params"] == {"alpha": 0.05, "margin": 0.0}
    # 12 steps unpruned at 1 s each; the incumbent pruner trains 8, Median 10, Wilcoxon 11
    assert result["unpruned"]["gpu_seconds_priced"] == 12.0 and result["pruned"]["steps_trained"] == 8
    assert result["gpu_seconds_saved_frac"] == pytest.approx(4 / 12) == result["steps_saved_frac"]
    assert result["median"]["gpu_seconds_saved_frac"] == pytest.approx(2 / 12)
    assert result["wilcoxon"]["steps_saved_frac"] == pytest.approx(1 / 12)
    assert result["best_score_gap"] == 0.0 and result["best_within_one_se"] is True
    assert result["acceptance"] == {
        "gpu_seconds_saved_frac >= 0.40": False, "|best gap| <= unpruned best SE": True,
        "saves more GPU-seconds than median": True, "saves more PPO steps than median": True,
        "best score >= median's": True, "saves more GPU-seconds than wilcoxon": True,
        "saves more PPO steps than wilcoxon": True, "best score >= wilcoxon's": True}
    assert not math.isnan(result["wall_saved_frac"])


def test_a_spec_with_its_own_storage_is_refused_before_the_work_directory_is_emptied(base, tmp_path):
    from tasks.bench_sweep import run_bench

    work = tmp_path / "work"
    (work / "kept").mkdir(parents=True)
    with pytest.raises(BadInput, match="^spec: storage: "):
        run_bench(base.model_copy(update={"storage": f"sqlite:///{tmp_path}/s.db"}), work, fake_sweep([]))
    assert (work / "kept").is_dir()
