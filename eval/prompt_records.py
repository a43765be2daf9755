"""Per-prompt gate records: what the eval gate scored on each held-out prompt at each checkpoint.

A prompts CSV has one row per run, checkpoint and prompt, long format, rows in any order:

    run_id, step, prompt_id, gold_score [, seed, proxy_score, response_len]

- `run_id`, `prompt_id`: any non-empty string; the same prompt id means the same held-out prompt at every step.
- `step`: the checkpoint's training step (finite, >= 0); it matches the run's steps in the trace.
- `gold_score`: the gate's score of this checkpoint's response to this prompt, higher is better (a trace that
  declares `direction` lower flips it, like `eval_score`); finite.
- optional `seed` (the sampling seed the prompt was answered with: the same for a prompt at every checkpoint is
  what makes two checkpoints' scores comparable prompt by prompt), `proxy_score`, `response_len` (>= 0), `batch`
  (>= 0, see below): finite where given, an empty cell is "not recorded".

Every step of a run carries the same prompts: a paired comparison of two checkpoints is only paired on prompts
both were scored on, so a step that lacks a prompt its run's other steps have is a broken export, refused with
the run, step and prompt named (as is a repeated (run, step, prompt) row, a non-numeric or non-finite value and a
missing column). The one exception is a gate that scores more prompts when a decision is close: it scores the next
batch of its held-out pool for the two checkpoints in question only. Such extension batches are told apart by an
optional integer column `batch` (0: the gate's own prompts, 1, 2, ...: extension batches), or, without it, by
`seed` where the seed is per batch (two or more prompts share a seed, as `training/gate.py` writes them): a step
that has any prompt of a batch must have all of it, and some batch must be scored at every step.
`load_prompt_records(path, complete=False)` skips these checks. `paired_matrix` holds NaN where a checkpoint has
no score, and the rule pairs two checkpoints on the prompts both have.

Plain Python + numpy/pandas: no Prefect or MLflow here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common.errors import BadInput
from eval.traces import read_user_csv

REQUIRED = ("run_id", "step", "prompt_id", "gold_score")
OPTIONAL = ("seed", "proxy_score", "response_len", "batch")
#: largest magnitude a score may hold (as for traces: beyond it a value is an export bug, not a measurement)
MAX_ABS = 1e12


def load_prompt_records(path: str | Path, complete: bool = True) -> pd.DataFrame:
    """Read and validate a prompts CSV; rows sorted by (run_id, step, prompt_id), `step` and the scores as floats,
    ids as strings. Raises `BadInput`, one line naming the file, line, run, step, prompt and column, for a
    missing column, an empty id, a non-numeric or non-finite value, a repeated (run, step, prompt) and (with
    `complete`) a step that lacks a prompt its run's other steps have."""
    path = Path(path)
    where = f"prompts '{path}'"
    df = read_user_csv(path, where, REQUIRED, text_columns=("run_id", "prompt_id"))
    for col in ("run_id", "prompt_id"):
        empty = df[col].isna().to_numpy()
        if empty.any():
            raise BadInput(f"{where}: column '{col}' is empty on line {int(np.flatnonzero(empty)[0]) + 2}")
        df[col] = df[col].astype(str).str.strip()
    for col in ("step", "gold_score", *[c for c in OPTIONAL if c in df.columns]):
        df[col] = _numeric(df, col, where, required=col in REQUIRED)
    dup = df.duplicated(["run_id", "step", "prompt_id"])
    if dup.any():
        i = int(np.flatnonzero(dup.to_numpy())[0])
        raise BadInput(f"{where}: line {i + 2}: run '{df['run_id'].iloc[i]}' step {df['step'].iloc[i]:g} repeats "
                       f"prompt '{df['prompt_id'].iloc[i]}' (one row per run, step and prompt)")
    if complete:
        _check_complete(df, where)
    return df.sort_values(["run_id", "step", "prompt_id"], kind="stable").reset_index(drop=True)


def _numeric(df: pd.DataFrame, col: str, where: str, required: bool) -> pd.Series:
    """`df[col]` as floats, or BadInput naming the first bad cell (line, run, step, prompt, column)."""
    raw = df[col]
    values = pd.to_numeric(raw, errors="coerce").astype(float)
    arr = values.to_numpy()
    empty = raw.isna().to_numpy()
    low = 0.0 if col in ("step", "response_len", "batch") else -MAX_ABS
    high = 2.0**53 if col == "step" else MAX_ABS
    with np.errstate(invalid="ignore"):
        bad = (~empty & ~np.isfinite(arr)) | (np.isfinite(arr) & ((arr < low) | (arr > high)))
    if required:
        bad |= empty
    if not bad.any():
        return values
    i = int(np.flatnonzero(bad)[0])
    cell = raw.iloc[i]
    at = (f"{where}: column '{col}' line {i + 2} (run '{df['run_id'].iloc[i]}', step {df['step'].iloc[i]}, "
          f"prompt '{df['prompt_id'].iloc[i]}'):")
    if empty[i]:
        problem = "is empty; every row needs one"
    elif np.isnan(arr[i]):
        problem = f"'{cell}' is not a number"
    elif not np.isfinite(arr[i]):
        problem = f"{cell} is not a finite number (fix the export)"
    else:
        problem = f"{arr[i]:g} is outside [{low:g}, {high:g}] (fix the export or rescale the column)"
    raise BadInput(f"{at} {problem}")


