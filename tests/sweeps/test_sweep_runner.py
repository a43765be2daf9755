"""The sweep runner (sweeps/runner.py) with its MLflow tracker (tasks/sweep.py) on a real Optuna storage (SQLite
file) and a real MLflow store, with a scripted trial in place of training: each trial's held-out curve, GPU time and
failure are set by its kl_coef, so the expected prune step, values, ledger totals and registry entry are computed by
hand below."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState
from sweep_helpers import BASE

from sweeps.runner import TrialOutcome

# kl_coef -> held-out score at steps 2, 4, ..., 12 and the proxy reward (rising in the hacking run)
HACK, HEALTHY, BROKEN = 0.01, 0.2, 0.5
CURVES = {HACK: [0.3, 0.5, 0.4, 0.3, 0.2, 0.1], HEALTHY: [0.1, 0.2, 0.3, 0.4, 0.5, 0.6], BROKEN: [0.0] * 6}
GPU_S_PER_STEP = 1.0
BROKEN_AT = 3  # the broken setting fails at step 3


class ScriptedTrial:
    """Stands in for `run_trial`: one GPU-second per step charged to the ledger, the observer at every checkpoint."""

    def __init__(self):
        self.calls: list[float] = []

    def __call__(self, request, observer, *, checked, ledger, run_id):
        cfg, out_dir, tenant, gpu_kind, gpus = (checked.config, request.out_dir, request.tenant, request.gpu_kind,
                                                request.gpus)
        kl = cfg.ppo.kl_coef
        self.calls.append(kl)
        records, scores = [], []
        for step in range(1, cfg.steps + 1):
            ledger.charge(run_id, tenant, gpu_kind, "rollout", GPU_S_PER_STEP * gpus, steps=1)
            if kl == BROKEN and step == BROKEN_AT:
                return TrialOutcome("failed", steps=step, gpu_seconds=step * GPU_S_PER_STEP, wall_s=0.0,
                                    error="RuntimeError: reward service down", records=records)
            rec = {"step": step, "reward_mean": 0.1 * step if kl == HACK else 0.0, "gold_eval": math.nan,
                   "gold_eval_se": math.nan, "wall_s": float(step)}
            if step % cfg.eval_every == 0:
                score = CURVES[kl][step // cfg.eval_every - 1]
                rec.update(gold_eval=score, gold_eval_se=0.02)
                ckpt = Path(out_dir) / "checkpoints" / f"step-{step:06d}"
                ckpt.mkdir(parents=True, exist_ok=True)
                (ckpt / "weights.txt").write_text(f"{kl} {step}")
                scores.append((step, score, str(ckpt)))
            records.append(rec)
            if math.isfinite(rec["gold_eval"]) and observer(step, rec):
                best = max(scores, key=lambda s: (s[1], -s[0]))
                return TrialOutcome("pruned", steps=step, gpu_seconds=step * GPU_S_PER_STEP, wall_s=0.0,
                                    best_step=best[0], best_score=best[1], best_se=0.02, best_checkpoint=best[2],
                                    pruned_at=step, stop_reason="pruned", records=records)
        best = max(scores, key=lambda s: (s[1], -s[0]))
        return TrialOutcome("completed", steps=cfg.steps, gpu_seconds=cfg.steps * GPU_S_PER_STEP, wall_s=0.0,
                            best_step=best[0], best_score=best[1], best_se=0.02, best_checkpoint=best[2],
                            records=records)


def spec_dict(tmp_path, **kw):
    d = {"name": "t", "base": BASE, "space": {"ppo.kl_coef": {"grid": [HACK, HEALTHY, BROKEN]}},
         "sampler": {"kind": "grid", "seed": 0}, "trials": 3, "tenant": "acme", "concurrency": 2,
         "pruning": {"detector": "evalstop", "params": {"k": 2}}, "out_dir": str(tmp_path / "sweep"),
         "mlflow_experiment": "sweeps-test"}
    d.update(kw)
    return d


def run(tmp_path, fake, **kw):
    from tasks.sweep import prepare, run_sweep

    resume = kw.pop("resume", False)
    prune = kw.pop("prune", True)
    trials = kw.pop("trials", None)
    spec, ledger = prepare(spec_dict(tmp_path, **kw), trials=trials)
    return run_sweep(spec, ledger, prune=prune, resume=resume, trial_fn=fake), ledger, spec


def by_kl(study):
    return {t.params["ppo.kl_coef"]: t for t in study.trials}


def test_prune_fail_complete_recorded_in_optuna_mlflow_ledger_and_registry(tmp_path, mlflow_store):
    from infra import tracking as T

    fake = ScriptedTrial()
    summary, ledger, spec = run(tmp_path, fake)
    study = optuna.load_study(study_name="t", storage=spec.storage_url)
    t = by_kl(study)
    # EvalStop k=2 on 0.3, 0.5, 0.4, 0.3: the second consecutive decline is the checkpoint at step 8
    assert t[HACK].state is TrialState.PRUNED and t[HACK].last_step == 8
    assert t[HACK].value == 0.5  # its kept checkpoint (step 4), not the score it stopped at
    assert t[HEALTHY].state is TrialState.COMPLETE and t[HEALTHY].value == 0.6
    assert t[BROKEN].state is TrialState.FAIL
    # GPU time: 8 steps (pruned) + 12 (complete) + 3 (failed), one GPU-second each
    expected_gpu_s = (8 + 12 + BROKEN_AT) * GPU_S_PER_STEP
    assert summary["gpu_seconds"] == pytest.approx(expected_gpu_s)
    assert float(ledger.tenant_totals()["acme"].gpu_seconds) == pytest.approx(expected_gpu_s)
    assert summary["trials_pruned"] == 1 and summary["trials_failed"] == 1 and summary["best"]["objective"] == 0.6

    c = T.client()
    parent = c.get_run(summary["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_pruned"] == 1
    kids = {r.data.params["ppo.kl_coef"]: r for r in c.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")}
    assert set(kids) == {str(HACK), str(HEALTHY), str(BROKEN)}
    assert kids[str(HACK)].info.status == "FINISHED" and kids[str(HACK)].data.tags["final_state"] == "PRUNED"
    assert kids[str(HACK)].data.metrics["pruned_at_step"] == 8
    assert kids[str(BROKEN)].info.status == "FAILED" and "reward service" in kids[str(BROKEN)].data.tags["error"]
    assert kids[str(HEALTHY)].data.tags["final_state"] == "COMPLETED"
    hist = c.get_metric_history(kids[str(HACK)].info.run_id, "gold_eval")
    assert sorted(m.step for m in hist) == [2, 4, 6, 8]
    # per-trial cost from the ledger: 12 GPU-seconds at the cpu price
    from infra.ledger import load_prices

    price = float(load_prices().hourly("cpu"))
    assert kids[str(HEALTHY)].data.metrics["cost_usd"] == pytest.approx(12 / 3600 * price)
    # the best trial's checkpoint is registered under the sweep's own model, with the best alias; the tenant's
    # job model is not touched
    mv = c.get_model_version_by_alias("t-sweep", "best")
    assert "acme-policy" not in {m.name for m in c.search_registered_models()}
    assert mv.run_id == kids[str(HEALTHY)].info.run_id and mv.tags["step"] == "12"
    arts = {a.path for a in c.list_artifacts(parent.info.run_id, "report")}
    assert {"report/sweep.md", "report/pareto.png", "report/curves.png"} <= arts


def test_no_prune_runs_every_trial_to_the_end(tmp_path, mlflow_store):
    summary, _, spec = run(tmp_path, ScriptedTrial(), prune=False)
    t = by_kl(optuna.load_study(study_name="t", storage=spec.storage_url))
    assert t[HACK].state is TrialState.COMPLETE and t[HACK].value == 0.5 and t[HACK].last_step == 12
    assert summary["gpu_seconds"] == pytest.approx((12 + 12 + BROKEN_AT) * GPU_S_PER_STEP)


def test_budget_stops_new_trials_and_says_so(tmp_path, mlflow_store):
    from infra import tracking as T

    # one trial at a time; 10 GPU-seconds of budget: the first trial (HACK, pruned at 8) leaves 2, the second
    # (HEALTHY, 12) crosses it, so the third never starts
    summary, _, spec = run(tmp_path, ScriptedTrial(), concurrency=1, budget={"gpu_hours": 10 / 3600})
    assert summary["trials_done"] == 2
    assert summary["budget_stop"] and summary["budget_stop"].startswith("budget.gpu_hours reached")
    assert len(optuna.load_study(study_name="t", storage=spec.storage_url).trials) == 2
    assert T.client().get_run(summary["mlflow_run_id"]).data.tags["budget_stop"] == summary["budget_stop"]


def test_resume_extends_and_reruns_only_interrupted_trials(tmp_path, mlflow_store):
    from common.errors import BadInput

    fake = ScriptedTrial()
    space = {"ppo.kl_coef": {"choice": [HACK, HEALTHY]}}
    sampler = {"kind": "random", "seed": 3}
    run(tmp_path, fake, trials=2, space=space, sampler=sampler)
    assert len(fake.calls) == 2
    with pytest.raises(BadInput, match="--resume"):  # a second sweep under the same name must say resume
        run(tmp_path, fake, trials=2, space=space, sampler=sampler)
    # a process died with a trial RUNNING: simulate it by asking for one and never telling
    from sweeps.spec import parse_spec

    spec = parse_spec(spec_dict(tmp_path, space=space, sampler=sampler))
    study = optuna.load_study(study_name="t", storage=spec.storage_url)
    dead = study.ask({"ppo.kl_coef": optuna.distributions.CategoricalDistribution([HACK, HEALTHY])})
    before = len(fake.calls)
    summary, _, _ = run(tmp_path, fake, trials=3, space=space, sampler=sampler, resume=True)
    study = optuna.load_study(study_name="t", storage=spec.storage_url)
    states = [(t.number, t.state, bool(t.user_attrs.get("interrupted"))) for t in study.trials]
    assert (dead.number, TrialState.FAIL, True) in states
    assert len(fake.calls) - before == 1  # only the requeued setting ran; the two finished trials did not
    assert fake.calls[-1] == dead.params["ppo.kl_coef"]
    assert summary["trials_done"] == 3


def test_custom_prices_check_and_charge_every_trial(tmp_path, mlflow_store):
    """`prepare(prices=...)`: every trial's request is checked against that table (a GPU kind priced only there is
    accepted) and charged at its price: per-trial cost = the trial's GPU-seconds (counted here) x the custom price."""
    from infra import tracking as T

    prices = tmp_path / "prices.yaml"
    prices.write_text('currency: USD\ngpu_hour:\n  tpu-x: "7.20"\ntenants: [acme]\n')
    seen: list[tuple[str, dict]] = []
    fake = ScriptedTrial()

    def trial(request, observer, *, checked, ledger, run_id):
        seen.append((request.prices, dict(checked.gpu_hour)))
        return fake(request, observer, checked=checked, ledger=ledger, run_id=run_id)

    from tasks.sweep import prepare, run_sweep

    spec, ledger = prepare(spec_dict(tmp_path, gpu_kind="tpu-x", space={"ppo.kl_coef": {"grid": [HACK, HEALTHY]}},
                                     trials=2), prices=str(prices))
    summary = run_sweep(spec, ledger, trial_fn=trial)
    assert summary["trials_failed"] == 0 and len(seen) == 2
    assert all(p == str(prices) and table == {"tpu-x": "7.20"} for p, table in seen)
    kids = T.client().search_runs([T.experiment_id("sweeps-test")],
                                  f"tags.`mlflow.parentRunId` = '{summary['mlflow_run_id']}'")
    gpu_s = {HACK: 8 * GPU_S_PER_STEP, HEALTHY: 12 * GPU_S_PER_STEP}  # pruned at step 8; ran all 12 steps
    assert {float(r.data.params["ppo.kl_coef"]): r.data.metrics["cost_usd"] for r in kids} == pytest.approx(
        {kl: s / 3600 * 7.20 for kl, s in gpu_s.items()})
