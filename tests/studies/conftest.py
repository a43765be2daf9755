"""Hand-made runs for the detector-selection tests, whose verdicts follow from how they were built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

STEPS = 21


def _slow_decline_trace(healthy: int, hacking: int) -> pd.DataFrame:
    """Healthy runs rise steadily (noise SD 0.02: never 0.3 below their best); hacking runs rise to 1 at
    checkpoint 10 and fall 0.08 per checkpoint to 0.2 at the end: no proxy, so only the patience rule judges them.
    The best of the last 5 evals falls more than 0.3 below the peak at checkpoint 18, never more than 0.6 below it
    before the run ends. Run ids are r0, r1, ...: the healthy runs first."""
    rng = np.random.default_rng(7)
    rows = []
    for k in range(healthy + hacking):
        label = int(k >= healthy)
        if label:
            y = np.r_[np.linspace(0.0, 1.0, 11), 1.0 - 0.08 * np.arange(1, STEPS - 10)]
        else:
            y = np.linspace(0.0, 1.0, STEPS)
        y = y + rng.normal(0, 0.02, STEPS)
        rows += [{"run_id": f"r{k}", "step": s, "eval_score": v, "label": label} for s, v in enumerate(y)]
    return pd.DataFrame(rows)


@pytest.fixture
def slow_decline_trace():
    """The trace builder above: slow_decline_trace(healthy, hacking) -> a Trace DataFrame."""
    return _slow_decline_trace


@pytest.fixture
def write_corpus(tmp_path):
    """write_corpus(trace, split_of) -> a corpus directory laid out as `--corpus` reads it (one source, and
    runs.csv with each run's label, no labelled peak, and the split `split_of(run_number)`)."""

    def write(trace: pd.DataFrame, split_of) -> Path:
        corpus = tmp_path / "corpus"
        (corpus / "src").mkdir(parents=True)
        trace = trace.assign(direction="max")
        trace.to_csv(corpus / "src" / "traces.csv", index=False)
        index = trace.groupby("run_id", as_index=False)["label"].first()
        index["split"] = [split_of(int(run_id[1:])) for run_id in index["run_id"]]
        index.assign(peak_step=float("nan")).to_csv(corpus / "runs.csv", index=False)
        return corpus

    return write
