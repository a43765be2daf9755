"""One supervisor, one detector: one job spec run through the `rlhf-job` flow, a platform round, a sweep trial and
`rlhfops train --detector`, gated by the real EvalStop detector (k = 2, no stub), gets the same verdict at the same
step, and every record says who decided it (`decided_by`).

What the gate reads is fixed: the trainer's held-out scoring (`Trainer.score_batch`) is replaced by recorded
per-prompt gate scores (`GATE_DECLINES`: a peak at step 6, then two declines), so the stop case runs on every clean
clone whatever warm start the run builds; the rest (training, the gate's records, the supervisor, the detector, each
entry point's plumbing) is the real path. The oracle is the schedule itself, read by hand: EvalStop(k=2) stops at the
second consecutive decline, step 10. The never-stops case is a second test on a rising schedule, and an alert's
failure a third (a KL spike over the catalog's ceiling), so each record's `decided_by` is read for a gate pause, an
alert failure and a completed job."""

from __future__ import annotations

import json
import math
import uuid

import pandas as pd
import pytest
import yaml

#: recorded gate means by step (a gate every 2 steps): rises to a peak at 6, declines at 8 and 10 (EvalStop(k=2)
#: stops at 10), recovers at 12
GATE_DECLINES = {2: 0.30, 4: 0.40, 6: 0.50, 8: 0.45, 10: 0.42, 12: 0.60}
#: the same run rising at every gate: no detector stops it
GATE_RISES = {2: 0.30, 4: 0.40, 6: 0.50, 8: 0.55, 10: 0.60, 12: 0.65}
#: each prompt's fixed offset from the gate's mean (zero mean over every 4 prompts): per-prompt records with spread
OFFSETS = (-0.06, -0.02, 0.02, 0.06)
#: the default round's acme/healthy-kl job, with a fixed chunk size (the overlap does not depend on timing)
OVERRIDES = {"ppo.kl_coef": 0.2, "oppo.tune_chunk": False}


def replay_gate(monkeypatch, means: dict[int, float]) -> None:
    """Every trainer's held-out scoring returns the recorded scores of `means` at its step (per prompt: the mean plus
    the prompt's offset; proxy rising with the step), with the prompt ids and seed the real gate uses."""
    from training.gate import PromptRecord, batch_seed, heldout_batches, summary
    from training.trainer import GoldEval, Trainer

    def score_batch(self, batch, policy=None):
        cfg = self.cfg
        ids = heldout_batches(cfg.task.n_heldout_prompts, cfg.eval_prompts, cfg.eval_extra_batch)[batch]
        records = [PromptRecord(prompt_id=int(i), seed=batch_seed(cfg.seed, batch),
                                gold_score=means[self.step] + OFFSETS[k % len(OFFSETS)],
                                proxy_score=0.1 * self.step, response_len=8) for k, i in enumerate(ids)]
        mean, se = summary(records)
        return GoldEval(mean=mean, se=se, n=len(records), response_len_mean=8.0, unparseable_rate=0.0,
                        records=records)

    monkeypatch.setattr(Trainer, "score_batch", score_batch)


def second_consecutive_decline(means: dict[int, float]) -> int | None:
    """EvalStop(k=2) by hand: the first gate whose score is below the previous one, which was itself below the one
    before."""
    gates = sorted(means.items())
    declines = 0
    for (_, prev), (step, cur) in zip(gates, gates[1:], strict=False):
        declines = declines + 1 if cur < prev else 0
        if declines == 2:
            return step
    return None


def gate_means(metrics_csv) -> dict[int, float]:
    """The gate scores a run recorded in its metrics.csv."""
    m = pd.read_csv(metrics_csv)
    return {int(s): float(g) for s, g in zip(m.step, m.gold_eval, strict=True) if not math.isnan(float(g))}


