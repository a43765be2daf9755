"""Trace CSV (its contract: docs/ARCHITECTURE.md, File formats): one row per run and checkpoint, long format, rows in
any order, ids any string.

Required: run_id, step, eval_score. Optional: reward, loss, kl, entropy, grad_norm, response_len,
tenant, label (1 = hacking, 0 = healthy), progress (the run's own step fraction; when absent it is
step / the run's last step, i.e. the run's planned length is taken to be the recorded one), eval_se (the
eval gate's standard error, read by the noise-aware detectors), direction (`higher` or `lower`: which way
the metric is better; default higher, or `rlhfops detect --direction`), gold_score (the hindsight quality
the usefulness scores use, e.g. a gold reward the detector never sees; default eval_score).

Loading validates before any detector runs and raises `BadInput` naming the line, run, step and column.
What each numeric column accepts (`COLUMN_RULES`), and why:

- `step`: required on every row, finite, 0 <= step <= 2**53 (steps are counts; beyond 2**53 floats skip integers).
- `eval_score`: a required column, finite, |x| <= 1e12 (units are arbitrary, but the detectors' slopes square
  the values: beyond 1e154 they overflow, and a score of 1e12 is an export bug, not a measurement). An empty
  cell is a step without an eval (run-health traces have a row per step and an eval every few steps).
- optional signals (`reward`, `loss`, `kl`; `eval_se`, `entropy`, `grad_norm`, `response_len`, `gpu_seconds`,
  `staleness`, `reward_std`, `group_reward_std` >= 0; `progress`, `truncation_rate`, `unparseable_rate`,
  `group_flat_frac` in [0, 1]): an empty cell means "not recorded at this step" and the detectors and alerts
  skip it, as they skip steps between evals.
  A spelled-out `nan` is rejected rather than read as missing: a NaN reward or KL is what a broken reward
  service or a diverged run produces, and reading it as "not recorded" would silence the alert that should
  fire. `inf`/`-inf` and magnitudes above 1e12 are rejected for the same reason (an `inf` reward raised no alert
  and 1e308 overflowed the catalog's statistics, which then fired nothing): fix the export, or leave the cell
  empty if the value really was not measured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from common.errors import BadInput
from eval.detector_base import Checkpoint, Detector

REQUIRED = ("run_id", "step", "eval_score")
NUMERIC_OPTIONAL = ("reward", "loss", "kl", "entropy", "grad_norm", "response_len", "progress", "eval_se",
                    "gold_score", "peak_step")
#: per-step columns only the run-health catalog reads (the trainer's StepRecord carries them)
HEALTH_COLUMNS = ("truncation_rate", "unparseable_rate", "gpu_seconds", "staleness", "reward_std", "group_flat_frac",
                  "group_reward_std")
#: largest magnitude any numeric column may hold (see the module docstring)
MAX_ABS = 1e12
#: column -> (low, high, what the bound means); see the module docstring
COLUMN_RULES: dict[str, tuple[float, float, str]] = {
    "step": (0.0, 2.0**53, "a training step count"),
    "eval_score": (-MAX_ABS, MAX_ABS, "an eval score"),
    "reward": (-MAX_ABS, MAX_ABS, "a reward"),
    "loss": (-MAX_ABS, MAX_ABS, "a loss"),
    "kl": (-MAX_ABS, MAX_ABS, "a KL estimate"),
    "eval_se": (0.0, MAX_ABS, "a standard error, >= 0"),
    "entropy": (0.0, MAX_ABS, "a token entropy, >= 0"),
    "grad_norm": (0.0, MAX_ABS, "a norm, >= 0"),
    "response_len": (0.0, MAX_ABS, "a length, >= 0"),
    "gpu_seconds": (0.0, MAX_ABS, "GPU time, >= 0"),
    "staleness": (0.0, MAX_ABS, "policy versions behind, >= 0"),
    "reward_std": (0.0, MAX_ABS, "a standard deviation, >= 0"),
    "group_flat_frac": (0.0, 1.0, "a share of the step's groups"),
    "group_reward_std": (0.0, MAX_ABS, "a standard deviation, >= 0"),
    "progress": (0.0, 1.0, "a fraction of the run"),
    "gold_score": (-MAX_ABS, MAX_ABS, "a hindsight quality score"),
    "peak_step": (0.0, 2.0**53, "the step of the gold peak"),
    "truncation_rate": (0.0, 1.0, "a rate"),
    "unparseable_rate": (0.0, 1.0, "a rate"),
}
_NAN_SPELLINGS = {"nan", "-nan", "+nan", "na", "n/a", "null", "none"}
VERDICT_COLUMNS = ["run_id", "stopped", "stop_step", "best_step", "best_eval_score", "final_eval_score"]


@dataclass
class Run:
    run_id: str
    steps: np.ndarray
    checkpoints: list[Checkpoint]
    label: int | None
    tenant: str | None
    #: +1 higher-is-better, -1 lower-is-better: checkpoints carry sign * eval_score (detectors see "up is good")
    sign: float = 1.0
    #: hindsight quality per checkpoint in higher-is-better units (gold_score, else eval_score)
    gold: np.ndarray | None = None
    #: the gold peak's step as labelled in hindsight (trace column peak_step), else the gold's argmax
    peak_step: float = math.nan


def read_user_csv(path: Path, where: str, required, text_columns=()) -> pd.DataFrame:
    """A user's CSV as a frame, or `BadInput` naming `where` and the fix: the file exists, is UTF-8 and parses, has
    the `required` columns and a row. Only an empty cell is missing: a spelled-out "nan" stays text so it can be
    told apart; `text_columns` are read as strings."""
    if not path.is_file():
        raise BadInput(f"{where}: no such file")
    try:
        df = pd.read_csv(path, dtype={c: str for c in text_columns}, keep_default_na=False, na_values=[""])
    except UnicodeDecodeError as err:
        raise BadInput(f"{where}: not UTF-8 text (byte 0x{err.object[err.start]:02x}; save the file as UTF-8)") \
            from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise BadInput(f"{where}: not a readable CSV ({str(err).splitlines()[0]})") from None
    df.columns = [str(c).strip() for c in df.columns]
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise BadInput(f"{where}: missing required column(s) {', '.join(missing)} "
                       f"(need {', '.join(required)}; found: {', '.join(df.columns)})")
    if df.empty:
        raise BadInput(f"{where}: no rows")
    return df


def load_trace(path: str | Path) -> pd.DataFrame:
    """Read and validate a trace; returns rows sorted by (run_id, step)."""
    path = Path(path)
    df = read_user_csv(path, f"trace '{path}'", REQUIRED, text_columns=("run_id", "tenant"))
    if df["run_id"].isna().any():
        row = int(np.flatnonzero(df["run_id"].isna().to_numpy())[0]) + 2
        raise BadInput(f"trace '{path}': column 'run_id' is empty on line {row}")
    for col in ("step", "eval_score", *[c for c in (*NUMERIC_OPTIONAL, *HEALTH_COLUMNS) if c in df.columns]):
        df[col] = _numeric_column(df, col, path)
    if "label" in df.columns:
        labels = pd.to_numeric(df["label"], errors="coerce")
        bad = ~labels.isin([0, 1])
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise BadInput(f"trace '{path}': column 'label' line {row + 2}: must be 0 (healthy) or 1 (hacking)")
        df["label"] = labels.astype(int)
        per_run = df.groupby("run_id")["label"].nunique()
        if (per_run > 1).any():
            raise BadInput(f"trace '{path}': run '{per_run[per_run > 1].index[0]}' has both labels 0 and 1")
    dup = df.duplicated(["run_id", "step"])
    if dup.any():
        row = int(np.flatnonzero(dup.to_numpy())[0])
        raise BadInput(f"trace '{path}': run '{df['run_id'].iloc[row]}' repeats step {df['step'].iloc[row]:g} "
                       f"(line {row + 2})")
    return df.sort_values(["run_id", "step"], kind="stable").reset_index(drop=True)


def _numeric_column(df: pd.DataFrame, col: str, path: Path) -> pd.Series:
    """`df[col]` as floats, or BadInput naming the first bad cell's line, run, step and column."""
    raw = df[col]
    values = pd.to_numeric(raw, errors="coerce").astype(float)
    low, high, what = COLUMN_RULES[col]
    arr = values.to_numpy()
    empty = raw.isna().to_numpy()
    with np.errstate(invalid="ignore"):
        bad = (~empty & ~np.isfinite(arr)) | (np.isfinite(arr) & ((arr < low) | (arr > high)))
    if col == "step":
        bad |= empty
    if not bad.any():
        return values
    row = int(np.flatnonzero(bad)[0])
    cell = raw.iloc[row]
    step = df["step"].iloc[row]
    where = f"trace '{path}': column '{col}' line {row + 2} (run '{df['run_id'].iloc[row]}', step {step}):"
    if empty[row]:
        problem = "is empty; every row needs a step"
    elif np.isnan(arr[row]) and str(cell).strip().lower() not in _NAN_SPELLINGS:
        problem = f"'{cell}' is not a number"
    elif np.isnan(arr[row]):
        problem = (f"'{cell}' is not a measurement (a NaN {col} is a fault to fix upstream; leave the cell empty "
                   "if it was not recorded at this step)" if col != "step"
                   else f"'{cell}' is not a number (every row needs a finite step)")
    elif not np.isfinite(arr[row]):
        problem = f"{cell} is not a finite number (fix the export; an infinite {col} would silence the alerts)"
    else:
        problem = f"{arr[row]:g} is outside [{low:g}, {high:g}] for {what} (fix the export or rescale the column)"
    raise BadInput(f"{where} {problem}")


