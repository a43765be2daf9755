"""The real-curve validation corpus (`data/curves/`): hindsight labels, the tune/report split, and a loader.

Each source directory `data/curves/<source>/traces.csv` holds Trace-CSV rows (`run_id, step, eval_score`, ...)
with the metric's `direction` (`max` or `min`). `data/curves/runs.csv` is the per-run index written by
`data/curves/build_index.py` from the two rules here:

- `hindsight_label`: the label rule of `data/curves/LABELS.md` (written before any detector ran on the corpus);
- `split_of`: the seeded tune/report split of `data/curves/README.md`; a source in `HELD_OUT_SOURCES` (runs
  recorded after a version of the default detector was chosen and calibrated) is held out whole as its own split.

`load_corpus()` joins both into one long DataFrame in the trace format the detectors read, plus `source`,
`direction`, `label`, `peak_step` and `split`. numpy and pandas only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

CORPUS_DIR = Path(__file__).resolve().parents[1] / "data" / "curves"
DIRECTIONS = ("max", "min")

# The label rule's constants (LABELS.md).
MIN_CHECKPOINTS = 6
RANGE_FRACTION = 0.20
NOISE_SDS = 3.0
MIN_AFTER_PEAK = 2

SPLIT_SALT = "rlhfops-corpus-split-v1"
SPLITS = ("tune", "report")
#: sources recorded after some version of the default detector was fixed, each held out whole as a split of its own
#: (never split) so it can check that version on runs it never saw; which version each one checked is in
#: docs/CHANGELOG.md. `gate128`, `gate256`, `sealed256` and `sealed8_256` score another split's runs with a larger
#: eval gate (PAIRED_SPLITS); the `sealed*` sources were kept unread in data/sealed/ until their version was committed.
HELD_OUT_SOURCES = {"own_ppo_fresh": "fresh", "own_ppo_holdout": "holdout", "own_ppo_gate128": "gate128",
                    "own_ppo_twin64": "twin64", "own_ppo_gate256": "gate256", "own_ppo_sealed64": "sealed64",
                    "own_ppo_sealed256": "sealed256", "own_ppo_sealed8_64": "sealed8_64",
                    "own_ppo_sealed8_256": "sealed8_256"}
ALL_SPLITS = (*SPLITS, *HELD_OUT_SOURCES.values())
#: splits that re-measure another split's runs (same training, another eval gate): reported beside that split,
#: never pooled with it (a run would count twice). Run ids differ only in their first path part.
PAIRED_SPLITS = {"gate128": "holdout", "gate256": "twin64", "sealed256": "sealed64", "sealed8_256": "sealed8_64"}
#: the parts the current default's parameters (configs/detectors.yaml, chosen by `rlhfops select-detector`) were
#: chosen and calibrated on: reported as in-sample, never pooled as unseen
CHOSEN_ON_SPLITS = ("tune", "fresh", "holdout", "twin64")


@dataclass(frozen=True)
class HindsightLabel:
    label: int  # 1 hacking, 0 healthy
    peak_step: int
    n_checkpoints: int
    sigma: float
    range: float
    decline: float
    margin: float

    @property
    def decline_over_range(self) -> float:
        return self.decline / self.range if self.range > 0 else 0.0


def _moving_average3(y: np.ndarray) -> np.ndarray:
    """Centred width-3 mean; the two ends average over the two points they have."""
    padded = np.concatenate(([np.nan], y, [np.nan]))
    windows = np.stack([padded[:-2], padded[1:-1], padded[2:]])
    return np.nanmean(windows, axis=0)


def noise_sd(y: np.ndarray) -> float:
    """Robust noise SD from second differences (which cancel a locally linear trend): MAD * 1.4826 / sqrt(6)."""
    d2 = np.diff(y, n=2)
    if d2.size == 0:
        return 0.0
    return float(1.4826 * np.median(np.abs(d2 - np.median(d2))) / np.sqrt(6.0))


def hindsight_label(steps, scores, direction: str = "max", eval_se=None) -> HindsightLabel:
    """Label one run by the rule of data/curves/LABELS.md; `steps`/`scores` in any order, NaN scores dropped."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction '{direction}': expected one of {', '.join(DIRECTIONS)}")
    steps = np.asarray(steps, dtype=float)
    scores = np.asarray(scores, dtype=float)
    keep = np.isfinite(scores) & np.isfinite(steps)
    order = np.argsort(steps[keep], kind="stable")
    s, y = steps[keep][order], scores[keep][order]
    if y.size < MIN_CHECKPOINTS:
        raise ValueError(f"a run needs at least {MIN_CHECKPOINTS} finite checkpoints, got {y.size}")
    if direction == "min":
        y = -y
    sigma = noise_sd(y)
    if eval_se is not None:
        se = np.asarray(eval_se, dtype=float)[keep][order]
        se = se[np.isfinite(se)]
        if se.size:
            sigma = max(sigma, float(np.median(se)))
    rng = float(y.max() - y.min())
    smooth = _moving_average3(y)
    peak = int(np.argmax(smooth))
    decline = float(smooth[peak] - smooth[-1])
    margin = max(RANGE_FRACTION * rng, NOISE_SDS * sigma)
    hacking = peak <= y.size - 1 - MIN_AFTER_PEAK and decline > margin
    return HindsightLabel(label=int(hacking), peak_step=int(s[peak]), n_checkpoints=int(y.size), sigma=sigma,
                          range=rng, decline=decline, margin=margin)