def run_everywhere(tmp_path, cache, capsys, monkeypatch, steps: int) -> dict:
    """The one job through the platform round, `rlhf-job`, a sweep trial and `rlhfops train`, each gated (or
    pruned) by EvalStop; what each recorded."""
    from cli_helpers import run_cli_output

    from common.validate import set_dotted
    from flows.params import platform_job_config
    from flows.platform_round import platform_round
    from flows.rlhf_job import rlhf_job
    from sweeps.runner import SweepRunner
    from tasks.sweep import MlflowSweepTracker, prepare
    from training.job.lifecycle import JOB_DONE

    base = platform_job_config(steps, str(cache))
    out = {}
    rnd = platform_round(jobs=[{"tenant": "acme", "name": "same", "overrides": OVERRIDES}], scheduler="EvalStop+FIFO",
                         slots=1, steps=steps, out_dir=str(tmp_path / "round"), cache_dir=str(cache),
                         retry_delay_s=0.1, slot_limit=f"gpu-slots-test-{uuid.uuid4().hex[:8]}")
    out["round"] = rnd["jobs"].iloc[0]
    out["round_done"] = json.loads((tmp_path / "round" / "acme" / "same" / JOB_DONE).read_text())
    out["round_metrics"] = tmp_path / "round" / "acme" / "same" / "metrics.csv"

    out["job"] = rlhf_job(request={"config": base, "overrides": OVERRIDES, "tenant": "acme", "name": "same",
                                   "steps": steps, "overlap": "full", "detector": "evalstop",
                                   "out_root": str(tmp_path / "job"), "run_dir": "."})
    out["job_done"] = json.loads((tmp_path / "job" / JOB_DONE).read_text())
    out["job_metrics"] = tmp_path / "job" / "metrics.csv"

    fixed = {k: v for k, v in OVERRIDES.items() if k != "ppo.kl_coef"}
    spec, ledger = prepare({"name": "same", "base": base, "overrides": fixed, "overlap": "full",
                            "space": {"ppo.kl_coef": {"grid": [OVERRIDES["ppo.kl_coef"]]}}, "trials": 1,
                            "pruning": {"detector": "evalstop"}, "out_dir": str(tmp_path / "sweep")})
    (out["trial"],) = SweepRunner(spec, ledger=ledger, report=False,
                                  tracker=MlflowSweepTracker(ledger)).run()["trials"]

    raw = json.loads(json.dumps(base))
    for key, value in OVERRIDES.items():
        set_dotted(raw, key, value)
    (tmp_path / "same.yaml").write_text(yaml.safe_dump(raw))
    code, stdout, err = run_cli_output(["train", tmp_path / "same.yaml", "--steps", steps, "--overlap", "full",
                                        "--detector", "evalstop", "--out", tmp_path / "train"], capsys, monkeypatch)
    assert code == 0, err
    out["train_out"] = stdout
    out["train_done"] = json.loads((tmp_path / "train" / JOB_DONE).read_text())
    out["train_metrics"] = tmp_path / "train" / "metrics.csv"
    return out


def mlflow_tags(run_id: str) -> dict[str, str]:
    from infra import tracking as T

    return T.client().get_run(run_id).data.tags


@pytest.mark.slow
def test_one_job_spec_gets_the_same_verdict_at_the_same_step_everywhere(prefect_server, mlflow_store, tmp_path,
                                                                         warm_start_cache, capsys, monkeypatch):
    replay_gate(monkeypatch, GATE_DECLINES)
    expected = second_consecutive_decline(GATE_DECLINES)
    assert expected == 10  # the schedule read by hand
    got = run_everywhere(tmp_path, warm_start_cache, capsys, monkeypatch, steps=12)
    # every run read the recorded gate up to its stop, and stopped there
    for key in ("round_metrics", "job_metrics", "train_metrics"):
        assert gate_means(got[key]) == pytest.approx({s: v for s, v in GATE_DECLINES.items() if s <= expected}), key

    rnd = got["round"]
    assert rnd.decision == "stopped" and rnd.stopped_at == expected and rnd.decided_by == "gate"
    assert got["round_done"]["paused_step"] == expected and got["round_done"]["decided_by"] == "gate"
    assert got["round_done"]["detector"] == "evalstop"
    assert got["round_done"]["evidence"]["detector"] == "evalstop" and got["round_done"]["evidence"]["params"] == {
        "k": 2}
    assert mlflow_tags(rnd.run_id)["decided_by"] == "gate"

    job = got["job"]
    assert job["state"].startswith("PAUSED_BY_GATE"), job["state"]
    assert job["decided_by"] == "gate" and job["decision"] == "stopped"
    assert got["job_done"]["paused_step"] == expected and got["job_done"]["decided_by"] == "gate"
    assert mlflow_tags(job["run_id"])["decided_by"] == "gate"

    trial = got["trial"]
    assert trial["state"] == "pruned" and trial["pruned_at"] == expected, trial
    assert mlflow_tags(trial["run_id"])["decided_by"] == "pruner"

    trained = got["train_done"]
    assert trained["state"].startswith("PAUSED_BY_GATE") and trained["paused_step"] == expected, trained
    assert trained["decided_by"] == "gate"
    assert trained["evidence"]["detector"] == "evalstop" and trained["evidence"]["params"] == {"k": 2}
    assert f"paused at step {expected} by the eval gate" in " ".join(got["train_out"].split())