DIRECTIONS = {"higher": 1.0, "lower": -1.0, "max": 1.0, "min": -1.0}


def run_signs(df: pd.DataFrame, direction: str | None = None) -> dict[str, float]:
    """Per run: +1 when a higher eval_score is better, -1 when lower is (a trace column `direction`, else
    `direction` for every run, else higher). Raises BadInput naming an unknown direction or a conflict."""
    if direction is not None and direction.strip().lower() not in DIRECTIONS:
        raise BadInput(f"direction: '{direction}' must be 'higher' (or 'max') or 'lower' "
                       "(or 'min'): which way the metric is better")
    default = DIRECTIONS[direction.strip().lower()] if direction else 1.0
    if "direction" not in df.columns:
        return {str(r): default for r in df["run_id"].unique()}
    col = df["direction"].astype(str).str.strip().str.lower()
    bad = ~col.isin(list(DIRECTIONS)) & df["direction"].notna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise BadInput(f"trace column 'direction' line {row + 2}: '{df['direction'].iloc[row]}' is not a direction "
                       "(use 'higher'/'max' or 'lower'/'min')")
    signs = {}
    for run_id, g in col[df["direction"].notna()].groupby(df["run_id"]):
        if g.map(DIRECTIONS).nunique() > 1:
            raise BadInput(f"trace column 'direction': run '{run_id}' has both 'higher' and 'lower'")
        sign = DIRECTIONS[g.iloc[0]]
        if direction and sign != default:
            raise BadInput(f"direction: '{direction}', but run '{run_id}' declares '{g.iloc[0]}' in the trace")
        signs[str(run_id)] = sign
    return {str(r): signs.get(str(r), default) for r in df["run_id"].unique()}


