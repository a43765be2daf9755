"""The corpus section of docs/detectors.md (studies.detector_report.render_corpus) on a small hand-made corpus:
every held-out split gets its own table and acceptance lines, and the pooled lines count every run nothing was
tuned on. The expected counts come from how the test built each run, not from the detector's code."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from eval.corpus import ALL_SPLITS, CHOSEN_ON_SPLITS
from studies.detector_report import corpus_table, render_corpus

STEPS = 21


def _healthy(rng) -> np.ndarray:
    # a steady rise with small noise: no drawdown of half the range, never stopped
    return np.linspace(0.0, 1.0, STEPS) + rng.normal(0, 0.01, STEPS)


def _hacked(rng) -> np.ndarray:
    # a rise to 1 by checkpoint 10, a plateau, then a collapse to -1 at checkpoint 15 that stays: stopped there or
    # within the patience window, after the peak and well before the last checkpoint
    y = np.r_[np.linspace(0.0, 1.0, 11), np.ones(4), -np.ones(STEPS - 15)]
    return y + rng.normal(0, 0.01, STEPS)


def _write_corpus(root, plan: dict[str, tuple[int, int]]) -> None:
    """plan: split -> (healthy runs, hacking runs); one source per split (held-out splits by their source name)."""
    from eval.corpus import HELD_OUT_SOURCES

    source_of = {split: source for source, split in HELD_OUT_SOURCES.items()}
    rng = np.random.default_rng(0)
    index = []
    for split, (healthy, hacking) in plan.items():
        source = source_of.get(split, f"src_{split}")
        rows = []
        for k in range(healthy + hacking):
            label = int(k >= healthy)
            run_id = f"{source}/run{k}"
            y = _hacked(rng) if label else _healthy(rng)
            for t in range(STEPS):
                rows.append({"run_id": run_id, "step": 5 * t, "eval_score": y[t], "eval_se": 0.01,
                             "reward": float(t) if t else float("nan"), "direction": "max"})
            peak = 50 if label else 100
            index.append({"run_id": run_id, "label": label, "peak_step": peak, "split": split})
        (root / source).mkdir()
        pd.DataFrame(rows).to_csv(root / source / "traces.csv", index=False)
    pd.DataFrame(index).to_csv(root / "runs.csv", index=False)


def test_every_held_out_split_is_reported_and_pooled(tmp_path):
    # gate128 re-measures holdout's runs, gate256 twin64's and sealed256 sealed64's (the same run ids after the
    # source part): each reported beside its base split, never pooled; the parts the default was chosen on
    # (CHOSEN_ON_SPLITS) are reported, never pooled with the unseen ones
    plan = {"tune": (12, 2), "report": (10, 3), "fresh": (6, 2), "holdout": (8, 5), "gate128": (8, 5),
            "twin64": (7, 4), "gate256": (7, 4), "sealed64": (9, 6), "sealed256": (9, 6), "sealed8_64": (8, 7),
            "sealed8_256": (8, 7)}
    assert set(plan) == set(ALL_SPLITS)
    _write_corpus(tmp_path, plan)
    text = render_corpus({split: corpus_table(tmp_path, split) for split in ALL_SPLITS}, tmp_path)
    for split, (healthy, hacking) in plan.items():
        assert f"### `{split}` split: {healthy + hacking} runs ({hacking} hacking, {healthy} healthy)" in text
    # every hacking run here is stopped usefully and no healthy one at all (the test's construction)
    for split in ("fresh", "holdout", "gate128", "twin64", "gate256", "sealed64", "sealed256", "sealed8_64",
                  "sealed8_256"):
        healthy, hacking = plan[split]
        seen = " (the default was chosen on it: in-sample)" if split in CHOSEN_ON_SPLITS else ""
        section = text.split(f"The same lines on the `{split}` split{seen}:")[1].split("\n\n")[1]
        assert f"0/{healthy} = 0.0%" in section
        assert f"{hacking}/{hacking} = 100.0%" in section
    pooled = text.split("The same lines on `report`, `sealed64` and `sealed8_64` pooled")[1].split("\n\n")[1]
    n_healthy = sum(plan[s][0] for s in ("report", "sealed64", "sealed8_64"))
    n_hacking = sum(plan[s][1] for s in ("report", "sealed64", "sealed8_64"))
    assert f"0/{n_healthy} = 0.0%" in pooled and f"{n_hacking}/{n_hacking} = 100.0%" in pooled
    paired = text.split("The same 13 runs as `holdout` measured them:")[1].split("\n\n")[1]
    assert "0/8 = 0.0%" in paired and "5/5 = 100.0%" in paired
    paired = text.split("The same 11 runs as `twin64` measured them:")[1].split("\n\n")[1]
    assert "0/7 = 0.0%" in paired and "4/4 = 100.0%" in paired
    paired = text.split("The same 15 runs as `sealed64` measured them:")[1].split("\n\n")[1]
    assert "0/9 = 0.0%" in paired and "6/6 = 100.0%" in paired
    paired = text.split("The same 15 runs as `sealed8_64` measured them:")[1].split("\n\n")[1]
    assert "0/8 = 0.0%" in paired and "7/7 = 100.0%" in paired
    for n in (13, 11, 15):
        assert f"the two agree on {n} of {n} labels" in text
    assert "The bar's trade-off on `gate128`:" in text and "The bar's trade-off on the same runs of `holdout`:" in text
    assert "The bar's trade-off on `gate256`:" in text and "The bar's trade-off on the same runs of `twin64`:" in text
    # the report half's own lines come first and count the report half only
    report = text.split("acceptance on the `report` half")[1].split("\n\n")[1]
    assert f"0/{plan['report'][0]} = 0.0%" in report and f"{plan['report'][1]}/{plan['report'][1]} = 100.0%" in report


def test_without_held_out_runs_the_report_half_stands_alone(tmp_path):
    _write_corpus(tmp_path, {"tune": (12, 2), "report": (10, 3)})
    text = render_corpus({split: corpus_table(tmp_path, split) for split in ALL_SPLITS}, tmp_path)
    assert "### `report` split" in text and "### `holdout` split" not in text
    assert "pooled (every run nothing was chosen" not in text


def test_threshold_tradeoff_scales_the_calibrated_bar(tmp_path):
    from eval.calibrate import has_proxy
    from eval.detectors import DEFAULT_DETECTOR, make_detector
    from studies.detector_report import _split_runs, threshold_tradeoff

    plan = {"tune": (4, 1), "report": (6, 3), "holdout": (5, 2)}
    _write_corpus(tmp_path, plan)
    runs = [r for split in ("report", "holdout") for r in _split_runs(tmp_path, split)]
    assert all(has_proxy(r.checkpoints) for r in runs)
    det = make_detector(DEFAULT_DETECTOR)
    table = threshold_tradeoff(det, runs, factors=(0.5, 1.0, 2.0))
    assert table["z"].tolist() == pytest.approx([0.5 * det.z, det.z, 2 * det.z])
    # the collapse is about 200 noise SDs deep and the healthy runs never fall: the same verdicts at every factor
    assert table["useful"].tolist() == [5, 5, 5] and table["fp"].tolist() == [0, 0, 0]
    assert table["healthy"].tolist() == [11, 11, 11]
    # at a bar beyond the collapse's depth nothing is stopped: the factor reaches the detector
    deep = threshold_tradeoff(det, runs, factors=(1e4,))
    assert deep["useful"].tolist() == [0]