def _batches(g: pd.DataFrame) -> pd.Series:
    """One run's rows -> the batch each prompt belongs to: the `batch` column; else the `seed` column where the
    seeds are per batch (some seed shared by two or more prompts: prompts answered with one seed were scored
    together); else one batch (every prompt at every step)."""
    if "batch" in g.columns:
        return g["batch"].astype(str)
    if "seed" in g.columns and g["seed"].notna().all():
        seeds = g.groupby("seed")["prompt_id"].nunique()
        if (seeds >= 2).any():
            return g["seed"].astype(str)
    return pd.Series("0", index=g.index)


def _check_complete(df: pd.DataFrame, where: str) -> None:
    """Per run: a step that has any prompt of a batch has all of the batch's prompts, and some batch (the gate's
    own prompts) is scored at every step; name the first step that lacks a prompt."""
    for run_id, g in df.groupby("run_id", sort=True):
        batch = _batches(g)
        steps = set(g["step"])
        everywhere = False
        for _, rows in g.groupby(batch, sort=True):
            prompts = set(rows["prompt_id"])
            have = rows.groupby("step")["prompt_id"].agg(set)
            everywhere |= len(have) == len(steps)
            for step, got in have.items():
                lacking = prompts - got
                if lacking:
                    first = min(lacking, key=_prompt_key)
                    other = rows.loc[rows["prompt_id"] == first, "step"].min()
                    raise BadInput(f"{where}: run '{run_id}' step {step:g} lacks prompt '{first}' (scored at step "
                                   f"{other:g}; {len(lacking)} prompt(s) missing at this step): every step of a run "
                                   "needs the same prompts")
        if not everywhere:  # every batch is missing somewhere: name the step with the fewest prompts
            per_step = g.groupby("step")["prompt_id"].agg(set)
            step, got = min(per_step.items(), key=lambda item: len(item[1]))
            lacking = min(set(g["prompt_id"]) - got, key=_prompt_key)
            raise BadInput(f"{where}: run '{run_id}' step {step:g} lacks prompt '{lacking}': every step of a run "
                           "needs the same prompts (no batch of prompts is scored at every step)")


def _prompt_key(pid: str) -> tuple:
    """Sort key of a prompt id: numeric ids by number (the held-out pool's order), then the rest as text."""
    return (0, int(pid), "") if pid.isdigit() else (1, 0, pid)


def paired_matrix(df_one_run: pd.DataFrame, column: str = "gold_score") -> tuple[np.ndarray, list[str], np.ndarray]:
    """One run's records as (steps ascending, prompt ids, scores[n_steps, n_prompts]); NaN where a step has no
    score for a prompt (an extension batch, or a file loaded with complete=False). Prompt ids are in the held-out
    pool's order where they are numbers (the gate's ids are their index in the pool), else sorted as text."""
    if df_one_run["run_id"].nunique() > 1:
        raise ValueError("paired_matrix: give the rows of one run (found runs "
                         f"{', '.join(map(str, df_one_run['run_id'].unique()[:3]))}, ...)")
    table = df_one_run.pivot(index="step", columns="prompt_id", values=column).sort_index()
    table = table.reindex(columns=sorted(table.columns, key=_prompt_key))
    return table.index.to_numpy(dtype=float), [str(c) for c in table.columns], table.to_numpy(dtype=float)


def records_by_run(df: pd.DataFrame, sign: dict[str, float] | None = None
                   ) -> dict[str, tuple[np.ndarray, list[str], np.ndarray]]:
    """`paired_matrix` of every run, scores multiplied by the run's sign (+1 higher is better, -1 lower)."""
    out = {}
    for run_id, g in df.groupby("run_id", sort=True):
        steps, prompts, scores = paired_matrix(g)
        out[str(run_id)] = (steps, prompts, scores * (sign or {}).get(str(run_id), 1.0))
    return out


def check_against_trace(records: dict[str, tuple[np.ndarray, list[str], np.ndarray]], trace_steps: dict[str,
                        np.ndarray], trace_evals: dict[str, np.ndarray], source: str) -> None:
    """Refuse (BadInput naming run and step) records whose runs or steps the trace lacks, and trace checkpoints
    with an eval score but no per-prompt records."""
    for run_id in records:
        if run_id not in trace_steps:
            raise BadInput(f"prompts '{source}': run '{run_id}' is not in the trace")
    for run_id, steps in trace_steps.items():
        if run_id not in records:
            raise BadInput(f"prompts '{source}': no records for run '{run_id}' of the trace (every run needs its "
                           "per-prompt scores)")
        have = set(records[run_id][0].tolist())
        known = set(np.asarray(steps, dtype=float).tolist())
        extra = sorted(have - known)
        if extra:
            raise BadInput(f"prompts '{source}': run '{run_id}' step {extra[0]:g} is not a step of the trace")
        evals = trace_evals[run_id]
        for s, e in zip(steps, evals, strict=True):
            if e == e and float(s) not in have:
                raise BadInput(f"prompts '{source}': run '{run_id}' step {float(s):g} has an eval_score in the trace "
                               "but no per-prompt records")
