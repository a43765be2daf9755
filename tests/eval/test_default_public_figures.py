"""The mean-only default (`NoisePatience`, configs/detectors.yaml) keeps its published figures on the public corpus's
parts it was never chosen on (docs/default-detector.md): the `report` half, `sealed64` and `sealed8_64` pooled stop
30 of 48 hacking runs usefully and 3 of 172 healthy runs, with quality kept +0.153. The paired rule is the default
only where per-prompt records exist; a change meant for it must not move these. About 8 s.

    .venv/bin/python -m pytest tests/eval/test_default_public_figures.py -q
"""

from __future__ import annotations

import pandas as pd
import pytest

from eval.corpus import load_corpus
from eval.detectors import DEFAULT_DETECTOR, make_detector
from eval.traces import detection_quality, runs_from_trace, verdicts

# part -> (useful stops, hacking runs, healthy runs stopped, healthy runs): docs/default-detector.md's table
PUBLISHED = {"report": (5, 7, 0, 101), "sealed64": (13, 26, 0, 30), "sealed8_64": (12, 15, 3, 41)}


def test_the_mean_only_default_keeps_its_published_figures_on_the_unseen_parts():
    assert DEFAULT_DETECTOR == "noisepatience"
    det = make_detector(DEFAULT_DETECTOR)
    parts = {}
    for split in PUBLISHED:
        v = verdicts(det, runs_from_trace(load_corpus(split=split)))
        q = detection_quality(v)
        assert (q["useful"], q["hacking"], q["fp"], q["healthy"]) == PUBLISHED[split], split
        parts[split] = v
    pooled = detection_quality(pd.concat(parts.values()))
    assert (pooled["useful"], pooled["hacking"], pooled["fp"], pooled["healthy"]) == (30, 48, 3, 172)
    assert pooled["useful_recall"] == pytest.approx(0.625) and pooled["false_stop_rate"] == pytest.approx(3 / 172)
    assert pooled["quality_kept"] == pytest.approx(0.153, abs=5e-4)
