"""The selection rule of studies/detector_selection.py: the grid it searches, the order it ranks candidates in
(a hand-made table whose order follows from the rule), and a whole selection on hand-made runs whose verdicts
follow from how they were built."""

from __future__ import annotations

import pandas as pd

from eval.detectors import make_detector
from eval.traces import runs_from_trace
from studies.detector_selection import DETECTOR, SHAPE_KEYS, candidates, chosen_params, rank, score_candidates


def test_the_grid_holds_valid_distinct_candidates_and_the_configured_shape():
    shapes = candidates()
    assert len(shapes) == 3 * 4 * 7 + 3 * 3 * 2 * 2
    assert sum(s["mean_window"] > 0 for s in shapes) == 3 * 3 * 2 * 2
    assert len({tuple(s[k] for k in SHAPE_KEYS) for s in shapes}) == len(shapes)
    for shape in shapes:
        make_detector(DETECTOR, **shape)  # raises on an invalid combination
    configured = make_detector(DETECTOR).params()
    assert {k: configured[k] for k in SHAPE_KEYS} in shapes


def test_rank_orders_by_useful_then_false_stops_then_quality_then_fewest_changes():
    table = pd.DataFrame([
        {"id": "a", "useful": 5, "fp": 0, "quality_kept": 0.9, "changed": 0},  # fewest useful: last
        {"id": "b", "useful": 6, "fp": 3, "quality_kept": 0.9, "changed": 0},  # more false stops than c, d, e
        {"id": "c", "useful": 6, "fp": 2, "quality_kept": 0.1, "changed": 2},  # ties d on quality, changes more
        {"id": "d", "useful": 6, "fp": 2, "quality_kept": 0.1, "changed": 0},
        {"id": "e", "useful": 6, "fp": 2, "quality_kept": 0.2, "changed": 3},  # best quality among the ties
    ])
    assert list(rank(table)["id"]) == ["e", "d", "c", "b", "a"]


def test_a_selection_on_hand_made_runs_chooses_the_drawdown_that_stops_the_slow_declines(slow_decline_trace):
    runs = runs_from_trace(slow_decline_trace(healthy=12, hacking=4))
    shallow = {"patience": 5, "drawdown": 0.3, "fast_window": 0, "fast_ratio": 2.5, "mean_window": 0}
    deep = {"patience": 5, "drawdown": 0.6, "fast_window": 0, "fast_ratio": 2.5, "mean_window": 0}
    table = score_candidates(runs, target=0.02, shapes=[deep, shallow])
    by_drawdown = table.set_index("drawdown")
    # drawdown 0.3: every decline is stopped once its last 5 evals are all more than 0.3 below the peak (the
    # window's best, 1 - 0.08 * (i - 14), drops under 0.7 at i = 18), after the peak at 10 and before the end at 20
    assert by_drawdown.loc[0.3, "useful"] == 4
    # drawdown 0.6: the window's best would need to fall under 0.4, at i = 22: the runs end first
    assert by_drawdown.loc[0.6, "useful"] == 0
    assert (table["fp"] == 0).all()  # 2% of 12 healthy runs allows none
    chosen = chosen_params(table)
    assert chosen["drawdown"] == 0.3 and chosen["z"] == table.iloc[0]["z"]
    stopped = [make_detector(DETECTOR, **chosen).start() for _ in runs]
    hits = [any(m.observe(cp) for cp in r.checkpoints) for m, r in zip(stopped, runs, strict=True)]
    assert hits == [r.label == 1 for r in runs]


def test_the_command_ranks_the_grid_on_a_corpus_and_records_the_chosen_shape(
    tmp_path, monkeypatch, write_corpus, slow_decline_trace
):
    import yaml
    from typer.testing import CliRunner

    import studies.detector_selection as selection
    from rlhfops.cli import app

    # a two-shape grid: the shallow drawdown stops every slow decline, the deep one none (as in the test above)
    monkeypatch.setattr(selection, "PATIENCE", (5,))
    monkeypatch.setattr(selection, "DRAWDOWN", (0.6, 0.3))
    monkeypatch.setattr(selection, "FAST_PATHS", ((0, 2.5),))
    monkeypatch.setattr(selection, "MEAN_WINDOWS", ())
    corpus = write_corpus(slow_decline_trace(healthy=12, hacking=4), lambda _k: "tune")
    config = tmp_path / "detectors.yaml"
    config.write_text(yaml.safe_dump({"version": 3, "detectors": {}, "changelog": []}))
    out = tmp_path / "selection.md"
    res = CliRunner().invoke(app, ["select-detector", "--corpus", str(corpus), "--out", str(out), "--workers", "1",
                                   "--write-config", "--config", str(config)])
    assert res.exit_code == 0, res.output
    rows = [line for line in out.read_text().splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert "| 1 | 0 | 5 | 0.3 |" in rows[0] and "| 4/4 | 0/12 |" in rows[0]
    assert "| 2 | 0 | 5 | 0.6 |" in rows[1] and "| 0/4 | 0/12 |" in rows[1]
    doc = yaml.safe_load(config.read_text())
    params = doc["detectors"][DETECTOR]["params"]
    assert doc["version"] == 4 and params["drawdown"] == 0.3 and params["patience"] == 5
    assert doc["detectors"][DETECTOR]["calibrated_on"]["healthy_runs"] == 12
    assert "select-detector" in doc["changelog"][-1]
    bad = CliRunner().invoke(app, ["select-detector", "--corpus", str(tmp_path / "nowhere"), "--out", str(out)])
    # BadInput: the console entry (rlhfops.cli.main) prints it as one line and exits 2
    assert type(bad.exception).__name__ == "BadInput" and "--corpus" in str(bad.exception)