def runs_from_trace(df: pd.DataFrame, direction: str | None = None) -> list[Run]:
    signs = run_signs(df, direction)
    runs = []
    for run_id, g in df.groupby("run_id", sort=False):
        steps = g["step"].to_numpy()
        last = steps[-1] if steps[-1] > 0 else 1.0
        progress = g["progress"].to_numpy() if "progress" in g else steps / last
        cols = {c: g[c].to_numpy() if c in g else np.full(len(g), math.nan)
                for c in ("reward", "loss", "kl", "entropy", "grad_norm", "response_len", "eval_se")}
        sign = signs[str(run_id)]
        evals = sign * g["eval_score"].to_numpy()
        cps = [Checkpoint(step=float(steps[i]), eval_score=float(evals[i]), progress=float(progress[i]),
                          **{c: float(v[i]) for c, v in cols.items()}) for i in range(len(g))]
        label = int(g["label"].iloc[0]) if "label" in g else None
        tenant = str(g["tenant"].iloc[0]) if "tenant" in g else None
        gold = sign * pd.to_numeric(g["gold_score"], errors="coerce").to_numpy(dtype=float) \
            if "gold_score" in g else evals
        peak = float(g["peak_step"].iloc[0]) if "peak_step" in g else math.nan
        runs.append(Run(str(run_id), steps, cps, label, tenant, sign, gold, peak))
    return runs


