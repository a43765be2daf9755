"""The sweep runner with the incumbent pruner (eval/incumbent_pruner.py): each trial's gate records (the run
directory's gate_records.csv, as the trainer writes them) reach the pruner as per-prompt scores, a trial far below
the sweep's best checkpoint is pruned at its first checkpoint with the evidence in its stop reason, and the spec names
Optuna's Median and Wilcoxon pruners too. A scripted trial stands in for training (its scores are set by the test)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from sweep_helpers import BASE

from sweeps.runner import TrialOutcome
from training.gate import record_rows, write_records

GOOD, BAD, WORSE = 0.2, 0.05, 0.01  # kl_coef of the settings (one trial at a time, in the grid's order)
OFFSET = {GOOD: 0.0, BAD: -1.0, WORSE: -1.5}
N_PROMPTS = BASE["eval_prompts"]
DIFFICULTY = np.linspace(-0.5, 0.5, N_PROMPTS)


def prompt_scores(kl: float, step: int) -> dict[int, float]:
    rng = np.random.default_rng([int(kl * 100), step])
    return {i: float(DIFFICULTY[i] + 0.05 * step + OFFSET[kl] + rng.normal(0, 0.05)) for i in range(N_PROMPTS)}


class ScriptedTrial:
    """One GPU-second per step; at each gate the per-prompt scores go to the run directory's gate_records.csv (the
    trainer's format) before the observer is called, as in training."""

    def __call__(self, request, observer, *, checked, ledger, run_id):
        from training.gate import PromptRecord

        cfg, out_dir = checked.config, request.out_dir
        kl = cfg.ppo.kl_coef
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        records, scores = [], []
        for step in range(1, cfg.steps + 1):
            rec = {"step": step, "reward_mean": 0.0, "gold_eval": math.nan, "gold_eval_se": math.nan,
                   "wall_s": float(step)}
            if step % cfg.eval_every == 0:
                ps = prompt_scores(kl, step)
                write_records(out / "gate_records.csv",
                              record_rows("r", step, [PromptRecord(i, 0, v, math.nan, 1) for i, v in ps.items()]),
                              append=True)
                rec.update(gold_eval=float(np.mean(list(ps.values()))), gold_eval_se=0.01)
                ckpt = out / "checkpoints" / f"step-{step:06d}"
                ckpt.mkdir(parents=True, exist_ok=True)
                scores.append((step, rec["gold_eval"], str(ckpt)))
            records.append(rec)
            reason = observer(step, rec) if math.isfinite(rec["gold_eval"]) else None
            best = max(scores, key=lambda s: (s[1], -s[0])) if scores else None
            if reason:
                return TrialOutcome("pruned", steps=step, gpu_seconds=float(step), wall_s=0.0, best_step=best[0],
                                    best_score=best[1], best_se=0.01, best_checkpoint=best[2], pruned_at=step,
                                    stop_reason=reason, records=records)
        return TrialOutcome("completed", steps=cfg.steps, gpu_seconds=float(cfg.steps), wall_s=0.0, best_step=best[0],
                            best_score=best[1], best_se=0.01, best_checkpoint=best[2], records=records)


def spec_dict(tmp_path, pruning):
    return {"name": "inc", "base": BASE, "space": {"ppo.kl_coef": {"grid": [GOOD, BAD, WORSE]}},
            "sampler": {"kind": "grid", "seed": 5}, "trials": 3, "tenant": "acme", "concurrency": 1,
            "pruning": pruning, "out_dir": str(tmp_path / "sweep"), "mlflow_experiment": "sweeps-test"}


def test_a_trial_far_below_the_incumbent_is_pruned_with_its_evidence(tmp_path):
    from sweeps.runner import SweepRunner
    from tasks.sweep import prepare

    spec, ledger = prepare(spec_dict(tmp_path, {"detector": "incumbent", "params": {"alpha": 0.02}}))
    summary = SweepRunner(spec, ledger=ledger, trial_fn=ScriptedTrial(), report=False).run()
    study = optuna.load_study(study_name="inc", storage=spec.storage_url)
    t = {tr.params["ppo.kl_coef"]: tr for tr in study.trials}
    assert sorted(t) == sorted(OFFSET)
    first = min(study.trials, key=lambda tr: tr.number)
    assert first.state is TrialState.COMPLETE  # the first trial has no incumbent to lose to
    # the per-prompt scores the pruner read are the ones the trial wrote (the CSV keeps 6 significant digits)
    kl = first.params["ppo.kl_coef"]
    assert first.user_attrs["rlhfops.ckpt.000000002"]["prompts"] == pytest.approx(
        {str(i): v for i, v in prompt_scores(kl, 2).items()}, abs=1e-5)
    # grid seed 5 runs GOOD, BAD, WORSE. BAD has one trial before it: too little history for the allowance
    # (min_history 2), so it completes. WORSE, 1.5 below GOOD on every prompt with GOOD and BAD finished, is pruned
    # at its first checkpoint: its bound + the largest improvement they showed after step 2 (GOOD's 0.05 a step,
    # smoothed over 3 checkpoints: 0.4) is below GOOD's best checkpoint
    gate = BASE["eval_every"]
    by_number = {r["number"]: r for r in summary["trials"]}
    order = [tr.params["ppo.kl_coef"] for tr in sorted(study.trials, key=lambda tr: tr.number)]
    assert order == [GOOD, BAD, WORSE]
    assert t[GOOD].state is TrialState.COMPLETE and t[BAD].state is TrialState.COMPLETE
    assert t[WORSE].state is TrialState.PRUNED and t[WORSE].last_step == gate
    reason = by_number[t[WORSE].number]["stop_reason"]
    assert reason.startswith(f"pruned by the incumbent pruner at step {gate}: cannot beat the sweep's best checkpoint")
    assert f"{N_PROMPTS} prompts paired with trial {t[GOOD].number}'s step {BASE['steps']}" in reason
    assert summary["gpu_seconds"] == 2 * BASE["steps"] + gate


@pytest.mark.parametrize("name", ["median", "wilcoxon", "incumbent", "none"])
def test_the_spec_names_every_sweep_pruner(tmp_path, name):
    from sweeps.runner import make_pruner
    from tasks.sweep import prepare

    spec, _ = prepare(spec_dict(tmp_path, {"detector": name}))
    pruner = make_pruner(spec, True)
    assert getattr(pruner, "name", "none") == name or isinstance(pruner, optuna.pruners.NopPruner)


def test_a_misspelled_pruner_is_bad_input(tmp_path):
    from common.errors import BadInput
    from tasks.sweep import prepare

    with pytest.raises(BadInput, match="pruning.detector"):
        prepare(spec_dict(tmp_path, {"detector": "incumbent", "params": {"alhpa": 0.1}}))
