"""The eval gate's per-prompt records, sampled with common random numbers (CRN).

The held-out pool is cut into fixed batches, in held-out order: batch 0 is the gate itself (the first
`eval_prompts` prompts), batches 1, 2, ... are the extension batches (`eval_extra_batch` prompts each) that the gate
scores only when a stop decision is close (`TrainConfig.eval_extra_budget`, see `Trainer.extend_gate`). Each batch
is sampled with a seed fixed for the run (`batch_seed`), the same at every checkpoint. Why: the difference of two
checkpoints on the same prompts *and the same sampling noise* cancels prompt difficulty and most of the sampling
noise, so a paired per-prompt difference has a far smaller SE than the difference of two means. The batched sampler
draws one-sample `torch.multinomial`, i.e. exponential noise per row and vocabulary entry at each decode step, from
the batch's generator; with the same batch (same prompts, same order) row i gets the same noise at every checkpoint.
The same checkpoint scored twice therefore gives identical records.

A record is one prompt at one checkpoint: `PromptRecord` (prompt id = its index in the held-out list, the batch's
sampling seed, gold score, proxy score as training sees it, response length in tokens). `GateRecordsCSV` writes them
to `gate_records.csv` in the run directory, in the `eval.prompt_records` format (`run_id, step, prompt_id,
gold_score, seed, proxy_score, response_len`; `proxy_score` only for a job with a proxy reward model: a tenant's
function reward has none, and `eval.prompt_records` reads the column as optional).

`HeldoutScorer` is the gate's scorer of every kind (`gate:` gold, function or model): one score per held-out prompt.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eval.attribution import TenantCodeError
from training.inputs.scorers import FunctionScorer, examples_of, gold_code_hash
from training.inputs.synthetic_task import gold_score
from training.job.config import TrainConfig

#: the file a run directory keeps its gate records in
GATE_RECORDS = "gate_records.csv"
#: columns of a gate-records CSV (the per-prompt records format `eval.prompt_records` reads)
RECORD_COLUMNS = ("run_id", "step", "prompt_id", "gold_score", "seed", "proxy_score", "response_len")
#: the columns a file has only when some record has them: the proxy reward model's score (none without one)
OPTIONAL_COLUMNS = ("proxy_score",)


@dataclass(frozen=True)
class PromptRecord:
    """One held-out prompt scored at one checkpoint."""

    prompt_id: int
    seed: int
    gold_score: float
    proxy_score: float
    response_len: int


def batch_seed(run_seed: int, batch: int) -> int:
    """The sampling seed of held-out batch `batch` in a run with seed `run_seed`: fixed for the run (the same at
    every checkpoint), distinct from the trainer's own generators (`seed * 1000 + 1`, `+ 2`)."""
    return (int(run_seed) * 1000 + 3) * 1000 + int(batch)


def heldout_batches(n_heldout: int, eval_prompts: int, extra_batch: int) -> list[range]:
    """The held-out pool's batches as index ranges: the gate's `eval_prompts`, then extension batches of
    `extra_batch` prompts (the last may be shorter) up to `n_heldout`; none when `extra_batch` is 0."""
    out = [range(0, min(eval_prompts, n_heldout))]
    if extra_batch > 0:
        for lo in range(eval_prompts, n_heldout, extra_batch):
            out.append(range(lo, min(lo + extra_batch, n_heldout)))
    return out


@torch.no_grad()
def proxy_scores(reward_model: torch.nn.Module, prompt_ids: list[list[int]], responses: list[list[int]],
                 pad_id: int) -> list[float]:
    """The proxy reward model's score of each (prompt, response), read at the last real token, as the rollout
    reads it (`training/rollout/streaming.py`)."""
    from training.rollout.engine import IncrementalScorer, left_pad

    seqs = [p + r for p, r in zip(prompt_ids, responses, strict=True)]
    ids, attn = left_pad(seqs, pad_id)
    device = next(reward_model.parameters()).device
    scorer = IncrementalScorer(reward_model, "reward")
    out = scorer.begin(ids.to(device), attn.to(device)).cpu()
    scorer.release()
    return [float(v) for v in out[:, -1]]


def summary(records: list[PromptRecord]) -> tuple[float, float]:
    """(mean gold score, SE of that mean) over one checkpoint's records."""
    golds = np.array([r.gold_score for r in records], dtype=float)
    se = float(golds.std(ddof=1) / math.sqrt(len(golds))) if len(golds) > 1 else math.nan
    return float(golds.mean()), se


