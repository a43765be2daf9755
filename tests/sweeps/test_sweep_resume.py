"""Kill -9 of `rlhfops sweep` mid-trial, then `--resume`: no finished trial runs again, no MLflow run stays RUNNING,
the study ends with the spec's trial count. Real training (tiny models), a real Optuna SQLite storage and a real
MLflow store, each in the test's own directory. Wall about 1-2 minutes on 2 shared cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

PY = sys.executable
pytestmark = pytest.mark.slow
TRIALS = 4


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}", OMP_WAIT_POLICY="PASSIVE", MPLBACKEND="Agg")
    return env


def _spec(tmp_path: Path, cache: Path) -> Path:
    base = {
        "seed": 2, "steps": 10, "cache_dir": str(cache),
        "policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "reward": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64},
        "task": {"n_train_prompts": 24, "n_heldout_prompts": 8, "n_pairs": 32, "rm_epochs": 1, "sft_steps": 40,
                 "long_mean_len": 10.0},
        "ppo": {"batch_size": 4, "max_new_tokens": 12, "num_ppo_epochs": 1, "num_mini_batches": 1},
        "oppo": {"tune_chunk": False, "adaptive_delta": False},
        "checkpoint_every": 2, "eval_every": 2, "eval_prompts": 8,
    }
    spec = {"name": "resume", "base": base, "space": {"ppo.kl_coef": {"log_uniform": [0.01, 0.3]}},
            "sampler": {"kind": "random", "seed": 1}, "trials": TRIALS, "concurrency": 1,
            "pruning": {"detector": "none"}, "out_dir": str(tmp_path / "sweep"), "mlflow_experiment": "resume-test"}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _study(tmp_path: Path):
    url = f"sqlite:///{(tmp_path / 'sweep' / 'optuna.db').resolve()}"
    try:
        return optuna.load_study(study_name="resume", storage=url)
    except Exception:  # noqa: BLE001 - not created yet
        return None


def test_kill_9_mid_sweep_then_resume(tmp_path, warm_start_cache):
    from mlflow import MlflowClient
    from mlflow.entities import ViewType

    spec = _spec(tmp_path, warm_start_cache)
    env = _env(tmp_path)
    cmd = [PY, "-m", "rlhfops.cli", "sweep", str(spec)]
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        t0 = time.time()
        snap = None
        while time.time() - t0 < 300:
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            study = _study(tmp_path)
            if study is not None:
                trials = study.get_trials(deepcopy=False)
                done = [t for t in trials if t.state.is_finished()]
                # mid-trial: one finished, the next one has reported a checkpoint
                if done and any(t.state is TrialState.RUNNING and t.intermediate_values for t in trials):
                    snap = trials
                    break
            time.sleep(0.05)
        assert snap is not None, "the sweep never reached a finished trial and a running one"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    study = _study(tmp_path)
    finished_before = {t.number: t for t in study.trials if t.state.is_finished()}
    running_before = [t for t in study.trials if t.state is TrialState.RUNNING]
    assert finished_before and running_before
    metrics_files = {n: tmp_path / "sweep" / f"trial-{n:04d}" / "seed-0" / "metrics.csv" for n in finished_before}
    stamps = {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in metrics_files.items()}

    resumed = subprocess.run(cmd + ["--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]

    study = _study(tmp_path)
    by_number = {t.number: t for t in study.trials}
    # no finished trial ran again: same end time in the study, and its run directory was not rewritten
    for n, t in finished_before.items():
        assert by_number[n].state is t.state and by_number[n].datetime_complete == t.datetime_complete
        p = metrics_files[n]
        assert (p.stat().st_ino, p.stat().st_mtime_ns) == stamps[n]
    # the interrupted trial is recorded as such, and its setting ran again under a new number
    for t in running_before:
        again = by_number[t.number]
        assert again.state is TrialState.FAIL and again.user_attrs.get("interrupted") is True
        redo = [x for x in study.trials if x.user_attrs.get("requeued_from") == t.number]
        assert len(redo) == 1 and redo[0].params == t.params and redo[0].state is TrialState.COMPLETE
    counted = [t for t in study.trials if t.state.is_finished() and not t.user_attrs.get("interrupted")]
    assert len(counted) == TRIALS

    c = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = [e.experiment_id for e in c.search_experiments()]
    runs = c.search_runs(ids, run_view_type=ViewType.ACTIVE_ONLY, max_results=10_000)
    assert not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    # one MLflow run per trial the killed process finished (none made again) and one sweep parent
    for n in finished_before:
        mine = [r for r in runs if r.data.tags.get("optuna_trial") == str(n)]
        assert len(mine) == 1 and mine[0].info.status == "FINISHED"
    parents = [r for r in runs if r.data.tags.get("rlhfops.kind") == "sweep"]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.metrics["trials_done"] == TRIALS
