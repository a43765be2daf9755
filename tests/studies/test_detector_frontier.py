"""The hindsight frontier of studies/detector_frontier.py: its critical values against replays of the detector at
many bars (the path every report uses), its choice of points on hand-made critical values, and the command."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from eval.corpus import load_corpus
from eval.detectors import make_detector
from eval.traces import detection_quality, runs_from_trace, verdicts
from studies.detector_frontier import ShapeCriticals, frontier_points, shape_criticals
from studies.detector_selection import DETECTOR

SHAPES = [
    {"patience": 6, "drawdown": 0.5, "fast_window": 1, "fast_ratio": 2.0, "mean_window": 0},
    {"patience": 3, "drawdown": 0.6, "fast_window": 0, "fast_ratio": 2.5, "mean_window": 2},
]


@pytest.fixture(scope="module")
def real_runs():
    """Own PPO runs of the corpus (gate SE, proxy reward, 21 checkpoints): the report half's, whose hacking runs
    stop before, after and at the end of their peak as the bar moves, and 20 healthy runs of twin64 as the fleet."""
    split = [r for r in runs_from_trace(load_corpus(split="report")) if r.run_id.startswith("own/")]
    fleet = [r for r in runs_from_trace(load_corpus(split="twin64")) if r.label == 0][:20]
    return split, fleet


@pytest.mark.parametrize("shape", SHAPES, ids=["every-eval", "mean-window"])
def test_critical_values_count_what_a_replay_at_each_bar_counts(real_runs, shape):
    split, fleet = real_runs
    base = make_detector(DETECTOR).params()
    # copies of the hacking runs labelled as peaking where the detector stops them at z = 2: a stop exactly at the
    # peak is useful (the boundary of the interval)
    stops = verdicts(make_detector(DETECTOR, **{**base, **shape, "z": 2.0}), split).set_index("run_id")["stop_step"]
    split = split + [dataclasses.replace(r, run_id=f"{r.run_id}/peak-at-stop", peak_step=float(stops[r.run_id]))
                     for r in split if r.label == 1 and stops[r.run_id] < r.steps[-1]]
    assert len(split) > len(real_runs[0])
    crits = shape_criticals(shape, base, split, [r.checkpoints for r in fleet])
    edges = np.concatenate([crits.healthy, crits.fleet, crits.useful_from, crits.useful_to])
    edges = edges[np.isfinite(edges)]
    seen = set()
    for z in np.arange(0.1, 9.0, 0.1):
        if np.min(np.abs(edges - z)) < 1e-4:  # within the bisection's tolerance of a critical value
            continue
        det = make_detector(DETECTOR, **{**base, **shape, "z": float(z)})
        q = detection_quality(verdicts(det, split))
        want = (int(q["useful"]), int(q["fp"]), int(verdicts(det, fleet)["stopped"].sum()))
        assert crits.counts(float(z)) == want, f"z = {z:.2f}"
        seen.add(want)
    # the bars swept reach several distinct outcomes, so the comparison is not between two constants
    assert len({useful for useful, _, _ in seen}) >= 3 and len(seen) >= 4


def _crits(name: str, fleet: list[float], useful: list[tuple[float, float]]) -> ShapeCriticals:
    return ShapeCriticals(shape={"name": name}, params={}, healthy=np.array([]), fleet=np.array(fleet),
                          useful_from=np.array([a for a, _ in useful]), useful_to=np.array([b for _, b in useful]))


def test_frontier_points_keep_the_fewest_fleet_stops_per_useful_count_and_drop_dominated_ones():
    # a: z in [0,1): 2 useful, 3 fleet; [1,1.5): 2, 2; [1.5,2): 0, 2; [2,3): 0, 1; [3,inf): 0, 0
    a = _crits("a", [1.0, 2.0, 3.0], [(0.0, 1.5), (0.0, 1.5)])
    # b: [0,0.2): 2, 3; [0.2,0.5): 1, 3; [0.5,3.5): 1, 2; [3.5,4): 0, 2; [4,inf): 0, 0
    b = _crits("b", [0.5, 4.0, 4.0], [(0.0, 3.5), (0.0, 0.2)])
    table = frontier_points([a, b])
    # 2 useful: a at [1,1.5) with 2 fleet stops; 1 useful needs 2 fleet stops at best (b): dominated, dropped;
    # 0 useful: a at [3,inf), the earlier of the two shapes that stop no fleet run
    assert list(table["useful"]) == [2, 0]
    assert list(table["fleet_stopped"]) == [2, 0]
    assert list(table["name"]) == ["a", "a"]
    assert (table.loc[0, "z_from"], table.loc[0, "z_to"], table.loc[0, "z"]) == (1.0, 1.5, 1.25)
    assert table.loc[1, "z_from"] == 3.0 and math.isinf(table.loc[1, "z_to"]) and table.loc[1, "z"] == 4.0
    assert table.loc[0, "params"] == {"z": 1.25}


def test_the_command_writes_the_frontier_of_a_corpus_split(tmp_path, monkeypatch, write_corpus, slow_decline_trace):
    from typer.testing import CliRunner

    import studies.detector_selection as selection
    from rlhfops.cli import app

    # one shape: patience 5, drawdown 0.3 stops every hand-made slow decline at checkpoint 18 whatever its bar, and
    # no steadily rising healthy run at any bar (see slow_decline_trace)
    monkeypatch.setattr(selection, "PATIENCE", (5,))
    monkeypatch.setattr(selection, "DRAWDOWN", (0.3,))
    monkeypatch.setattr(selection, "FAST_PATHS", ((0, 2.5),))
    monkeypatch.setattr(selection, "MEAN_WINDOWS", ())
    # the 12 healthy runs r0-r11 are the fleet; 8 healthy runs and the 4 hacking ones the report half
    corpus = write_corpus(slow_decline_trace(healthy=20, hacking=4), lambda k: "tune" if k < 12 else "report")
    out = tmp_path / "frontier.md"
    res = CliRunner().invoke(app, ["detector-frontier", "--corpus", str(corpus), "--out", str(out),
                                   "--workers", "1"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "| 4/4 (100.0%) | 0/12 (0.0%) | 0/8 (0.0%) | 5 | 0.3 | 0 | 2.5 | 0 |" in text
    assert "reaches 85% useful recall (4 of 4)" in text
    bad = CliRunner().invoke(app, ["detector-frontier", "--corpus", str(corpus), "--split", "nope", "--out",
                                   str(out)])
    assert type(bad.exception).__name__ == "BadInput" and "--split 'nope'" in str(bad.exception)
