"""Export a run's per-step metrics as a Trace CSV (docs/ARCHITECTURE.md; input of `rlhfops detect` / `health`).

Columns: run_id, step, eval_score, reward, loss, kl, entropy, grad_norm, response_len, label.
One row per eval gate (the steps where the held-out gold evaluation ran): `eval_score` is the gold
score there, the other columns are that step's training metrics. `label` (1 hacking, 0 healthy) is
written when given, so real over-optimising and healthy runs can be replayed through the detectors.

`export_prompt_records` exports the gate's per-prompt records beside it (a second CSV, `run_id, step, prompt_id,
gold_score, seed, proxy_score, response_len`: the format `rlhfops detect --prompts` reads) from a run directory's
`gate_records.csv` (training/gate.py).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

from common.errors import BadInput
from training.gate import read_records, write_records
from training.metrics import StepRecord

TRACE_COLUMNS = ("run_id", "step", "eval_score", "reward", "loss", "kl", "entropy", "grad_norm", "response_len",
                 "label")


def _rows_from_csv(path: Path) -> list[dict]:
    if not path.is_file():
        raise BadInput(f"metrics: '{path}' not found (a run directory's metrics.csv)")
    with path.open() as f:
        return list(csv.DictReader(f))


def trace_rows(records: Iterable[StepRecord | dict], run_id: str, label: int | None = None) -> list[dict]:
    out = []
    for rec in records:
        r = rec.flat() if isinstance(rec, StepRecord) else rec
        gold = float(r["gold_eval"]) if r.get("gold_eval") not in (None, "") else math.nan
        if math.isnan(gold):
            continue
        out.append({
            "run_id": run_id, "step": int(float(r["step"])), "eval_score": gold,
            "reward": float(r["reward_mean"]), "loss": float(r["loss_policy"]), "kl": float(r["kl"]),
            "entropy": float(r["entropy"]), "grad_norm": float(r["grad_norm"]),
            "response_len": float(r["response_len_mean"]), "label": "" if label is None else int(label),
        })
    return out


def export_trace(source: str | Path | Iterable[StepRecord], out: str | Path, run_id: str, label: int | None = None,
                 append: bool = False) -> int:
    """Write (or append) one run's trace rows; `source` is a metrics.csv path or StepRecords. Returns rows."""
    records = _rows_from_csv(Path(source)) if isinstance(source, (str, Path)) else source
    rows = trace_rows(records, run_id, label)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not (append and out.exists())
    with out.open("w" if new else "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=TRACE_COLUMNS)
        if new:
            w.writeheader()
        w.writerows(rows)
    return len(rows)


def export_prompt_records(source: str | Path, out: str | Path, run_id: str, append: bool = False) -> int:
    """Write (or append) one run's per-prompt gate records, from its `gate_records.csv`, under `run_id`. Returns
    rows."""
    source = Path(source)
    if not source.is_file():
        raise BadInput(f"gate records: '{source}' not found (a run directory's gate_records.csv)")
    rows = [{**r, "run_id": run_id} for r in read_records(source)]
    return write_records(out, rows, append=append)