def record_rows(run_id: str, step: int, records: Iterable[PromptRecord]) -> list[dict]:
    """The CSV rows of one checkpoint's records; `proxy_score` only where there is one (a job without a proxy reward
    model, a tenant's function reward, has none: its records are NaN there, and its file has no such column)."""
    return [{"run_id": run_id, "step": int(step), "prompt_id": r.prompt_id, "gold_score": r.gold_score,
             "seed": r.seed, **({} if math.isnan(r.proxy_score) else {"proxy_score": r.proxy_score}),
             "response_len": r.response_len} for r in records]


def _fmt(v):
    return f"{v:.6g}" if isinstance(v, float) else v


def write_records(path: str | Path, rows: Iterable[dict], append: bool = False) -> int:
    """Write (or append) gate-record rows to a CSV in `RECORD_COLUMNS` order; returns the rows written. A new file's
    columns are the required ones and the optional ones (`OPTIONAL_COLUMNS`) some row has (all of them for no rows);
    rows appended to a file keep its header, a value it has no row for left empty ("not recorded")."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(rows)
    new = not (append and path.exists())
    if new:
        columns = [c for c in RECORD_COLUMNS if c not in OPTIONAL_COLUMNS or not rows or any(c in r for r in rows)]
    else:
        with path.open(newline="") as f:
            columns = next(csv.reader(f), None) or list(RECORD_COLUMNS)
    with path.open("w" if new else "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: _fmt(r[k]) if k in r else "" for k in columns})
    return len(rows)


def read_records(path: str | Path) -> list[dict]:
    """The rows of a gate-records CSV (strings as written)."""
    with Path(path).open() as f:
        return list(csv.DictReader(f))


class GateRecordsCSV:
    """A run directory's `gate_records.csv`; on resume it keeps only the rows up to the checkpoint's step."""

    def __init__(self, path: Path, resume_step: int):
        self.path = Path(path)
        kept = [r for r in read_records(self.path) if int(r["step"]) <= resume_step] \
            if self.path.exists() and resume_step > 0 else []
        if kept:
            write_records(self.path, kept)
        else:  # the first records written choose the columns (`write_records`: no proxy_score without a proxy)
            self.path.unlink(missing_ok=True)

    def write(self, run_id: str, step: int, records: list[PromptRecord]) -> None:
        write_records(self.path, record_rows(run_id, step, records), append=True)


class HeldoutScorer:
    """The eval gate's scorer: `score(prompts, texts, responses, rows) -> list[float]`, one score per held-out
    prompt (rows: their indices in the held-out split)."""

    def __init__(self, cfg: TrainConfig, inputs: Any, tok: Any, pool_of=None, model: Any = None,
                 own_pool: bool = False):
        self.cfg, self.inputs, self.tok = cfg, inputs, tok
        self.kind = cfg.gate.kind
        self._pool = None
        if own_pool:  # a scorer outside a trainer: a pool of its own, stopped by close()
            pool_of = self._own_pool
        self.function = (FunctionScorer(cfg.gate, "gate function", "gate.ref", cfg.config_dir, pool_of)
                         if self.kind == "function" else None)
        self.model = model

    def _own_pool(self):
        if self._pool is None:
            from training.inputs.tenant_code import TenantFunctionPool

            cwd = Path(self.cfg.config_dir) if self.cfg.config_dir else Path.cwd()
            self._pool = TenantFunctionPool(cwd, workers=1, memory_mb=self.cfg.gate.memory_mb)
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    @property
    def code_hash(self) -> str:
        if self.function is not None:
            return self.function.code_hash
        if self.kind == "gold":
            return gold_code_hash()
        return ""

    def score(self, prompts: list, texts: list[str], responses: list[list[int]], rows: list[int]) -> list[float]:
        if self.kind == "gold":
            return [gold_score(p, t, self.cfg.task) for p, t in zip(prompts, texts, strict=True)]
        if self.kind == "model":
            from training.job.device import autocast, model_device

            with autocast(model_device(self.model), self.cfg.dtype):
                return proxy_scores(self.model, [self.tok.encode(self.inputs.render(p)) for p in prompts], responses,
                                    self.tok.pad_id)
        got = self.function(prompts, texts, self.inputs.columns("heldout", rows), [list(r) for r in responses],
                            getattr(self, "step", 0), self.cfg.steps)
        bad = [(i, f) for i, f in enumerate(got.failures)]
        if bad or any(s is None or not math.isfinite(s) for s in got.scores):
            examples = examples_of(got.failures)
            missing = sum(s is None for s in got.scores) - len(got.failures)
            what = (f"raised on {len(got.failures)} of {len(texts)} held-out prompts: {got.failures[0].error}" if bad
                    else f"returned None (no score) for {missing} of {len(texts)} held-out prompts")
            err = TenantCodeError(f"your gate function {self.function.text} {what}; a gate must score every held-out "
                                  f"prompt (fix it and resubmit){'; examples attached' if examples else ''}")
            err.examples = examples
            raise err
        return [float(s) for s in got.scores]