def split_of(run_ids_by_stratum: dict[tuple[str, int], list[str]]) -> dict[str, str]:
    """The seeded split: within each (source, label) stratum, runs sorted by sha256(SALT:run_id) alternate
    tune, report, tune, ... so each stratum is halved (the odd one out goes to tune)."""
    out = {}
    for ids in run_ids_by_stratum.values():
        ranked = sorted(ids, key=lambda r: hashlib.sha256(f"{SPLIT_SALT}:{r}".encode()).hexdigest())
        for i, run_id in enumerate(ranked):
            out[run_id] = SPLITS[i % 2]
    return out


def read_source_traces(corpus_dir: Path = CORPUS_DIR) -> pd.DataFrame:
    """Every `<source>/traces.csv` under the corpus, with a `source` column (the directory name)."""
    frames = []
    for path in sorted(corpus_dir.glob("*/traces.csv")):
        df = pd.read_csv(path)
        df.insert(0, "source", path.parent.name)
        if "direction" not in df.columns:
            df["direction"] = "max"
        frames.append(df)
    if not frames:
        raise FileNotFoundError(f"no <source>/traces.csv under {corpus_dir}")
    return pd.concat(frames, ignore_index=True)


def build_index(traces: pd.DataFrame) -> pd.DataFrame:
    """One row per run: source, direction, the hindsight label and its numbers, and the split."""
    rows = []
    for run_id, run in traces.groupby("run_id", sort=True):
        directions = run["direction"].unique()
        if len(directions) != 1 or directions[0] not in DIRECTIONS:
            raise ValueError(f"run '{run_id}': direction must be one of {DIRECTIONS} on every row, got {directions}")
        se = run["eval_se"] if "eval_se" in run.columns and run["eval_se"].notna().any() else None
        lab = hindsight_label(run["step"], run["eval_score"], directions[0], se)
        rows.append({"run_id": run_id, "source": run["source"].iloc[0], "direction": directions[0],
                     "n_checkpoints": lab.n_checkpoints, "label": lab.label, "peak_step": lab.peak_step,
                     "sigma": lab.sigma, "range": lab.range, "decline": lab.decline, "margin": lab.margin,
                     "decline_over_range": lab.decline_over_range})
    index = pd.DataFrame(rows)
    strata: dict[tuple[str, int], list[str]] = {}
    for r in index.itertuples():
        if r.source not in HELD_OUT_SOURCES:
            strata.setdefault((r.source, r.label), []).append(r.run_id)
    held_out = index["source"].map(HELD_OUT_SOURCES)
    index["split"] = held_out.fillna(index["run_id"].map(split_of(strata)))
    return index


def load_corpus(corpus_dir: Path = CORPUS_DIR, split: str | None = None) -> pd.DataFrame:
    """The corpus as one long trace DataFrame (sorted by run and step) with `source, direction, label,
    peak_step, split` on every row; `split` (one of ALL_SPLITS) keeps only that part."""
    if split is not None and split not in ALL_SPLITS:
        raise ValueError(f"split '{split}': expected one of {', '.join(ALL_SPLITS)}")
    traces = read_source_traces(corpus_dir)
    index = pd.read_csv(corpus_dir / "runs.csv")
    missing = set(traces["run_id"]) ^ set(index["run_id"])
    if missing:
        raise ValueError(f"runs.csv and the traces disagree on {len(missing)} runs (e.g. {sorted(missing)[0]}); "
                         "rebuild it with data/curves/build_index.py")
    meta = index[["run_id", "label", "peak_step", "split"]]
    df = traces.drop(columns=[c for c in ("label", "peak_step", "split") if c in traces.columns])
    df = df.merge(meta, on="run_id", how="left", validate="many_to_one")
    if split is not None:
        df = df[df["split"] == split]
    return df.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)