@pytest.mark.slow
def test_one_job_spec_that_never_declines_twice_runs_to_the_end_everywhere(prefect_server, mlflow_store, tmp_path,
                                                                            warm_start_cache, capsys, monkeypatch):
    replay_gate(monkeypatch, GATE_RISES)
    assert second_consecutive_decline(GATE_RISES) is None
    steps = 8
    got = run_everywhere(tmp_path, warm_start_cache, capsys, monkeypatch, steps=steps)
    for key in ("round_metrics", "job_metrics", "train_metrics"):
        assert gate_means(got[key]) == pytest.approx({s: v for s, v in GATE_RISES.items() if s <= steps}), key
    rnd = got["round"]
    assert rnd.decision == "completed" and rnd.decided_by == "none" and rnd.state == "SUCCEEDED"
    assert got["round_done"].get("paused_step") is None and got["round_done"]["decided_by"] == "none"
    assert mlflow_tags(rnd.run_id)["decided_by"] == "none"
    job = got["job"]
    assert job["state"] == "SUCCEEDED" and job["decided_by"] == "none" and job["decision"] == "completed"
    assert got["job_done"]["decided_by"] == "none" and mlflow_tags(job["run_id"])["decided_by"] == "none"
    trial = got["trial"]
    assert trial["state"] == "completed" and trial["pruned_at"] is None
    assert mlflow_tags(trial["run_id"])["decided_by"] == "none"
    assert got["train_done"]["state"] == "SUCCEEDED" and got["train_done"]["decided_by"] == "none"


@pytest.mark.slow
def test_a_job_an_alert_failed_says_the_alert_decided(prefect_server, mlflow_store, tmp_path, warm_start_cache,
                                                     monkeypatch):
    """The same job with its KL over the catalog's PPO ceiling (configs/alerts.yaml: 6.0, persist 2) at steps 4 and
    5: `kl_blowup` pages at 5, the run ends FAILED, and the flow's summary, job.json and MLflow run say the alert
    decided (the training loop's own word was `paused`)."""
    from flows.params import platform_job_config
    from flows.rlhf_job import JobFailed, rlhf_job
    from training.job.lifecycle import JOB_DONE
    from training.trainer import Trainer

    replay_gate(monkeypatch, GATE_RISES)
    real_step = Trainer.train_step

    def train_step(self):
        rec = real_step(self)
        if rec.step in (4, 5):
            rec.kl = 10.0
        return rec

    monkeypatch.setattr(Trainer, "train_step", train_step)
    request = {"config": platform_job_config(8, str(warm_start_cache)), "overrides": OVERRIDES, "tenant": "acme",
               "name": "alerted", "steps": 8, "detector": "evalstop", "out_root": str(tmp_path / "job"),
               "run_dir": "."}
    state = rlhf_job(request=request, return_state=True)
    assert state.is_failed()
    with pytest.raises(JobFailed, match="kl_blowup"):
        state.result()
    done = json.loads((tmp_path / "job" / JOB_DONE).read_text())
    assert done["decided_by"] == "alert" and done["decision"] == "failed: kl_blowup at step 5"
    from infra import tracking as T

    (run,) = T.client().search_runs([T.client().get_experiment_by_name(T.DEFAULT_EXPERIMENT).experiment_id],
                                    filter_string="tags.decided_by = 'alert'")
    assert run.data.tags["decision"] == "failed: kl_blowup at step 5" and run.info.status == "FAILED"


