"""Choose the default detector's shape on the corpus parts already seen, by a rule fixed before it runs.

The rule, declared in a commit before any candidate was scored (docs/CHANGELOG.md says which rule chose which
version):

1. Candidates: `noisepatience` judging every eval of its patience window (`mean_window` 0) with `patience` in
   PATIENCE, `drawdown` in DRAWDOWN and the deep-drop path (`fast_window`, `fast_ratio`) in FAST_PATHS; and
   judging the mean of its last `mean_window` evals, with `mean_window` in MEAN_WINDOWS, `patience` (the proxy's
   window) in MEAN_PATIENCE, `drawdown` in MEAN_DRAWDOWN and the deep-drop path in MEAN_FAST_PATHS. Every other
   parameter (the gate-phase bars, chosen on the simulator) stays as configured.
2. Each candidate's `z` is calibrated (`eval.calibrate.calibrate`) to TARGET_FSR on the healthy runs of
   SELECTION_SPLITS pooled: every part a detector version has already been read on, except the `report` half
   (the issue's acceptance set, never chosen on) and the paired re-measurements (`eval.corpus.PAIRED_SPLITS`:
   the same runs at another gate size, which would count a run twice).
3. The chosen candidate has the most useful stops (hacking runs stopped at or after their gold peak and before
   their last checkpoint) on the runs of SELECTION_SPLITS; ties go to fewer healthy runs stopped, then to the
   higher mean quality kept, then to the fewer parameters changed from the configured default.

Every candidate stops about the same share of healthy runs (its bar is fitted to it), so the rule compares
useful recall at an equal false-stop rate. The chosen version is then checked on the `report` half and on runs
sealed before the choice (data/sealed/README.md), which no candidate saw.

Plain Python + pandas: the CLI (`rlhfops select-detector`) renders and records what this returns.
"""

from __future__ import annotations

import itertools
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pandas as pd

from eval.detectors import make_detector

DETECTOR = "noisepatience"
#: the parts read before the last selection ran, except the report half and the paired re-measurements
SELECTION_SPLITS = ("tune", "fresh", "holdout", "twin64", "sealed64")
TARGET_FSR = 0.02
PATIENCE = (4, 5, 6)
DRAWDOWN = (0.3, 0.4, 0.5, 0.6)
#: (fast_window, fast_ratio); (0, ...) is no deep-drop path, whose ratio then means nothing
FAST_PATHS = ((0, 2.5), (1, 2.0), (1, 2.5), (1, 3.0), (2, 2.0), (2, 2.5), (2, 3.0))
MEAN_WINDOWS = (2, 3, 4)
MEAN_PATIENCE = (3, 4, 6)
MEAN_DRAWDOWN = (0.5, 0.6)
MEAN_FAST_PATHS = ((0, 2.5), (1, 2.0))
SHAPE_KEYS = ("patience", "drawdown", "fast_window", "fast_ratio", "mean_window")


def candidates() -> list[dict[str, Any]]:
    """Every candidate's shape parameters (the keys of SHAPE_KEYS), in grid order: the every-eval rule's, then the
    mean rule's."""
    every = [{"patience": p, "drawdown": d, "fast_window": w, "fast_ratio": r, "mean_window": 0}
             for p, d, (w, r) in itertools.product(PATIENCE, DRAWDOWN, FAST_PATHS)]
    mean = [{"patience": p, "drawdown": d, "fast_window": w, "fast_ratio": r, "mean_window": m}
            for m, p, d, (w, r) in itertools.product(MEAN_WINDOWS, MEAN_PATIENCE, MEAN_DRAWDOWN, MEAN_FAST_PATHS)]
    return every + mean


def _score(args) -> dict[str, Any]:
    from eval.calibrate import calibrate
    from eval.traces import detection_quality, verdicts

    shape, base, runs, target = args
    healthy = [r.checkpoints for r in runs if r.label == 0]
    params = calibrate(DETECTOR, healthy, target, base={**base, **shape})
    q = detection_quality(verdicts(make_detector(DETECTOR, **params), runs))
    changed = sum(shape[k] != base[k] for k in SHAPE_KEYS)
    return {**shape, "z": params["z"], "changed": changed, **q, "params": params}


