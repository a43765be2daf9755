"""`eval.sweep_pruners.replay` (what `rlhfops bench sweep-replay` reports): a recorded unpruned sweep replayed under
a pruner on the sweep's slots, time running on the recorded GPU-seconds. Oracles: the order of checkpoints and the
steps, GPU-seconds and kept scores worked out by hand for a scripted pruner; and the real incumbent pruner through the
CLI on recorded run directories written here."""

from __future__ import annotations

import csv
import json

import pytest
from optuna.pruners import BasePruner

from eval.sweep_pruners import RecordedTrial, replay

STEPS = [2, 4, 6, 8]


def recorded(number: int, means: list[float], per_step: float) -> RecordedTrial:
    return RecordedTrial(number, [(s, {"0": m, "1": m}) for s, m in zip(STEPS, means, strict=True)],
                         {s: per_step for s in range(1, STEPS[-1] + 1)})


class Scripted(BasePruner):
    """Prunes (trial, step) pairs named in advance; records the order it was asked in."""

    def __init__(self, at: set[tuple[int, int]]):
        self.at, self.asked = at, []

    def prune(self, study, trial) -> bool:
        self.asked.append((trial.number, trial.last_step))
        return (trial.number, trial.last_step) in self.at


def test_replay_orders_checkpoints_by_recorded_time_and_frees_a_pruned_trials_slot():
    # trial 0: 1 GPU-s a step, trial 1: 3, trial 2: 1. Two slots: 0 and 1 start at 0; trial 0 ends at 8 (its last
    # checkpoint is not asked: nothing left to save) and trial 2 takes its slot. Checkpoint times: t0 2, 4, 6, (8);
    # t1 6, 12; t2 10, 12, 14, (16); ties go to the lower trial number. Trial 1 is pruned at its step 4 (time 12)
    trials = [recorded(0, [0.1, 0.2, 0.3, 0.4], 1.0), recorded(1, [0.5, 0.9, 0.9, 0.9], 3.0),
              recorded(2, [0.0, 0.1, 0.6, 0.2], 1.0)]
    pruner = Scripted({(1, 4)})
    r = replay(trials, pruner, slots=2)
    assert pruner.asked == [(0, 2), (0, 4), (0, 6), (1, 2), (2, 2), (1, 4), (2, 4), (2, 6)]
    assert r["per_trial"][1] == {"steps": 4, "kept": 0.9, "pruned": True, "gpu_seconds": 12.0}
    assert r["steps_trained"] == 8 + 4 + 8 and r["gpu_seconds"] == pytest.approx(8 + 12 + 8)
    assert (r["best_score"], r["best_trial"], r["trials_pruned"]) == (0.9, 1, 1)  # a pruned trial keeps its best
    one = replay(trials, Scripted(set()), slots=1)
    assert one["steps_trained"] == 24 and one["gpu_seconds"] == pytest.approx(8 + 24 + 8)


def write_sweep(root, curves: dict[int, list[float]]) -> None:
    """Run directories as an unpruned sweep leaves them: trial-NNNN/seed-0/{gate_records.csv, metrics.csv}."""
    from training.gate import PromptRecord, record_rows, write_records

    for n, means in curves.items():
        d = root / f"trial-{n:04d}" / "seed-0"
        d.mkdir(parents=True)
        for s, m in zip(STEPS, means, strict=True):
            recs = [PromptRecord(i, 0, m + (0.3 if i % 2 else -0.3) + 0.01 * i, float("nan"), 1) for i in range(16)]
            write_records(d / "gate_records.csv", record_rows("r", s, recs), append=True)
        with (d / "metrics.csv").open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "phase_rollout_s"])
            w.writerows([s, 1.0] for s in range(1, STEPS[-1] + 1))


def test_the_cli_replays_a_recorded_sweep_and_the_incumbent_pruner_stops_a_hopeless_trial(tmp_path, capsys,
                                                                                          monkeypatch):
    from cli_helpers import run_cli_output

    # trials 0 and 1 rise 0.3 over their run; trial 2 sits 2.0 below them on every prompt: with two trials of
    # history (allowance 0.2: their 3-checkpoint means rise 0.2 after step 2) it is pruned at its first checkpoint
    write_sweep(tmp_path / "sweep", {0: [0.0, 0.1, 0.2, 0.3], 1: [0.0, 0.1, 0.2, 0.3], 2: [-2.0] * 4})
    spec = tmp_path / "spec.yaml"
    spec.write_text(open("configs/sweeps/example.yaml").read().replace("concurrency: 2", "concurrency: 1"))
    out = tmp_path / "replay.json"
    code, _, err = run_cli_output(["bench", "sweep-replay", "--run-dir", tmp_path / "sweep", "--spec", spec, "--out",
                                   out], capsys, monkeypatch)
    assert code == 0, err
    r = json.loads(out.read_text())
    assert r["unpruned"]["steps_trained"] == 24 and r["pruned"]["per_trial"]["2"]["steps"] == 2
    assert r["pruned"]["steps_saved_frac"] == pytest.approx(6 / 24)
    assert r["pruned"]["best_score"] == pytest.approx(r["unpruned"]["best_score"])