def test_train_refuses_an_unknown_detector_naming_the_option(tmp_path, capsys, monkeypatch):
    from cli_helpers import run_cli, tripwire

    import training.trainer

    monkeypatch.setattr(training.trainer, "Trainer", tripwire)
    code, err = run_cli(["train", "configs/ppo-tiny.yaml", "--detector", "nope", "--out", tmp_path / "t"], capsys,
                        monkeypatch)
    assert code == 2 and "--detector: 'nope' is not one of" in err[-1] and "paired" in err[-1], err
    assert not (tmp_path / "t").exists()


@pytest.mark.slow
def test_the_round_and_train_decide_the_gameable_job_alike_with_the_paired_rule(prefect_server, mlflow_store, tmp_path,
                                                                                warm_start_cache, capsys, monkeypatch):
    """The default round's gameable job gated by the paired rule named without parameters (`Paired+SRTF`, the round's
    default scheduler, and `rlhfops train --detector paired`): both requests carry it with the platform's margin of
    0.1 (training.job.request.DETECTOR_DEFAULTS), fitted to the job's planned looks by the one builder; the same end
    state at the same step on the same evidence. Which verdict it is depends on the warm start the cache holds (a gate
    pause,
    or the KL alert first: docs/orchestration.md); a pause's difference is recomputed by hand from the round's
    gate_records.csv and comes after the job's gate peak, keeping an earlier checkpoint."""
    from cli_helpers import run_cli_output

    from common.validate import set_dotted
    from flows.params import DEFAULT_JOBS, platform_job_config
    from flows.platform_round import platform_round
    from training.job.lifecycle import JOB_DONE

    (job,) = [j for j in DEFAULT_JOBS if j["name"] == "gameable"]
    steps = 24
    platform_round(jobs=[job], scheduler="Paired+SRTF", slots=1, steps=steps, out_dir=str(tmp_path / "round"),
                   cache_dir=str(warm_start_cache), retry_delay_s=0.1,
                   slot_limit=f"gpu-slots-test-{uuid.uuid4().hex[:8]}")
    round_dir = tmp_path / "round" / job["tenant"] / job["name"]
    done = json.loads((round_dir / JOB_DONE).read_text())

    raw = platform_job_config(steps, str(warm_start_cache))
    for key, value in job["overrides"].items():
        set_dotted(raw, key, value)
    (tmp_path / "gameable.yaml").write_text(yaml.safe_dump(raw))
    code, _out, err = run_cli_output(["train", tmp_path / "gameable.yaml", "--steps", steps, "--detector", "paired",
                                      "--out", tmp_path / "train"], capsys, monkeypatch)
    assert code == 0, err
    trained = json.loads((tmp_path / "train" / JOB_DONE).read_text())
    for key in ("state", "paused_step", "best_step", "evidence"):
        assert trained.get(key) == done.get(key), key
    ran = [len(pd.read_csv(d / "metrics.csv")) for d in (round_dir, tmp_path / "train")]
    assert ran[0] == ran[1] < steps  # both ended early, at the same step

    if done["state"].startswith("PAUSED_BY_GATE"):
        evidence, paused = done["evidence"], done["paused_step"]
        assert evidence["detector"] == "paired" and evidence["params"]["horizon"] == steps // 2 - 1
        assert evidence["params"]["margin"] == 0.1 and done["detector"] == trained["detector"] == "paired(margin=0.1)"
        (fired,) = [c for c in evidence["comparisons"] if c["reference_step"] == evidence["kept_step"]]
        g = pd.read_csv(round_dir / "gate_records.csv")
        ref = g[g.step == fired["reference_step"]].set_index("prompt_id").gold_score
        cur = g[g.step == paused].set_index("prompt_id").gold_score
        common = ref.index.intersection(cur.index)
        assert len(common) == fired["prompts"] and fired["upper"] < 0
        assert fired["mean_diff"] == pytest.approx(float((cur[common] - ref[common]).mean()))
        m = pd.read_csv(round_dir / "metrics.csv").dropna(subset=["gold_eval"])
        assert int(m.step[m.gold_eval.idxmax()]) < paused and done["best_step"] < paused