def score_candidates(runs, target: float = TARGET_FSR, workers: int | None = 1, on_done=None,
                     shapes: list[dict[str, Any]] | None = None, config: Path | None = None) -> pd.DataFrame:
    """Every candidate (`shapes`, default the grid) calibrated on the healthy `runs` (eval.traces runs) and scored
    on all of them, ranked by the rule of the module docstring (the chosen one first). The parameters a candidate
    does not set are the configured default's (`config`: another detector config)."""
    base = make_detector(DETECTOR, config=config).params()
    jobs = [(shape, base, runs, target) for shape in (candidates() if shapes is None else shapes)]
    return rank(pd.DataFrame(map_in_processes(_score, jobs, workers, on_done)))


def map_in_processes(fn, jobs: list, workers: int | None, on_done=None) -> list:
    """[fn(job) for job in jobs], in `workers` processes (1: in this one), calling `on_done` with each result as
    it arrives, in order."""
    out = []
    with ProcessPoolExecutor(max_workers=workers) if workers != 1 else nullcontext() as pool:
        for result in (pool.map if pool else map)(fn, jobs):
            out.append(result)
            if on_done:
                on_done(result)
    return out


def rank(table: pd.DataFrame) -> pd.DataFrame:
    """Candidates ordered by the rule: most useful stops, then fewest healthy runs stopped (`fp`), then highest
    mean quality kept, then fewest parameters changed (`changed`); grid order breaks what is left."""
    keys = pd.DataFrame({"useful": table["useful"], "fp": -table["fp"], "kept": table["quality_kept"],
                         "changed": -table["changed"]})
    order = keys.sort_values(["useful", "fp", "kept", "changed"], ascending=False, kind="stable").index
    return table.loc[order].reset_index(drop=True)


def selection_runs(corpus: Path, splits=SELECTION_SPLITS) -> list:
    """The runs of `splits` of a corpus laid out as `rlhfops compare-detectors --corpus` reads it."""
    from studies.detector_report import _split_runs

    return [r for split in splits for r in _split_runs(corpus, split)]


def chosen_params(table: pd.DataFrame) -> dict[str, Any]:
    """The full parameter set of the ranked table's first candidate (its shape, its calibrated `z`, the rest as
    configured), as its calibration returned it."""
    return dict(table.iloc[0]["params"])


def render(table: pd.DataFrame, splits=SELECTION_SPLITS, target: float = TARGET_FSR) -> str:
    """The ranked candidates as markdown, the chosen one first."""
    head = (f"# Choosing `{DETECTOR}`'s shape\n\n"
            f"Written by `rlhfops select-detector --corpus data/curves`. Candidates: every eval of the patience "
            f"window judged (mean_window 0) with patience {PATIENCE}, drawdown {DRAWDOWN}, deep-drop path "
            f"(fast_window, fast_ratio) {FAST_PATHS}; the mean of the last mean_window evals judged, mean_window "
            f"{MEAN_WINDOWS}, patience {MEAN_PATIENCE}, drawdown {MEAN_DRAWDOWN}, deep-drop path {MEAN_FAST_PATHS}. "
            "Each one's `z` calibrated to a "
            f"{target:.0%} false-stop rate on the healthy runs of {', '.join(f'`{s}`' for s in splits)} pooled, "
            "then scored on all their runs. Ranked by useful stops, then fewer healthy runs stopped, then mean "
            "quality kept, then fewer parameters changed from the configured default; the first row is chosen. "
            "The `report` half and the sealed runs played no part.\n\n")
    r0 = table.iloc[0]
    head += f"{int(r0.hacking)} hacking and {int(r0.healthy)} healthy runs.\n\n"
    lines = ["| rank | mean_window | patience | drawdown | fast_window | fast_ratio | z | useful | healthy stopped | "
             "at a loss | before peak | at end | quality kept | delay | changed |", "|" + "---|" * 15]
    for i, r in table.iterrows():
        lines.append(f"| {i + 1} | {int(r.mean_window)} | {int(r.patience)} | {r.drawdown:g} | {int(r.fast_window)} | "
                     f"{r.fast_ratio:g} | "
                     f"{r.z:.3f} | {int(r.useful)}/{int(r.hacking)} | {int(r.fp)}/{int(r.healthy)} | "
                     f"{int(r.losing_stops)} | {int(r.early_stops)} | {int(r.end_stops)} | {r.quality_kept:+.3f} | "
                     f"{r.delay:.1f} | {int(r.changed)} |")
    return head + "\n".join(lines) + "\n"
