"""The committed real-curve corpus (data/curves/): counts, labels re-derived by the rule of LABELS.md with a
plain re-implementation (no numpy, no eval.corpus helpers), the split rule, finiteness, the loader."""

from __future__ import annotations

import csv
import hashlib
import math
import statistics
from collections import defaultdict
from pathlib import Path

import pytest

from eval.corpus import CORPUS_DIR, hindsight_label, load_corpus

#: the held-out sources data/curves/README.md declares, and their splits
HELD_OUT = {"own_ppo_fresh": "fresh", "own_ppo_holdout": "holdout", "own_ppo_gate128": "gate128",
            "own_ppo_twin64": "twin64", "own_ppo_gate256": "gate256", "own_ppo_sealed64": "sealed64",
            "own_ppo_sealed256": "sealed256", "own_ppo_sealed8_64": "sealed8_64", "own_ppo_sealed8_256": "sealed8_256"}

SOURCES_MIN_RUNS = {"algoperf": 30, "nanogpt": 20, "pythia": 30}


def _read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _runs() -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = defaultdict(list)
    for path in sorted(CORPUS_DIR.glob("*/traces.csv")):
        for row in _read_csv(path):
            row["source"] = path.parent.name
            runs[row["run_id"]].append(row)
    return runs


def _label_by_hand(rows: list[dict]) -> tuple[int, int]:
    """LABELS.md, step by step, in plain Python."""
    rows = sorted(rows, key=lambda r: float(r["step"]))
    sign = -1.0 if rows[0].get("direction") == "min" else 1.0
    y = [sign * float(r["eval_score"]) for r in rows]
    n = len(y)
    d2 = [y[i + 1] - 2 * y[i] + y[i - 1] for i in range(1, n - 1)]
    med = statistics.median(d2)
    sigma = 1.4826 * statistics.median([abs(v - med) for v in d2]) / math.sqrt(6)
    ses = [float(r["eval_se"]) for r in rows if r.get("eval_se") not in (None, "")]
    if ses:
        sigma = max(sigma, statistics.median(ses))
    smooth = [sum(y[max(0, i - 1):i + 2]) / len(y[max(0, i - 1):i + 2]) for i in range(n)]
    peak = max(range(n), key=lambda i: (smooth[i], -i))  # first index of the maximum
    decline = smooth[peak] - smooth[-1]
    margin = max(0.2 * (max(y) - min(y)), 3 * sigma)
    label = int(peak <= n - 3 and decline > margin)
    return label, int(float(rows[peak]["step"]))


def test_index_matches_traces_and_every_value_is_finite():
    runs = _runs()
    index = {r["run_id"]: r for r in _read_csv(CORPUS_DIR / "runs.csv")}
    assert set(index) == set(runs)
    for run_id, rows in runs.items():
        assert len(rows) >= 6, run_id
        assert len({r["step"] for r in rows}) == len(rows), f"{run_id}: duplicate steps"
        assert {r.get("direction", "max") for r in rows} <= {"max", "min"}, run_id
        for r in rows:
            assert math.isfinite(float(r["step"])) and math.isfinite(float(r["eval_score"])), run_id
            for col in ("eval_se", "reward", "loss", "kl", "entropy"):
                if r.get(col) not in (None, ""):
                    assert math.isfinite(float(r[col])), f"{run_id} step {r['step']}: {col}={r[col]}"


def test_counts_per_source_and_public_total():
    index = _read_csv(CORPUS_DIR / "runs.csv")
    per_source: dict[str, int] = defaultdict(int)
    for r in index:
        per_source[r["source"]] += 1
    for source, least in SOURCES_MIN_RUNS.items():
        assert per_source[source] >= least, per_source
    public = {s: n for s, n in per_source.items() if not s.startswith("own_ppo")}
    assert sum(public.values()) >= 60 and len(public) >= 3, per_source
    for source in per_source:
        assert (CORPUS_DIR / source / "SOURCE.md").is_file(), source


def test_labels_and_peak_steps_rederived_by_the_rule():
    runs = _runs()
    index = {r["run_id"]: r for r in _read_csv(CORPUS_DIR / "runs.csv")}
    for run_id, rows in runs.items():
        label, peak_step = _label_by_hand(rows)
        assert int(index[run_id]["label"]) == label, run_id
        assert int(float(index[run_id]["peak_step"])) == peak_step, run_id


def test_split_follows_the_seeded_rule_and_halves_each_stratum():
    index = _read_csv(CORPUS_DIR / "runs.csv")
    strata: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in index:
        if r["source"] in HELD_OUT:  # recorded after a default was fixed: held out whole
            assert r["split"] == HELD_OUT[r["source"]], r["run_id"]
            continue
        strata[(r["source"], r["label"])].append(r)
    for rows in strata.values():
        ranked = sorted(rows, key=lambda r: hashlib.sha256(f"rlhfops-corpus-split-v1:{r['run_id']}".encode())
                        .hexdigest())
        assert [r["split"] for r in ranked] == [("tune", "report")[i % 2] for i in range(len(ranked))]


def test_load_corpus_gives_trace_format_with_labels():
    df = load_corpus()
    index = _read_csv(CORPUS_DIR / "runs.csv")
    assert df["run_id"].nunique() == len(index)
    assert {"run_id", "step", "eval_score", "direction", "label", "peak_step", "split", "source"} <= set(df.columns)
    report = load_corpus(split="report")
    assert set(report["split"]) == {"report"}
    assert report["run_id"].nunique() == sum(r["split"] == "report" for r in index)
    for source, split in HELD_OUT.items():
        part = load_corpus(split=split)
        assert set(part["source"]) == {source}
        assert part["run_id"].nunique() == sum(r["source"] == source for r in index) > 0


def test_rule_on_hand_made_curves():
    steps = list(range(0, 100, 10))
    rise_then_fall = [0, 2, 4, 6, 8, 10, 8, 6, 4, 2]
    lab = hindsight_label(steps, rise_then_fall)
    # smoothed: peak (8+10+8)/3 = 8.67 at step 50; end (4+2)/2 = 3; decline 5.67 > max(0.2*10, 3*0) = 2
    assert (lab.label, lab.peak_step) == (1, 50)
    assert lab.decline == pytest.approx(26 / 3 - 3)
    # the same curve as a loss (lower is better) is the same run
    assert hindsight_label(steps, [-v for v in rise_then_fall], "min").label == 1
    # affine change of units: same label, same peak step
    scaled = hindsight_label(steps, [3.5 * v - 7 for v in rise_then_fall])
    assert (scaled.label, scaled.peak_step) == (1, 50)
    # a rise that flattens is healthy; so is a dip at the very end (smoothed peak (10+9)/2 at the last step)
    assert hindsight_label(steps, [0, 5, 8, 9, 9.5, 9.8, 9.9, 10, 9.9, 10]).label == 0
    assert (hindsight_label(steps, [0, 1, 2, 3, 4, 5, 6, 8, 10, 9]).label,
            hindsight_label(steps, [0, 1, 2, 3, 4, 5, 6, 8, 10, 9]).peak_step) == (0, 90)
    # a wide SE turns the same fall into noise: margin 3 * 3 = 9 > decline 5.67
    assert hindsight_label(steps, rise_then_fall, eval_se=[3.0] * 10).label == 0
    with pytest.raises(ValueError, match="direction"):
        hindsight_label(steps, rise_then_fall, "up")
    with pytest.raises(ValueError, match="at least 6"):
        hindsight_label(steps[:5], rise_then_fall[:5])
