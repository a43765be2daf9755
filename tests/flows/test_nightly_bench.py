"""The nightly's bench stage (`rlhfops bench oppo --quick --baseline ...`) on a tiny PPO config, for real: one
10-step round-robin of the four OPPO modes, compared with a hand-made baseline whose every ratio is 100x, so every
ratio the run measured must be flagged. Checks the flagged ratios reach the stage's MLflow run (FAILED), the
nightly's run and its closing summary, and that the logged ratios are the medians of the per-seed ratios recomputed
here from the JSON's raw per-seed times."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common.errors import BadInput
from infra import tracking as T

#: a PPO config small enough for the four modes x 10 steps in seconds
TINY = """seed: 2
steps: 10
policy: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}
reward: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}
task: {n_train_prompts: 24, n_heldout_prompts: 8, n_pairs: 32, rm_epochs: 1, sft_steps: 40, long_mean_len: 10.0}
ppo: {batch_size: 8, max_new_tokens: 12, num_ppo_epochs: 1, num_mini_batches: 1}
oppo: {tune_chunk: false, adaptive_delta: false, delta_init: 2}
eval_prompts: 8
"""
STEPS, SEEDS = 10, 1
#: ratio -> the per-seed figure it divides (reference's / the mode's)
FIGURE = {"speedup": "time_to_reward_s", "speedup_gold": "time_to_gold_s", "step_time_speedup": "step_s_mean"}


def _baseline(path, ratio: float, **settings) -> str:
    """A baseline JSON of the nightly bench's settings in which every ratio of every mode was `ratio` in each seed."""
    base = {"steps": STEPS, "seeds": [2 + i for i in range(SEEDS)], "target_frac": 0.7, "smooth_window": 5,
            "gate_every": 5, **settings,
            "ratios": {k: {m: {"runs": [ratio] * SEEDS} for m in ("intra", "inter", "full")} for k in FIGURE}}
    path.write_text(json.dumps(base))
    return str(path)


def test_a_baseline_of_other_settings_is_refused_before_any_stage(tmp_path):
    from flows.nightly_check import check_nightly

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    off = dict(experiments=[], canaries=[], job=False, sweep=False, out_dir=str(tmp_path / "n"), bench=True,
               bench_config=str(config), bench_steps=STEPS, bench_seeds=SEEDS)
    plan = check_nightly(**off, bench_baseline=_baseline(tmp_path / "ok.json", 1.0))
    assert plan.bench.settings["steps"] == STEPS and plan.bench.baseline is not None
    with pytest.raises(BadInput, match=r"^bench_baseline: .* its steps is 30, this run's is 10"):
        check_nightly(**off, bench_baseline=_baseline(tmp_path / "b.json", 1.0, steps=30))
    with pytest.raises(BadInput, match=r"^bench_baseline: file 'nowhere.json' not found"):
        check_nightly(**off, bench_baseline="nowhere.json")
    assert check_nightly(**off, bench_baseline=None).bench.baseline is None  # no comparison
    assert not (tmp_path / "n").exists()  # nothing written by the checks


@pytest.mark.slow  # a flow run with real training: 10-40 s of bench, ~100 s in all on 2 loaded cores
def test_bench_stage_flags_every_ratio_below_the_baseline(prefect_server, mlflow_store, warm_start_cache, tmp_path):
    import io

    from rich.console import Console

    import flows.nightly as N
    from rlhfops.commands.nightly import print_summary

    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    baseline = _baseline(tmp_path / "baseline.json", 100.0)
    state = N.nightly_sweep(quick=True, experiments=[], detectors=False, job=False, canaries=[], platform=False,
                            sweep=False, bench=True, bench_config=str(config), bench_baseline=baseline,
                            bench_steps=STEPS, bench_seeds=SEEDS, out_dir=str(tmp_path / "n"),
                            cache_dir=str(warm_start_cache), workers=1, return_state=True)
    assert state.is_completed(), state.message
    res = state.result()
    print(f"bench stage ({STEPS} steps, {SEEDS} seed, tiny config): {res.stages['bench_s']:.1f} s")
    out = json.loads((tmp_path / "n" / "bench-oppo.json").read_text())
    assert out["steps"] == STEPS and out["seeds"] == [2] and (tmp_path / "n" / "bench-oppo.png").is_file()

    # the ratios, recomputed from the raw per-seed figures: reference / mode, median over seeds
    per_seed, ref = out["per_seed"], out["reference"]
    medians = {}
    for key, figure in FIGURE.items():
        for mode in ("intra", "inter", "full"):
            r = [a[figure] / b[figure] for a, b in zip(per_seed[ref], per_seed[mode], strict=True)
                 if a[figure] and b[figure]]
            medians[f"{key}.{mode}"] = float(np.median(r)) if r else None
    measured = {k for k, v in medians.items() if v is not None}
    assert {f"step_time_speedup.{m}" for m in ("intra", "inter", "full")} <= measured  # always measured
    # every measured ratio is far below 100x: all flagged, and only those (a ratio not reached is never flagged)
    assert {r["ratio"] for r in res.bench["regressed"]} == measured
    assert res.bench["ok"] is False and res.bench["baseline"] == baseline

    c = T.client()
    brun = c.get_run(res.bench["run_id"])
    assert brun.info.status == "FAILED" and brun.data.tags[T.PARENT_TAG] == res.run_id
    assert set(brun.data.tags["regressed"].split(",")) == measured
    for name in measured:
        key, mode = name.split(".")
        assert brun.data.metrics[f"{key}/{mode}"] == pytest.approx(medians[name])
    assert brun.data.metrics["regressed"] == len(measured)
    assert {"bench-oppo.json", "bench-oppo.png"} <= {a.path for a in c.list_artifacts(brun.info.run_id)}
    night = c.get_run(res.run_id)
    assert night.data.metrics["bench_regressed"] == len(measured) and night.data.metrics["bench_s"] > 0
    assert set(night.data.tags["bench_regressed"].split(",")) == measured

    console = Console(file=io.StringIO(), width=400)
    print_summary(console, res, {"wall_s": 1.0, "orchestration_s": 0.0, "orchestration_frac": 0.0},
                  "sqlite:////x.db")
    text = console.file.getvalue()
    assert "oppo bench" in text and "REGRESSED" in text
    assert all(name in text for name in measured)