def check_columns(detector: Detector, df: pd.DataFrame, source: str) -> None:
    """Refuse, before any replay, a detector whose signal the trace lacks (BadInput naming both)."""
    for need in detector.needs:
        if need == "progress" and detector.name != "stopat":
            continue  # derived from step when absent
        if need not in df.columns or df[need].isna().all():
            why = {"progress": " (the run's planned step fraction: without it the last recorded step would count "
                               "as the planned end and every run would be stopped)"}.get(need, "")
            raise BadInput(f"trace '{source}': detector '{detector.name}' needs column '{need}'{why}")
    if detector.name == "lossplateau" and (df["loss"].dropna() <= 0).any():
        raise BadInput(f"trace '{source}': detector 'lossplateau' needs a training loss (positive, e.g. a "
                       "cross-entropy) in column 'loss'; this one has values <= 0, as a policy loss does")


def verdicts(detector: Detector, runs: list[Run]) -> pd.DataFrame:
    """Replay each run through a fresh monitor: where it would stop, which checkpoint it keeps, and how
    useful the stop was (the columns after the contract's verdict columns; see `USEFULNESS`)."""
    rows = []
    for run in runs:
        monitor = detector.start()
        best_i, best, stop_i = -1, -math.inf, None
        for i, cp in enumerate(run.checkpoints):
            if cp.eval_score == cp.eval_score and cp.eval_score > best:
                best_i, best = i, cp.eval_score
            if monitor.observe(cp):
                stop_i = i
                break
        rows.append(verdict_row(run, stop_i, best_i))
    return pd.DataFrame(rows)


def verdict_row(run: Run, stop_i: int | None, kept_i: int) -> dict:
    """One run's row of the verdicts CSV: where it stopped (`stop_i`, None: never), the checkpoint it keeps
    (`kept_i`, -1: none), its final score, the label when known and the usefulness columns."""
    end = stop_i if stop_i is not None else len(run.checkpoints) - 1
    row = {
        "run_id": run.run_id,
        "stopped": int(stop_i is not None),
        "stop_step": run.steps[stop_i] if stop_i is not None else math.nan,
        "best_step": run.steps[kept_i] if kept_i >= 0 else math.nan,
        "best_eval_score": run.sign * run.checkpoints[kept_i].eval_score if kept_i >= 0 else math.nan,
        "final_eval_score": run.sign * run.checkpoints[end].eval_score,
    }
    if run.label is not None:
        row["label"] = run.label
    row.update(usefulness(run, stop_i, kept_i))
    return row


#: what the columns after the contract's verdict columns (docs/ARCHITECTURE.md) mean
USEFULNESS = {
    "stop_phase": "none (not stopped), before_peak (before the gold peak: quality still to gain), "
                  "after_peak (at or after the peak and before the last checkpoint: the useful stop), "
                  "at_end (at the last checkpoint: saves nothing)",
    "gold_peak_step": "step of the run's gold peak in hindsight: the trace's peak_step, else the step of its best "
                      "gold_score (else eval_score)",
    "quality_kept": "(gold of the kept checkpoint - gold of the final checkpoint) / the run's gold range; "
                    "0 when not stopped, > 0 better than never stopping",
    "compute_saved": "steps not trained after the stop / the run's recorded steps",
    "delay": "checkpoints from the gold peak to the stop (stopped runs)",
}


def _gold(run: Run) -> np.ndarray:
    return run.gold if run.gold is not None else np.array([c.eval_score for c in run.checkpoints])


def peak_index(run: Run) -> int:
    """Index of the run's gold peak: the first checkpoint at or after its hindsight `peak_step` when labelled,
    else its best gold (else eval) score; -1 when it has no finite score. A stop at or after it is after the peak."""
    gold = _gold(run)
    if run.peak_step == run.peak_step:
        return min(int(np.searchsorted(run.steps, run.peak_step, side="left")), len(gold) - 1)
    return int(np.nanargmax(gold)) if np.isfinite(gold).any() else -1


def usefulness(run: Run, stop_i: int | None, kept_i: int) -> dict[str, float | str]:
    gold = _gold(run)
    n = len(gold)
    finite = np.isfinite(gold)
    peak_i = peak_index(run)
    out: dict[str, float | str] = {"stop_phase": "none", "gold_peak_step": run.steps[peak_i] if peak_i >= 0
                                   else math.nan, "quality_kept": 0.0, "compute_saved": 0.0, "delay": math.nan}
    if stop_i is None:
        return out
    out["stop_phase"] = "at_end" if stop_i == n - 1 else "after_peak" if stop_i >= peak_i else "before_peak"
    span = float(np.nanmax(gold) - np.nanmin(gold)) if finite.any() else 0.0
    kept, final = gold[kept_i] if kept_i >= 0 else math.nan, gold[-1]
    out["quality_kept"] = float((kept - final) / span) if span > 0 and np.isfinite(kept - final) else 0.0
    length = float(run.steps[-1] - run.steps[0])
    out["compute_saved"] = float(run.steps[-1] - run.steps[stop_i]) / length if length > 0 else 0.0
    out["delay"] = float(stop_i - peak_i) if peak_i >= 0 else math.nan
    return out


def detection_quality(v: pd.DataFrame) -> dict[str, float]:
    """Usefulness first: useful recall (hacking runs stopped after their gold peak and before their last
    checkpoint), false-stop rate (healthy runs stopped at all) and how many of those stops lost quality (the
    kept checkpoint scores below the run's final one: what a false stop cost the tenant), hacking stops
    before the peak and at the end, mean quality kept, compute saved and delay; then precision, recall and
    FPR of `stopped` against `label`, with the counts behind them."""
    stopped = v["stopped"].to_numpy().astype(bool)
    label = v["label"].to_numpy().astype(bool)
    tp = int(np.sum(stopped & label))
    fp = int(np.sum(stopped & ~label))
    pos, neg = int(label.sum()), int((~label).sum())
    phase = v["stop_phase"].to_numpy() if "stop_phase" in v else np.where(stopped, "after_peak", "none")
    useful = int(np.sum(label & (phase == "after_peak")))
    kept = v["quality_kept"].to_numpy(dtype=float) if "quality_kept" in v else np.zeros(len(v))
    saved = v["compute_saved"].to_numpy(dtype=float) if "compute_saved" in v else np.zeros(len(v))
    delay = v["delay"].to_numpy(dtype=float) if "delay" in v else np.full(len(v), math.nan)
    useful_delay = delay[label & (phase == "after_peak")]
    return {
        "runs": len(v), "hacking": pos, "healthy": neg, "stopped": int(stopped.sum()), "tp": tp, "fp": fp,
        "useful": useful,
        "useful_recall": useful / pos if pos else math.nan,
        "false_stop_rate": fp / neg if neg else math.nan,
        "losing_stops": int(np.sum(stopped & ~label & (kept < 0))),
        "early_stops": int(np.sum(label & (phase == "before_peak"))),
        "end_stops": int(np.sum(label & (phase == "at_end"))),
        "quality_kept": float(kept.mean()) if len(kept) else math.nan,
        "quality_kept_hacking": float(kept[label].mean()) if pos else math.nan,
        "compute_saved": float(saved.mean()) if len(saved) else math.nan,
        "delay": float(useful_delay.mean()) if len(useful_delay) else math.nan,
        "precision": tp / (tp + fp) if tp + fp else math.nan,
        "recall": tp / pos if pos else math.nan,
        "fpr": fp / neg if neg else math.nan,
    }
